"""Run a script as ``__main__`` and, on exit, record this process's peak memory.

The benchmark launches each rank through this wrapper,
``torchrun ... benchmarks/rank_rss.py OUT_DIR solutions/step3_ddp.py ARGS``,
so each rank writes ``OUT_DIR/rank<R>.json`` with its ``ru_maxrss``: peak
memory per rank, not of torchrun's whole process tree. The step scripts end
normally (``destroy_process_group`` in their ``finally``), so the record is
written in this wrapper's own ``finally``.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
from pathlib import Path


def record(out: str) -> None:
    rank = int(os.environ.get("RANK", "0"))  # torchrun's; 0 under plain python
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "max_rss_mb": rss_mb}) + "\n")


def main() -> None:
    out, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        record(out)


if __name__ == "__main__":
    main()
