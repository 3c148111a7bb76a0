"""The script checker on real 2-rank runs: each mistake, written into a solution script, is named in one line.

Every script below runs in one call of the checker (a fresh pair of rank processes per run), once per test
module; a right way of each of steps 1-3 among them gives the ``--all`` table too (RIGHT says which). The
families are issue 25's: a wrapped model DDP never synchronises, sharding judged by what was read, a rank that
leaves early, a second DistributedSampler on the dev loader, step 4 restarting at epoch 0, reduce for all_reduce
and a missing barrier. Then issue 40's, each a new learner's edit that the invariants name without a rule of its
own: a collective moved into rank 0's block, a constant set_epoch, totals averaged, and step 4's snapshot lines
moved out of rank 0's block.

A run costs seconds (a step 4 resume three runs), so a verdict is run here once per way the run reaches it. Another
edit that reaches the same rule through the same records, or whose verdict is read from the script's text alone once
its run has passed, is judged on hand-made records in test_rules.py (another row of torch's errors:
test_torch_errors.py); step 4's snapshot verdicts (missing, of the wrong epoch, written in place, loaded without
weights_only or map_location), on what this process's torch.save and torch.load recorded, in test_resume.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO, in_213_words
from tools import build
from workshop_lib.engine import script

STEP1, STEP2, STEP3, STEP4 = (REPO / "solutions" / f"{script.STEPS[s]}.py" for s in (1, 2, 3, 4))
CPU_INIT = '        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))\n'
DESTROY = "        dist.destroy_process_group()  # always leave the group, even after an error\n"
SET_EPOCH = "            train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n"
TRAIN = "            totals = train_epoch(model, train_loader, optimizer, device)\n"
SAMPLER = "    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)\n"
MAKE_LOADER = "        train_loader = make_loader(splits.train, cfg.batch_size, cfg.seed)\n"
WRAP = ('        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # backward() now '
        'averages\n')
TOTALS = "            dist.all_reduce(totals)  # summed over the ranks: the loss of the whole epoch, every molecule\n"
REPORTED = "                report.epoch(epoch, loss, samples, seconds, dev_auc, replica_spread=spread)\n"
SAVE = '            torch.save(model.module.state_dict(), cfg.out / "model.pt")\n'
FINISH = "            report.finish(best, evaluate(model.module, heldout_loader, device), replica_spread=spread)\n"
SNAPSHOT = "                save_snapshot(snapshot, cfg.out / checkpoint.SNAPSHOT)  # rank 0 alone writes it\n"
EARLY = "                if dev_auc > 0.5:  # good enough: stop early\n                    break\n"
SNAPSHOT_LINES = (
    '                snapshot = {"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()}\n'
    "                snapshot.update(checkpoint.run_record(best, report))  # this run's settings, the best model, the "
    "history\n" + SNAPSHOT)

# (name, script, [(text in the solution, what replaces it[, "all"])], what the checker's line must say)
MISTAKES = [
    # 1. A wrapped model that DDP never synchronises.
    ("loss_through_module", STEP3, [(TRAIN, TRAIN.replace("(model,", "(model.module,"))],
     "the training forward at line <<model(tokens, lengths)>> (in train_epoch, called at line <<train_epoch(model.module>>) "
     "calls the model inside the wrapper"),
    ("no_ddp", STEP3, [(WRAP, ""), ("model.module", "model", "all")],
     "rank 0 never wrapped its model in DistributedDataParallel: the replicas differ by up to"),
    # 2. Sharding judged by what each rank read.
    ("per_rank_seed", STEP2, [(SAMPLER, SAMPLER.replace("seed=seed)", "seed=seed + dist.get_rank())"))],
     "in epoch 1 ranks 0 and 1 read "),  # then how many they shared, and PER_RANK_SEED
    ("sampler_not_drawn_from", STEP2,
     [(MAKE_LOADER, "        sampler = DistributedSampler(splits.train, shuffle=True, seed=cfg.seed)\n"
                    "        train_loader = DataLoader(splits.train, batch_size=cfg.batch_size, shuffle=True, "
                    "collate_fn=collate)\n"),
      (SET_EPOCH, SET_EPOCH.replace("train_loader.sampler.", "sampler."))],
     "in epoch 1 every rank read all 144 training molecules: the DistributedSampler built at line "
     "<<sampler = DistributedSampler(splits.train>> is not the one the DataLoader draws from (it draws from a "
     "RandomSampler)"),
    ("shuffle_false", STEP2, [(SAMPLER, SAMPLER.replace("shuffle=True", "shuffle=False"))],
     "epoch 2 read the same training molecules in the same order as epoch 1 on every rank: the DistributedSampler "
     "was built with shuffle=False (line <<DistributedSampler(dataset>>): pass shuffle=True"),
    ("split_per_rank", STEP2,
     [("import os\n", "import dataclasses\nimport os\n"),
      ("    cfg = parse_args(argv, __doc__)\n", "    cfg = parse_args(argv, __doc__)\n    cfg = dataclasses.replace("
       "cfg, split_seed=cfg.split_seed + int(os.environ[\"RANK\"]))  # each rank its own molecules\n")],
     "rank 1's training split is not rank 0's (their molecules differ"),
    ("sampler_local_rank", STEP2, [(SAMPLER, SAMPLER.replace("shuffle=True", "num_replicas=dist.get_world_size(), "
                                                             "rank=int(os.environ[\"LOCAL_RANK\"]), shuffle=True"))],
     "in epoch 1 ranks 0 and 1 read 72 of the same training molecules (together 72 of 144): ranks 0 and 1 all built "
     "their DistributedSampler with rank=0 (line <<DistributedSampler(dataset>>), their local rank"),
    ("sampler_one_replica", STEP2, [(SAMPLER, SAMPLER.replace("shuffle=True", "num_replicas=1, rank=0, shuffle=True"))],
     "in epoch 1 every rank read all 144 training molecules: rank 0's DistributedSampler (line "
     "<<DistributedSampler(dataset>>) splits the data into 1 shard(s)"),
    # set_epoch_missing: test_the_command_prints_one_line_and_exits_1_on_a_mistake runs it
    ("set_epoch_after_reading", STEP2, [(SET_EPOCH, ""), (TRAIN, TRAIN + SET_EPOCH)],
     "in epoch 2 the loader (line <<in loader:>>) read the sampler while it was still set to epoch 0"),
    ("sampler_before_group", STEP2, [("    device = setup(cfg.timeout)\n", MAKE_LOADER[4:] + "    device = setup("
                                      "cfg.timeout)\n")],
     "the DistributedSampler (line <<DistributedSampler(dataset>>) was built before the process group existed"),
    # 3. A rank that leaves the loop early, on a decision of rank 0 alone.
    ("rank0_stops_early", STEP3, [(REPORTED, REPORTED + EARLY)],  # then the watch's line, or where rank 1 waited
     "rank 0 left the training loop early (after 1 epoch(s) of 2 and 2 optimizer step(s); it left the group (line "
     "<<dist.destroy_process_group()>>)), while rank 1 wait"),
    # 4. A second DistributedSampler, on the dev loader, while rank 0 alone evaluates.
    ("dev_sampler", STEP2, [("dev_loader = DataLoader(splits.dev, batch_size=256, collate_fn=collate)",
                             "dev_loader = DataLoader(splits.dev, batch_size=256, sampler=DistributedSampler("
                             "splits.dev, shuffle=False), collate_fn=collate)")],
     "rank 0 evaluated 18 of the 36 dev molecules in epoch 1: the dev loader has a DistributedSampler (line "
     "<<dev_loader = >>)"),
    # 5. Step 4: the loop restarting at epoch 0 on resume, judged from the epochs the resumed run trained. The snapshot
    #    missing, of the wrong epoch, written in place, or loaded without weights_only or map_location: the same
    #    observers of torch.save and torch.load and the same rules, in-process, in test_resume.py.
    ("resume_from_epoch_0", STEP4, [("for epoch in range(first_epoch, cfg.epochs):", "for epoch in range(cfg.epochs):")],
     "the second run (--epochs 3 into the same --out) trained epoch(s) 1, 2, 3, not epoch 3 alone: after loading the "
     "snapshot, start the loop at the epoch after the snapshot's"),
    # 6. reduce where every rank uses the value; every rank loading the file rank 0 has just saved.
    ("reduce_for_all_reduce", STEP3,
     [(TOTALS, "            dist.reduce(totals, dst=0)  # summed on rank 0\n            if totals[0].item() / "
               "len(splits.train) < 0.5:  # the loss is low enough: every rank stops\n                break\n")],
     "dist.reduce (line <<dist.reduce(>>) delivers the result to one rank only (rank 0 [97.09, 144], rank 1 "
     "[48.84, 72]), yet every rank decided from it: use dist.all_reduce"),
    ("load_without_barrier", STEP3,  # a FileNotFoundError, or the file found by luck: the same line either way
     [(FINISH, FINISH + '        model.module.load_state_dict(torch.load(cfg.out / "model.pt"))  # every rank goes on '
                        "from the best model\n")],
     "rank 1 loaded model.pt (line <<torch.load(>>) "),
    # The mistakes the checker named before, in the new scripts' text.
    ("never_initialised", STEP1, [(CPU_INIT, "        pass  # never joins\n")],
     "rank 0 used the process group before joining it (torch: Default process group has not been initialized)"),
    ("never_destroyed", STEP1, [(DESTROY, "        pass\n")], "rank 0 never called dist.destroy_process_group"),
    # destroy_process_group moved out of the finally: read from the script's text once the run has passed, as a
    # passing run of step 1 above; test_rules.py test_every_rank_leaves_the_group_on_every_rank_in_a_finally
    ("all_reduce_max", STEP1, [("op=dist.ReduceOp.SUM", "op=dist.ReduceOp.MAX")],
     "rank 0 used op=MAX (line <<dist.all_reduce(value>>): summing needs op=dist.ReduceOp.SUM"),
    ("rank_skips_a_collective", STEP1, [("        check_all_reduce(device)\n",
                                         "        if rank == 0:\n            check_all_reduce(device)\n")],
     "the ranks' collectives first differ: rank 0 called all_reduce at line <<dist.all_reduce(value>> (in "
     "check_all_reduce, called at line <<    check_all_reduce(device)>>), rank 1 called nothing more (it finished); "
     "line <<    check_all_reduce(device)>> runs under `if rank == 0:` (line <<if rank == 0:>>), called by rank 0 "
     "alone: call it on every rank, or move it out of the block"),
    ("device_ids_on_cpu", STEP3, [('device_ids=[device.index] if device.type == "cuda" else None', "device_ids=[0]")],
     "rank 0 raised ValueError (line <<model = DDP(>>): DistributedDataParallel device_ids and output_device "
     "arguments only work with"),  # then torch's words, and DEVICE_IDS
    ("evaluate_on_every_rank", STEP3, [("            if rank == 0:  # rank 0 alone evaluates",
                                        "            evaluate(model.module, dev_loader, device)  # every rank\n"
                                        "            if rank == 0:  # rank 0 alone evaluates")],
     "rank 1 evaluated too (line <<dev_loader, device)  # every rank>>)"),
    ("evaluate_the_wrapper", STEP3, [("dev_auc = evaluate(model.module,", "dev_auc = evaluate(model,")],
     "rank 0 evaluated the DDP wrapper (line <<dev_auc = evaluate(>>)"),
    ("keep_the_wrapper", STEP3, [("best.update(epoch, dev_auc, model.module)", "best.update(epoch, dev_auc, model)")],
     "the best weights were kept from DDP's wrapper, line <<best.update(epoch, dev_auc, model)>>"),
    ("restore_into_the_wrapper", STEP3, [("best.restore(model.module)", "best.restore(model)")],
     "a plain model's weights loaded into DDP's wrapper, whose keys start with module.: load into model.module"),
    ("save_the_wrapper", STEP3, [("torch.save(model.module.state_dict()", "torch.save(model.state_dict()")],
     "their keys start with 'module.'"),
    ("save_on_local_rank_0", STEP3, [(SAVE, ""), (FINISH, FINISH + '        if int(os.environ["LOCAL_RANK"]) == 0:\n'
                                                  '            torch.save(model.module.state_dict(), cfg.out / '
                                                  '"model.pt")\n')],
     "ranks 0 and 1 all saved model.pt"),
    # op=MAX on the totals: test_rules.py (the same rule as op=AVG below, whose run records the op)
    ("loss_of_rank_0", STEP2, [(TOTALS, "")], "is rank 0's molecules alone: all_reduce the [loss sum, molecules]"),
    # What the CPU run cannot show, on a made-up node with 2 GPUs:
    ("device_from_the_global_rank", STEP1, [('int(os.environ["LOCAL_RANK"])', 'int(os.environ["RANK"])')],
     "setup as a made-up rank 3 of 4 (nothing joined): as local rank 1 on a node with 2 GPUs, setup called "
     "torch.cuda.set_device with [3], the global rank"),
    # device_ids=[rank]: read from the script's text once the run has passed (on CPU it runs as the solution does);
    # test_rules.py test_device_ids_of_the_global_rank_are_read_from_the_script
    # Last of its pair: two ranks that both join as rank 0 are stopped at once.
    ("init_with_local_rank", STEP1, [(CPU_INIT, CPU_INIT.replace("timeout=", 'rank=int(os.environ["LOCAL_RANK"]), '
                                                                 'world_size=2, timeout='))],
     "ranks 0 and 1 all joined as rank 0 (init_process_group (line <<dist.init_process_group(\"gloo\">>) got rank=0, the "
     "local rank)"),
    # Torch raises: its first line, then the cause and the fix (workshop_lib/engine/torch_errors.py): device_ids_on_cpu
    # above takes that way (a rank's crash, its line, torch's error explained by the one table); `.module` of an
    # unwrapped model and shuffle= beside the sampler are two more rows of the table, each raised by torch itself in
    # test_torch_errors.py.
    # Issue 40: a new learner's edits, each named by an invariant (the collectives, the shards, the sums, a crash).
    ("barrier_in_rank_0s_block", STEP3, [(REPORTED, REPORTED + "                dist.barrier()  # wait until rank 0 "
                                                               "has evaluated\n")],
     "the ranks' collectives first differ: rank 0 called barrier at line <<dist.barrier()>>, rank 1 called "
     "loss.backward() (DDP's gradient all-reduce) at line <<loss.backward()>> (in train_epoch, called at line "
     "<<totals = train_epoch(>>); line <<dist.barrier()>> runs under `if rank == 0:` (line <<if rank == 0:  # rank 0 "
     "alone evaluates;>>): a barrier that rank 0 alone reaches waits for ranks that never call it, a deadlock; call it "
     "on every rank, or move it out of the block"),
    # replica_spread moved into rank 0's block: the same rule and branch as the barrier above (its run hangs the
    # same way) and as rank_skips_a_collective (a collective in a function called under the condition); the all_gather
    # named through its call: test_rules.py
    ("set_epoch_constant", STEP2, [(SET_EPOCH, SET_EPOCH.replace("set_epoch(epoch)", "set_epoch(0)"))],
     "epoch 2 read the same training molecules in the same order as epoch 1 on every rank: set_epoch was called "
     "with 0, 0 in epochs 1, 2 (line <<sampler.set_epoch(0)>>): pass the epoch number, sampler.set_epoch(epoch)"),
    ("totals_averaged", STEP2, [(TOTALS, TOTALS.replace("(totals)", "(totals, op=dist.ReduceOp.AVG)"))],
     "the all_reduce at line <<dist.all_reduce(totals>> averaged [loss sum, molecules] (op=AVG): the loss is right "
     "but the molecule count is halved (rank 0 logs 72 molecules in epoch 1, the ranks trained on 144), and every "
     "throughput figure with it: sum the totals (ReduceOp.SUM)"),
    # Issue 46: a ✓ that was false, a mistake that 2 ranks hide, logged figures and torch's raw errors to their lines.
    ("seed_per_rank_without_ddp", STEP2, [("        torch.manual_seed(cfg.seed)\n",
                                           "        torch.manual_seed(cfg.seed + rank)  # each rank its own\n")],
     "ranks 0 and 1 start from different weights (measured before the first optimizer step): torch.manual_seed at "
     "line <<torch.manual_seed(cfg.seed + rank)>> (torch.manual_seed(cfg.seed + rank)  # each rank its own) seeds "
     "each rank with its own number, so each builds its own initial model; give every rank the same seed"),
    ("sampler_of_two_replicas", STEP2, [(SAMPLER, SAMPLER.replace("shuffle=True", "num_replicas=2, shuffle=True"))],
     "at 3 ranks (the data is judged at 1 and 3 ranks too): rank 2 raised ValueError (line "
     "<<DistributedSampler(dataset>>): Invalid rank 2, rank should be in the interval [0, 1]; rank 0's "
     "DistributedSampler (line <<DistributedSampler(dataset>>) splits the data into 2 shard(s) (num_replicas=2), but 3 "
     "ranks train: leave num_replicas out (the group's size) or pass dist.get_world_size()"),
    ("totals_reduced_twice", STEP2, [(TOTALS, TOTALS + TOTALS.replace("  # summed", "  # again:"))],
     "the totals were all-reduced twice, at line <<dist.all_reduce(totals)  # summed>> and again at line "
     "<<dist.all_reduce(totals)  # again:>>: the second sums the sums (rank 0 logs 288 molecules in epoch 1, the "
     "ranks trained on 144; the loss, a ratio, hides it): all_reduce them once"),
    ("loss_divided_by_the_world", STEP2, [("(totals[0] / totals[1]).item(),", "(totals[0] / totals[1]).item() / "
                                                                             "world_size,")],
     "the logged loss of epoch 1 is "),  # then its value, the line it was logged at, and SCALED
    ("device_id_on_cpu", STEP1, [(CPU_INIT, CPU_INIT.replace("))", "), device_id=device)"))],
     "rank 0 raised ValueError (line <<dist.init_process_group(\"gloo\">>): init_process_group device_id parameter "
     "must be an accelerator with an index; device_id binds the group to this process's GPU, and the device given is "
     "the CPU: pass device_id only on a GPU"),
    ("no_collate_fn", STEP2, [("sampler=sampler, collate_fn=collate)", "sampler=sampler)")],
     "; line <<return DataLoader(dataset, batch_size=batch_size, sampler=sampler)>> (return DataLoader(dataset, "
     "batch_size=batch_size, sampler=sampler)) built the loader it read; the DataLoader has no collate_fn, so torch's "
     "default_collate stacks the items as they are, and they differ in length"),
    ("reduce_decides_though_no_rank_left", STEP3,
     [(TOTALS, "            dist.reduce(totals, dst=0)  # summed on rank 0\n            if totals[1].item() < 0:  "
               "# never true: this run does not diverge\n                break\n")],
     "dist.reduce (line <<dist.reduce(totals, dst=0)>>) delivers totals to its dst rank alone, yet line "
     "<<if totals[1].item() < 0:>> (`totals[1].item() < 0`) decides from it on every rank: each other rank decides "
     "from its own value; use dist.all_reduce where every rank uses it"),
    ("snapshot_out_of_rank_0s_block", STEP4, [(SNAPSHOT_LINES, SNAPSHOT_LINES.replace(" " * 16, " " * 12))],
     "rank 1 raised AttributeError (line <<snapshot.update(>>): 'NoneType' object has no attribute 'world_size'; "
     "report is None on rank 1, set only where `rank == 0` holds (line <<report = Reporter(>>): run line "
     "<<snapshot.update(>> under the same condition, or create report on every rank"),
]
SCALED = (": line <<(totals[0] / totals[1]).item() / world_size>> ((totals[0] / totals[1]).item() / world_size) "
          "divides by the world size (2) a loss that the totals summed over every rank already made the mean; divide "
          "the summed loss by the summed molecules")
DEVICE_IDS = "; device_ids names a GPU, and this model is on the CPU: give DDP no device_ids on CPU"
EARLY_CAUSE = ("the break at line <<                    break>> runs under `if rank == 0:` (line "
               "<<if rank == 0:  # rank 0 alone evaluates>>), on rank 0 alone")
PER_RANK_SEED = ("the samplers' seeds differ (rank 0: 0, rank 1: 1, line <<DistributedSampler(dataset>>): each rank "
                 "shuffles the data its own way, so the shards overlap; give every rank the same seed")

# (name, script, edits): other right ways, which must pass too
ACCEPTED = [

    ("sampler_with_replicas_and_rank", STEP2, [(SAMPLER, SAMPLER.replace(
        "shuffle=True", "num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True"))]),
    # init_process_group with neither timeout= nor device_id= (both optional)
    ("init_without_timeout_or_device_id", STEP1, [(CPU_INIT, '        dist.init_process_group("gloo")\n'),
                                                  (", device_id=device)", ")")]),
    # a seed per rank before the wrap (DDP broadcasts rank 0's weights), find_unused_parameters (a note), and the
    # optimizer built before the wrap (DDP keeps the model's parameters). Step 4's other right ways (the snapshot
    # written through a file object, renamed with os.rename, loaded onto the CPU) are test_resume.py's, in-process.
    ("per_rank_seed_before_wrap_find_unused_optimizer_first", STEP3, [
        ("        torch.manual_seed(cfg.seed)\n", "        torch.manual_seed(cfg.seed + rank)  # DDP broadcasts rank 0's\n"),
        (WRAP, ""), ("        report = Reporter(", WRAP.replace("DDP(model, device_ids=", "DDP(model, "
                                                                  "find_unused_parameters=True, device_ids=") +
                     "        report = Reporter(")]),
]


def _expected(template: str, script_text: str) -> str:
    """``template`` with each <<text>> replaced by the number of the first line of the script that holds the text."""
    lines = script_text.splitlines()

    def number(m: re.Match) -> str:
        return str(next(i for i, line in enumerate(lines, 1) if m.group(1) in line))
    return re.sub(r"<<(.+?)>>", number, template)


def _mutate(path, edits, to):
    text = path.read_text()
    for old, new, *count in edits:
        n = text.count(old)
        assert n >= 1 if count else n == 1, f"{old!r} is in {path.name} {n} times: update the mistake"
        text = text.replace(old, new)
    to.write_text(text)
    return to


# The untouched solutions are not run here: each is checked where a learner checks it, by check.script in its
# notebook (01-03's script cells, 04a's nb04a-snap-check for step 4's three runs), on the script write_script gathers
# from the cells, the same text as solutions/ (tools.build generates both from the same cells); nbval compares their ✓
# lines with the stored ones, which state what was measured. The --all table is drawn from another right way of each.
RIGHT = {1: "init_without_timeout_or_device_id", 2: "sampler_with_replicas_and_rank",
         3: "per_rank_seed_before_wrap_find_unused_optimizer_first"}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Every mistake and every other right way, checked in one call:
    {name: (status, line, the script's text, its path)}."""
    tmp = tmp_path_factory.mktemp("mistakes")
    named = [*ACCEPTED, *((m[0], m[1], m[2]) for m in MISTAKES)]
    paths = [path if not edits else _mutate(path, edits, tmp / f"{name}_{path.name}") for name, path, edits in named]
    start = time.monotonic()
    results = script.check_scripts(paths)
    print(f"checked {len(paths)} scripts in {time.monotonic() - start:.0f} s")
    return {name: (*result, path.read_text(), path)
            for (name, _, _), path, result in zip(named, paths, results, strict=True)}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", [a[0] for a in ACCEPTED])
def test_another_right_way_passes(verdicts, name):
    status, line, *_ = verdicts[name]
    assert status == "done", line


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "expected"), [(m[0], m[3]) for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_named(verdicts, name, expected):
    status, line, text, _ = verdicts[name]
    assert status == "wrong" and _expected(expected, text) in in_213_words(line), line
    assert "\n" not in line
    if name == "per_rank_seed":
        assert _expected(PER_RANK_SEED, text) in line, line
    if name.startswith("rank0_stops_early"):
        assert _expected(EARLY_CAUSE, text) in line, line
    if name == "device_ids_on_cpu":
        assert DEVICE_IDS in line, line
    if name == "loss_divided_by_the_world":
        assert _expected(SCALED, text) in line, line
    if name == "load_without_barrier":
        assert "put dist.barrier() after the save, before any rank loads the file" in line, line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_line_states_what_was_measured(verdicts):
    """(The untouched steps' whole ✓ lines are 01-03's stored outputs, compared by nbval.)"""
    assert verdicts["per_rank_seed_before_wrap_find_unused_optimizer_first"][1].split(": ", 1)[1].startswith(
        "2 ranks, 2 epochs: each read its own 72 of 144 training molecules, a new order each epoch; spread after every "
        "step 0.0")
    assert verdicts[RIGHT[1]][1].endswith(  # the made-up GPU node's row claims what it measured, at step 1
        "as rank 3 of 4 on a made-up node with 2 GPUs, setup chose NCCL on cuda:1; every rank left the group")
    assert "note: find_unused_parameters=True" in verdicts["per_rank_seed_before_wrap_find_unused_optimizer_first"][1]


def test_the_unfilled_exercises_are_not_started(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(script, "MINE", tmp_path)  # no learner's scripts: the exercises themselves
    for step in script.STEPS:
        assert script.not_started(script.default_script(step), step)
    with pytest.raises(SystemExit):  # --all on exercises alone starts nothing: every script is "not started"
        script._exit_with_verdict(["--all"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["step", "script", "status", "mistake"]
    assert [r.split()[3:] for r in rows[1:]] == [["not", "started"]] * 4


def test_a_partly_filled_exercise_is_run_not_called_unstarted(tmp_path):
    exercise = (build.EXERCISES / "step1_process_group_todo.py").read_text()
    assert exercise.count(script.TODO_LINE) >= 2
    one_done = tmp_path / "step1_process_group.py"
    one_done.write_text(exercise.replace(script.TODO_LINE, "pass", 1))
    assert not script.not_started(one_done, 1)
    assert script.not_started(build.EXERCISES / "step1_process_group_todo.py", 1)


def test_the_step_comes_from_the_name_or_the_flag_and_any_other_script_is_none(tmp_path):
    assert script.step_of(tmp_path / "step2_sampler.py") == 2
    assert script.step_of(tmp_path / "mine.py", 3) == 3
    assert script.step_of(tmp_path / "mine.py") is None  # any DDP script: the rules that hold for any
    assert script.step_of(tmp_path / "mine_step2_sampler.py") == 2
    assert script.step_of(tmp_path / "train_step2.py") is None
    with pytest.raises(script.WorkshopError, match=r"--step 7 has no script check"):
        script.step_of(tmp_path / "mine.py", 7)


@pytest.mark.timeout(60)
def test_what_is_not_a_python_script_is_refused_in_one_line_with_exit_2(tmp_path, capsys):
    """A shell script, a binary file, a missing file: one line each, exit 2, nothing run. A Python file that does not
    compile: its file:line and the message, exit 1 (the learner's mistake)."""
    shell = tmp_path / "train.sh"
    shell.write_text("#!/bin/bash\ntorchrun --nproc_per_node=2 train.py 4 2\n")
    weights = tmp_path / "model.pt"
    torch.save({"w": torch.ones(3)}, weights)
    broken = tmp_path / "train.py"
    broken.write_text("import torch\n\ndef main(:\n    pass\n")
    cases = [(shell, 2, "train.sh is not a Python script (its first line, #!/bin/bash, runs another program)"),
             (weights, 2, "model.pt is not a Python script (binary data, not text)"),
             (tmp_path / "gone.py", 2, f"{tmp_path / 'gone.py'}: no such file"),
             (REPO / "notebooks" / "02_distributed_sampler.ipynb", 2, "02_distributed_sampler.ipynb is a notebook, not "
                                                                      "a Python script"),
             (broken, 1, "train.py:3: SyntaxError: invalid syntax; fix it")]
    for path, code, says in cases:
        assert script.main([str(path), "4", "2"]) == code
        out = capsys.readouterr().out
        assert out.startswith(f"\N{BALLOT X} {says}") and out.count("\n") == 1, out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_command_tables_a_row_per_step_done_or_its_mistake(verdicts):
    """``--all``'s table, from the fixture's checks: a right way of each of steps 1-3, and a step 4 that restarts at
    epoch 0 (the solutions' own rows are their notebooks' checks, see RIGHT)."""
    checked = [verdicts[RIGHT[s]] for s in (1, 2, 3)] + [verdicts["resume_from_epoch_0"]]
    rows = script.table([path for *_, path in checked], [(status, line) for status, line, *_ in checked])
    assert [(r.split()[:2], r.split()[3]) for r in rows[1:4]] == [(["step", str(s)], "done") for s in (1, 2, 3)]
    assert rows[4].split()[:2] == ["step", "4"] and rows[4].split()[3] == "wrong", rows[4]
    assert rows[4].endswith("trained epoch(s) 1, 2, 3, not epoch 3 alone: after loading the snapshot, start the loop at "
                            "the epoch after the snapshot's"), rows[4]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_command_prints_one_line_and_exits_1_on_a_mistake(tmp_path):
    mine = _mutate(STEP2, [(SET_EPOCH, "")], tmp_path / "step2_sampler.py")
    proc = subprocess.run([sys.executable, "-m", "workshop_lib.check", str(mine)], capture_output=True, text=True,
                          timeout=110, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("\N{BALLOT X} step2_sampler.py: epoch 2 read the same training molecules in the "
                                  "same order as epoch 1 on every rank: sampler.set_epoch is never called")
    assert proc.stdout.count("\n") == 1
