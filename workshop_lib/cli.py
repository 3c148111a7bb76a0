"""The entry-point wrapper of every script: a WorkshopError becomes one line on stderr and exit code 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from workshop_lib.distributed import read_launch_env
from workshop_lib.errors import WorkshopError


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; turn a WorkshopError into one line on stderr and exit code 2.

    Under torchrun every rank runs this; each prefixes its rank so the line that
    names the problem also names where it happened, and then ends its process
    at once (see :func:`exit_worker`).
    """
    code = 0
    try:
        main(argv)
    except WorkshopError as err:
        print(f"{rank_label()}error: {err}", file=sys.stderr, flush=True)
        code = 2
    except KeyboardInterrupt:
        snapshots = sys.modules.get("workshop_lib.checkpoint")  # only a script that saves snapshots has it
        saved = snapshots.last_saved() if snapshots else None
        print(f"{rank_label()}interrupted" + (f": {saved}" if saved else ""), file=sys.stderr, flush=True)
        code = 130
    exit_worker(code)  # returns only outside a multi-process job
    return code


def rank_label() -> str:
    """'[rank N] ' in a multi-process job, '' otherwise: a prefix for messages."""
    launch = read_launch_env()
    return f"[rank {launch.rank}] " if launch.world_size > 1 else ""


def exit_worker(code: int) -> None:
    """In a multi-process job, end this process now, after teardown; elsewhere return.

    A finished gloo rank sometimes aborts while the interpreter shuts down (C++
    destructors racing: "terminate called without an active exception"), and
    torchrun then reports a good run as failed. Leaving with ``os._exit`` after the
    process group is destroyed and the output flushed skips that shutdown.
    """
    if read_launch_env().world_size <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
