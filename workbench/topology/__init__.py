"""Persistent homology of activation clouds: diagrams, summaries, statistics, neuron-level flow.

Plain functions over arrays (``rips_persistence``, ``alpha_persistence``, ``h0_persistence``)
return ``PersistenceResult``; summaries are scikit-learn transformers in ``summaries``.
Heavy dependencies (torch, giotto-ph, ripser, gudhi) are imported inside the functions.
"""

from workbench.topology.persistence import (
    PersistenceResult,
    alpha_persistence,
    h0_persistence,
    rips_persistence,
)

__all__ = ["PersistenceResult", "alpha_persistence", "h0_persistence", "rips_persistence"]
