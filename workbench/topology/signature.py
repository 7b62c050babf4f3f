"""The reference finding, "topological compression", as signed expectations under attack.

Under adversarial influence many small short-lived features collapse into fewer, dominant, larger-scale ones:
H0 bars die later (+1), fewer H1 loops (-1) that persist longer (+1), with less spread among them (entropy -1).
Every place that reads the signature (the probe's verdicts, the tool drift columns, the study tables and the
app) reads it from here.
"""

COMPRESSION_SIGNATURE = {"h0_death_mean": +1, "h1_count": -1, "h1_persistence_mean": +1, "h1_entropy": -1}
SIGNATURE_FEATURES = tuple(COMPRESSION_SIGNATURE)
