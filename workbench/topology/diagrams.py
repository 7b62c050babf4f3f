"""Persistence diagrams as JSON: what ``workbench topology`` writes and the probe, the app and the studies read.

A ``diagrams.json`` holds ``{"dgms": [[[birth, death], ...] per dimension], ...}`` plus the metric,
sizes, threshold, landmark indices and the Hausdorff / bottleneck error bound. An infinite death (the
essential H0 class, classes cut by ``thresh``) is written as ``null``, which is valid JSON;
``load_diagrams`` turns it back into ``inf``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

FORMAT = "workbench.diagrams/1"


def diagrams_to_lists(dgms) -> list:
    """Diagrams as JSON-ready nested lists, infinite deaths as None (JSON null)."""
    return [[[float(b), None if math.isinf(d) else float(d)] for b, d in dgm] for dgm in dgms]


def diagrams_from_lists(lists) -> list[np.ndarray]:
    """The inverse of ``diagrams_to_lists``: one (n, 2) float array per dimension, null deaths back to inf."""
    return [
        np.array([[b, np.inf if d is None else d] for b, d in dgm], dtype=np.float64).reshape(-1, 2)
        for dgm in lists
    ]


def diagram_document(result) -> dict:
    """A PersistenceResult as a JSON-ready document (inf deaths as null, never NaN: it is not JSON)."""
    return {
        "format": FORMAT,
        "dgms": diagrams_to_lists(result.dgms),
        "infinite_death": None,
        "metric": result.metric,
        "complex": result.complex,
        "n_points": int(result.n_points),
        "maxdim": int(result.maxdim),
        "thresh": None if math.isinf(result.thresh) else float(result.thresh),
        "landmarks": None if result.landmarks is None else [int(i) for i in result.landmarks],
        "hausdorff": float(result.hausdorff),
        "bottleneck_bound": float(result.bottleneck_bound),
        "backend": result.backend,
    }


def load_diagrams(path) -> list[np.ndarray]:
    """Diagrams from a ``diagrams.json`` (null deaths back to inf), one (n, 2) array per dimension."""
    return diagrams_from_lists(json.loads(Path(path).read_text())["dgms"])
