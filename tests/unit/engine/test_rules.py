"""The rules on records made by hand: a correct 2-rank run of step 3, then one mistake put into it; nothing starts.

The records have the shape :mod:`workshop_lib.engine.recorder` writes (one dict an event, ``kind`` and ``line``
first) and :class:`workshop_lib.engine.runner.Run` holds (each rank's events, its parameters after each step,
the hang watch's blocks). The script's text is the real step 3 solution, so every "line N" is one of its lines.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from tests.conftest import REPO
from workshop_lib.engine import branches, resume, rules, shards, source
from workshop_lib.engine.recorder import spreads, waiting_in
from workshop_lib.engine.rules import Case
from workshop_lib.engine.runner import Run

SOURCE = (REPO / "solutions" / "step3_ddp.py").read_text()
N, DEV, WORLD, EPOCHS = 144, 36, 2, 2
LOSS = {0: 0.7, 1: 0.8}  # each rank's mean loss over its 72 molecules: the mean over all 144 is 0.75


def line(text: str) -> int:
    """The number of the solution's first line that holds ``text``."""
    return next(i for i, code in enumerate(SOURCE.splitlines(), 1) if text in code)


INIT, CHECK, SAMPLER, WRAP = line('init_process_group("gloo"'), line("dist.all_reduce(value"), \
    line("DistributedSampler(dataset"), line("model = DDP(")
SET_EPOCH, READ, BACKWARD, STEP = line("sampler.set_epoch"), line("in loader:"), line("loss.backward()"), \
    line("optimizer.step()")
TOTALS, GATHER, EVAL, SAVE, DESTROY = line("dist.all_reduce(totals)"), line("dist.all_gather("), \
    line("dev_auc = evaluate("), line("torch.save("), line("dist.destroy_process_group()")


def ev(kind: str, where: int | None = None, **data) -> dict:
    return {"kind": kind, "line": where, "t": 0.0, **data}


def collective(name: str, where: int, seq: int, op=None, before=None, after=None) -> list[dict]:
    return [ev("collective", where, name=name, phase="enter", seq=seq, op=op, before=before),
            ev("collective", None, name=name, phase="exit", seq=seq, after=after)]


def order(epoch: int) -> list[int]:
    return random.Random(epoch).sample(range(N), N)  # the sampler's permutation of an epoch


def rank_events(rank: int) -> list[dict]:
    """What one rank of a correct step 3 run records."""
    events = [ev("start"), ev("splits", line("load_splits("), train={"n": N, "fp": "f00d"}, dev={"n": DEV, "fp": "d"},
                              heldout={"n": 20, "fp": "h"}),
              ev("init", INIT, phase="enter", backend="gloo", store=False, timeout=True),
              ev("init", None, phase="exit", rank=rank, world_size=WORLD),
              *collective("all_reduce", CHECK, 1, "SUM", [rank + 1.0], [3.0]),
              ev("sampler", SAMPLER, split="train", id=7, given_replicas=None, given_rank=None, num_replicas=WORLD,
                 rank=rank, shuffle=True, seed=0, n=N, local_rank="0"),
              ev("ddp", WRAP, device_ids=None, find_unused=False)]
    seq = 1
    for epoch in range(EPOCHS):
        events += [ev("set_epoch", SET_EPOCH, id=7, split="train", epoch=epoch),
                   ev("pass", READ, split="train", epoch_pass=epoch, sampler="DistributedSampler", sampler_id=7,
                      sampler_epoch=epoch, workers=0),
                   ev("backward", BACKWARD, phase="enter"), ev("backward", None, phase="exit", ok=True),
                   ev("fetched", None, split="train", epoch_pass=epoch, indices=order(epoch)[rank::WORLD]),
                   ev("step", STEP, n=epoch, epoch_pass=epoch, numel=3, ddp_forwards=1, bypasses=0, backwards=1,
                      losses=[[LOSS[rank], 72]]),
                   *collective("all_reduce", TOTALS, seq + 1, None, [LOSS[rank] * 72, 72.0], [108.0, 144.0]),
                   *collective("all_gather", GATHER, seq + 2)]
        seq += 2
        if rank == 0:
            events += [ev("evaluate", EVAL, model="SmilesLSTM", split="dev"),
                       ev("pass", EVAL, split="dev", epoch_pass=epoch, sampler="SequentialSampler", sampler_id=None,
                          sampler_epoch=None, workers=0),
                       ev("fetched", None, split="dev", epoch_pass=epoch, indices=list(range(DEV)))]
    if rank == 0:
        events.append(ev("save", SAVE, path="/tmp/out/model.pt", keys=["embed.weight", "forward_lstm.weight_ih_l0"],
                         rank=0, epoch=None))
    return [*events, ev("destroy", DESTROY), ev("end", None, how="returned")]


def good_run() -> Run:
    return Run({r: rank_events(r) for r in range(WORLD)}, {r: [np.ones(3, np.float32)] * EPOCHS for r in range(WORLD)})


METRICS = {"history": [{"epoch": e, "train_loss": 0.75, "dev_roc_auc": 0.6, "replica_spread": 0.0, "seconds": 2.0,
                         "samples_per_second": 72.0} for e in range(2)]}  # 144 molecules an epoch


def case(run: Run | None = None, step: int = 3, metrics: dict | None = METRICS, source: str = SOURCE) -> Case:
    return Case(run or good_run(), step, EPOCHS, source, "step3_ddp.py", copy.deepcopy(metrics))


def changed(match: dict, changes: dict | None = None, on: tuple[int, ...] = (0, 1), drop: bool = False,
            run: Run | None = None) -> Run:
    """A copy of ``run`` (default: the good one) whose events that ``match`` get ``changes``, or go (``drop``)."""
    run = copy.deepcopy(run or good_run())
    for r in on:
        kept = []
        for e in run.ranks[r]:
            if all(e.get(k) == v for k, v in match.items()):
                if drop:
                    continue
                e.update(changes or {})
            kept.append(e)
        run.ranks[r] = kept
    return run


def ended(run: Run, rank: int, **end) -> Run:
    """``rank`` ended otherwise (no destroy): with ``end``'s fields, or stopped (no end at all) when empty."""
    run = copy.deepcopy(run)
    run.ranks[rank] = [e for e in run.ranks[rank] if e["kind"] not in ("end", "destroy")]
    if end:
        run.ranks[rank].append(ev("end", None, rank=rank, **end))  # as launching.ends records it
    return run


def cut(run: Run, rank: int, kind: str, nth: int = 0, **match) -> Run:
    """``rank`` stopped just after entering its ``nth`` event of ``kind`` (and ``match``), still inside it."""
    run = copy.deepcopy(run)
    events = run.ranks[rank]
    at = [i for i, e in enumerate(events) if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())][nth]
    run.ranks[rank] = events[:at + 1]
    return run


def first(c: Case) -> str | None:
    return rules.first_mistake(c)


# ----------------------------------------------------------------------------- a correct run


@pytest.mark.parametrize("step", [2, 3, 4])
def test_a_correct_run_breaks_no_rule_and_its_tick_says_what_was_measured(step):
    assert first(case(step=step)) is None
    assert rules.passed(case()) == (
        "2 ranks, 2 epochs: each read its own 72 of 144 training molecules, a new order each epoch; spread after every "
        "step 0.0; rank 0 alone evaluated all 36 dev molecules each epoch and saved the plain model; the logged loss "
        "is the mean over all ranks")


def test_the_tick_of_steps_1_and_2_says_what_was_measured():
    whole = good_run()
    for r in range(WORLD):
        for e in whole.ranks[r]:
            if e["kind"] == "fetched" and e["split"] == "train":
                e["indices"] = order(e["epoch_pass"])
    assert rules.passed(case(whole, step=1)) == (
        "2 ranks joined one group and all-reduced 1 + 2 = 3; 2 epochs: each read all 144 training molecules; rank 0 "
        "alone evaluated all 36 dev molecules each epoch and saved the model; as rank 3 of 4 on a made-up node with 2 "
        "GPUs, setup chose NCCL on cuda:1; every rank left the group")
    drifted = good_run()
    drifted.params[1] = [np.array([1, 1, 1.25], np.float32)] * 2
    assert "; the replicas drifted apart (spread 0.25 after the last step); " in rules.passed(case(drifted, 2))
    assert "; the replicas stayed equal (spread 0.0 after every step); " in rules.passed(case(step=2))


def test_step_1_wants_every_epoch_trained():
    short = changed({"kind": "pass", "split": "train", "epoch_pass": 1}, drop=True, on=(1,))
    short = changed({"kind": "fetched", "split": "train", "epoch_pass": 1}, drop=True, on=(1,), run=short)
    assert first(case(short, step=1)) == "rank 1 read the training molecules in 1 epoch(s), not 2: train every epoch"


# ----------------------------------------------------------------------------- how the run ended


@pytest.mark.parametrize(("run", "expected"), [
    (ended(good_run(), 1, how="raised", type="NotImplementedError", message="fill in the TODO above", line=60),
     "a TODO is still open (line 60): fill it in (its line raises NotImplementedError)"),
    (ended(good_run(), 0, how="exit", code=2, message="unrecognized arguments: --fast", line=None),
     "rank 0 exited with code 2: unrecognized arguments: --fast"),
    (ended(changed({"kind": "init"}, drop=True), 0, how="raised", type="ValueError", line=line("dist.get_rank(),"),
           message="Default process group has not been initialized, please make sure to call init_process_group."),
     f"rank 0 used the process group before joining it (torch: Default process group has not been initialized) "
     f"(line {line('dist.get_rank(),')}): call dist.init_process_group first (in setup)"),
    (ended(changed({"kind": "init"}, drop=True), 0, how="raised", type="ValueError", line=SAMPLER,
           message="Default process group has not been initialized, please make sure to call init_process_group."),
     f"the DistributedSampler (line {SAMPLER}) was built before the process group existed"),
    (changed({"kind": "destroy"}, drop=True, on=(1,), run=changed({"kind": "collective"}, drop=True, on=(1,),
                                                                   run=changed({"kind": "init"}, drop=True, on=(1,)))),
     "rank 1 never called dist.init_process_group: the processes never formed a group"),  # nor used one
    (ended(changed({"kind": "init", "phase": "enter"}, {"backend": "nccl"}), 0, how="raised", type="RuntimeError",
           message="ProcessGroupNCCL is only supported with GPUs, no GPUs found!", line=INIT),
     f"rank 0 joined with backend nccl (line {INIT}) on a machine without GPUs: use the backend of the device, gloo "
     "for CPU tensors"),
    (changed({"kind": "init", "phase": "enter"}, {"given_rank": 0}),
     f"ranks 0 and 1 all joined as rank 0 (init_process_group (line {INIT}) got rank=0, the local rank)"),
], ids=["todo", "exit", "not_joined", "sampler_first", "never_joined", "nccl_on_cpu", "same_rank"])
def test_the_endings_name_who_and_where(run, expected):
    assert first(case(run)).startswith(expected), first(case(run))


@pytest.mark.parametrize(("change", "expected"), [
    ({"op": "MAX"}, f"rank 0 used op=MAX (line {CHECK}): summing needs op=dist.ReduceOp.SUM"),
    ({"before": [1.0]}, f"rank 1 contributed [1.0] (line {CHECK}), expected [2.0]: each rank contributes its rank + 1 "
                        "(dist.get_rank() + 1)"),
], ids=["max", "wrong_value"])
def test_summing_reads_check_all_reduces_values(change, expected):
    on = (1,) if "before" in change else (0, 1)
    run = changed({"kind": "collective", "seq": 1, "phase": "enter"}, change, on=on)
    assert rules.summed(case(run)) == expected


def test_the_totals_all_reduce_is_not_check_all_reduces():
    assert rules.summed(case()) is None  # its values are the loss sums, but it is not in check_all_reduce


def test_one_judge_of_an_all_reduce_of_rank_plus_one_reads_any_record_of_it():
    """rules.all_reduced: the judge of the script's check_all_reduce and of notebook 01's cell (checks.group)."""
    run = changed({"kind": "collective", "seq": 1, "phase": "exit"}, {"after": [2.0]}, on=(1,))
    assert rules.all_reduced(run.ranks) == f"rank 1 got [2.0] from the all_reduce (line {CHECK}), expected [3.0]"
    assert rules.all_reduced(good_run().ranks) is None
    assert rules.all_reduced({0: [], 1: []}) is None  # no call: the caller says so (the cell) or another rule does


# ----------------------------------------------------------------------------- the made-up GPU node, a row


SET_DEVICE = "        torch.cuda.set_device(device)\n"
ONE_GPU = SOURCE.replace(SET_DEVICE, SET_DEVICE + '        if torch.cuda.device_count() > 1:\n'
                                                  '            raise ValueError("one GPU a node")\n')


@pytest.mark.parametrize(("text", "expected"), [
    (SOURCE.replace('int(os.environ["LOCAL_RANK"])', 'int(os.environ["RANK"])', 1),
     "setup as a made-up rank 3 of 4 (nothing joined): as local rank 1 on a node with 2 GPUs, setup called "
     "torch.cuda.set_device with [3], the global rank"),
    (SOURCE.replace(SET_DEVICE, ""), "setup as a made-up rank 3 of 4 (nothing joined): as local rank 1 on a node "
                                     "with 2 GPUs, setup never called torch.cuda.set_device"),
    (SOURCE.replace('dist.init_process_group("nccl",', 'dist.init_process_group("gloo",'),
     "setup as a made-up rank 3 of 4 (nothing joined): on a node with 2 GPUs setup joined with backend 'gloo', which "
     "has no nccl for cuda tensors"),
    (ONE_GPU, "setup as a made-up rank 3 of 4 (nothing joined): on a made-up node with 2 GPUs, setup raised "
              f"ValueError (line {line('torch.cuda.set_device(device)') + 2}): one GPU a node"),
], ids=["set_device_global_rank", "no_set_device", "gloo_on_gpus", "raised"])
def test_the_made_up_gpu_node_is_a_row_judged_from_its_record(text, expected):
    """A step's setup runs as rank 3 of 4 on a made-up node with 2 GPUs, judged by its row of the table from the
    Recorder that kept what it called; a run the CPU rules pass is then named by it."""
    assert SET_DEVICE in SOURCE
    assert first(case(source=text)).startswith(expected), first(case(source=text))


def test_the_tick_claims_the_made_up_node_only_where_it_ran_setup():
    assert "as rank 3 of 4 on a made-up node with 2 GPUs, setup chose NCCL on cuda:1" in rules.passed(case(step=1))
    no_setup = SOURCE.replace("def setup(", "def join(")
    assert first(case(source=no_setup, step=1)) is None  # nothing measured, nothing named
    assert "made-up" not in rules.passed(case(source=no_setup, step=1))
    assert "made-up" not in rules.passed(case(step=None))  # not a workshop step: the row is not judged


def test_a_crash_is_named_with_its_line_and_the_peer_that_lost_it_is_not():
    lost = ended(good_run(), 0, how="raised", type="RuntimeError", line=GATHER,
                 message="[pair.cc:553] Connection closed by peer [127.0.0.1]:4242")
    assert rules.crashed(case(lost)) is None
    both = ended(lost, 1, how="raised", type="KeyError", message="'smiles'", line=40)
    assert rules.crashed(case(both)) == "rank 1 raised KeyError (line 40): 'smiles'"


def test_a_crash_on_a_value_only_a_rank_condition_sets_names_the_condition():
    """The report lines moved out of `if rank == 0:`: report is None on rank 1 (``... if rank == 0 else None``)."""
    at = line("report.epoch(")
    run = ended(good_run(), 1, how="raised", type="AttributeError", line=at,
                message="'NoneType' object has no attribute 'epoch'")
    assert rules.crashed(case(run)) == (
        f"rank 1 raised AttributeError (line {at}): 'NoneType' object has no attribute 'epoch'; report is None on rank "
        f"1, set only where `rank == 0` holds (line {line('report = Reporter(')}): run line {at} under the same "
        "condition, or create report on every rank")


def test_a_file_loaded_before_its_save_asks_for_a_barrier():
    run = ended(good_run(), 1, how="raised", type="FileNotFoundError", line=120,
                message="[Errno 2] No such file or directory: '/tmp/out/model.pt'")
    assert rules.crashed(case(run)) == (f"rank 1 loaded model.pt (line 120) before rank 0 had saved it (line {SAVE}; "
                                        "FileNotFoundError): put dist.barrier() after the save, before any rank loads "
                                        "the file")


def test_a_crash_torch_explains_gets_the_cause_and_the_fix_from_the_one_table():
    run = ended(good_run(), 0, how="raised", type="ValueError", line=WRAP,
                message="DistributedDataParallel device_ids and output_device arguments only work with single-device/"
                        "multiple-device GPU modules or CPU modules, but got device_ids [0], output_device None")
    assert rules.crashed(case(run)).endswith("but got device_ids [0], output_device None; device_ids names a GPU, "
                                             "and this model is on the CPU: give DDP no device_ids on CPU, [local_rank] "
                                             "on a GPU")


def _rank0_left_after_epoch_1() -> Run:
    """Rank 0 left after epoch 1; rank 1 entered epoch 2's backward and waits there (the checker stopped it)."""
    run = good_run()
    mine = run.ranks[0]
    second = next(i for i, e in enumerate(mine) if e["kind"] == "set_epoch" and e["epoch"] == 1)
    run.ranks[0] = mine[:second] + mine[-3:]  # its save, destroy and end
    run = cut(run, 1, "backward", nth=1, phase="enter")
    run.params[0] = run.params[0][:1]
    return run


BREAK = ("                report.epoch(epoch, loss, samples, seconds, dev_auc, replica_spread=spread)\n",
         "                report.epoch(epoch, loss, samples, seconds, dev_auc, replica_spread=spread)\n"
         "                if dev_auc > 0.5:\n                    break\n")


def test_a_rank_that_left_early_is_named_with_where_the_other_waited_and_why():
    source = SOURCE.replace(*BREAK)
    got = rules.first_mistake(case(_rank0_left_after_epoch_1(), source=source))
    assert got == (f"rank 0 left the training loop early (after 1 epoch(s) of 2 and 1 optimizer step(s); it left the "
                   f"group (line "
                   f"{DESTROY})), while rank 1 waited in loss.backward() (DDP's gradient all-reduce) (line {BACKWARD}) "
                   f"until the checker stopped it: the break at line {line('report.epoch(') + 2} runs under `if rank "
                   f"== 0:` (line {line('if rank == 0:  # rank 0 alone evaluates')}), on rank 0 alone: a decision "
                   "that ends the loop must be taken on every rank (share it first, with dist.broadcast or an "
                   "all_reduce)")


def test_the_hang_watchs_line_says_what_the_other_waited_in():
    run = _rank0_left_after_epoch_1()
    run.hang = [{"line": "rank 1 waits in loss.backward() (called at /tmp/x/step3_ddp.py:71 in train_epoch()); rank 0 "
                         "never joined it: it has left the job", "missing": [0], "waiting_for": []}]
    got = rules.same_collectives(case(run))
    assert "while rank 1 waits in loss.backward() (called at step3_ddp.py:71 in train_epoch()); rank 0 never joined " \
           "it: it has left the job: " in got, got


def test_a_reduce_that_only_rank_0_received_is_the_cause_when_ranks_decide_apart():
    run = _rank0_left_after_epoch_1()
    for r, kept in ((0, [108.0, 144.0]), (1, [57.6, 72.0])):
        for e in run.ranks[r]:
            if e["kind"] == "collective" and e.get("seq") == 2:
                e.update(name="reduce", **({"after": kept} if e["phase"] == "exit" else {}))
    got = rules.same_collectives(case(run))
    assert got.endswith(f"dist.reduce (line {TOTALS}) delivers the result to one rank only (rank 0 [108, 144], rank 1 "
                        "[57.6, 72]), yet every rank decided from it: use dist.all_reduce where every rank uses the "
                        "value"), got


def test_a_rank_that_skipped_a_collective_and_finished_is_named_as_the_skipper():
    run = changed({"kind": "collective"}, drop=True, on=(1,))  # rank 1 skipped check_all_reduce, and has no other
    run = changed({"kind": "ddp"}, drop=True, on=(1,), run=run)
    run = cut(run, 0, "collective", seq=1, phase="enter")
    got = rules.same_collectives(case(run))
    assert got == (f"rank 1 skipped the all_reduce that rank 0 called at line {CHECK} and finished, while rank 0 "
                   f"waited in all_reduce (line {CHECK}) until the checker stopped it: every rank must call every "
                   "collective, or the others wait for it"), got


def test_collectives_that_differ_are_named_with_each_ranks_call_and_line():
    run = changed({"kind": "collective", "seq": 2}, {"name": "barrier", "line": 200}, on=(1,))
    run = cut(cut(run, 0, "collective", seq=3, phase="enter"), 1, "collective", seq=2, phase="enter")
    run.stopped = "hang"
    assert rules.same_collectives(case(run)) == (
        f"the ranks' collectives first differ: rank 0 called all_reduce at line {TOTALS}, rank 1 called barrier at "
        "line 200: every rank must call every collective, in the same order, or the others wait for it")


def _barrier_in_rank_0s_block() -> tuple[Run, str]:
    """Rank 0 called dist.barrier() after its evaluation, inside `if rank == 0:`; rank 1 went on to epoch 2's
    backward(), DDP's gradient all-reduce. The script's text has the barrier there."""
    text = SOURCE.replace(REPORTED, REPORTED + "                dist.barrier()  # wait for the evaluation\n")
    at = line("report.epoch(") + 1
    run = cut(good_run(), 1, "backward", nth=1, phase="enter")
    mine = run.ranks[0]
    second = next(i for i, e in enumerate(mine) if e["kind"] == "set_epoch" and e["epoch"] == 1)
    run.ranks[0] = [*mine[:second], ev("collective", at, name="barrier", phase="enter", seq=4, op=None, before=None,
                                       via=[128])]
    return run, text


REPORTED = "                report.epoch(epoch, loss, samples, seconds, dev_auc, replica_spread=spread)\n"


def test_a_collective_under_a_rank_condition_is_named_with_the_conditions_line():
    run, text = _barrier_in_rank_0s_block()
    at, condition = line("report.epoch(") + 1, line("if rank == 0:  # rank 0 alone evaluates")
    assert rules.first_mistake(case(run, source=text)) == (
        f"the ranks' collectives first differ: rank 0 called barrier at line {at}, rank 1 called loss.backward() "
        f"(DDP's gradient all-reduce) at line {BACKWARD}; line {at} runs under `if rank == 0:` (line {condition}): "
        "a barrier that rank 0 alone reaches waits for ranks that never call it, a deadlock; call it on every rank, or "
        "move it out of the block")


def test_a_collective_in_a_function_called_under_a_rank_condition_names_the_call():
    """replica_spread(model) moved into rank 0's block: rank 0 waits in its all_gather, rank 1 in epoch 2's backward."""
    run = cut(changed({"kind": "collective", "seq": 3}, drop=True, on=(1,)), 1, "backward", nth=1, phase="enter")
    called, condition = line("report.epoch(") - 1, line("if rank == 0:  # rank 0 alone evaluates")
    run = cut(run, 0, "collective", seq=2, phase="exit")
    run.ranks[0].append(ev("collective", GATHER, name="all_gather", phase="enter", seq=3, op=None, before=None,
                           via=[128, called]))
    got = rules.same_collectives(case(run))
    assert got.endswith(f"; line {called} runs under `if rank == 0:` (line {condition}), called by rank 0 alone: call "
                        "it on every rank, or move it out of the block"), got
    assert f"rank 0 called all_gather at line {GATHER} (in replica_spread, called at line {called})" in got, got


def test_a_hang_without_the_watch_names_where_each_waited():
    run = cut(cut(good_run(), 0, "collective", seq=3, phase="enter"), 1, "collective", seq=3, phase="enter")
    run.stopped = "stalled"
    assert rules.same_collectives(case(run)) == (
        f"the ranks stopped making progress (rank 0 waited in all_gather (line {GATHER}) until the checker stopped it; "
        f"rank 1 waited in all_gather (line {GATHER}) until the checker stopped it): every rank must call every "
        "collective, in the same order, or the others wait for it")


# ----------------------------------------------------------------------------- what a finished run did


def test_ranks_with_different_splits_are_named():
    run = changed({"kind": "splits"}, {"train": {"n": N, "fp": "beef"}}, on=(1,))
    assert rules.same_split(case(run)) == ("rank 1's training split is not rank 0's (their molecules differ: "
                                           "fingerprint beef against f00d): every rank must load the same split, "
                                           "and a DistributedSampler gives each its share of it")


@pytest.mark.parametrize(("reads", "expected"), [
    ({0: [[0, 1], [1, 0]], 1: [[2, 3]]}, ("epochs", "rank 1 read the items in 1 epoch(s), not 2")),
    ({0: [[0, 1, 2, 3]] * 2, 1: [[0, 1, 2, 3]] * 2}, ("all", "in epoch 1 every rank read all 4 items")),
    ({0: [[0, 1], [2, 1]], 1: [[0, 3], [0, 3]]},
     ("overlap", "in epoch 1 ranks 0 and 1 read 1 of the same items (together 3 of 4)")),
    ({0: [[0], [1]], 1: [[2], [3]]}, ("missing", "in epoch 1 the ranks read 2 of the 4 items together")),
    ({0: [[0, 2], [0, 2]], 1: [[1, 3], [1, 3]]},
     ("same_order", "epoch 2 read the same items in the same order as epoch 1 on every rank")),
    ({0: [[0, 2, 4], [4, 0, 2]], 1: [[1, 3, 0], [3, 1, 0]]}, None),  # 5 items: one padded duplicate, allowed
    ({0: [[0, 2], [1, 3]], 1: [[1, 3], [2, 0]]}, None),
], ids=["epochs", "all", "overlap", "missing", "same_order", "padded", "good"])
def test_reads_are_judged_disjoint_covering_and_reordered(reads, expected):
    n = 5 if len(reads[0][0]) == 3 else 4
    assert shards.read_mistake(reads, n, 2, "items") == expected


def _set_epoch_after_reading() -> Run:
    """Each epoch's set_epoch(epoch) called after its pass: the passes read the sampler at epochs 0 and 0."""
    run = changed({"kind": "pass", "split": "train"}, {"sampler_epoch": 0})
    for events in run.ranks.values():
        for e in [e for e in events if e["kind"] == "set_epoch"]:
            i = events.index(e)
            events.insert(i + 1, events.pop(i))  # after the pass that followed it
    return run


@pytest.mark.parametrize(("run", "expected"), [
    (changed({"kind": "sampler"}, drop=True), "no DistributedSampler was built over the data"),
    (changed({"kind": "pass", "split": "train"}, {"sampler": "RandomSampler", "sampler_id": None}),
     f"the DistributedSampler built at line {SAMPLER} is not the one the DataLoader draws from (it draws from a "
     "RandomSampler)"),
    (changed({"kind": "sampler"}, {"num_replicas": 1}),
     f"rank 0's DistributedSampler (line {SAMPLER}) splits the data into 1 shard(s) (num_replicas=1), but 2 ranks "
     "train"),
    (changed({"kind": "sampler"}, {"rank": 0}),
     f"ranks 0 and 1 all built their DistributedSampler with rank=0 (line {SAMPLER}), their local rank"),
    (changed({"kind": "sampler"}, {"seed": 1}, on=(1,)), f"the samplers' seeds differ (rank 0: 0, rank 1: 1, line "
                                                         f"{SAMPLER})"),
    (changed({"kind": "sampler"}, {"shuffle": False}),
     f"the DistributedSampler was built with shuffle=False (line {SAMPLER}): pass shuffle=True"),
    (changed({"kind": "pass", "split": "train"}, {"sampler_epoch": 0}, run=changed({"kind": "set_epoch"}, drop=True)),
     "sampler.set_epoch is never called; call train_loader.sampler.set_epoch(epoch)"),
    (changed({"kind": "pass", "split": "train"}, {"sampler_epoch": 0}),
     f"in epoch 2 the loader (line {READ}) read the sampler while it was still set to epoch 0"),
    (_set_epoch_after_reading(),
     f"in epoch 2 the loader (line {READ}) read the sampler while it was still set to epoch 0"),
    (changed({"kind": "pass", "split": "train"}, {"sampler_epoch": 0}, run=changed({"kind": "set_epoch"}, {"epoch": 0})),
     f"set_epoch was called with 0, 0 in epochs 1, 2 (line {SET_EPOCH}): pass the epoch number, "
     "sampler.set_epoch(epoch)"),
], ids=["none", "not_drawn_from", "one_replica", "local_rank", "seeds", "no_shuffle", "no_set_epoch", "late",
        "late_in_order", "constant"])
def test_the_cause_of_a_sharding_mistake_comes_from_how_the_sampler_was_built(run, expected):
    kind = "same_order" if "shuffle" in expected or "epoch" in expected else "overlap"
    assert shards.cause(kind, run.ranks, "train", WORLD).startswith(expected)


def test_drifting_replicas_are_named_with_their_cause():
    run = good_run()
    run.params[1] = [np.array([1, 1, 1.5], np.float32)] * 2
    assert rules.replicas(case(run)) == ("the replicas differ by up to 0.5 after step 1: every rank must take the "
                                         "same step (the gradients averaged by DDP, the same optimizer settings)")
    unwrapped = changed({"kind": "ddp"}, drop=True, run=run)
    assert rules.replicas(case(unwrapped)).startswith("rank 0 never wrapped its model in DistributedDataParallel: "
                                                      "the replicas differ by up to 0.5 after step 1")
    around = changed({"kind": "step"}, {"ddp_forwards": 0}, run=run)
    for r in (0, 1):
        around.ranks[r].insert(5, ev("bypass", line("model(tokens, lengths)"), via=[128, 98]))
    assert f"the training forward at line {line('model(tokens, lengths)')} (in train_epoch, called at line 98) " \
           "calls the model inside the wrapper" in rules.replicas(case(around))


def test_spreads_are_measured_after_each_step_every_rank_took():
    assert spreads({0: [np.zeros(2), np.zeros(2)], 1: [np.array([0, 0.25]), np.array([0.5, 0])]}) == [0.25, 0.5]
    assert spreads({0: [np.zeros(2)], 1: []}) == []


@pytest.mark.parametrize(("run", "expected"), [
    (changed({"kind": "evaluate"}, run=Run({0: rank_events(0), 1: rank_events(0)})),
     f"rank 1 evaluated too (line {EVAL}): every rank scored the same model on the dev set"),
    (changed({"kind": "fetched", "split": "dev"}, {"indices": list(range(18))},
             run=Run({0: [*rank_events(0)[:5], ev("sampler", 87, split="dev", id=9), *rank_events(0)[5:]],
                      1: rank_events(1)}, good_run().params)),
     "rank 0 evaluated 18 of the 36 dev molecules in epoch 1: the dev loader has a DistributedSampler (line 87)"),
    (changed({"kind": "evaluate"}, {"model": "DistributedDataParallel"}),
     f"rank 0 evaluated the DDP wrapper (line {EVAL}): evaluate the plain model inside it, model.module"),
    (changed({"split": "dev"}, drop=True),
     "rank 0 never evaluated: score the model on the dev split every epoch, on global rank 0"),
], ids=["rank_1_too", "half", "the_wrapper", "never"])
def test_evaluated_wants_rank_0_alone_on_the_whole_dev_set(run, expected):
    assert rules.evaluated(case(run)).startswith(expected)


@pytest.mark.parametrize(("run", "expected"), [
    (Run({0: rank_events(0), 1: rank_events(0)}),
     f"ranks 0 and 1 all saved model.pt (line {SAVE}): one file for the job, written by global rank 0 only"),
    (Run({0: rank_events(1), 1: rank_events(0)}), f"rank 1 saved (line {SAVE}): save from global rank 0 only"),
    (changed({"kind": "save"}, {"keys": ["module.embed.weight"]}),
     f"rank 0 saved the DDP wrapper's weights (line {SAVE}): their keys start with 'module.' (module.embed.weight)"),
    (changed({"kind": "save"}, drop=True), "nothing was saved with torch.save"),
], ids=["both", "rank_1", "the_wrapper", "nothing"])
def test_the_files_are_one_of_plain_weights_from_rank_0(run, expected):
    assert (rules.files(case(run)) or rules.workshop_files(case(run))).startswith(expected)


def test_the_logged_loss_is_checked_against_every_ranks_batches():
    assert rules.logged(case()) is None
    own = copy.deepcopy(METRICS)
    own["history"][0]["train_loss"] = 0.7
    assert rules.logged(case(metrics=own)) == (
        "the logged loss of epoch 1 is 0.7000; the mean over the 144 molecules every rank trained on is 0.7500, and "
        "0.7000 is rank 0's molecules alone: all_reduce the [loss sum, molecules] totals")
    maxed = changed({"kind": "collective", "seq": 2, "phase": "enter"}, {"op": "MAX"})
    own["history"][0]["train_loss"] = 0.8
    assert rules.logged(case(maxed, metrics=own)).endswith(
        f"the totals were all-reduced with op=MAX (line {TOTALS}); sum them (ReduceOp.SUM)")
    assert rules.workshop_files(case(metrics=None)).startswith("rank 0 wrote no metrics.json")


def test_a_count_averaged_by_the_all_reduce_is_named_with_its_line():
    averaged = changed({"kind": "collective", "seq": 2, "phase": "enter"}, {"op": "AVG"})
    averaged = changed({"kind": "collective", "seq": 2, "phase": "exit"}, {"after": [54.0, 72.0]}, run=averaged)
    halved = copy.deepcopy(METRICS)
    for row in halved["history"]:
        row["samples_per_second"] = 36.0  # 72 molecules in 2.0 s: the averaged count
    assert rules.logged(case(averaged, metrics=halved)) == (
        f"the all_reduce at line {TOTALS} averaged [loss sum, molecules] (op=AVG): the loss is right but the molecule "
        "count is halved (rank 0 logs 72 molecules in epoch 1, the ranks trained on 144), and every throughput "
        "figure with it: sum the totals (ReduceOp.SUM)")
    assert rules.logged(case(metrics=halved)).startswith("rank 0 logs 72 molecules in epoch 1, the ranks trained on "
                                                         "144: count every rank's molecules")


def test_every_rank_leaves_the_group_on_every_rank_in_a_finally():
    assert rules.left_the_group(case(changed({"kind": "destroy"}, drop=True, on=(1,)))).startswith(
        "rank 1 never called dist.destroy_process_group")
    outside = SOURCE.replace("    finally:\n        dist.destroy_process_group()", "    finally:\n        pass\n"
                             "    dist.destroy_process_group()")
    assert rules.left_the_group(case(source=outside)).startswith(
        f"dist.destroy_process_group() at line {DESTROY + 1} is not in a finally")


def test_device_ids_of_the_global_rank_are_read_from_the_script():
    wrong = SOURCE.replace("device_ids=[device.index] if", "device_ids=[rank] if")
    assert rules.device_ids(case(source=wrong)).startswith(f"device_ids at line {WRAP} ([rank] if device.type == "
                                                           "'cuda' else None) names the global rank")
    assert rules.device_ids(case()) is None


# ----------------------------------------------------------------------------- step 4's resume, and the reading


def resumed(got: Run | None = None, history: list | None = None, whole: list | None = None) -> Case:
    """A first run of step 4 whose resumed run (``got``, its metrics ``history``) and uninterrupted one ran."""
    first = case(step=4)
    first.later = {"resumed": case(got, 4, {"history": history or []}), "whole": case(None, 4, {"history": whole or []})}
    return first


def test_a_resume_must_end_with_the_uninterrupted_runs_figures():
    whole = [{"train_loss": 0.7, "dev_roc_auc": 0.6, "replica_spread": 0.0, "seconds": 1.0} for _ in range(3)]
    later = copy.deepcopy(whole)
    later[2]["seconds"] = 2.0  # times may differ
    assert resume.figures(resumed(history=later, whole=whole)) is None
    later[2]["train_loss"] = 0.71
    assert resume.figures(resumed(history=later, whole=whole)) == (
        "after resuming, epoch 3's train loss is 0.71, where the uninterrupted run has 0.7: load the model's and the "
        "optimizer's state from the snapshot, and keep the reseed at the start of every epoch (checkpoint.seed_epoch)")
    assert resume.figures(resumed(history=later[:2], whole=whole)).startswith(
        "after resuming, metrics.json holds 2 epochs, the uninterrupted run's 3: keep the given "
        "checkpoint.restore_history line")
    assert resume.figures(case(step=4)) is None  # no later runs: nothing measured, nothing claimed
    assert "resumed at epoch 3" not in rules.passed(case(step=4))


def test_the_epochs_a_resumed_run_trained_come_from_set_epoch():
    said = ("the second run (--epochs 3 into the same --out) trained epoch(s) 1, 2, not epoch 3 alone: no rank loaded "
            "snapshot.pt (torch.load) when the run started")
    assert resume.epochs_trained(resumed(good_run())) == said
    assert resume.epochs_trained(resumed(changed({"kind": "set_epoch"}, drop=True))) == said  # else from the passes
    third = changed({"kind": "set_epoch", "epoch": 1}, drop=True, run=changed({"kind": "set_epoch", "epoch": 0},
                                                                                {"epoch": 2}))
    assert resume.epochs_trained(resumed(third)) is None


def test_waiting_in_is_the_call_a_rank_entered_and_never_left():
    assert waiting_in(cut(good_run(), 1, "backward", phase="enter").ranks[1])["kind"] == "backward"
    assert waiting_in(good_run().ranks[0]) is None


def test_the_scripts_text_says_where_a_line_is_and_what_ends_a_loop():
    assert source.function_at(SOURCE, CHECK) == "check_all_reduce"
    assert source.function_at(SOURCE, 1) is None
    assert branches.rank_exit(SOURCE) is None
    assert branches.rank_exit(SOURCE.replace(*BREAK)) == ("break", line("report.epoch(") + 2, "rank == 0",
                                                           line("if rank == 0:  # rank 0 alone evaluates"))
    assert source.destroy_outside_finally("try:\n    work()\nfinally:\n    dist.destroy_process_group()\n") is None
    assert source.destroy_outside_finally("work()\ndist.destroy_process_group()\n") == 2


# ----------------------------------------------------------------------------- issue 46: scopes, starts, one rank's value


def test_a_script_that_is_not_a_workshop_step_is_judged_by_the_rules_for_any_ddp_script():
    judged, left = rules.judged(case(step=None))
    assert "the same collectives in the same order on every rank" in judged
    assert "the shards: disjoint, covering, reshuffled each epoch (set_epoch)" in judged
    assert "the replicas are equal after every step (DDP wraps the model)" in judged
    assert "every rank leaves the group, in a finally" in judged
    assert "the data rules hold at 1 and 3 ranks too" in judged
    assert left[:6] == ["check_all_reduce's all-reduce leaves every rank the sum of what the ranks held",
                        "every rank loads the same split", "every rank reads the training data every epoch",
                        "rank 0 alone evaluates the whole dev set once an epoch, through the plain model",
                        "the files: model.pt in plain keys and metrics.json",
                        "setup, as rank 3 of 4 on a made-up node with 2 GPUs, makes its own GPU current and joins "
                        "with NCCL"]
    assert left[6] == "what rank 0 logs is the sum, or the mean, over every rank's batches"
    assert all(holds.startswith("step 4's ") for holds in left[7:]) and len(left) == 13  # its resume, 6 rows
    no_eval = changed({"kind": "evaluate"}, drop=True)
    no_eval = changed({"kind": "pass", "split": "dev"}, drop=True, run=no_eval)
    no_eval = changed({"kind": "fetched", "split": "dev"}, drop=True, run=no_eval)
    assert first(case(no_eval, step=None, metrics=None)) is None  # no "rank 0 never evaluated", no metrics.json
    assert first(case(no_eval, step=3)) == ("rank 0 never evaluated: score the model on the dev split every epoch, "
                                            "on global rank 0")
    probe = case(step=None)
    probe.reads = True
    assert [r.holds for r in rules.RULES if r.applies(probe)] == [
        "every rank joins one group, as its own rank, with the backend of its device",
        "every rank runs the script it was given (no TODO left open, no exit on its arguments)",
        "every rank runs to the end",
        "the shards: disjoint, covering, reshuffled each epoch (set_epoch)"]


def test_replicas_that_start_apart_are_named_with_the_seed_line_that_set_them_apart():
    seeded = line("torch.manual_seed(cfg.seed)")
    run = good_run()
    for r in range(WORLD):
        at = next(i for i, e in enumerate(run.ranks[r]) if e["kind"] == "ddp")
        run.ranks[r][at:at] = [ev("seed", seeded, seed=r), ev("weights", None, fp=f"w{r}", numel=3)]
    assert rules.same_start(case(run, step=2)) == (
        f"ranks 0 and 1 start from different weights (measured before the first optimizer step): torch.manual_seed at "
        f"line {seeded} (torch.manual_seed(cfg.seed)) seeds each rank with its own number, so each builds its own "
        "initial model; give every rank the same seed (DDP would broadcast rank 0's weights when it wraps the model, "
        "and this script has no DDP wrapper before its first step)")
    for r in range(WORLD):
        run.ranks[r] = [e for e in run.ranks[r] if e["kind"] != "weights"] + [ev("weights", None, fp="same", numel=3)]
    assert rules.same_start(case(run, step=2)) is None  # DDP's broadcast made them equal before the first step


def test_a_value_that_one_rank_received_and_every_rank_tests_is_named_though_nobody_left():
    text = SOURCE.replace("            dist.all_reduce(totals)  # summed over the ranks: the loss of the whole epoch, "
                          "every molecule\n", "            dist.reduce(totals, dst=0)\n            if totals[1] < 0:\n"
                          "                break\n")
    at = next(i for i, code in enumerate(text.splitlines(), 1) if "dist.reduce(" in code)
    run = changed({"kind": "collective", "name": "all_reduce", "line": TOTALS}, {"name": "reduce", "line": at})
    assert rules.one_rank_decides(case(run, source=text)) == (
        f"dist.reduce (line {at}) delivers totals to its dst rank alone, yet line {at + 1} (`totals[1] < 0`) decides "
        "from it on every rank: each other rank decides from its own value; use dist.all_reduce where every rank "
        "uses it")
    assert rules.one_rank_decides(case()) is None
