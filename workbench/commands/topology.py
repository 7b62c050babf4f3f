"""``workbench topology``: Rips persistence of a saved point cloud, written as ``diagrams.json`` (see
``workbench.topology.diagrams``) and ``diagram.html`` (a self-contained plotly page, viewable offline).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError
from workbench.io import check_output_folder, write_text_atomic
from workbench.topology.diagrams import diagram_document

METRICS = ("euclidean", "cosine")  # what `workbench topology` offers (the kernels' sqeuclidean is no metric)
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
    from workbench.report import write_figure
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.plots import diagram_figure
    from workbench.topology.validate import as_points

    name = Path(points).name if isinstance(points, (str, Path)) else "points"
    X = as_points(load_points(points) if isinstance(points, (str, Path)) else points, name)
    check_options(len(X), maxdim, metric, landmarks, thresh)
    check_output_folder(out)
    out = Path(out)
    start = time.perf_counter()
    result = rips_persistence(
        X, maxdim=maxdim, metric=metric, thresh=math.inf if thresh is None else thresh, landmarks=landmarks
    )
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "diagrams.json", out / "diagram.html"
    text = json.dumps(diagram_document(result), allow_nan=False)  # never NaN: it is not JSON
    write_text_atomic(json_path, text)
    title = f"{name}: Rips H0-H{result.maxdim}, {metric}, {result.n_points} points"
    if result.landmarks is not None:
        title += f" ({len(result.landmarks)} landmarks, bottleneck error <= {result.bottleneck_bound:.3g})"
    write_figure(html_path, diagram_figure(result, title))
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
