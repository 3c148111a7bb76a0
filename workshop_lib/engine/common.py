"""What every check shares: a ✓ line when the exercise works, else CheckFailed, one ✗ line without a traceback."""

from __future__ import annotations

from collections.abc import Callable

from workshop_lib.engine import torch_errors
from workshop_lib.errors import WorkshopError
from workshop_lib.launching import ends
from workshop_lib.launching.forklaunch import HANG_AFTER, HangError, LaunchTimeout, RanksFailed, notebook_launch


class CheckFailed(AssertionError):
    """The exercise does not work yet; the message says what to change."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"\N{BALLOT X} {self}"]


def verdict(mistake: str | None, measured: str, prediction: bool = False) -> None:
    """The one end of every judge (each returns its mistake, ``str | None``): the ✓ line of what was ``measured`` where
    there is none; else the ✗ line of the mistake, raised (CheckFailed), or for a ``prediction`` printed, not raised
    (a guess is not a bug, and Run All goes on)."""
    if mistake and not prediction:
        raise CheckFailed(mistake)
    print(f"\N{BALLOT X} {mistake}" if mistake else f"\N{CHECK MARK} {measured}")


def first(*checks: tuple[object, str | Callable[[], str]]) -> str | None:
    """The mistake of the first (broken, its line) pair whose ``broken`` holds: a check's judge as a table, in order;
    None where none does. A line given as a callable is built only when it is said, so it reads what its check
    established unguarded (a judge whose check needs what an earlier one established returns early instead)."""
    said = next((said for broken, said in checks if broken), None)
    return said() if callable(said) else said


def still_todo(name: str) -> str:
    """The one line for a learner's function whose TODO is still open."""
    return f"{name} still raises NotImplementedError: fill in its TODO and run its cell again"


def _empty(predicted) -> bool:
    return predicted is None or (isinstance(predicted, dict) and all(v is None for v in predicted.values()))


def predict_first(predicted, name: str | None = None) -> None:
    """Before the run: stop the cell while the learner's prediction ``name`` is still empty (the run shows the answer).

    ``predict_first("predicted_x")``, the name alone: the prediction is read from the calling cell's namespace, so a
    check cell run before its prediction cell says so, where the value itself would raise a bare NameError."""
    if name is None:
        import sys

        name, namespace = predicted, sys._getframe(1).f_globals
        if name not in namespace:
            raise CheckFailed(f"`{name}` is not set yet: run the prediction cell above first, then this cell")
        predicted = namespace[name]
    if _empty(predicted):
        raise CheckFailed(f"predict first: set `{name}` in the cell above and run it, then run this cell: "
                          f"the run shows the answer")


def is_number(predicted) -> bool:
    """Whether a prediction is a number (an int or a float; True and False are not)."""
    return isinstance(predicted, int | float) and not isinstance(predicted, bool)


def as_share(predicted):
    """A prediction of a share (at most 1), written as a share or as a percent (50 or 1.35 for 50% or 1.35%): the share;
    anything else as given. A number above 1 cannot be a share, so it is read as the percent the learner meant."""
    return predicted / 100 if is_number(predicted) and 1 < predicted <= 100 else predicted


def judge_prediction(name: str, predicted, measured, right: bool | None, why: str = "",
                     shown: str | None = None) -> None:
    """After the run, every prediction of the lab: ✓ when ``right`` (the caller's tolerance, which fits the
    measurement's noise), else ✗, with the measured value and ``why``; never raised (a guess is not a bug).
    ``right=None``: the measurement is too noisy to judge any prediction, said with ⚠ and neither mark."""
    said = "no prediction" if _empty(predicted) else f"you predicted {shown or repr(predicted)}"
    line = f"{name}: {said}, measured {measured}" + (f"; {why}" if why else "")
    if right is None:
        print(f"\N{WARNING SIGN} {line}")
    else:
        verdict(None if right and not _empty(predicted) else line, line, prediction=True)


def _collective_result(source: str, line: int) -> str | None:
    """A name read at ``line`` that holds what a collective returned (``value = dist.all_reduce(value)``): None."""
    import ast

    from workshop_lib.debug import collectives
    from workshop_lib.engine import branches

    tree = branches.parse(source)
    read = set(branches.names_read(source, line))
    for node in sorted(ast.walk(branches.scope(tree, line)) if tree else (), key=lambda n: -getattr(n, "lineno", 0)):
        call = node.value if isinstance(node, ast.Assign) and node.lineno < line else None
        name = branches.called(call)
        targets = {n.id for t in getattr(node, "targets", ()) for n in ast.walk(t) if isinstance(n, ast.Name)}
        if name in collectives.COLLECTIVES and read & targets and not any(k.arg == "async_op" for k in call.keywords):
            target = ast.unparse(node.targets[0])
            return (f"{target} = {ast.unparse(call.func)}(...) (line {node.lineno}) left {target} None: {name} works "
                    f"in place on the tensor it is given and returns None (a work handle only with async_op=True); "
                    f"call {ast.unparse(call.func)}(tensor) on a line of its own, then read the tensor")
    return None


def _call(fn: Callable, name: str, *args):
    """``fn(*args)``, the learner's function, in this process; what it raises becomes one line (:func:`said`)."""
    try:
        return fn(*args)
    except CheckFailed:
        raise
    except Exception as err:  # torch's "not been initialized": here no group was joined, and none is needed
        alone = "not been initialized" in str(err) and f"{name} runs in this one process, which joined no process " \
                                                        f"group: leave the dist calls out of it"
        raise CheckFailed(said(err, name, alone or None)) from None


def said(err: Exception, name: str, why: str | None = None) -> str:
    """The one line for what the learner's function ``name`` raised (in a rank too, where the rank returns it): its
    end record (:func:`~workshop_lib.launching.ends.record`) in :func:`told`'s words; ``why``: the cause, where the
    caller's record knows it better than torch's words."""
    from workshop_lib.engine.recorder import _rank

    return still_todo(name) if isinstance(err, NotImplementedError) else told(ends.record(_rank(), err), name, why)


def told(end: dict, subject: str | None = None, why: str | None = None) -> str:
    """An end record in one line (:func:`~workshop_lib.launching.ends.summary`, by its line: the cell is before the
    reader) with its cause: ``why``, else where it is known (one of :mod:`torch_errors`, or a name left None on its
    rank by a rank test)."""
    from workshop_lib.engine import branches

    why = why or torch_errors.explain(end.get("detail"))
    if not why and end.get("line"):  # a notebook cell's text too: IPython keeps it in linecache
        text, line = _text(end["file"]), end["line"]
        why = branches.unset_on_rank(text, line, end["type"], end["message"], end["rank"]) or (
            "NoneType" in end["message"] and _collective_result(text, line)) or None
    said = ends.summary(end, by_line=True, subject=subject)
    return f"{said.rstrip('.')}; {why}" if why else said


def rank_alone(waiting: list[dict]) -> str | None:
    """A hang whose cause is a collective under a rank test, read from ``waiting`` end records (the waiting rank's
    first, then the ranks it waited for; :func:`~workshop_lib.launching.ends.waiting`: each rank's innermost frame of
    the learner's) and the learner's code (:mod:`branches`)."""
    import ast

    from workshop_lib.engine import branches

    for end in waiting:
        file, line, _, code = (end.get("frames") or [[None] * 4])[-1]
        found = file and branches.under_rank([(_text(file), line)])
        if found:
            call = next((n for n in ast.walk(branches.parse(code) or ast.Module([], [])) if isinstance(n, ast.Call)), None)
            name = branches.called(call) or "the call"
            return (f"{name} (line {line}) is called by rank {end['rank']} alone, under `if {found[2]}:` (line "
                    f"{found[1]}): call it on every rank (it is a collective), or move it out of the block")
    return None


def _text(file: str) -> str:
    """A learner's file as the run read it: a notebook cell from IPython's linecache, a script from disk (linecache
    reads it)."""
    import linecache

    return "".join(linecache.getlines(file))


def run_forked(fn: Callable, nprocs: int, *args, timeout: float = 60, name: str | None = None,
               hang_after: float = HANG_AFTER, fix: str = "every rank must call every collective, in the same order",
               backend: str | None = "gloo", timed_out: Callable[[], str | None] | None = None) -> list:
    """``fn(env, *args)`` on ``nprocs`` ranks of :func:`~workshop_lib.launching.forklaunch.notebook_launch` (``backend``
    None: ``fn(None, *args)`` joins itself); a failure or a hang (a collective waiting ``hang_after`` s) becomes one
    line, with ``fix``, read from the ranks' end records; past ``timeout``, ``timed_out()``'s line where it has one."""
    try:
        return notebook_launch(fn, nprocs, *args, timeout=timeout, backend=backend, hang_after=hang_after)
    except HangError as err:  # the cause read from the records and the learner's code, else the watch's line and the fix
        waiter = next((e for e in err.ends if e["waited_for"]), {"waited_for": []})
        waiting = [waiter, *(e for e in err.ends if e["rank"] in waiter["waited_for"])]
        same = any(e["call"] == waiter.get("call") for e in waiting[1:])  # its shapes differ: the watch's line says so
        raise CheckFailed(rank_alone(waiting) or err.diagnosis + ("" if same else f": {fix}, or the others wait for it")
                          ) from None
    except LaunchTimeout:
        if timed_out is not None and (why := timed_out()):
            raise CheckFailed(why) from None
        raise CheckFailed(f"the ranks did not finish within {timeout:g}s: a rank waits in a collective that "
                          f"another rank never joins; {fix}") from None
    except RanksFailed as err:
        if any(end.get("type") == "NotImplementedError" for end in err.ends):
            raise CheckFailed(still_todo(name or "your function")) from None
        why = next(filter(None, (torch_errors.explain(end.get("detail")) for end in err.ends)), None)
        raise CheckFailed(f"a rank failed: {told(err.ends[0], why=why)}") from None  # the first to fail
    except WorkshopError as err:  # the ranks could not start (a function spawn cannot send, CUDA before a fork)
        raise CheckFailed(str(err)) from None
