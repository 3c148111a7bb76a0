"""A rank that fails on purpose, for the fault tests: fault_worker.py MODE TIMEOUT [fail|survive].

Every rank joins the group as a step script does (env://, timeout TIMEOUT seconds)
and all-reduces in a loop; the last rank fails after a few rounds, as MODE says:
``raise`` an exception, or ``exit`` at once through os._exit (as a crash or the OOM
killer would). The others are then blocked in an all_reduce that can never
complete. (A rank that stays alive but never joins: tests/workers/hang_worker.py.) With a third
argument, the processes launched with ``fail`` fail (one node of two).
``@record`` puts a rank's exception into torchrun's failure summary.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(argv: list[str] | None = None) -> None:
    mode, timeout, *role = argv or sys.argv[1:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(timeout)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    fails = role == ["fail"] or (not role and rank == world_size - 1)
    try:
        for step in range(10_000):
            if step == 3 and fails:
                print(f"rank {rank} fails now ({mode}) at {time.time():.3f}", flush=True)
                if mode == "raise":
                    raise RuntimeError(f"rank {rank} raised on purpose")
                os._exit(3)
            t = torch.ones(1)
            dist.all_reduce(t)
            time.sleep(0.05)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
