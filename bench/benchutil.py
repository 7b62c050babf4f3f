"""Shared helpers of the bench scripts: timing, a printed table of ratios, JSON results.

Every ratio compares timings measured in the same run on the same machine: a baseline's
time divided by ours (so > 1 means we are faster).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def best_of(fn, repeats: int = 1, warmup: bool = False):
    """(best wall time in seconds, last return value) of ``repeats`` calls."""
    if warmup:
        fn()
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        **cpu(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def cpu() -> dict:
    """The processor's name and its bfloat16 matrix instructions: they move every CPU timing here by 2-3x."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"cpu": platform.processor()}
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return {"cpu": name or platform.processor(), "bf16_instructions": sorted(flags & {"avx512_bf16", "amx_bf16"})}


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain fixed-width table (bench scripts print; the library never does)."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def write_results(name: str, args, rows: list[dict], **extra) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"bench": name, "args": vars(args), "machine": machine(), "rows": rows, **extra}
    path.write_text(json.dumps(doc, indent=1, default=float))
    print(f"wrote {path}")
    return path
