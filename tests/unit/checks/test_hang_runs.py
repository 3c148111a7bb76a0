"""The hang labs' runs, without starting processes: the lab's cells, the ranks' end records, torch's error."""

from __future__ import annotations

import linecache

import pytest

from tools import build
from workshop_lib.authoring import scripts
from workshop_lib.checks import hang_runs
from workshop_lib.errors import WorkshopError
from workshop_lib.paths import lab_root

CODE = "loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)"
DETAIL = ("Expected to have finished reduction in the prior iteration before starting a new one. You can enable "
          "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to ...\n"
          "Parameter indices which did not receive grad for rank 0: 13 14\n"
          " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL")
RAISED = {"rank": 0, "how": "raised", "type": "RuntimeError", "message": DETAIL.splitlines()[0], "detail": DETAIL,
          "file": "train-cell", "line": 17, "function": "train", "time": 2.0, "frames": [
              ["/x/workshop_lib/launching/forklaunch.py", 80, "_rank_main", "result = fn(env, *args)"],
              ["train-cell", 17, "train", CODE + "  # the loss"],
              ["/repo/workshop_lib/debug/collectives.py", 78, "collective", "return fn(*args, **kwargs)"],
              ["/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1775, "_pre_forward",
               "if torch.is_grad_enabled() and self.reducer._rebuild_buckets():"]]}
KILLED = {"rank": 1, "how": "killed", "code": -15, "signal": "SIGTERM", "time": 3.0, "detail": ""}


def test_each_ranks_error_where_it_raised_and_its_whole_error_are_read_from_its_end_record():
    run = hang_runs.Run("hanglab5", ends=[RAISED, KILLED], started=1.0)
    assert run.errors == {
        0: "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one",
        1: "exit code -15"}
    assert run.raised == {0: (17, CODE, ("_pre_forward",))}  # the functions below train(), the watch's wrapper left out
    assert run.messages[0].splitlines()[:4] == [  # from train() down, torch's paths from torch/
        '  File "train-cell", line 17, in train',
        f"    {CODE}  # the loss",
        '  File "torch/nn/parallel/distributed.py", line 1775, in _pre_forward',
        "    if torch.is_grad_enabled() and self.reducer._rebuild_buckets():"]
    assert run.messages[0].splitlines()[4].startswith("RuntimeError: Expected to have finished reduction")
    assert run.messages[0].endswith("either INFO or DETAIL")  # whole: torch's hint and the indices kept
    assert "find_unused_parameters=True" in run.messages[0] and "for rank 0: 13 14" in run.messages[0]
    assert not run.timed_out and hang_runs.Run("x", ends=[{"rank": 0, "how": "timed out", "time": 1.0}]).timed_out


def test_torchs_own_error_is_each_ranks_last_line_of_the_script_and_its_error():
    root = str(lab_root())
    lines = [f'[rank1]:   File "{root}/exercises/hanglab3.py", line 78, in main\n',
             "[rank1]:     train(cfg)\n",
             f'[rank1]:   File "{root}/exercises/hanglab3.py", line 58, in train\n',
             "[rank1]:     dist.all_reduce(epoch_loss)  # summed over the ranks\n",
             '[rank1]:   File "/venv/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n',
             "[rank1]:     work.wait()\n",
             "[rank1]: RuntimeError: [/__w/gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation\n",
             "hangwatch: rank 0 has waited 1 s\n", "W1204 torchrun: closing\n"]
    assert hang_runs._torch_said(lines, "exercises/hanglab3.py") == {1: [
        '   File "exercises/hanglab3.py", line 58, in train',
        "     dist.all_reduce(epoch_loss)  # summed over the ranks",
        " RuntimeError: [/__w/gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"]}


def test_the_terminal_command_is_the_one_a_learner_types():
    assert hang_runs.terminal_command("hanglab3", 30) == (
        "torchrun --standalone --nproc_per_node=2 exercises/hanglab3.py --limit 447 --epochs 1 --batch-size 32 "
        "--timeout 30")
    assert hang_runs.terminal_command("hanglab2", 3, watch=True) == (
        "torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch exercises/hanglab2.py --limit 447 --epochs 1 "
        "--batch-size 16 --timeout 3")
    text = (build.EXERCISES / "hanglab3.py").read_text().splitlines()
    before = hang_runs.train_offset("exercises/hanglab3.py")
    assert text[before].startswith("def train(")  # the script's line before + n is the cell's line n


def test_a_labs_cells_run_as_the_bug_or_as_the_fix(monkeypatch):
    """From the solution notebook: the exercise form puts the bug back, the solution form runs the fix."""
    monkeypatch.setattr(scripts, "_ran", {})
    broken = hang_runs.load("hanglab1", broken=True)
    assert callable(broken["train"]) and callable(broken["replica_spread"])
    text = "".join(linecache.getlines(hang_runs.TRAIN_CELL))
    bug = "loss {global_mean(total / steps, device):.4f}"
    assert bug in text and "BROKEN" not in text  # what torch's traceback will quote
    hang_runs.load("hanglab1", broken=False, edit=lambda s: s.replace("epoch + 1", "epoch + 2"))
    text = "".join(linecache.getlines(hang_runs.TRAIN_CELL))
    assert bug not in text and "epoch + 2" in text
    with pytest.raises(WorkshopError, match="no hang lab named 'hang9'"):
        hang_runs.load("hang9", broken=True)


def test_the_cells_are_taken_as_last_run(monkeypatch):
    import nbformat

    nb = nbformat.read(build.NOTEBOOKS / hang_runs.NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "script:hanglab3" in c.metadata.get("tags", []) and "def train(" in c.source)
    monkeypatch.setattr(scripts, "_ran", {cell.id: "def train(cfg, rank, world_size, device):\n    return 'mine'"})
    assert hang_runs.load("hanglab3", broken=True)["train"](None, 0, 2, None) == "mine"
    monkeypatch.setattr(scripts, "_ran", {cell.id: "def trian(cfg, rank, world_size, device):\n    pass"})
    with pytest.raises(WorkshopError, match="define no train"):
        hang_runs.load("hanglab3", broken=True)


def test_a_fixs_measures_are_read_from_each_ranks_record():
    """Steps, the DDP options and the model evaluate() got come from the recorder's events; the spread from the
    weights after the last step."""
    import numpy as np

    def rank(steps, model, find_unused, weights):
        events = [{"kind": "ddp", "find_unused": find_unused}, *({"kind": "step", "n": n} for n in range(steps)),
                  {"kind": "evaluate", "model": model}]
        return {"events": events, "weights": weights}

    same = np.array([1.0, 2.0], np.float32)
    assert hang_runs._measured([rank(6, "SmilesLSTM", False, same), rank(6, "SmilesLSTM", False, same.copy())]) == [
        {"steps": 6, "spread": 0.0, "wrapper": False, "find_unused": False}] * 2
    apart = hang_runs._measured([rank(6, "DistributedDataParallel", True, same), rank(5, "SmilesLSTM", True, same + 0.5)])
    assert [(m["steps"], m["spread"], m["wrapper"], m["find_unused"]) for m in apart] == [
        (6, 0.5, True, True), (5, 0.5, False, True)]
    assert {m["spread"] for m in hang_runs._measured([rank(0, "x", False, None), rank(1, "x", False, same)])} == {None}
    assert {m["spread"] for m in hang_runs._measured([rank(1, "x", False, same), rank(1, "x", False, same[:1])])} == {None}
