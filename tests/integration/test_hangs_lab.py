"""The hang lab of notebook 05, run for real: each broken lab stops where the watch's record says, a reading of
that record is checked, a learner's wrong fix is named in one line, and the terminal version hangs as documented."""

from __future__ import annotations

import difflib
import re

import pytest

from workshop_lib.checks import hang_labs
from workshop_lib.checks.common import CheckFailed
from workshop_lib.debug import hangreport
from workshop_lib.lab import build, sequences
from workshop_lib.lab.launch import LaunchError, torchrun

# Where each rank of each broken lab waits (a piece of its line's code) and why: what a learner reads.
HANGS = {
    "hang1_rank0_only": ({0: "if rank == 0 else None", 1: "dist.all_reduce(epoch_loss)"}, "skipped"),
    "hang2_uneven": ({0: "loss.backward()", 1: "spread = replica_spread("}, "batches"),
    "hang3_shapes": ({0: "dist.all_reduce(epoch_loss)", 1: "dist.all_reduce(epoch_loss)"}, "shapes"),
    "hang4_batchnorm_eval": ({0: "dev_auc = evaluate(model,", 1: "spread = replica_spread("}, "skipped"),
}


@pytest.mark.parametrize("name", list(hang_labs.BATCH))
def test_each_labs_exercise_script_is_its_solution_with_the_bug_put_back(name):
    """The learner gets the broken code and no hint; the solution has the fix in its place."""
    solution = (build.SOLUTIONS / f"{name}.py").read_text().splitlines()[2:]
    exercise = (build.EXERCISES / f"{name}.py").read_text().splitlines()[3:]  # its header has one line more
    changed = [line for line in difflib.ndiff(solution, exercise) if line[:2] in ("- ", "+ ")]
    assert [line[:2] for line in changed] == ["- ", "+ "], changed  # one line out, one line in
    assert not re.search(r"TODO|NotImplementedError|BROKEN", "\n".join(exercise))
    compile("\n".join(exercise), f"exercises/{name}.py", "exec")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(HANGS))
def test_each_broken_lab_stops_where_its_record_says(name, capsys):
    run = hang_labs.run_broken(name)
    out = capsys.readouterr().out
    assert run.record and hang_labs.deadlocked(run.record), out
    assert "never arrived: rank" in out and "where each rank is" in out, out
    hang_labs.check_reading(run, *HANGS[name])  # raises CheckFailed, naming the line, if the record says otherwise
    assert sequences.describe(run.record).startswith("the ranks' calls first differ at call ")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_unused_parameter_lab_fails_with_ddps_error(capsys):
    run = hang_labs.run_broken("hang5_unused")
    assert not run.record and run.errors, capsys.readouterr().out
    assert all("Expected to have finished reduction in the prior iteration" in e for e in run.errors.values())


def swap(*pairs: tuple[str, str]):
    """An edit of the train() cell: each (old, new) replaced once (the old text must be there)."""
    def edit(text: str) -> str:
        for old, new in pairs:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        return text
    return edit


LOOP = "        for tokens, lengths, labels in loader:\n"


def inside(context: str):
    """An edit of the train() cell: the training loop (the ``for`` over the loader and its body) in ``with context:``."""
    def edit(text: str) -> str:
        before, rest = text.split(LOOP)
        body = rest.splitlines(keepends=True)
        n = next(i for i, line in enumerate(body) if not line.startswith(" " * 12))  # the first line after the loop
        return before + f"        with {context}:\n    " + LOOP + "".join("    " + line for line in body[:n]) + \
            "".join(body[n:])
    return edit


def both(*edits):
    def edit(text: str) -> str:
        for e in edits:
            text = e(text)
        return text
    return edit


WRONG_FIXES = {
    # the error is gone, and so is the averaging: no_sync() skips the reduction that the unused head stalled
    "replicas differ": ("hang5_unused", both(swap(
        ("model = DDP(model.to(device), find_unused_parameters=True)", "model = DDP(model.to(device))")),
        inside("model.no_sync()"))),
    # uneven shares kept, and join() lets the rank that runs out shadow the other's all-reduces: it ends
    "steps differ": ("hang2_uneven", both(swap(
        ("train_set = splits.train  # every molecule: the sampler deals them out",
         "train_set = torch.utils.data.Subset(splits.train, range(rank, len(splits.train), world_size))")),
        inside("model.join()"))),
    # no more hang (no buffer broadcast), but rank 0 still evaluates through the wrapper
    "through the wrapper": ("hang4_batchnorm_eval", swap(
        ("model = DDP(model.to(device))", "model = DDP(model.to(device), broadcast_buffers=False)"),
        ("evaluate(model.module,", "evaluate(model,"))),
    # the bug left in place: the check's run is stopped by the watch, like the broken one
    "still hangs": ("hang1_rank0_only", swap(
        ("spread = replica_spread(model, world_size)  # an all_gather: every rank takes part",
         "spread = replica_spread(model, world_size) if rank == 0 else None"))),
}
SAID = {
    "replicas differ": r"it ends, but the replicas differ by [\d.e-]+ after training: the ranks' gradients were not "
                       r"averaged in every step",
    "steps differ": r"it ends, but the ranks ran different numbers of optimizer steps \(rank 0: 6, rank 1: 5\)",
    "through the wrapper": r"it trains, but evaluate\(\) still gets the DDP wrapper",
    "still hangs": r"it still hangs: rank \d waits in (all_gather|all_reduce) #2 \(called at .*train-cell:\d+",
}


def test_the_loop_edit_puts_the_whole_loop_in_the_block():
    text = "    x\n" + LOOP + "            a\n            b\n        after\n"
    assert inside("model.join()")(text) == ("    x\n        with model.join():\n            for tokens, lengths, labels "
                                            "in loader:\n                a\n                b\n        after\n")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mistake", list(WRONG_FIXES))
def test_a_wrong_fix_is_named_in_one_line(mistake):
    name, edit = WRONG_FIXES[mistake]
    with pytest.raises(CheckFailed) as err:
        hang_labs.check_fix(name, edit=edit)
    said = str(err.value)
    assert "\n" not in said and re.match(SAID[mistake], said), said


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_terminal_version_of_a_broken_lab_hangs_and_its_watch_explains(monkeypatch, tmp_path, capsys):
    """exercises/hang1_rank0_only.py under torchrun with the watch attached, as its docstring tells a learner to run it."""
    record = tmp_path / "hang.json"
    monkeypatch.setenv(hangreport.RECORD_VARIABLE, str(record))  # the ranks' watch saves its block there too
    with pytest.raises(LaunchError) as err:  # the group's 8 s timeout ends it, well before the launch's limit
        torchrun(build.EXERCISES / "hang1_rank0_only.py", 2, ["--limit", "447", "--epochs", "1", "--timeout", "8",
                                                              "--batch-size", "32", "--no-tensorboard"],
                 out=False, timeout=150, progress=False, show=None)  # -m workshop_lib.watch, as the docstring says
    shown = capsys.readouterr().out
    assert "$ torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch exercises/hang1_rank0_only.py " in shown
    assert "torchrun --nproc_per_node=2 -m workshop_lib.watch exercises/hangN_" in build.EXERCISES.joinpath(
        "hang1_rank0_only.py").read_text()  # what its docstring tells a learner to type
    said = hangreport.block(err.value.output)
    text = "\n".join(said)
    saved = hangreport.load(record)
    assert saved and saved[0]["block"] == said[:len(saved[0]["block"])], (saved, text)
    assert saved[0]["waiting_for"] and "the ranks' collectives first differ" in text, text
    for rank in (0, 1):  # each rank's stack, down to a line of the lab script
        line = next(x for x in said if x.strip().startswith(f"rank {rank}: "))
        assert re.search(r"exercises/hang1_rank0_only\.py:\d+ train\(\)", line), text
    assert not re.search(r"workshop_lib/(debug|lab|checks|scaling)/", text), text  # the tools' frames are not shown
