"""The script checker: each common DDP mistake, injected into a solution script, is named in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from workshop_lib.checks import script
from workshop_lib.debug import hangreport
from workshop_lib.lab import build

STEP1, STEP2, STEP3, STEP4 = (REPO / "solutions" / f"{script.STEPS[s]}.py" for s in (1, 2, 3, 4))

# (name, script, [(text in the solution, what replaces it)], what the checker's line must say)
MISTAKES = [
    ("never_initialised", STEP1,
     [("    dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,\n"
       "                            timeout=timedelta(seconds=cfg.timeout))\n", "")],
     "used the process group before joining it (torch: Default process group has not been initialized)"),
    ("never_destroyed", STEP1,
     [("        dist.destroy_process_group()  # always leave the group, even after an error", "        pass")],
     "rank 0 never called dist.destroy_process_group"),
    ("destroy_not_in_finally", STEP1,
     [("            return train(cfg, env)\n    finally:\n        dist.destroy_process_group()",
       "            result = train(cfg, env)\n    finally:\n        pass\n"
       "    dist.destroy_process_group()\n    return result")],
     "is not in a finally"),
    ("all_reduce_max", STEP1,
     [("dist.all_reduce(value, op=dist.ReduceOp.SUM)", "dist.all_reduce(value, op=dist.ReduceOp.MAX)")],
     "rank 0 used op=MAX"),
    ("rank_skips_a_collective", STEP1,
     [("            check_all_reduce(env)\n", "            if env.rank == 0:\n                check_all_reduce(env)\n")],
     "rank 1 skipped the all_reduce that rank 0 called at line"),
    ("sampler_local_rank", STEP2, [("rank=env.rank, shuffle=True", "rank=env.local_rank, shuffle=True")],
     "ranks 0 and 1 all read shard 0 of the DistributedSampler"),
    ("sampler_one_replica", STEP2, [("num_replicas=env.world_size, rank=env.rank", "num_replicas=1, rank=0")],
     "splits the data into 1 shard(s)"),
    ("sampler_before_group", STEP2,
     [("    dist.init_process_group(backend,", "    DistributedSampler(range(8))\n    dist.init_process_group(backend,")],
     "was built before the process group existed (torch: Default process group has not been initialized)"),
    ("set_epoch_missing", STEP2,
     [("        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n", "")],
     "sampler.set_epoch is never called"),
    ("set_epoch_after_reading", STEP2,
     [("        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n", ""),
      ("        stats = train_epoch(model, train_loader, optimizer, env.device, bar)\n",
       "        stats = train_epoch(model, train_loader, optimizer, env.device, bar)\n        sampler.set_epoch(epoch)\n")],
     "in epoch 2 the loader read the sampler while it was still set to epoch 0"),
    ("no_ddp", STEP3, [("    model = wrap(model, env)  #", "    #"), ("raw_model = model.module", "raw_model = model")],
     "never wrapped its model in DistributedDataParallel"),
    ("device_ids_on_cpu", STEP3, [('device_ids=[env.local_rank] if env.device.type == "cuda" else None',
                                   "device_ids=[env.local_rank]")],
     "passed device_ids=[0] for a CPU model"),
    ("evaluate_on_every_rank", STEP3, [("        if env.is_main:  # only rank 0 evaluates", "        if True:  #")],
     "rank 1 evaluated too"),
    ("evaluate_the_wrapper", STEP3, [("dev_auc = evaluate(raw_model,", "dev_auc = evaluate(model,")],
     "rank 0 evaluated the DDP wrapper"),
    ("save_the_wrapper", STEP3, [("torch.save(raw_model.state_dict()", "torch.save(model.state_dict()")],
     "their keys start with 'module.'"),
    ("save_on_local_rank_0", STEP3,
     [("    if env.is_main:\n        torch.save(", "    if env.local_rank == 0:\n        torch.save(")],
     "ranks 0 and 1 all saved model.pt"),
    ("loss_summed", STEP3, [("return total.item() / env.world_size", "return total.item()")],
     "mean_over_ranks returned the sum"),
    ("loss_max", STEP3, [("dist.all_reduce(total, op=dist.ReduceOp.SUM)", "dist.all_reduce(total, op=dist.ReduceOp.MAX)")],
     "mean_over_ranks all-reduced with op=MAX"),
    ("snapshot_never_saved", STEP4,
     [("        checkpoint.save(cfg, env, epoch, raw_model, optimizer, best, report)  # every rank; rank 0 writes the "
       "file\n", "")],
     "no snapshot.pt in --out after the run: call checkpoint.save(...) at the end of every epoch"),
    ("snapshot_of_the_wrong_epoch", STEP4,
     [("        checkpoint.save(cfg, env, epoch, raw_model, optimizer, best, report)  # every rank; rank 0 writes the "
       "file\n", ""),
      ("    spread = replica_spread(model, env)  # again", "    checkpoint.save(cfg, env, start, raw_model, optimizer, "
       "best, report)\n    spread = replica_spread(model, env)  # again")],
     "the snapshot holds epoch 1 of 2: save at the end of every epoch"),
    # Shown on a made-up GPU node (rank 3 of 4, local rank 1) after the CPU run passed:
    ("device_from_the_global_rank", STEP1,
     [('torch.device("cuda", launch.local_rank)', 'torch.device("cuda", launch.rank)')],
     "main called torch.cuda.set_device with [3]: the global rank"),
    ("device_ids_of_the_global_rank", STEP3, [("device_ids=[env.local_rank] if", "device_ids=[env.rank] if")],
     "wrap gave device_ids=[3], the global rank"),
    # Last: two ranks that both join as rank 0 wait for a rank 1 forever; the checker stops the run at once.
    ("init_with_local_rank", STEP1, [("rank=launch.rank, world_size=launch.world_size",
                                      "rank=launch.local_rank, world_size=launch.world_size")],
     "ranks 0 and 1 all joined as rank 0"),
]


# (name, script, [(text in the solution, what replaces it)]): other right ways, which must pass too
ACCEPTED = [
    ("standard_line", STEP1,  # env://: torch reads RANK and WORLD_SIZE; rank 0 shares the store's port with main's
     [("    dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,\n"
       "                            timeout=timedelta(seconds=cfg.timeout))\n",
       "    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout))\n")]),
]


def _mutate(script, edits, to):
    text = script.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not in {script.name} exactly once: update the mistake"
        text = text.replace(old, new)
    to.write_text(text)
    return to


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Every mistake and the four untouched solutions, checked in one run of two ranks."""
    tmp = tmp_path_factory.mktemp("mistakes")
    paths = [_mutate(script, edits, tmp / f"{name}_{script.name}") for name, script, edits, _ in MISTAKES]
    right = [_mutate(script, edits, tmp / f"{name}_{script.name}") for name, script, edits in ACCEPTED]
    results = script.check_scripts([STEP1, STEP2, STEP3, STEP4, *right, *paths])
    names = ["step1", "step2", "step3", "step4", *(a[0] for a in ACCEPTED), *(m[0] for m in MISTAKES)]
    return dict(zip(names, results, strict=True))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("step", ["step1", "step2", "step3", "step4"])
def test_the_untouched_solution_passes(verdicts, step):
    status, line = verdicts[step]
    assert status == "done", line


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [a[0] for a in ACCEPTED])
def test_another_right_way_passes(verdicts, name):
    status, line = verdicts[name]
    assert status == "done", line


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "expected"), [(m[0], m[3]) for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_named(verdicts, name, expected):
    status, line = verdicts[name]
    assert status == "wrong" and expected in line, line
    assert "\n" not in line


def test_the_unfilled_exercises_are_not_started(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(script, "MINE", tmp_path)  # no learner's scripts: the exercises themselves
    assert script.main(["--all"]) == 1
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["step", "script", "status", "mistake"]
    assert [r.split()[2:] for r in rows[1:]] == [[f"exercises/{script.STEPS[s]}.py", "not", "started"] for s in (1, 2, 3, 4)]


def test_a_partly_filled_exercise_is_run_not_called_unstarted(tmp_path):
    exercise = (build.EXERCISES / "step1_process_group.py").read_text()
    assert exercise.count(script.TODO_LINE) >= 3
    one_done = tmp_path / "step1_process_group.py"
    one_done.write_text(exercise.replace(script.TODO_LINE, "pass", 1))
    assert not script.not_started(one_done, 1)
    assert script.not_started(build.EXERCISES / "step1_process_group.py", 1)


def test_the_step_comes_from_the_name_or_the_flag(tmp_path):
    assert script.step_of(tmp_path / "step2_sampler.py") == 2
    assert script.step_of(tmp_path / "mine.py", 3) == 3
    with pytest.raises(script.WorkshopError, match=r"cannot tell the step of .*mine.py from its name; pass --step N"):
        script.step_of(tmp_path / "mine.py")


def test_destroy_outside_finally_is_found_by_its_line():
    inside = "try:\n    work()\nfinally:\n    dist.destroy_process_group()\n"
    outside = "work()\ndist.destroy_process_group()\n"
    assert script.destroy_outside_finally(inside) is None
    assert script.destroy_outside_finally(outside) == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_command_prints_one_line_and_exits_1_on_a_mistake(tmp_path):
    mine = _mutate(STEP2, MISTAKES[[m[0] for m in MISTAKES].index("set_epoch_missing")][2], tmp_path / "step2_sampler.py")
    proc = subprocess.run([sys.executable, "-m", "workshop_lib.check", str(mine)], capture_output=True, text=True,
                          timeout=110, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("\N{BALLOT X} step2_sampler.py: sampler.set_epoch is never called")
    assert proc.stdout.count("\n") == 1


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_rank_that_skips_a_collective_is_named_within_the_time_limit(tmp_path):
    """Rank 1 skips replica_spread's all_gather and waits elsewhere: the run stops, and the line names both."""
    mine = _mutate(STEP3, [("        spread = replica_spread(model, env)  # every rank takes part in the all_gather\n",
                            "        spread = replica_spread(model, env) if env.is_main else 0.0\n")],
                   tmp_path / "step3_ddp.py")
    work = tmp_path / "work"
    work.mkdir()
    run = script.run_as_two_nodes([mine], work)[0]
    # The checker stopped the run (not its limit) because the script's hang watch saved a block naming a rank
    # that the others wait for while it is still in the job.
    assert run["stopped"]
    assert [b["waiting_for"] for b in hangreport.load(work / "item0.hang.json")][:1] in ([[0]], [[1]])
    status, line = script._judge(mine, 3, run)
    assert status == "wrong" and "rank 1 skipped the all_gather that rank 0 called at line" in line, line
