"""A rank that fails on purpose, for the no-hang tests: fault_worker.py MODE TIMEOUT [fail|survive].

Every rank joins the group (timeout TIMEOUT seconds) and all-reduces in a loop;
the last rank fails after a few rounds, as MODE says: ``raise`` an exception,
``exit`` at once through os._exit (as a crash or the OOM killer would), or
``hang``: stay alive but never join the next collective.
The others are then blocked in an all_reduce that can never complete.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from workshop_lib import distributed
from workshop_lib.cli import run_cli


def main(argv: list[str] | None = None) -> None:
    mode, timeout, *role = argv or sys.argv[1:]
    env = distributed.setup("gloo", float(timeout))
    # The last rank fails; with a third argument, the processes launched with "fail" do.
    fails = role == ["fail"] or (not role and env.rank == env.world_size - 1)
    try:
        for step in range(10_000):
            if step == 3 and fails:
                print(f"rank {env.rank} fails now ({mode}) at {time.time():.3f}", flush=True)
                if mode == "raise":
                    raise RuntimeError(f"rank {env.rank} raised on purpose")
                if mode == "hang":
                    time.sleep(3600)  # alive, but never reaches the next collective
                os._exit(3)
            t = torch.ones(1)
            dist.all_reduce(t)
            time.sleep(0.05)
    finally:
        distributed.teardown()


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
