"""Peak memory of SAE training streamed from an activation store: flat in the store's size.

Two synthetic stores (float16 activations of the embedded default's width, 576; ``--rows`` rows and four times
that, in shards of 65,536 rows) are written once. In a fresh process each, the bare imports first, the peak
resident set reset (``/proc/self/clear_refs``), then one SAE (TopK, 8 x 576 features) is trained on a fixed
number of samples either

- **streamed**: ``store_batches`` (shards in a random order, two at a time through a shuffled buffer), what
  ``workbench sae train`` does, from a folder or any fsspec URL; or
- **in memory**, the named baseline: ``store.get(site)`` holds the whole store first (what ``sae train`` did
  before to count the activations; any trainer that loads its data does the same).

Target: the streamed peak at 4x the store within 10% of the streamed peak at 1x.

    python bench/bench_sae_stream.py [--rows 524288] [--train 262144]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SITE = "blocks.12.hook_resid_post"
D = 576
SHARD = 65_536

PROBE = r'''
import json, sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
import torch, sae_lens
from workbench.sae.train import TrainConfig, _shuffled_batches, store_batches, train_sae
from workbench.store import ActivationStore
how, path, n_train, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak
t = time.perf_counter()
store = ActivationStore(path)
site = store.sites[0]
cfg = TrainConfig(site=site, k=32, batch_size=4096, n_tokens=n_train, n_checkpoints=0, data=path)
if how == "streamed":
    batches = store_batches(store, site, cfg.batch_size, seed=0)
else:
    held = store.get(site).float()
    def forever():
        while True:
            yield held
    batches = _shuffled_batches(forever(), cfg.batch_size, torch.Generator().manual_seed(0))
train_sae(cfg, batches, store.manifest["d"][site][0], out, resume=False, progress=False)
print(json.dumps({"seconds": time.perf_counter() - t, "peak_bytes": status("VmHWM") - base}))
'''


def write_store(path: Path, rows: int) -> int:
    """A store of ``rows`` random float16 activations; returns its bytes on disk."""
    import torch

    from workbench.store import ActivationStore

    header = {"model": "synthetic", "weights_sha256": "0" * 64, "sites": [SITE], "positions": "all",
              "dtype": "float16", "prompts_sha256": f"rows-{rows}", "n_prompts": rows // SHARD, "d": {SITE: [D]}}
    store = ActivationStore.create_or_resume(path, header)
    generator = torch.Generator().manual_seed(rows)
    for i in range(rows // SHARD):
        x = torch.randn(SHARD, D, generator=generator).to(torch.float16)
        store.append_shard({SITE: x}, [{"block": i}])
    store.mark_complete()
    return sum(e["bytes"] for e in store.manifest["shards"])


def measure(how: str, path: Path, n_train: int, out: Path) -> dict:
    got = subprocess.run([sys.executable, "-c", PROBE, how, str(path), str(n_train), str(out)], capture_output=True,
                         text=True)
    if got.returncode:
        raise SystemExit(f"{how} {path} failed:\n{got.stderr[-2000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8 * SHARD, help="rows of the smaller store (a multiple of 65,536)")
    p.add_argument("--train", type=int, default=262_144, help="samples trained on in every case")
    a = p.parse_args()
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (1, 4):
            store = Path(tmp) / f"store-{scale}x"
            size = write_store(store, scale * a.rows)
            for how in ("streamed", "in memory"):
                got = measure(how, store, a.train, Path(tmp) / f"sae-{scale}-{how.replace(' ', '-')}")
                rows_out.append({"store_rows": scale * a.rows, "store_gb": size / 1e9, "how": how,
                                 "peak_gb": got["peak_bytes"] / 1e9, "seconds": got["seconds"]})
                r = rows_out[-1]
                print(f"store {r['store_rows']:>9,} rows ({r['store_gb']:.2f} GB)  {how:<10} peak {r['peak_gb']:.2f} GB"
                      f"  {r['seconds']:.1f} s", flush=True)
    peak = {(r["store_rows"] // a.rows, r["how"]): r["peak_gb"] for r in rows_out}
    ratios = {"streamed_4x_over_1x": peak[(4, "streamed")] / peak[(1, "streamed")],
              "in_memory_4x_over_1x": peak[(4, "in memory")] / peak[(1, "in memory")],
              "in_memory_over_streamed_at_4x": peak[(4, "in memory")] / peak[(4, "streamed")]}
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    from workbench.report import versions

    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "sae_stream.json"
    out.write_text(json.dumps({"versions": versions(), "rows": rows_out, "ratios": ratios,
                               "settings": {"rows": a.rows, "train": a.train, "d": D, "shard_rows": SHARD}}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
