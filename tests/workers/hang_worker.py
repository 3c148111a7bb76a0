"""Two ranks made to wait on purpose, for the hang watch and diagnose tests: hang_worker.py MODE TIMEOUT.

A plain script: it joins a gloo group through env:// and holds no line of the
watch, which the tests attach from outside (``torchrun ... -m workshop_lib.watch
--after S hang_worker.py MODE TIMEOUT``). After one all_reduce, rank 1 goes
elsewhere, as MODE says, while rank 0 enters all_reduce number 2:

* ``busy``: rank 1 sits in ``evaluate()`` until the watch has saved its block (``WORKSHOP_HANG_RECORD``),
  then joins: the diagnosis is certain to come first, and the job still finishes;
* ``wait``: rank 1 sits in ``evaluate()`` until killed (for diagnose);
* ``clean``: no rank goes elsewhere; at exit each rank says whether torch's functions are torch's own.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from workshop_lib.debug import hangreport

ORIGINAL_BACKWARD = "torch/autograd/__init__.py"  # where torch's own torch.autograd.backward is defined


def evaluate(seconds: float, until_the_watch_speaks: bool = False) -> None:
    if not until_the_watch_speaks:
        time.sleep(seconds)  # rank 1 is here
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not hangreport.load(os.environ[hangreport.RECORD_VARIABLE]):
        time.sleep(0.05)  # rank 1 is here (or one line up, reading the record)


def torchs_own() -> str:
    """Are the functions a script calls torch's own (not a wrapper)? One line, for the tests to read."""
    backward = torch.autograd.backward.__code__.co_filename.replace(os.sep, "/").endswith(ORIGINAL_BACKWARD)
    return (f"destroy_process_group={dist.destroy_process_group is distributed_c10d.destroy_process_group} "
            f"all_reduce={dist.all_reduce is distributed_c10d.all_reduce} backward={backward}")


def main(argv: list[str] | None = None) -> None:
    mode, timeout = (argv or sys.argv[1:])[:2]
    if mode == "clean":
        atexit.register(lambda: print(f"at exit: {torchs_own()}", flush=True))
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(timeout)))
    x = torch.ones(3)
    dist.all_reduce(x)
    print(f"rank {dist.get_rank()} ready; during the run: {torchs_own()}", flush=True)
    if dist.get_rank() == 1 and mode != "clean":
        evaluate(3600 if mode == "wait" else 60, until_the_watch_speaks=mode == "busy")
    dist.all_reduce(x)  # rank 0 waits here
    print(f"rank {dist.get_rank()} sum {x.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
