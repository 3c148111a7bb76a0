"""The entry-point wrapper of the lab's commands (check, diagnose, watch) and the course's (tools/).

A :class:`~workshop_lib.errors.WorkshopError` becomes one line on stderr and exit code 2; Ctrl-C, one line and 130.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from workshop_lib.errors import WorkshopError


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; return its int result (else 0), or 2 after one line for a WorkshopError."""
    try:
        result = main(argv)
    except WorkshopError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    return result if isinstance(result, int) else 0
