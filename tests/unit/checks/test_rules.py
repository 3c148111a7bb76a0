"""The rules of :mod:`workshop_lib.checks.rules` on records made by hand: two ranks, each mistake named in its line.

The records have the shape :mod:`workshop_lib.checks.record` and :func:`workshop_lib.checks.rank.run_script`
give them: one dict an event, ``kind`` and ``line`` first. A correct run of each step script is built
event by event, then one mistake is put into it; nothing is started.
"""

from __future__ import annotations

import copy

import pytest

from workshop_lib.checks import rules, step_rules

WORLD = 2
LOSS = {0: 1.0, 1: 3.0}  # each rank's value for mean_over_ranks: the mean is 2, the sum 4
# The learner's lines of each call, so that every "(line N)" of a message is checked too.
INIT, ALL_REDUCE, SAMPLER, DDP, MEAN, GATHER, SET_EPOCH, READ, EVAL, SAVE, DESTROY = \
    12, 30, 40, 45, 55, 50, 60, 61, 70, 80, 90
UNINITIALISED = "Default process group has not been initialized, please make sure to call init_process_group."


# ----------------------------------------------------------------------------- events


def ev(kind: str, line: int | None = None, **data) -> dict:
    return {"kind": kind, "line": line, **data}


def collective(name: str, line: int, op: str | None = None, before: list | None = None) -> list[dict]:
    return [ev("collective", line, name=name, phase="enter", op=op, before=before),
            ev("collective", line, name=name, phase="exit", after=before)]


def failed(error: str, message: str, at: int | None = None) -> dict:
    return ev("end", ok=False, error=error, message=message, at=at)


def joined(rank: int) -> list[dict]:
    return [ev("start", pid=1000 + rank),
            ev("init", INIT, backend="gloo", rank=rank, world_size=WORLD, phase="enter"), ev("init", INIT, phase="exit")]


def epoch(rank: int, number: int, step: int) -> list[dict]:
    events = [ev("set_epoch", SET_EPOCH, epoch=number), ev("read_sampler", READ, epoch=number)]
    if step == 3:
        events += [*collective("all_reduce", MEAN, "SUM", [LOSS[rank]]),
                   ev("call", MEAN, name="mean_over_ranks", args=[LOSS[rank], None], ops=["SUM"], result=2.0)]
    events += collective("all_gather", GATHER)
    if step == 3 and rank == 0:
        events.append(ev("evaluate", EVAL, model="SmilesLSTM"))
    return events


def step_run(step: int) -> dict[int, list[dict]]:
    """What each rank of a correct step script records."""
    ranks = {}
    for rank in range(WORLD):
        events = joined(rank)
        if step == 1:
            events += collective("all_reduce", ALL_REDUCE, "SUM", [rank + 1.0])
        else:
            events += [ev("sampler", SAMPLER, num_replicas=WORLD, rank=rank, group=True),
                       ev("sampler_made", SAMPLER, num_replicas=WORLD, rank=rank, shuffle=True)]
        if step == 3:
            events.append(ev("ddp", DDP, device_ids=None, devices=["cpu"]))
        if step > 1:
            events += [*epoch(rank, 0, step), *epoch(rank, 1, step)]
        if step == 3 and rank == 0:
            events.append(ev("save", SAVE, path="/tmp/ddp-check-1/out0/model.pt", rank=0,
                             keys=["embedding.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0"]))
        ranks[rank] = [*events, ev("destroy", DESTROY, args=[]), ev("end", ok=True, replica_spread=0.0)]
    return ranks


def _is(event: dict, kind: str, match: dict) -> bool:
    return event["kind"] == kind and all(event.get(k) == v for k, v in match.items())


def drop(ranks: dict, kind: str, on: tuple[int, ...] = (0, 1), **match) -> dict:
    """A copy of ``ranks`` without the events of ``kind`` (and ``match``) of the ranks ``on``."""
    return {r: [e for e in events if r not in on or not _is(e, kind, match)] for r, events in ranks.items()}


def edit(ranks: dict, kind: str, changes: dict, on: tuple[int, ...] = (0, 1), **match) -> dict:
    """A copy of ``ranks`` whose events of ``kind`` (and ``match``) on the ranks ``on`` get ``changes``."""
    ranks = copy.deepcopy(ranks)
    for r in on:
        for event in ranks[r]:
            if _is(event, kind, match):
                event.update(changes)
    return ranks


def ending(ranks: dict, end: dict, on: tuple[int, ...] = (0, 1)) -> dict:
    """A copy of ``ranks`` whose ranks ``on`` ended with ``end`` instead (no destroy: they raised)."""
    ranks = drop(ranks, "destroy", on)
    return {r: [e for e in events if r not in on or e["kind"] != "end"] + [end] * (r in on) for r, events in ranks.items()}


def cut(ranks: dict, kind: str, on: tuple[int, ...] = (0, 1), nth: int = 0, **match) -> dict:
    """A copy of ``ranks`` whose ranks ``on`` stopped before their ``nth`` event of ``kind`` (still waiting there)."""
    ranks = copy.deepcopy(ranks)
    for r in on:
        stop = [i for i, e in enumerate(ranks[r]) if _is(e, kind, match)][nth]
        ranks[r] = ranks[r][:stop]
    return ranks


def no_sampler(ranks: dict) -> dict:
    """A copy of ``ranks`` that never built a DistributedSampler (so never set or read one)."""
    for kind in ("sampler", "sampler_made", "set_epoch", "read_sampler"):
        ranks = drop(ranks, kind)
    return ranks


STEP1, STEP2, STEP3 = step_run(1), step_run(2), step_run(3)


# ----------------------------------------------------------------------------- correct runs


@pytest.mark.parametrize("step", [1, 2, 3])
def test_a_correct_run_breaks_none_of_its_steps_rules(step):
    ranks = step_run(step)
    found = {rule.__name__: rule(ranks, world_size=WORLD, epochs=2) for rule in rules.RULES[step]}
    assert found == dict.fromkeys(found)
    assert rules.stalled(ranks) is None
    assert rules.first_mistake(step, ranks, world_size=WORLD, epochs=2, timed_out=True) is None


# ----------------------------------------------------------------------------- each rule's mistakes


def test_open_todo_names_the_line_that_raises():
    for at, where in ((75, " at line 75"), (None, "")):
        ranks = ending(STEP1, failed("NotImplementedError", "fill in the TODO above", at=at), on=(1,))
        assert rules.open_todo(ranks) == f"a TODO is still open{where}: fill it in (its line raises NotImplementedError)"


def test_device_choice_wants_set_device_only_on_gpus():
    ranks = {r: [*events[:1], ev("set_device", 20, args=["cuda:0"]), *events[1:]] for r, events in STEP1.items()}
    assert rules.device_choice(ranks, cuda=True) is None
    assert rules.device_choice(ranks) == ("rank 0 called torch.cuda.set_device (line 20) on a machine without GPUs: "
                                          "call it only when the device is a GPU")


@pytest.mark.parametrize(("ranks", "cuda", "expected"), [
    (ending(drop(drop(STEP1, "init"), "collective"), failed("ValueError", UNINITIALISED, at=66)), False,
     "rank 0 used the process group before joining it (torch: Default process group has not been initialized) "
     "(line 66): call dist.init_process_group first, in main"),
    (drop(STEP1, "init", on=(1,)), False,
     "rank 1 never called dist.init_process_group: the processes never formed a group; join it in main before training"),
    (edit(STEP1, "init", {"backend": "nccl"}, phase="enter"), False,
     "rank 0 joined with backend nccl (line 12) on a machine without GPUs: use gloo (CPU tensors)"),
    (STEP1, True, "rank 0 joined with backend gloo (line 12) on GPUs: use nccl (CUDA tensors)"),
    (edit(STEP1, "init", {"world_size": 1}, on=(1,), phase="enter"), False,
     "rank 1 passed world_size=1 to init_process_group (line 12), but 2 processes were started: pass the launch's "
     "world size"),
    (edit(STEP1, "init", {"rank": 0}, phase="enter"), False,
     "ranks 0 and 1 all joined as rank 0 (init_process_group at line 12 got rank=0): pass the global rank "
     "(launch.rank); the local rank repeats on every node"),
], ids=["never_initialised", "never_joined", "nccl_on_cpu", "gloo_on_gpus", "world_size", "local_rank"])
def test_joining_names_how_a_rank_joined_wrongly(ranks, cuda, expected):
    assert rules.joining(ranks, world_size=WORLD, cuda=cuda) == expected


def test_joining_accepts_the_standard_line():
    """init_process_group(backend): no rank= or world_size= (env://, torch reads RANK and WORLD_SIZE itself)."""
    standard = edit(STEP1, "init", {"rank": None, "world_size": None}, phase="enter")
    assert rules.joining(standard, world_size=WORLD) is None
    assert rules.first_mistake(1, standard, world_size=WORLD, epochs=2) is None


def _sampler_before_group() -> dict:
    """A DistributedSampler built before init_process_group, without its place: torch raises, no rank joins."""
    early = [ev("start"), ev("sampler", 33, num_replicas=None, rank=None, group=False),
             failed("ValueError", UNINITIALISED, at=33)]
    return {r: copy.deepcopy(early) for r in range(WORLD)}


@pytest.mark.parametrize(("ranks", "expected"), [
    (_sampler_before_group(),
     "the DistributedSampler (line 33) was built before the process group existed (torch: Default process group has "
     "not been initialized): build it after init_process_group, or tell it this rank's place with num_replicas= and "
     "rank="),
    (no_sampler(STEP2),
     "no rank built a DistributedSampler: every rank trains on all the data; give each rank its own shard "
     "(torch.utils.data.distributed.DistributedSampler)"),
    (edit(STEP2, "sampler_made", {"num_replicas": 1, "rank": 0}),
     "rank 0's DistributedSampler splits the data into 1 shard(s) (line 40), but 2 processes train: pass the world "
     "size as num_replicas"),
    (edit(STEP2, "sampler_made", {"rank": 0}),
     "ranks 0 and 1 all read shard 0 of the DistributedSampler (line 40): pass this process's global rank (env.rank) "
     "as rank; the local rank repeats on every node"),
    (edit(edit(STEP2, "sampler_made", {"rank": 1}, on=(0,)), "sampler_made", {"rank": 0}, on=(1,)),
     "rank 0 read shard 1 (line 40): pass this process's global rank (env.rank) as rank"),
], ids=["before_group", "none_built", "one_replica", "local_rank", "swapped"])
def test_sharding_names_a_wrong_sampler(ranks, expected):
    assert step_rules.sharding(ranks, world_size=WORLD) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    (edit(drop(STEP2, "set_epoch"), "read_sampler", {"epoch": 0}),  # a sampler left at epoch 0
     "sampler.set_epoch is never called: epoch 2 reads the same order as epoch 1 (line 61); call it with the epoch "
     "number in every epoch, before the loader is read"),
    (edit(STEP2, "read_sampler", {"epoch": 0}),  # set_epoch(epoch) after the epoch's reading
     "in epoch 2 the loader read the sampler while it was still set to epoch 0 (line 61): call sampler.set_epoch(epoch) "
     "before the loader is read, not after"),
], ids=["never_set", "set_after_reading"])
def test_reshuffling_wants_set_epoch_before_each_read(ranks, expected):
    assert step_rules.reshuffling(ranks, epochs=2) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    (edit(drop(STEP3, "ddp"), "end", {"replica_spread": 0.0123}),
     "rank 0 never wrapped its model in DistributedDataParallel: each replica follows its own gradients and they drift "
     "apart (replica_spread 0.0123); wrap the model (torch.nn.parallel)"),
    (ending(drop(drop(STEP3, "ddp"), "evaluate"), failed("AttributeError", "'SmilesLSTM' object has no attribute 'module'",
                                                        at=64)),
     "rank 0 never wrapped its model in DistributedDataParallel: each replica follows its own gradients and they drift "
     "apart; wrap the model (torch.nn.parallel)"),
    (edit(STEP3, "ddp", {"device_ids": [0]}),
     "rank 0 passed device_ids=[0] for a CPU model (line 45): device_ids names a GPU; give none on CPU, and "
     "[env.local_rank] on a GPU"),
], ids=["unwrapped", "unwrapped_then_module", "device_ids_on_cpu"])
def test_wrapping_names_a_missing_or_wrong_wrap(ranks, expected):
    assert step_rules.wrapping(ranks) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    ({0: STEP3[0], 1: STEP3[0]},
     "rank 1 evaluated too (line 70): every rank scores the same replica on the whole dev set, N times the work; "
     "evaluate on global rank 0 only (env.is_main)"),
    (edit(STEP3, "evaluate", {"model": "DistributedDataParallel"}),
     "rank 0 evaluated the DDP wrapper (line 70): evaluate the plain model inside it (raw_model = model.module), which "
     "every rank holds the same"),
    (drop(STEP3, "evaluate"), "rank 0 never evaluated: score the model on the dev split every epoch, on global rank 0"),
], ids=["every_rank", "the_wrapper", "never"])
def test_evaluating_wants_rank_0_to_score_the_plain_model(ranks, expected):
    assert step_rules.evaluating(ranks) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    ({0: STEP3[0], 1: STEP3[0]},
     "ranks 0 and 1 all saved model.pt (line 80): one file for the job, written by global rank 0 only (env.is_main); "
     "local rank 0 exists on every node"),
    ({0: STEP3[1], 1: STEP3[0]}, "rank 1 saved (line 80): save from global rank 0 only (env.is_main)"),
    (edit(STEP3, "save", {"keys": ["module.embedding.weight", "module.lstm.weight_ih_l0"]}),
     "rank 0 saved the DDP wrapper's weights (line 80): their keys start with 'module.' (module.embedding.weight); "
     "save raw_model.state_dict(), the plain model's"),
    (drop(STEP3, "save"),
     "nothing was saved with torch.save: save the best weights to cfg.out / 'model.pt' on global rank 0"),
], ids=["every_rank", "rank_1", "the_wrapper", "nothing"])
def test_saving_wants_one_file_of_plain_weights_from_rank_0(ranks, expected):
    assert step_rules.saving(ranks) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    (edit(STEP3, "call", {"result": 4.0}),
     "mean_over_ranks returned the sum 4, not the mean 2: divide the all-reduced sum by the world size (2)"),
    (edit(STEP3, "call", {"result": 3.0, "ops": ["MAX"]}),
     "mean_over_ranks all-reduced with op=MAX: rank 0 got 3 instead of the mean 2; sum with ReduceOp.SUM, then divide "
     "by the world size"),
    ({r: [e if e["kind"] != "call" else {**e, "result": LOSS[r], "ops": []} for e in events]
      for r, events in STEP3.items()},  # no all-reduce: each rank's own value
     "mean_over_ranks returned 1 on rank 0, not the mean over the ranks 2"),
    (drop(STEP3, "call"),
     "mean_over_ranks is never called: the log line's loss is rank 0's shard alone; average it over the ranks"),
], ids=["sum", "max", "own_value", "never"])
def test_averaging_wants_the_mean_on_every_rank(ranks, expected):
    assert step_rules.averaging(ranks, world_size=WORLD) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    (edit(STEP1, "collective", {"op": "MAX"}, phase="enter"),
     "rank 0 used op=MAX (line 30): summing needs op=dist.ReduceOp.SUM"),
    (edit(STEP1, "collective", {"before": [1.0]}, on=(1,), phase="enter"),
     "rank 1 contributed [1.0] (line 30), expected [2.0]: each rank contributes its rank + 1"),
], ids=["max", "wrong_value"])
def test_summing_wants_rank_plus_one_summed(ranks, expected):
    assert step_rules.summing(ranks) == expected


@pytest.mark.parametrize(("ranks", "expected"), [
    (drop(STEP1, "collective", on=(1,)),
     "rank 1 skipped the all_reduce that rank 0 called at line 30: every rank must call every collective, or the "
     "others wait for it until the timeout"),
    (edit(STEP1, "collective", {"name": "barrier", "line": 33}, on=(1,)),
     "rank 1 skipped the all_reduce that rank 0 called at line 30 (it called barrier (line 33) instead): every rank "
     "must call every collective, or the others wait for it until the timeout"),
    (cut(STEP2, "collective", on=(0,), name="all_gather"),  # the longer record is rank 1's
     "rank 0 skipped the all_gather that rank 1 called at line 50: every rank must call every collective, or the "
     "others wait for it until the timeout"),
], ids=["missing", "another_one", "rank_0_skips"])
def test_skipped_collective_names_who_skipped_what(ranks, expected):
    assert rules.skipped_collective(ranks) == expected


def test_crashed_names_the_rank_that_raised_not_the_peer_that_lost_it():
    lost = failed("DistBackendError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")
    peer_lost = ending(STEP1, lost, on=(0,))
    assert rules.crashed(peer_lost) is None
    both = ending(peer_lost, failed("ValueError", "could not convert string to float: 'x'", at=33), on=(1,))
    assert rules.crashed(both) == "rank 1 raised ValueError (line 33): could not convert string to float: 'x'"


def test_leaving_wants_every_rank_that_finished_to_destroy_the_group():
    assert rules.leaving(drop(STEP1, "destroy", on=(1,))) == (
        "rank 1 never called dist.destroy_process_group: leave the group in a finally after the work, so it happens "
        "even after an error")


def test_stalled_names_where_each_unfinished_rank_waits():
    ranks = {0: cut(STEP2, "collective", on=(0,), name="all_gather", phase="exit")[0], 1: []}
    assert rules.stalled(ranks) == ("the ranks stopped making progress (rank 0 in all_gather (line 50); rank 1 in "
                                    "starting): look for a collective that not every rank reaches")


# ----------------------------------------------------------------------------- what the rules leave alone


@pytest.mark.parametrize(("rule", "ranks", "kwargs"), [
    # A rank that made a sampler too early did not forget to join: sharding names it.
    (rules.joining, _sampler_before_group(), {}),
    # A rank still starting (no events yet) has not joined wrongly.
    (rules.joining, {0: STEP1[0][:3], 1: []}, {}),
    # A run that crashed before training: no sampler is not the mistake.
    (step_rules.sharding, ending(no_sampler(STEP2), failed("KeyError", "'smiles'", at=50)), {}),
    # A rank that crashed in its first epoch read the sampler too few times to judge.
    (step_rules.reshuffling, cut(edit(drop(STEP2, "set_epoch"), "read_sampler", {"epoch": 0}), "read_sampler", nth=1),
     {"epochs": 2}),
    # device_ids name the GPU on GPUs.
    (step_rules.wrapping, edit(STEP3, "ddp", {"device_ids": [0]}), {"cuda": True}),
    # Values the record could not read (tensors) are not judged, nor a run that never finished.
    (step_rules.averaging, edit(STEP3, "call", {"args": [None, None], "result": 4.0}), {}),
    (step_rules.averaging, ending(drop(STEP3, "call"), failed("RuntimeError", "boom")), {}),
    # A rank that raised never reached its destroy_process_group: crashed names that.
    (rules.leaving, ending(STEP1, failed("RuntimeError", "boom"), on=(1,)), {}),
], ids=["joining_early_sampler", "joining_starting", "sharding_crashed_early", "reshuffling_one_epoch",
        "wrapping_gpu_ids", "averaging_tensors", "averaging_unfinished", "leaving_crashed"])
def test_a_rule_says_nothing_where_its_lesson_does_not_apply(rule, ranks, kwargs):
    assert rule(ranks, **kwargs) is None


# ----------------------------------------------------------------------------- the verdict: root causes first


def _both_joined_as_0_and_wait() -> dict:
    """Both ranks joined as rank 0; rank 0 waits in the all_reduce, rank 1 never got there. Stopped at once."""
    ranks = edit(STEP1, "init", {"rank": 0}, phase="enter")
    return cut(cut(ranks, "collective", on=(0,), phase="exit"), "collective", on=(1,))


@pytest.mark.parametrize(("step", "ranks", "timed_out", "expected"), [
    # The wrong join, not the collective rank 1 then skipped, nor the stall.
    (1, _both_joined_as_0_and_wait(), True, "ranks 0 and 1 all joined as rank 0"),
    # The sampler built too early, not the group that was never joined.
    (2, _sampler_before_group(), False, "the DistributedSampler (line 33) was built before the process group existed"),
    # The rank that raised, not the collective it never reached.
    (1, ending(cut(cut(STEP1, "collective", on=(0,), phase="exit"), "collective", on=(1,)),
               failed("ValueError", "bad value", at=28), on=(1,)), True,
     "rank 1 raised ValueError (line 28): bad value"),
    # The open TODO, not the NotImplementedError as a crash, nor the peer that lost contact because of it.
    (1, ending(ending(STEP1, failed("RuntimeError", "Connection reset by peer"), on=(0,)),
               failed("NotImplementedError", "fill in the TODO above", at=75), on=(1,)), False,
     "a TODO is still open at line 75"),
], ids=["join_before_skip", "sampler_before_join", "crash_before_skip", "todo_before_crash"])
def test_verdict_names_the_root_cause_first(step, ranks, timed_out, expected):
    got = rules.first_mistake(step, ranks, world_size=WORLD, epochs=2, timed_out=timed_out)
    assert got is not None and got.startswith(expected), got


def test_verdict_names_a_stall_only_when_the_run_was_stopped():
    waiting = cut(STEP1, "collective", phase="exit")  # both ranks in the same all_reduce: nothing else is wrong
    assert rules.first_mistake(1, waiting, timed_out=False) is None
    assert rules.first_mistake(1, waiting, timed_out=True) == (
        "the ranks stopped making progress (rank 0 in all_reduce (line 30); rank 1 in all_reduce (line 30)): look for "
        "a collective that not every rank reaches")


def test_verdict_checks_the_lessons_of_its_own_step():
    unwrapped = drop(STEP3, "ddp")
    assert rules.first_mistake(2, unwrapped) is None  # step 2 has no DDP yet
    assert rules.first_mistake(1, no_sampler(STEP2)) is None  # nor step 1 a sampler
    assert rules.first_mistake(2, no_sampler(STEP2)).startswith("no rank built a DistributedSampler")
    assert rules.first_mistake(3, unwrapped).startswith("rank 0 never wrapped its model in DistributedDataParallel")
    # Step 3's all_reduce sums the losses, not rank + 1: step 1's summing is not one of its rules.
    assert step_rules.summing(STEP3) == ("rank 1 contributed [3.0] (line 55), expected [2.0]: each rank contributes "
                                         "its rank + 1")
    assert rules.first_mistake(3, STEP3) is None
