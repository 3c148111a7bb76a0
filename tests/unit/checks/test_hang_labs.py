"""The hang lab's checks, from hand-made runs and records: the reading of a diagnosis, and the verdict on a fix."""

from __future__ import annotations

import linecache

import pytest

from workshop_lib.checks import hang_labs
from workshop_lib.checks.common import CheckFailed
from workshop_lib.checks.hang_labs import Run
from workshop_lib.errors import WorkshopError
from workshop_lib.lab import build


def where(rank, line, code, op, seq, tensors="float32[1]"):
    """A rank's answer in the watch's record: waiting at ``line`` of the train() cell, in collective ``op``."""
    current = {"op": op, "seq": seq, "tensors": tensors, "since": 0.0, "where": f"train-cell:{line} in train()",
               "backwards": 6}
    return {"rank": rank, "frames": [["train-cell", line, "train", code], ["shared-cell", 20, "spread", "x"]],
            "current": current, "history": [current] if op != "backward" else [], "backwards": 6}


SPREAD = "spread = replica_spread(model, world_size) if rank == 0 else None  # only rank 0 prints it"
SKIPPED = Run("hang1_rank0_only", record=[{"rank": 0, "block": ["..."], "line": "rank 0 waits in all_gather #2 ...",
                                           "answers": {"0": where(0, 10, SPREAD, "all_gather", 2, "2 tensors"),
                                                       "1": where(1, 12, "dist.all_reduce(loss)", "all_reduce", 2)}}])


def record(*answers):
    return [{"rank": 0, "block": [], "line": "", "answers": {str(a["rank"]): a for a in answers}}]


def test_the_waiting_lines_and_the_reason_come_from_the_record():
    assert hang_labs.waiting_lines(SKIPPED) == {0: (10, "spread = replica_spread(model, world_size) if rank == 0 else None"),
                                                1: (12, "dist.all_reduce(loss)")}  # the comment cut
    assert hang_labs.why(SKIPPED) == "skipped"
    shapes = Run("hang3_shapes", record=record(where(0, 12, "x", "all_reduce", 3, "float32[2]"),
                                               where(1, 12, "x", "all_reduce", 3, "float32[1]")))
    assert hang_labs.why(shapes) == "shapes"
    batches = Run("hang2_uneven", record=record(where(0, 9, "x", "backward", 0, "DDP's gradient buckets"),
                                                where(1, 10, "x", "all_gather", 2, "2 tensors")))
    assert hang_labs.why(batches) == "batches"
    assert all(hang_labs.deadlocked(r.record) for r in (SKIPPED, shapes, batches))
    slow = record(where(0, 12, "x", "all_reduce", 3), {**where(1, 9, "x", "all_reduce", 3), "current": None})
    assert not hang_labs.deadlocked(slow)  # rank 1 is not in a collective: it was only late


def test_a_right_reading_is_confirmed_line_by_line(capsys):
    hang_labs.check_reading(SKIPPED, {0: 10, 1: "dist.all_reduce(loss)"}, "skipped")  # a number, or a piece of code
    out = capsys.readouterr().out.splitlines()
    assert out == ["✓ rank 0 waits at line 10 of train(): spread = replica_spread(model, world_size) if rank == 0 "
                   "else None", "✓ rank 1 waits at line 12 of train(): dist.all_reduce(loss)",
                   f"✓ 'skipped': {hang_labs.WHY['skipped']}"]


@pytest.mark.parametrize(("waits", "reason", "message"), [
    ({0: 10, 1: 11}, "skipped", r"^rank 1 waits at line 12 of train\(\) \(dist\.all_reduce\(loss\)\), not at 11: read"),
    ({0: 10}, "skipped", r"^rank 1 waits too, at line 12 of train\(\): dist\.all_reduce\(loss\) \(a rank that skips"),
    ({0: "spread", 1: 12}, "shapes", r"^why: the record shows 'skipped' \(one rank calls a collective that the other"),
    ({0: "sp", 1: 12}, "skipped", r"^rank 0 waits at line 10"),  # too short a piece of code to say which line
])
def test_a_wrong_reading_is_named_in_one_line(waits, reason, message):
    with pytest.raises(CheckFailed, match=message) as err:
        hang_labs.check_reading(SKIPPED, waits, reason)
    assert "\n" not in str(err.value)


def test_a_prediction_says_what_was_right_and_what_was_not(capsys):
    hang_labs.check_prediction(SKIPPED, {0: 10}, "batches")  # a guess is not a bug: nothing raised
    out = capsys.readouterr().out.splitlines()
    assert [line[0] for line in out] == ["✓", "✗", "✗"]
    assert out[1].startswith("✗ rank 1 waits too, at line 12")
    with pytest.raises(CheckFailed, match="did not hang"):
        hang_labs.check_prediction(Run("hang1_rank0_only", results=[]), {0: 10}, "skipped")


def ran(steps=(6, 6), spread=0.0, wrapper=False):
    return Run("lab", results=[{"steps": s, "spread": spread, "wrapper": wrapper} for s in steps])


@pytest.mark.parametrize(("run", "ok", "message"), [
    (ran(), True, "both ranks ran 6 optimizer steps, and their replicas are equal (spread 0): it trains correctly"),
    (SKIPPED, False, "it still hangs: rank 0 waits in all_gather #2 ..."),
    (Run("lab", timed_out=True), False, "it did not end within 60 s: a rank waits for one that never comes"),
    (Run("lab", errors={1: "RuntimeError: Expected to have finished reduction"}), False,
     "it still fails: rank 1 raised RuntimeError: Expected to have finished reduction"),
    (ran(steps=(6, 5)), False, "it ends, but the ranks ran different numbers of optimizer steps (rank 0: 6, rank 1: 5): "
                               "the replicas stepped apart; every rank must train on the same number of batches"),
    (ran(steps=(0, 0)), False, "it ends, but no rank ran an optimizer step: train() must train"),
    (ran(spread=0.0123), False, "it ends, but the replicas differ by 0.0123 after training: the ranks' gradients were "
                                "not averaged in every step (each rank trained its own model)"),
    (ran(spread=None), False, "it ends, but the ranks' models do not even have the same number of weights"),
    (ran(wrapper=True), False, "it trains, but evaluate() still gets the DDP wrapper, whose forward may start a "
                               "collective on the one rank that evaluates: evaluate the model inside it"),
])
def test_the_verdict_on_a_fix_names_what_is_wrong_in_one_line(run, ok, message):
    assert hang_labs.verdict(run) == (ok, message)


def test_each_ranks_error_is_read_from_the_launchs_failure_lines():
    message = ("notebook_launch of _rank failed:\n"
               "rank 0 raised RuntimeError: Expected to have finished reduction in the prior iteration before starting "
               "a new one. This error indicates ... (File \"x.py\", line 3, in f)\n"
               "rank 1 failed with exit code -15\nevery rank's output: /tmp/x/all.log")
    assert hang_labs._errors(message) == {
        0: "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one",
        1: "exit code -15"}


def test_a_labs_cells_run_as_the_bug_or_as_the_fix(monkeypatch):
    """From the solution notebook: the exercise form puts the bug back, the solution form runs the fix."""
    monkeypatch.setattr(build, "_ran", {})
    broken = hang_labs.load("hang1_rank0_only", broken=True)
    assert callable(broken["train"]) and callable(broken["replica_spread"])
    text = "".join(linecache.getlines(hang_labs.TRAIN_CELL))
    assert "if rank == 0 else None" in text and "BROKEN" not in text  # what the watch will quote
    hang_labs.load("hang1_rank0_only", broken=False, edit=lambda s: s.replace("epoch + 1", "epoch + 2"))
    text = "".join(linecache.getlines(hang_labs.TRAIN_CELL))
    assert "if rank == 0 else None" not in text and "epoch + 2" in text
    with pytest.raises(WorkshopError, match="no hang lab named 'hang9'"):
        hang_labs.load("hang9", broken=True)


def test_the_cells_are_taken_as_last_run(monkeypatch):
    import nbformat

    nb = nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "script:hang3_shapes" in c.metadata.get("tags", []) and "def train(" in c.source)
    monkeypatch.setattr(build, "_ran", {cell.id: "def train(cfg, rank, world_size, device):\n    return 'mine'"})
    assert hang_labs.load("hang3_shapes", broken=True)["train"](None, 0, 2, None) == "mine"
    monkeypatch.setattr(build, "_ran", {cell.id: "def trian(cfg, rank, world_size, device):\n    pass"})
    with pytest.raises(WorkshopError, match="define no train"):
        hang_labs.load("hang3_shapes", broken=True)
