"""The hang labs' judging, from hand-made runs and records: predictions, readings, and the verdict on a fix."""

from __future__ import annotations

import pytest

from workshop_lib.checks import hang_labs, hang_runs
from workshop_lib.checks.hang_labs import Run
from workshop_lib.debug import collectives
from workshop_lib.engine.common import CheckFailed


def where(rank, line, code, op, seq, tensors="float32[1]", file="train-cell", inner=None):
    """A rank's answer in the watch's record: waiting at ``line`` of the train() cell, in collective ``op``."""
    current = {"kind": collectives.kind_of(op), "name": op, "seq": seq, "n": 6, "tensors": tensors, "t": 0.0,
               "where": f"{file}:{line} in train()"}
    return {"rank": rank, "frames": [[file, line, "train", code], ["shared-cell", 20, "spread", "x"]],
            "current": current, "history": [current], "inner": inner}


SPREAD = "spread = replica_spread(model, world_size)  # the replicas' largest difference"
SKIPPED = Run("hanglab1", started=100.0,
              record=[{"rank": 0, "block": ["..."], "line": "rank 0 waits in all_gather #2 ...",
                       "answers": {"0": where(0, 10, SPREAD, "all_gather", 2, "2 tensors"),
                                   "1": where(1, 12, "dist.all_reduce(loss)", "all_reduce", 2)}}])
UNUSED = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. ..."
BELOW = ("_wrapped_call_impl", "_call_impl", "forward", "_pre_forward")  # DDP's forward raised, under the module call


def raised(rank, line, code, below=BELOW, detail="Expected to have finished reduction"):
    """A rank's end record (launching/ends) that raised at ``line`` of the train() cell, in the functions ``below``."""
    return {"rank": rank, "how": "raised", "type": "RuntimeError", "message": detail.splitlines()[0], "detail": detail,
            "time": 1.0, "frames": [["/x/workshop_lib/launching/forklaunch.py", 80, "_rank_main", "fn(env, *args)"],
                                    ["train-cell", line, "train", code],
                                    *(["/venv/torch/nn/modules/module.py", 1, fn, "x"] for fn in below)]}


RAISED = Run("hanglab5", started=100.0, ends=[raised(0, 17, "loss = f(model(x))"), raised(1, 17, "loss = f(model(x))")])
RIGHT = {0: ("all_gather", 10), 1: ("dist.all_reduce", 12)}


def record(*answers):
    return [{"rank": 0, "block": [], "line": "", "answers": {str(a["rank"]): a for a in answers}}]


@pytest.fixture(autouse=True)
def no_predictions(monkeypatch):
    monkeypatch.setattr(hang_labs, "_predictions", {})
    monkeypatch.setattr(hang_labs, "_runs_started", {})


def kept(run, waits, monkeypatch, capsys):
    """``waits`` kept as the prediction for ``run``'s lab, before the run started."""
    monkeypatch.setattr(hang_labs.time, "time", lambda: run.started - 50)
    hang_labs.predict(run.name, waits)
    capsys.readouterr()


def test_where_each_rank_stops_comes_from_the_record():
    assert hang_labs.stops(SKIPPED) == {0: ("all_gather", 10, "spread = replica_spread(model, world_size)"),
                                        1: ("all_reduce", 12, "dist.all_reduce(loss)")}  # the comment cut
    buffers = Run("hanglab4", record=record(where(0, 26, "x", "DDP.forward", 8, "broadcasts 3 buffers"),
                                            where(1, 29, "y", "all_gather", 8, "2 tensors")))
    backward = Run("hanglab2", record=record(where(0, 9, "x", "backward", None, "DDP's gradient buckets"),
                                             where(1, 10, "y", "all_gather", 2, "2 tensors")))
    assert [c for c, _, _ in hang_labs.stops(buffers).values()] == ["forward", "all_gather"]
    assert [c for c, _, _ in hang_labs.stops(backward).values()] == ["backward", "all_gather"]
    assert all(hang_runs.deadlocked(r.record) for r in (SKIPPED, buffers, backward))
    slow = record(where(0, 12, "x", "all_reduce", 3), {**where(1, 9, "x", "all_reduce", 3), "current": None})
    assert not hang_runs.deadlocked(slow)  # rank 1 is not in a collective: it was only late


def test_an_error_run_is_read_from_each_ranks_traceback():
    """The call is the innermost function below train() that names one: DDP's forward, not the module's call."""
    assert hang_labs.stops(RAISED) == {0: ("forward", 17, "loss = f(model(x))"), 1: ("forward", 17, "loss = f(model(x))")}
    timeout = Run("hanglab1", ends=[raised(0, 24, "print(...)", ("global_mean", "wrapper", "all_reduce"))])
    assert hang_labs.stops(timeout) == {0: ("all_reduce", 24, "print(...)")}


def test_a_terminal_runs_lines_count_from_the_scripts_train(monkeypatch, capsys):
    """The watch's frames of a terminal run are the script's lines; the reading may give the cell's or the script's."""
    monkeypatch.setattr(hang_labs, "train_offset", lambda script: 41)
    run = Run("hanglab3", script="exercises/hanglab3.py", started=100.0,
              record=record(where(0, 64, "dist.all_reduce(epoch_loss)", "all_reduce", 3, "float32[2]",
                                  file="exercises/hanglab3.py"),
                            where(1, 64, "dist.all_reduce(epoch_loss)", "all_reduce", 3, "float32[1]",
                                  file="exercises/hanglab3.py")))
    assert hang_labs.stops(run) == {0: ("all_reduce", 23, "dist.all_reduce(epoch_loss)"),
                                    1: ("all_reduce", 23, "dist.all_reduce(epoch_loss)")}
    kept(run, {0: ("all_reduce", 23), 1: ("all_reduce", 64)}, monkeypatch, capsys)  # the cell's line, or the script's
    hang_labs.check(run, {0: ("all_reduce", 23), 1: ("all_reduce", 64)})
    assert "✓ your reading is your prediction, and the record agrees with every part" in capsys.readouterr().out


def test_a_right_prediction_is_confirmed_rank_by_rank_then_the_explanation_is_named(monkeypatch, capsys):
    kept(SKIPPED, RIGHT, monkeypatch, capsys)
    hang_labs.check(SKIPPED, RIGHT)
    assert capsys.readouterr().out.splitlines() == [
        "your prediction, kept before the run:",
        "✓ rank 0 waits in all_gather, called at line 10 of train(): spread = replica_spread(model, world_size)",
        "✓ rank 1 waits in all_reduce, called at line 12 of train(): dist.all_reduce(loss)",
        "✓ your reading is your prediction, and the record agrees with every part",
        f"why, and what the fix costs: the worked notebook, notebooks/{hang_labs.NOTEBOOK}, below this lab"]


@pytest.mark.parametrize(("reading", "message"), [
    ({0: ("all_gather", 11), 1: ("all_reduce", 12)}, r"^your reading: rank 0: in all_gather, yes; at line 11, no: "),
    ({0: ("all_gather", 10), 1: ("all_gather", 12)}, r"^your reading: rank 1: in all_gather, no; at line 12, yes: "),
    ({0: ("all_gather", 10)}, r"^your reading: rank 1 stops too: you gave nothing for it: "),
    ({0: ("all_gather", 10), 1: ("wait", 12)}, r"^'wait' is not a call that a rank waits in here; name one of "),
    ({0: ("all_gather", "spread ="), 1: ("all_reduce", 12)}, r"^give, for each rank, the call .* as \{rank: \(call, "
                                                             r"line\)\}"),  # a line number, not a piece of code
    ({0: 10, 1: 12}, r"^give, for each rank, the call it stops in and the line"),
])
def test_a_wrong_reading_is_named_in_one_line_without_the_answer(reading, message, monkeypatch, capsys):
    kept(SKIPPED, RIGHT, monkeypatch, capsys)
    with pytest.raises(CheckFailed, match=message) as err:
        hang_labs.check(SKIPPED, reading)
    said = str(err.value)
    assert "\n" not in said and "all_reduce(loss)" not in said and "line 10" not in said.replace("line 10,", "")


def test_a_wrong_prediction_is_said_part_by_part_without_the_answer(monkeypatch, capsys):
    kept(SKIPPED, {0: ("all_reduce", 10), 1: ("all_reduce", 13)}, monkeypatch, capsys)
    hang_labs.check(SKIPPED, RIGHT)  # a guess is not a bug: the right reading passes
    assert capsys.readouterr().out.splitlines()[1:4] == [
        "✗ rank 0: in all_reduce, no; at line 10, yes", "✗ rank 1: in all_reduce, yes; at line 13, no",
        "✓ your reading agrees with the record, rank by rank"]


def test_a_lab_runs_only_once_a_prediction_is_kept(monkeypatch, capsys):
    """The run shows the answer: without a prediction it asks for one in one line, and starts nothing."""
    monkeypatch.setattr(hang_labs, "launch", lambda *a, **k: pytest.fail("the run started without a prediction"))
    monkeypatch.setattr(hang_labs, "terminal", lambda *a, **k: pytest.fail("the run started without a prediction"))
    for run in (hang_labs.run_broken, hang_labs.run_in_terminal):
        with pytest.raises(CheckFailed, match=r"^predict first: run the prediction cell above \(check\.predict_hang\("
                                              r"'hanglab1', waits\)\); this run shows the answer$"):
            run("hanglab1")


def test_a_prediction_is_kept_before_the_run_and_not_replaced_after_it(capsys, monkeypatch):
    monkeypatch.setattr(hang_labs.time, "time", lambda: 50.0)  # before SKIPPED started (100.0)
    hang_labs.predict("hanglab1", {0: ("dist.all_reduce()", 10)})
    assert capsys.readouterr().out == "prediction kept for hanglab1: rank 0 in all_reduce at line 10\n"
    hang_labs.predict("hanglab1", {0: ("all_gather", 10)})  # changed before the run: replaced
    hang_labs._runs_started["hanglab1"] = 100.0
    monkeypatch.setattr(hang_labs.time, "time", lambda: 150.0)
    hang_labs.predict("hanglab1", {0: ("all_reduce", 12)})  # after the run: a reading, not a prediction
    assert "stays kept" in capsys.readouterr().out
    assert hang_labs._predictions["hanglab1"].waits == {0: ("all_gather", 10)}


def test_no_prediction_or_no_record_is_said_in_one_line(monkeypatch, capsys):
    with pytest.raises(CheckFailed, match="no prediction was kept for hanglab1 before this run"):
        hang_labs.check(SKIPPED, RIGHT)
    monkeypatch.setattr(hang_labs.time, "time", lambda: 500.0)  # made after the run started
    hang_labs.predict("hanglab1", RIGHT)
    with pytest.raises(CheckFailed, match="no prediction was kept"):
        hang_labs.check(SKIPPED, RIGHT)
    with pytest.raises(CheckFailed, match="neither hung nor raised"):
        hang_labs.check(Run("hanglab1", results=[], started=600.0), RIGHT)
    with pytest.raises(CheckFailed, match="no hang lab named 'hang9'"):
        hang_labs.predict("hang9", RIGHT)


def ran(steps=(6, 6), spread=0.0, wrapper=False, find_unused=False):
    return Run("lab", results=[{"steps": s, "spread": spread, "wrapper": wrapper, "find_unused": find_unused}
                               for s in steps])


@pytest.mark.parametrize(("run", "ok", "message"), [
    (ran(), True, "both ranks ran 6 optimizer steps, and their replicas are equal (spread 0): it trains correctly"),
    (ran(find_unused=True), True, "both ranks ran 6 optimizer steps, and their replicas are equal (spread 0): it "
                                  "trains correctly; find_unused_parameters=True pays in every step (a walk of the "
                                  "autograd graph and one more all-reduce), where freezing a part before DDP wraps the "
                                  "model, or removing it, is free"),
    (SKIPPED, False, "it still hangs: rank 0 waits in all_gather #2 ..."),
    (Run("lab", ends=[{"rank": 0, "how": "timed out", "time": 1.0}]), False,
     "it did not end within 60 s: a rank waits for one that never comes"),
    (Run("lab", ends=[raised(1, 17, "x")]), False,
     "it still fails: rank 1 raised RuntimeError: Expected to have finished reduction"),
    (Run("lab", ends=[{"rank": 1, "how": "killed", "code": -9, "signal": "SIGKILL", "time": 1.0, "detail": ""}]), False,
     "it still fails: rank 1 died of SIGKILL (exit code -9) without a Python error; it printed nothing"),
    (ran(steps=(6, 5)), False, "it ends, but the ranks ran different numbers of optimizer steps (rank 0: 6, rank 1: 5): "
                               "the replicas stepped apart; every rank must train on the same number of batches"),
    (ran(steps=(0, 0)), False, "it ends, but no rank ran an optimizer step: train() must train"),
    (ran(spread=0.0123), False, "it ends, but the replicas differ by 0.0123 after training: the ranks' gradients were "
                                "not averaged in every step (each rank trained its own model)"),
    (ran(spread=None), False, "it ends, but the ranks' models do not even have the same number of weights"),
    (ran(wrapper=True), False, "it trains, but evaluate() still gets the DDP wrapper, whose forward may start a "
                               "collective on the one rank that evaluates: evaluate the model inside it"),
])
def test_the_verdict_on_a_fix_names_what_is_wrong_in_one_line(run, ok, message, monkeypatch, capsys):
    assert hang_labs.fix_mistake(run) == (None if ok else message)
    monkeypatch.setattr(hang_labs, "launch", lambda *a, **k: run)
    if ok:
        hang_labs.check_fix(run.name)
        assert capsys.readouterr().out == f"\N{CHECK MARK} {message}\n"
    else:
        with pytest.raises(CheckFailed) as err:
            hang_labs.check_fix(run.name)
        assert str(err.value) == message


def test_an_error_run_prints_each_ranks_traceback_and_error_whole(capsys, monkeypatch):
    whole = "first line\nsecond line for rank 0: 13 14\n hint naming find_unused_parameters"
    run = Run("hanglab5", ends=[raised(0, 17, "loss = f(x)", (), whole),
                                raised(1, 17, "loss = f(x)", (), whole.replace("rank 0", "rank 1"))])
    monkeypatch.setattr(hang_labs, "launch", lambda name, broken, notebook: run)
    hang_labs._predictions["hanglab5"] = hang_labs.Prediction({0: ("forward", 17)}, 0.0)
    assert hang_labs.run_broken("hanglab5") is run
    assert capsys.readouterr().out.splitlines() == [
        "the job failed; each rank's traceback, from train() down, and its error:", "rank 0:",
        '    File "train-cell", line 17, in train', "      loss = f(x)", "  RuntimeError: first line",
        "  second line for rank 0: 13 14", "   hint naming find_unused_parameters",
        "rank 1: the same as rank 0's, with its own rank"]
