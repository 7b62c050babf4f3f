"""Run every benchmark in this folder (``--quick`` sizes unless ``--full``); each prints its ratios.

    python bench/run_all.py [--full]
"""

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    full = "--full" in sys.argv[1:]
    failed = []
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script), *([] if full else ["--quick"])]).returncode:
            failed.append(script.name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
