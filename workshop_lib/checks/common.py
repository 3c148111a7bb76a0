"""What every check shares: a ✓ line when the exercise works, else CheckFailed, one ✗ line without a traceback."""

from __future__ import annotations

from collections.abc import Callable

from workshop_lib.checks import torch_errors
from workshop_lib.errors import WorkshopError, first_line


class CheckFailed(AssertionError):
    """The exercise does not work yet; the message says what to change."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"\N{BALLOT X} {self}"]


def _passed(message: str) -> None:
    print(f"\N{CHECK MARK} {message}")


def _missed(message: str) -> None:
    """A prediction that was off: said with a cross, not raised (a guess is not a bug, and Run All goes on)."""
    print(f"\N{BALLOT X} {message}")


def predict_first(predicted, name: str) -> None:
    """Stop a run cell before it shows its answer while the learner's prediction ``name`` is still empty."""
    empty = predicted is None or (isinstance(predicted, dict) and all(v is None for v in predicted.values()))
    if empty:
        raise CheckFailed(f"predict first: set `{name}` in the cell above and run it, then run this cell: "
                          f"the run shows the answer")


# A collective that waits this long in a check (whose ranks each take a second or two) is a hang:
# the hang watch names the rank that never arrived, and the check stops there instead of at its timeout.
HANG_AFTER = 8.0


def _call(fn: Callable, name: str, *args):
    """``fn(*args)``, the learner's function; what it raises becomes one line: where, torch's words, the cause."""
    from workshop_lib.debug import frames

    try:
        return fn(*args)
    except CheckFailed:
        raise
    except NotImplementedError:
        raise CheckFailed(f"{name} still raises NotImplementedError: fill in its TODO and run its cell again") from None
    except Exception as err:
        if "not been initialized" in str(err):
            raise CheckFailed(f"{name} looked for a process group, and there is none here (torch: Default process "
                              f"group has not been initialized)") from None
        why = torch_errors.explain(str(err))
        mine = frames.raised_at(err)  # the innermost line of the learner's code
        raise CheckFailed(f"{name} raised {type(err).__name__}{f' (line {mine.lineno})' if mine else ''}: "
                          f"{first_line(err, 300)}" + (f"; {why}" if why else "")) from None


def run_forked(fn: Callable, nprocs: int, *args, timeout: float = 60, name: str | None = None,
               hang_after: float | None = None,
               fix: str = "every rank must call every collective, in the same order") -> list:
    """``fn(env, *args)`` on ``nprocs`` ranks of :func:`~workshop_lib.lab.forklaunch.notebook_launch`; a failure or
    a hang (a collective waiting ``hang_after`` s, default :data:`HANG_AFTER`) becomes one line, with ``fix``."""
    from workshop_lib.lab.forklaunch import HangError, LaunchTimeout, RanksFailed, notebook_launch

    try:
        return notebook_launch(fn, nprocs, *args, timeout=timeout,
                               hang_after=HANG_AFTER if hang_after is None else hang_after)
    except HangError as err:  # the watch's line, and the fix unless it says one already
        said = err.diagnosis
        raise CheckFailed(said if "every rank must" in said else f"{said}: {fix}, or the others wait for it") from None
    except LaunchTimeout:
        raise CheckFailed(f"the ranks did not finish within {timeout:g}s: a rank waits in a collective that "
                          f"another rank never joins; {fix}") from None
    except RanksFailed as err:
        if "NotImplementedError" in str(err):
            raise CheckFailed(f"{name or 'your function'} still raises NotImplementedError: fill in its TODO and "
                              f"run its cell again") from None
        why = next(filter(None, map(torch_errors.explain, err.details)), None)
        raise CheckFailed(f"a rank failed: {err.failures[0]}" + (f"; {why}" if why else "")) from None
    except WorkshopError as err:  # the ranks could not start (a function spawn cannot send, CUDA before a fork)
        raise CheckFailed(str(err)) from None
