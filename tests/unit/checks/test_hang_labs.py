"""The hang labs' judging, from hand-made runs and records: predictions, readings, and the verdict on a fix."""

from __future__ import annotations

import pytest

from workshop_lib.checks import hang_labs
from workshop_lib.checks.common import CheckFailed
from workshop_lib.checks.hang_labs import Run


def where(rank, line, code, op, seq, tensors="float32[1]", file="train-cell"):
    """A rank's answer in the watch's record: waiting at ``line`` of the train() cell, in collective ``op``."""
    current = {"op": op, "seq": seq, "tensors": tensors, "since": 0.0, "where": f"{file}:{line} in train()",
               "backwards": 6}
    return {"rank": rank, "frames": [[file, line, "train", code], ["shared-cell", 20, "spread", "x"]],
            "current": current, "history": [current] if op != "backward" else [], "backwards": 6}


SPREAD = "spread = replica_spread(model, world_size) if rank == 0 else None  # the replicas' largest difference"
SKIPPED = Run("hang1_rank0_only", started=100.0,
              record=[{"rank": 0, "block": ["..."], "line": "rank 0 waits in all_gather #2 ...",
                       "answers": {"0": where(0, 10, SPREAD, "all_gather", 2, "2 tensors"),
                                   "1": where(1, 12, "dist.all_reduce(loss)", "all_reduce", 2)}}])
UNUSED = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. ..."
RAISED = Run("hang5_unused", started=100.0, errors={0: "RuntimeError: Expected to have finished reduction"},
             raised={0: (17, "loss = f(model(x))"), 1: (17, "loss = f(model(x))")},
             messages={0: UNUSED, 1: UNUSED})


def record(*answers):
    return [{"rank": 0, "block": [], "line": "", "answers": {str(a["rank"]): a for a in answers}}]


@pytest.fixture(autouse=True)
def no_predictions(monkeypatch):
    monkeypatch.setattr(hang_labs, "_predictions", {})
    monkeypatch.setattr(hang_labs, "_runs_started", {})


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


def test_an_error_run_is_read_from_each_ranks_traceback_and_torchs_message():
    assert hang_labs.waiting_lines(RAISED) == {0: (17, "loss = f(model(x))"), 1: (17, "loss = f(model(x))")}
    assert hang_labs.why(RAISED) == "unused"  # from torch's own words
    assert hang_labs.why(Run("x", raised={0: (3, "y")}, messages={0: "ValueError: something else"})) is None
    hang_labs.check_reading(RAISED, {0: 17, 1: "loss = f(model"}, "unused")


def test_a_terminal_runs_lines_count_from_the_scripts_train(monkeypatch):
    """The watch's frames of a terminal run are the script's lines; the reading may give the cell's or the script's."""
    monkeypatch.setattr(hang_labs, "train_offset", lambda script: 35)
    run = Run("hang3_shapes", script="exercises/hang3_shapes.py",
              record=record(where(0, 58, "dist.all_reduce(epoch_loss)", "all_reduce", 3, "float32[2]",
                                  file="exercises/hang3_shapes.py"),
                            where(1, 58, "dist.all_reduce(epoch_loss)", "all_reduce", 3, "float32[1]",
                                  file="exercises/hang3_shapes.py")))
    assert hang_labs.waiting_lines(run) == {0: (23, "dist.all_reduce(epoch_loss)"), 1: (23, "dist.all_reduce(epoch_loss)")}
    hang_labs.check_reading(run, {0: 23, 1: 58}, "shapes")  # the cell's line, or the script's


def test_a_right_reading_is_confirmed_line_by_line(capsys):
    hang_labs.check_reading(SKIPPED, {0: 10, 1: "dist.all_reduce(loss)"}, "skipped")  # a number, or a piece of code
    out = capsys.readouterr().out.splitlines()
    assert out == ["✓ rank 0 waits at line 10 of train(): spread = replica_spread(model, world_size) if rank == 0 "
                   "else None", "✓ rank 1 waits at line 12 of train(): dist.all_reduce(loss)",
                   f"✓ 'skipped': {hang_labs.WHY['skipped']}"]


@pytest.mark.parametrize(("waits", "reason", "message"), [
    ({0: 10, 1: 11}, "skipped", r"^rank 1: not at 11: read the diagnosis again"),
    ({0: 10}, "skipped", r"^rank 1 waits too: you gave no line for it: read"),
    ({0: "spread", 1: 12}, "shapes", r"^why: not 'shapes': read"),
    ({0: "sp", 1: 12}, "skipped", r"^rank 0: not at 'sp'"),  # too short a piece of code to say which line
    ([10, 12], "skipped", r"^give where each rank waits as \{rank: line\}"),
])
def test_a_wrong_reading_is_named_in_one_line_without_the_answer(waits, reason, message):
    with pytest.raises(CheckFailed, match=message) as err:
        hang_labs.check_reading(SKIPPED, waits, reason)
    assert "\n" not in str(err.value) and "all_reduce(loss)" not in str(err.value)  # the answer is not given


def test_a_prediction_is_kept_before_the_run_and_compared_after_it(capsys, monkeypatch):
    monkeypatch.setattr(hang_labs.time, "time", lambda: 50.0)  # before SKIPPED started (100.0)
    hang_labs.predict("hang1_rank0_only", {0: 10}, "batches")
    assert capsys.readouterr().out == "prediction kept for hang1_rank0_only: rank 0 at 10; why: 'batches'\n"
    hang_labs.check_prediction(SKIPPED)  # a guess is not a bug: nothing raised
    out = capsys.readouterr().out.splitlines()
    assert [line[0] for line in out] == ["✓", "✗", "✗", "f"]
    assert out[1] == "✗ rank 1 waits too: you gave no line for it" and out[2] == "✗ why: not 'batches'"
    hang_labs._runs_started["hang1_rank0_only"] = 100.0
    monkeypatch.setattr(hang_labs.time, "time", lambda: 150.0)
    hang_labs.predict("hang1_rank0_only", {0: 10, 1: 12}, "skipped")  # after the run: a reading, not a prediction
    assert "stays kept" in capsys.readouterr().out
    assert hang_labs._predictions["hang1_rank0_only"].why == "batches"


def test_a_reading_that_is_the_prediction_is_said_once(capsys, monkeypatch):
    monkeypatch.setattr(hang_labs.time, "time", lambda: 50.0)
    hang_labs.predict("hang1_rank0_only", {0: 10, 1: 12}, "skipped")
    capsys.readouterr()
    hang_labs.check_reading(SKIPPED, {0: 10, 1: 12}, "skipped")
    assert capsys.readouterr().out == "✓ your reading is your prediction, and the record agrees with every part\n"


def test_no_prediction_or_no_record_is_said_in_one_line(monkeypatch):
    with pytest.raises(CheckFailed, match="no prediction was kept for hang1_rank0_only before this run"):
        hang_labs.check_prediction(SKIPPED)
    monkeypatch.setattr(hang_labs.time, "time", lambda: 500.0)  # made after the run started
    hang_labs.predict("hang1_rank0_only", {0: 10}, "skipped")
    with pytest.raises(CheckFailed, match="no prediction was kept"):
        hang_labs.check_prediction(SKIPPED)
    with pytest.raises(CheckFailed, match="neither hung nor raised"):
        hang_labs.check_prediction(Run("hang1_rank0_only", results=[]), {0: 10}, "skipped")
    with pytest.raises(CheckFailed, match=r"not a key of hang_labs\.WHY"):
        hang_labs.predict("hang1_rank0_only", {0: 10}, "slow")
    with pytest.raises(CheckFailed, match="no hang lab named 'hang9'"):
        hang_labs.predict("hang9", {0: 10}, "skipped")


def ran(steps=(6, 6), spread=0.0, wrapper=False, find_unused=False):
    return Run("lab", results=[{"steps": s, "spread": spread, "wrapper": wrapper, "find_unused": find_unused}
                               for s in steps])


@pytest.mark.parametrize(("run", "ok", "message"), [
    (ran(), True, "both ranks ran 6 optimizer steps, and their replicas are equal (spread 0): it trains correctly"),
    (ran(find_unused=True), True, "both ranks ran 6 optimizer steps, and their replicas are equal (spread 0): it "
                                  "trains correctly; find_unused_parameters=True pays in every step (a walk of the "
                                  "autograd graph and one more all-reduce), where freezing or removing a part that no "
                                  "loss uses is free"),
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


def test_an_error_run_prints_where_each_rank_raised_and_the_message_whole(capsys, monkeypatch):
    whole = "RuntimeError: first line\nsecond line for rank 0: 13 14\n hint naming find_unused_parameters"
    run = Run("hang5_unused", raised={0: (17, "loss = f(x)"), 1: (17, "loss = f(x)")},
              messages={0: whole, 1: whole.replace("rank 0", "rank 1")}, errors={0: "RuntimeError: first line"})
    monkeypatch.setattr(hang_labs, "launch", lambda name, broken, notebook: run)
    assert hang_labs.run_broken("hang5_unused") is run
    assert capsys.readouterr().out.splitlines() == [
        "the job failed; where each rank raised its error:",
        "  rank 0: train-cell:17 in train(): loss = f(x)", "  rank 1: train-cell:17 in train(): loss = f(x)",
        "rank 0's error, whole (rank 1's is the same, with its own rank):",
        "  RuntimeError: first line", "  second line for rank 0: 13 14", "   hint naming find_unused_parameters"]
