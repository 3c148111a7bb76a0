"""Two ranks made to wait on purpose, for the hangwatch and diagnose tests: hang_worker.py MODE TIMEOUT THRESHOLD.

Every rank joins a gloo group and installs the watch; after one all_reduce,
rank 1 goes elsewhere, as MODE says, while rank 0 enters all_reduce number 2:

* ``busy``: rank 1 sits in ``evaluate()`` until the watch has saved its block (``WORKSHOP_HANG_RECORD``),
  then joins: the diagnosis is certain to come first, and the job still finishes;
* ``exit``: rank 1 leaves the job (destroy_process_group) and ends;
* ``wait``: rank 1 sits in ``evaluate()`` until killed (for diagnose).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from workshop_lib.debug import hangreport, hangwatch


def evaluate(seconds: float, until_the_watch_speaks: bool = False) -> None:
    if not until_the_watch_speaks:
        time.sleep(seconds)  # rank 1 is here
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not hangreport.load(os.environ[hangreport.RECORD_VARIABLE]):
        time.sleep(0.05)  # rank 1 is here (or one line up, reading the record)


def main(argv: list[str] | None = None) -> None:
    mode, timeout, threshold = (argv or sys.argv[1:])[:3]
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(timeout)))
    hangwatch.install(threshold=float(threshold))
    x = torch.ones(3)
    dist.all_reduce(x)
    print(f"rank {dist.get_rank()} ready", flush=True)
    if dist.get_rank() == 1:
        if mode == "exit":
            dist.destroy_process_group()
            return
        evaluate(3600 if mode == "wait" else 60, until_the_watch_speaks=mode == "busy")
    dist.all_reduce(x)  # rank 0 waits here
    print(f"rank {dist.get_rank()} sum {x.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
