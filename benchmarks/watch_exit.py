"""What the watch's gc.freeze() at the end saves: torchrun of step 3, watched, with and without it.

    python benchmarks/watch_exit.py [--rounds 3]

Alternates (so that drift in the machine's load falls on both alike) two launches of
``torchrun --standalone --nproc_per_node=2`` running solutions/step3_ddp.py (400 molecules,
2 epochs) under the hang watch: ``-m workshop_lib.watch``, which freezes the collector once
the script has ended, and the same watch started without that line (``_watch_unfrozen.py``).
Times each launch (wall, and the CPU time of the agent and its ranks) and writes
benchmarks/results/watch_exit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "watch_exit.json"
STEP3 = ROOT / "solutions" / "step3_ddp.py"
ARGS = ["--limit", "400", "--epochs", "2", "--no-tensorboard"]
WAYS = {"frozen at exit (-m workshop_lib.watch)": ["-m", "workshop_lib.watch"],
        "not frozen": [str(HERE / "_watch_unfrozen.py")]}


def launch(entry: list[str], out: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of torchrun and its ranks) of one launch."""
    before = os.times()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *entry,
                    str(STEP3), *ARGS, "--out", out], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    opts = p.parse_args(argv)
    runs: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(opts.rounds):
            for way, entry in WAYS.items():
                runs[way].append(launch(entry, out))
    summary = {way: {"wall_s": [round(w, 2) for w, _ in r], "cpu_s": [round(c, 2) for _, c in r],
                     "median_wall_s": round(statistics.median(w for w, _ in r), 2),
                     "median_cpu_s": round(statistics.median(c for _, c in r), 2)} for way, r in runs.items()}
    RESULTS.write_text(json.dumps({"command": "torchrun --standalone --nproc_per_node=2 WATCH solutions/step3_ddp.py "
                                   + " ".join(ARGS), "cpus": os.cpu_count(), "runs": summary}, indent=1) + "\n")
    for way, s in summary.items():
        print(f"{way:40s} median {s['median_wall_s']:.2f} s wall, {s['median_cpu_s']:.2f} s CPU "
              f"(walls {s['wall_s']})")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
