"""The entry-point wrapper of every script: a WorkshopError becomes one line on stderr and exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from workshop_lib.distributed import exit_worker, rank_label
from workshop_lib.errors import WorkshopError


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; turn a WorkshopError into one line on stderr and exit code 2.

    Under torchrun every rank runs this; each prefixes its rank so the line that
    names the problem also names where it happened, and then ends its process
    at once (see :func:`workshop_lib.distributed.exit_worker`).
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
