"""The hang labs of notebooks/05_when_it_hangs.ipynb: what the learner predicts, reads and fixes, judged.

Every lab is a reading. Before the run the learner predicts which line of ``train()`` each rank will wait at
(or raise at) and why (:func:`predict` keeps it); the run (:func:`run_broken`, or :func:`run_in_terminal`)
prints what the hang watch says, or torch's own error whole; :func:`check_prediction` then says which parts of
the prediction were right, without the answer, and :func:`check_reading` checks the learner's reading of the
diagnosis. Both compare with the run's record (the watch's saved block for a hang, each rank's traceback for
an error), never with an answer written here. :func:`check_fix` runs the learner's fix and passes when it
trains correctly. The runs themselves are :mod:`workshop_lib.checks.hang_runs`'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.checks.common import CheckFailed, _missed, _passed
from workshop_lib.checks.hang_runs import (  # noqa: F401 (the notebook's and the tests' names for them)
    BATCH,
    HANG_AFTER,
    NOTEBOOK,
    TIMEOUT,
    TRAIN_CELL,
    Run,
    deadlocked,
    launch,
    terminal,
    train_offset,
)
from workshop_lib.lab import sequences

WHY = {
    "skipped": "one rank calls a collective that the other rank skips",
    "batches": "one rank has a batch more: its backward() all-reduces gradients that the other rank never sends",
    "shapes": "the ranks call the same collective with tensors of different shapes",
    "unused": "a parameter gets no gradient, so DDP's reduction of the step never finishes",
}
# What an error says about its cause: a piece of torch's message, and the key of WHY it shows.
_ERROR_CAUSES = {"Expected to have finished reduction in the prior iteration": "unused"}


@dataclass
class Prediction:
    waits: dict[int, object]
    why: str
    made: float  # time.time() when it was kept


_predictions: dict[str, Prediction] = {}  # lab -> the learner's prediction, as kept before its run
_runs_started: dict[str, float] = {}  # lab -> when its broken run last started


def _same_but_rank(a: str, b: str) -> bool:
    import re

    return re.sub(r"\brank \d+", "rank N", a) == re.sub(r"\brank \d+", "rank N", b)


def run_broken(name: str, notebook: str | Path = NOTEBOOK) -> Run:
    """Run lab ``name``'s train() as its cell gives it on 2 forked ranks; print what the watch (or each error) says."""
    run = launch(name, broken=True, notebook=notebook)
    _runs_started[name] = run.started
    if run.record:
        print("the job hangs; the ranks were stopped once the hang watch had printed:")
        print("\n".join(f"  {line}" for line in run.record[0]["block"]))
    elif run.raised:
        print("the job failed; where each rank raised its error:")
        print("\n".join(f"  rank {r}: {TRAIN_CELL}:{line} in train(): {code}"
                        for r, (line, code) in sorted(run.raised.items())))
        shown = min(run.messages) if run.messages else None
        if shown is not None:
            same = [r for r in sorted(run.messages) if r != shown and _same_but_rank(run.messages[r], run.messages[shown])]
            also = f" (rank {', '.join(map(str, same))}'s is the same, with its own rank)" if same else ""
            print(f"rank {shown}'s error, whole{also}:")
            print("\n".join(f"  {line}" for line in run.messages[shown].splitlines()))
    elif run.errors:
        by_error = {e: [r for r, x in sorted(run.errors.items()) if x == e] for e in run.errors.values()}
        print("the job failed:\n" + "\n".join(f"  {e} (rank {', '.join(map(str, rs))})" for e, rs in by_error.items()))
    elif run.timed_out:
        print(f"the job did not end within {TIMEOUT:g} s, and the hang watch said nothing")
    else:
        print("the job ran to the end: this train() has no bug (did you fix it already?)")
    return run


def run_in_terminal(name: str) -> Run:
    """Lab ``name``'s exercise script under torchrun, as in a terminal: the stacks while it hangs, then torch's error."""
    run = terminal(name)
    _runs_started[name] = run.started
    return run


# ----------------------------------------------------------------------- the learner's reading of the run


def waiting_lines(run: Run) -> dict[int, tuple[int, str]]:
    """{rank: (line, code)}: the line of train() where each rank waits (the watch's record) or raised (its traceback).

    A terminal run's frames are in the lab script: its lines count from its ``def train(`` line, as the cell's do.
    """
    if not run.record:
        return dict(run.raised)
    before = train_offset(run.script) if run.script else 0
    found = {}
    for rank, answer in sequences.answers(run.record).items():
        mine = [f for f in answer["frames"] if f[0] == TRAIN_CELL or
                (run.script and f[2] == "train" and Path(f[0]).name == Path(run.script).name)]
        if mine:
            line = mine[-1][1] - (before if mine[-1][0] != TRAIN_CELL else 0)
            found[rank] = (line, mine[-1][3].split("  # ")[0])
    return found


def why(run: Run) -> str | None:
    """The key of :data:`WHY` that the run shows: the collective each rank is in, compared; or what the error says."""
    if not run.record:
        said = " ".join(run.messages.values()) or " ".join(run.errors.values())
        return next((key for piece, key in _ERROR_CAUSES.items() if piece in said), None)
    now = [a.get("current") or {} for a in sequences.answers(run.record).values()]
    ops = {c.get("op") for c in now}
    if len(ops) == 1 and len({c.get("seq") for c in now}) == 1 and len({c.get("tensors") for c in now}) > 1:
        return "shapes"
    return "batches" if "backward" in ops and len(ops) > 1 else "skipped"


def _matches(given: object, line: int, code: str, script_line: int | None = None) -> bool:
    """A line number of the train() cell (or of the script, for a terminal run), or a piece of that line's code."""
    if isinstance(given, int) and not isinstance(given, bool):
        return given in (line, script_line)
    return isinstance(given, str) and len(given.strip()) >= 4 and given.strip() in code


def _compare(run: Run, waits: dict[int, object], reason: str) -> list[tuple[bool, str]]:
    """(right, what to say) for each rank's line and for the reason; what is wrong is named, not its answer."""
    if not run.record and not run.raised:
        raise CheckFailed("this run neither hung nor raised in train(), so there is nothing to compare with: run the "
                          "broken cell first")
    if not isinstance(waits, dict):
        raise CheckFailed(f"give where each rank waits as {{rank: line}}, e.g. {{0: 12, 1: 'dist.all_reduce('}}; "
                          f"got {waits!r}")
    where = "waits" if run.record else "raises its error"
    before = train_offset(run.script) if run.script else None
    said = []
    for rank, (line, code) in sorted(waiting_lines(run).items()):
        given = waits.get(rank)
        if _matches(given, line, code, None if before is None else line + before):
            said.append((True, f"rank {rank} {where} at line {line} of train(): {code}"))
        elif given is None:
            said.append((False, f"rank {rank} {where} too: you gave no line for it"))
        else:
            said.append((False, f"rank {rank}: not at {given!r}"))
    truth = why(run)
    said.append((True, f"{truth!r}: {WHY[truth]}") if truth is not None and reason == truth else
                (False, f"why: not {reason!r}"))
    return said


def predict(name: str, waits: dict[int, object], reason: str) -> None:
    """Keep your prediction for lab ``name``, before its run: {rank: line of train(), or a piece of it}, and why."""
    if name not in BATCH:
        raise CheckFailed(f"no hang lab named {name!r}; pick one of {', '.join(BATCH)}")
    if reason not in WHY:
        raise CheckFailed(f"why: {reason!r} is not a key of hang_labs.WHY; pick one of {', '.join(map(repr, WHY))}")
    if not isinstance(waits, dict) or not waits:
        raise CheckFailed(f"give where each rank will wait as {{rank: line}}, e.g. {{0: 12, 1: 'dist.all_reduce('}}; "
                          f"got {waits!r}")
    kept = _predictions.get(name)
    if kept is not None and kept.made < _runs_started.get(name, 0.0):
        print(f"the prediction you made before {name}'s run stays kept; check what you read with "
              f"hang_labs.check_reading(run, waits, why)")
        return
    _predictions[name] = Prediction(dict(waits), reason, time.time())
    each = ", ".join(f"rank {r} at {w!r}" for r, w in sorted(waits.items()))
    print(f"prediction kept for {name}: {each}; why: {reason!r}")


def check_prediction(run: Run, waits: dict[int, object] | None = None, reason: str | None = None) -> None:
    """Your prediction (kept by :func:`predict` before the run, or given here) against the run's record.

    Says what was right (✓) and what was not (✗), without the answer: the diagnosis has it.
    """
    if waits is None:
        kept = _predictions.get(run.name)
        if kept is None or kept.made > run.started:
            raise CheckFailed(f"no prediction was kept for {run.name} before this run: run its prediction cell "
                              f"(hang_labs.predict), then the job again")
        waits, reason = kept.waits, kept.why
    said = _compare(run, waits, reason)
    for right, text in said:
        (_passed if right else _missed)(text)
    if not all(right for right, _ in said):
        print("for what is ✗: read the diagnosis (where each rank is, and the call it is in), then check your reading")


def check_reading(run: Run, waits: dict[int, object], reason: str) -> None:
    """Your reading of the run (the line where each rank waits or raises, and why) against its record."""
    said = _compare(run, waits, reason)
    wrong = next((text for right, text in said if not right), None)
    if wrong:
        raise CheckFailed(f"{wrong}: read the diagnosis again (where each rank is, and the call it is in; for an "
                          f"error, each rank's line and torch's message)")
    kept = _predictions.get(run.name)
    if kept is not None and kept.made <= run.started and (kept.waits, kept.why) == (waits, reason):
        _passed("your reading is your prediction, and the record agrees with every part")
        return
    for _, text in said:
        _passed(text)


# --------------------------------------------------------------------------------------------- the fix


def verdict(run: Run) -> tuple[bool, str]:
    """(trains correctly, the one line that says so or names what is wrong) for a run of a fix."""
    if run.record:
        return False, f"it still hangs: {run.record[0]['line']}"
    if run.timed_out:
        return False, f"it did not end within {TIMEOUT:g} s: a rank waits for one that never comes"
    if run.errors:
        rank, error = min(run.errors.items())
        return False, f"it still fails: rank {rank} raised {error}"
    steps = [r["steps"] for r in run.results or []]
    spreads = [r["spread"] for r in run.results or []]
    each = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
    if len(set(steps)) > 1:
        return False, (f"it ends, but the ranks ran different numbers of optimizer steps ({each}): the replicas "
                       f"stepped apart; every rank must train on the same number of batches")
    if not steps or steps[0] == 0:
        return False, "it ends, but no rank ran an optimizer step: train() must train"
    if spreads[0] is None:
        return False, "it ends, but the ranks' models do not even have the same number of weights"
    if spreads[0] > 0:
        return False, (f"it ends, but the replicas differ by {spreads[0]:.3g} after training: the ranks' gradients "
                       f"were not averaged in every step (each rank trained its own model)")
    if any(r["wrapper"] for r in run.results):
        return False, ("it trains, but evaluate() still gets the DDP wrapper, whose forward may start a collective "
                       "on the one rank that evaluates: evaluate the model inside it")
    said = f"both ranks ran {steps[0]} optimizer steps, and their replicas are equal (spread 0): it trains correctly"
    if any(r.get("find_unused") for r in run.results):
        said += ("; find_unused_parameters=True pays in every step (a walk of the autograd graph and one more "
                 "all-reduce), where freezing or removing a part that no loss uses is free")
    return True, said


def check_fix(name: str, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> None:
    """Run your train() of lab ``name`` (its cells as you ran them) on 2 ranks; ✓ when it trains correctly."""
    ok, said = verdict(launch(name, broken=False, notebook=notebook, edit=edit))
    if not ok:
        raise CheckFailed(said)
    _passed(said)
