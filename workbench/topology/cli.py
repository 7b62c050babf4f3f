"""What ``workbench topology`` does, as a function the CLI (and tests) call.

Files written to ``out``:
- ``diagrams.json``: ``{"dgms": [[[birth, death], ...] per dimension], ...}`` plus the metric,
  sizes, threshold, landmark indices and the Hausdorff / bottleneck error bound. An infinite
  death (the essential H0 class, classes cut by ``thresh``) is written as ``null``, which is
  valid JSON; ``load_diagrams`` turns it back into ``inf``.
- ``diagram.html``: a self-contained plotly page (diagram + barcode), viewable offline.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError

FORMAT = "workbench.diagrams/1"
METRICS = ("euclidean", "cosine")  # what `workbench topology` offers (kernels' sqeuclidean is no metric)
MAXDIMS = (0, 1, 2)


def load_points(path) -> np.ndarray:
    """An array from a .npy file (or a .npz holding exactly one array), without pickles."""
    path = Path(path)
    if path.is_dir():
        raise WorkbenchError(f"points path {path} is a folder: give a .npy or .npz file")
    if not path.is_file():
        raise WorkbenchError(f"points file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise WorkbenchError(f"{path} is not a readable .npy/.npz array file ({err})") from err
    if isinstance(data, np.lib.npyio.NpzFile):
        names = list(data.files)
        if len(names) != 1:
            raise WorkbenchError(
                f"{path} holds {len(names)} arrays ({', '.join(names)}); save the cloud alone as .npy"
            )
        data = data[names[0]]
    return data


def diagrams_to_lists(dgms) -> list:
    """Diagrams as JSON-ready nested lists, infinite deaths as None (JSON null)."""
    return [[[float(b), None if math.isinf(d) else float(d)] for b, d in dgm] for dgm in dgms]


def diagrams_from_lists(lists) -> list[np.ndarray]:
    """The inverse of ``diagrams_to_lists``: one (n, 2) float array per dimension, null deaths back to inf."""
    return [
        np.array([[b, np.inf if d is None else d] for b, d in dgm], dtype=np.float64).reshape(-1, 2)
        for dgm in lists
    ]


def save_diagrams(result, path) -> dict:
    """Write a PersistenceResult as JSON (inf deaths as null); returns the written document."""
    doc = {
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
    Path(path).write_text(json.dumps(doc, allow_nan=False))  # never NaN: it is not JSON
    return doc


def load_diagrams(path) -> list[np.ndarray]:
    """Diagrams from a ``diagrams.json`` (null deaths back to inf), one (n, 2) array per dimension."""
    return diagrams_from_lists(json.loads(Path(path).read_text())["dgms"])


def check_options(n_points: int, maxdim, metric, landmarks, thresh) -> None:
    """The settings of ``workbench topology`` for a cloud of ``n_points``, or a one-line error."""
    if maxdim not in MAXDIMS:
        raise WorkbenchError(f"--maxdim must be 0, 1 or 2; got {maxdim}")
    if metric not in METRICS:
        raise WorkbenchError(f"unknown metric {metric!r}: use {' or '.join(METRICS)}")
    if landmarks is not None and not 3 <= landmarks <= n_points:
        raise WorkbenchError(f"--landmarks must be between 3 and the {n_points} points; got {landmarks} "
                             "(omit it to use every point)")
    if thresh is not None and not (math.isfinite(thresh) and thresh > 0):
        raise WorkbenchError(f"--thresh must be a positive finite distance; got {thresh} (omit it for no threshold)")


def run_topology_file(
    points,
    maxdim: int = 1,
    metric: str = "euclidean",
    landmarks: int | None = None,
    thresh: float | None = None,
    out=".",
) -> dict:
    """Rips persistence of a saved cloud; writes ``diagrams.json`` and ``diagram.html`` into ``out``.

    ``points`` is a path to .npy/.npz or an array. Returns a summary dict (bar counts and
    longest finite bar per dimension, error bound, timings, file paths) for the CLI to print.
    Every argument is checked before anything is computed or written.
    """
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.plots import diagram_figure
    from workbench.topology.validate import as_points

    name = Path(points).name if isinstance(points, (str, Path)) else "points"
    X = as_points(load_points(points) if isinstance(points, (str, Path)) else points, name)
    check_options(len(X), maxdim, metric, landmarks, thresh)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise WorkbenchError(f"--out {out} is a file: give a folder path")
    start = time.perf_counter()
    result = rips_persistence(
        X, maxdim=maxdim, metric=metric, thresh=math.inf if thresh is None else thresh, landmarks=landmarks
    )
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "diagrams.json", out / "diagram.html"
    save_diagrams(result, json_path)
    title = f"{name}: Rips H0-H{result.maxdim}, {metric}, {result.n_points} points"
    if result.landmarks is not None:
        title += f" ({len(result.landmarks)} landmarks, bottleneck error <= {result.bottleneck_bound:.3g})"
    diagram_figure(result, title).write_html(html_path, include_plotlyjs=True)
    dims = {}
    for dim, d in enumerate(result.dgms):
        fin = d[np.isfinite(d[:, 1])]
        life = fin[:, 1] - fin[:, 0]
        dims[f"H{dim}"] = {
            "bars": int(len(d)),
            "infinite": int(len(d) - len(fin)),
            "longest": float(life.max()) if life.size else 0.0,
            "total_persistence": float(life.sum()),
        }
    return {
        "n_points": int(result.n_points),
        "n_used": int(len(result.landmarks)) if result.landmarks is not None else int(result.n_points),
        "metric": metric,
        "maxdim": int(result.maxdim),
        "thresh": thresh,
        "hausdorff": float(result.hausdorff),
        "bottleneck_bound": float(result.bottleneck_bound),
        "backend": result.backend,
        "seconds": round(seconds, 3),
        "dims": dims,
        "files": {"diagrams": str(json_path), "plot": str(html_path)},
    }
