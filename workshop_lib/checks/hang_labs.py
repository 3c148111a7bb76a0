"""The hang labs of notebooks/05_when_it_hangs.ipynb: the learner's prediction and reading, judged against the run.

Before a run the learner predicts, per rank, the call it stops in and its line of ``train()`` (:func:`predict`);
:func:`check` compares with the run's record (the watch's block, or each rank's traceback), never with an answer
written here, and :func:`check_fix` passes a fix that trains correctly. The runs: :mod:`~workshop_lib.checks.hang_runs`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.checks.hang_runs import BATCH, NOTEBOOK, TIMEOUT, TRAIN_CELL, Run, launch, terminal, train_offset
from workshop_lib.engine.common import CheckFailed, verdict
from workshop_lib.figures import sequences
from workshop_lib.launching import ends

# The calls a reading may name, as the record names them (a collective, or DDP's backward or forward)
CALLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "backward", "forward")
EXAMPLE = '{0: ("all_reduce", 12), 1: ("backward", 9)}'


@dataclass
class Prediction:
    waits: dict[int, tuple[str, int]]
    made: float  # time.time() when it was kept


_predictions: dict[str, Prediction] = {}  # lab -> the learner's prediction, as kept before its first run
_runs_started: dict[str, float] = {}  # lab -> when its broken run last started


def _same_but_rank(a: str, b: str) -> bool:
    return re.sub(r"\brank ?\d+", "rank N", a) == re.sub(r"\brank ?\d+", "rank N", b)


def call_named(name: str) -> str | None:
    """The call of :data:`CALLS` that a name says (``dist.all_gather``, ``DDP.forward``), or None."""
    return next((call for call in CALLS if call in str(name).lower()), None)


def _asked(name: str, kept: bool = True) -> None:
    """A lab of :data:`BATCH`; its run shows the answer: it starts only once a prediction is ``kept``."""
    if name not in BATCH:
        raise CheckFailed(f"no hang lab named {name!r}; pick one of {', '.join(BATCH)}")
    if kept and name not in _predictions:
        raise CheckFailed(f"predict first: run the prediction cell above (check.predict_hang({name!r}, waits)); "
                          f"this run shows the answer")


def run_broken(name: str, notebook: str | Path = NOTEBOOK) -> Run:
    """Run lab ``name``'s train() as its cell gives it on 2 forked ranks; print what the watch (or each error) says."""
    _asked(name)
    run = launch(name, broken=True, notebook=notebook)
    _runs_started[name] = run.started
    if run.record:
        print("the job hangs; the ranks were stopped once the hang watch had printed:")
        print("\n".join(f"  {line}" for line in run.record[0]["block"]))
    elif run.raised:
        print("the job failed; each rank's traceback, from train() down, and its error:")
        shown = None
        for rank in sorted(run.messages):
            same = shown is not None and _same_but_rank(run.messages[rank], run.messages[shown])
            print(f"rank {rank}:" + (f" the same as rank {shown}'s, with its own rank" if same else ""))
            if not same:
                print("\n".join(f"  {line}" for line in run.messages[rank].splitlines()))
                shown = rank
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
    _asked(name)
    _runs_started[name] = time.time()
    return terminal(name)


# ----------------------------------------------------------------------- the learner's reading of the run


def stops(run: Run) -> dict[int, tuple[str, int, str]]:
    """{rank: (call, line, code)}: the call each rank waits in (the watch's record) or raised in (its traceback), and
    its line of train() (in a lab script, counted from ``def train(`` as in the cell)."""
    if not run.record:
        return {rank: (next((c for fn in reversed(below) if (c := call_named(fn))), ""), line, code)
                for rank, (line, code, below) in run.raised.items()}
    before = train_offset(run.script) if run.script else 0
    found = {}
    for rank, answer in sequences.answers(run.record).items():
        mine = [f for f in answer["frames"] if f[0] == TRAIN_CELL or
                (run.script and f[2] == "train" and Path(f[0]).name == Path(run.script).name)]
        now = answer.get("current") or {}
        if mine:
            line = mine[-1][1] - (before if mine[-1][0] != TRAIN_CELL else 0)
            call = call_named(now.get("name", "")) or call_named(answer.get("inner") or "") or ""
            found[rank] = (call, line, mine[-1][3].split("  # ")[0])
    return found


def _valid(waits: object) -> dict[int, tuple[str, int]]:
    """``waits`` as {rank: (call, line)}, or a CheckFailed that shows the form."""
    ok = isinstance(waits, dict) and waits and all(
        isinstance(r, int) and isinstance(w, tuple | list) and len(w) == 2 and isinstance(w[1], int)
        and not isinstance(w[1], bool) and isinstance(w[0], str) for r, w in waits.items())
    if not ok:
        raise CheckFailed(f"give, for each rank, the call it stops in and the line of train() it is called from, "
                          f"as {{rank: (call, line)}}, e.g. {EXAMPLE}; got {waits!r}")
    unknown = next((w[0] for w in waits.values() if not call_named(w[0])), None)
    if unknown is not None:
        raise CheckFailed(f"{unknown!r} is not a call that a rank waits in here; name one of {', '.join(CALLS)}")
    return {r: (call_named(w[0]), w[1]) for r, w in waits.items()}


def _compare(run: Run, waits: dict[int, tuple[str, int]]) -> list[tuple[str | None, str]]:
    """(the mistake or None, what was measured) for each rank: its call and its line; what is wrong is named, not its
    answer."""
    truth = stops(run)
    if not truth:
        raise CheckFailed("this run neither hung nor raised in train(), so there is nothing to compare with: run the "
                          "broken cell first")
    verb = "waits" if run.record else "raises its error"
    before = train_offset(run.script) if run.script else None
    said = []
    for rank, (call, line, code) in sorted(truth.items()):
        given_call, given_line = waits.get(rank, (None, None))
        call_ok, line_ok = given_call == call, given_line in (line, None if before is None else line + before)
        wrong = None if call_ok and line_ok else (
            f"rank {rank}: in {given_call}, {'yes' if call_ok else 'no'}; at line {given_line}, "
            f"{'yes' if line_ok else 'no'}" if rank in waits else f"rank {rank} stops too: you gave nothing for it")
        said.append((wrong, f"rank {rank} {verb} in {call}, called at line {line} of train(): {code}"))
    return said


def predict(name: str, waits: dict[int, tuple[str, int]]) -> None:
    """Keep your prediction for lab ``name``, before its run: {rank: (the call it stops in, its line of train())}."""
    _asked(name, kept=False)
    waits = _valid(waits)
    kept = _predictions.get(name)
    if kept is not None and kept.made < _runs_started.get(name, 0.0):
        print(f"the prediction you made before {name}'s run stays kept; check your reading with "
              f"check.hang(run, waits)")
        return
    _predictions[name] = Prediction(waits, time.time())
    each = ", ".join(f"rank {r} in {c} at line {n}" for r, (c, n) in sorted(waits.items()))
    print(f"prediction kept for {name}: {each}")


def check(run: Run, waits: dict[int, tuple[str, int]]) -> None:
    """Your prediction (kept before the run: ✓ or ✗ per part, without the answer) and your reading ``waits`` (now,
    which must be right) against the run's record."""
    kept = _predictions.get(run.name)
    if kept is None or kept.made > run.started:
        raise CheckFailed(f"no prediction was kept for {run.name} before this run: run its prediction cell, then the "
                          f"job again")
    reading = _valid(waits)
    print("your prediction, kept before the run:")
    for wrong, measured in _compare(run, kept.waits):
        verdict(wrong, measured, prediction=True)
    wrong = next((w for w, _ in _compare(run, reading) if w), None)
    verdict(wrong and f"your reading: {wrong}: read the run's output again (each rank's innermost call, and the line "
                      f"of train() it came from), change waits, and run the prediction cell and this one",
            "your reading agrees with the record, rank by rank" if reading != kept.waits else
            "your reading is your prediction, and the record agrees with every part")
    print(f"why, and what the fix costs: the worked notebook, notebooks/{NOTEBOOK}, below this lab")


# --------------------------------------------------------------------------------------------- the fix


def fix_mistake(run: Run) -> str | None:
    """What keeps a run of a fix from training correctly, in one line; None if it trains correctly."""
    if run.record:
        return f"it still hangs: {run.record[0]['line']}"
    if run.timed_out:
        return f"it did not end within {TIMEOUT:g} s: a rank waits for one that never comes"
    if run.errors:
        rank, error = min(run.errors.items())
        end = next(e for e in run.ends if e["rank"] == rank and e["how"] in ("raised", "exit", "killed"))
        return f"it still fails: rank {rank} raised {error}" if end["how"] == "raised" else \
            f"it still fails: {ends.summary(end)}"  # exited or died: its code, signal and last lines
    steps = [r["steps"] for r in run.results or []]
    spreads = [r["spread"] for r in run.results or []]
    each = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
    if len(set(steps)) > 1:
        return (f"it ends, but the ranks ran different numbers of optimizer steps ({each}): the replicas stepped "
                f"apart; every rank must train on the same number of batches")
    if not steps or steps[0] == 0:
        return "it ends, but no rank ran an optimizer step: train() must train"
    if spreads[0] is None:
        return "it ends, but the ranks' models do not even have the same number of weights"
    if spreads[0] > 0:
        return (f"it ends, but the replicas differ by {spreads[0]:.3g} after training: the ranks' gradients were not "
                f"averaged in every step (each rank trained its own model)")
    if any(r["wrapper"] for r in run.results):
        return ("it trains, but evaluate() still gets the DDP wrapper, whose forward may start a collective on the one "
                "rank that evaluates: evaluate the model inside it")
    return None


def trained(run: Run) -> str:
    """The ✓ of a fix that trains correctly: what its run measured."""
    said = (f"both ranks ran {run.results[0]['steps']} optimizer steps, and their replicas are equal (spread 0): it "
            f"trains correctly")
    if any(r.get("find_unused") for r in run.results):
        said += ("; find_unused_parameters=True pays in every step (a walk of the autograd graph and one more "
                 "all-reduce), where freezing a part before DDP wraps the model, or removing it, is free")
    return said


def check_fix(name: str, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> None:
    """Run your train() of lab ``name`` (its cells as you ran them) on 2 ranks; ✓ when it trains correctly."""
    run = launch(name, broken=False, notebook=notebook, edit=edit)
    wrong = fix_mistake(run)
    verdict(wrong, "" if wrong else trained(run))
