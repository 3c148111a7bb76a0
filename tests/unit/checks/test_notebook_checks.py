"""Each check passes the right exercise answer and names the mistake in a wrong one."""

from __future__ import annotations

import importlib.util
import re
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from tests.conftest import REPO
from workshop_lib.checks import baseline, common, ddp, group, sampler
from workshop_lib.train import BestModel

# ------------------------------------------------------------------ shards (in-process)

def sampler_ok(dataset, cfg, env):
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=cfg.seed)


def sampler_no_rank(dataset, cfg, env):
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=0, shuffle=True, seed=cfg.seed)


def sampler_no_replicas(dataset, cfg, env):
    return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)


def sampler_no_shuffle(dataset, cfg, env):
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=False)


def sampler_todo(dataset, cfg, env):
    raise NotImplementedError("fill in the TODO above")


def sampler_random(dataset, cfg, env):
    return torch.utils.data.RandomSampler(dataset)


def sampler_local_rank(dataset, cfg, env):
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=env.local_rank, shuffle=True, seed=cfg.seed)


def sampler_from_the_group(dataset, cfg, env):
    return DistributedSampler(dataset, shuffle=True, seed=cfg.seed)


def test_shards_pass_and_report_padding(capsys):
    sampler.shards(sampler_ok, n=11)
    assert "4 ranks (2 a node) x 3 items: disjoint shards covering all 11 (1 padded duplicate)" in capsys.readouterr().out


@pytest.mark.parametrize(("make", "message"), [
    (sampler_no_rank, "rank 1 got the same indices as rank 0: pass rank=env.rank"),
    (sampler_local_rank, "rank 2 (local rank 0) got the same indices as rank 0: pass the global rank"),
    (sampler_from_the_group, "make_sampler looked for a process group, and there is none here (torch: "
                             "Default process group has not been initialized)"),
    (sampler_no_replicas, "rank 0 got 11 of 11 items, expected 3"),
    (sampler_no_shuffle, "pass shuffle=True"),
    (sampler_random, "make_sampler returned a RandomSampler, which has no set_epoch: return a DistributedSampler"),
    (sampler_todo, "make_sampler still raises NotImplementedError"),
])
def test_shards_name_the_mistake(make, message):
    with pytest.raises(common.CheckFailed, match=re.escape(message)):
        sampler.shards(make, n=11)


def _step2_metrics(spreads=(0.0858, 0.145)):
    """A step-2 metrics.json of 2 ranks, 720 training molecules (6 steps of 64 per rank and epoch)."""
    return {"world_size": 2, "batch_size_per_process": 64, "config": {"lr": 0.008},
            "history": [{"epoch": e, "replica_spread": s, "samples_per_second": 720.0, "seconds": 1.0}
                        for e, s in enumerate(spreads)]}


@pytest.mark.parametrize(("predicted", "verdict"), [
    (None, "(no prediction to compare: set predicted_spread before the run)"),
    (0.05, "\N{CHECK MARK} you predicted 0.05: the right order of magnitude"),
    (0.0, "\N{BALLOT X} you predicted 0: the replicas stay equal only if every rank takes the same step"),
    (1e-5, "\N{BALLOT X} you predicted 1e-05, more than 10 times below the measured 0.0858"),
    (2.0, "\N{BALLOT X} you predicted 2, more than 10 times above the measured 0.0858"),
])
def test_spread_prediction_compares_and_says_why(predicted, verdict, capsys):
    sampler.spread_prediction(predicted, _step2_metrics())  # a wrong guess is said, not raised
    out = capsys.readouterr().out
    assert "differ by up to 0.0858 after epoch 1, 0.1450 after epoch 2" in out
    assert verdict in out
    assert "each rank took 6 AdamW steps in epoch 1" in out and "2 x 6 x 0.008 = 0.096" in out


def test_check_failed_renders_as_one_line():
    assert common.CheckFailed("pass rank=").__class__._render_traceback_(common.CheckFailed("pass rank=")) == [
        "\N{BALLOT X} pass rank="]


# ------------------------------------------------------------- all_reduce (2 forked ranks)

def reduce_ok(env):
    value = torch.tensor([env.rank + 1.0])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    assert value.item() == 3.0


def reduce_max(env):
    value = torch.tensor([env.rank + 1.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)


def reduce_rank_only(env):
    value = torch.tensor([float(env.rank)])
    dist.all_reduce(value)


def reduce_never(env):
    torch.tensor([env.rank + 1.0])


def reduce_only_rank0(env):
    if env.rank == 0:
        dist.all_reduce(torch.tensor([1.0]))


def reduce_rank0_while_rank1_sleeps(env):
    if env.rank == 0:
        dist.all_reduce(torch.tensor([1.0]))
    else:
        time.sleep(60)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_all_reduce_passes(capsys):
    group.all_reduce(reduce_ok)
    assert "each of 2 ranks contributed rank + 1, all_reduce(SUM) left 3 on every rank" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fn", "message"), [
    (reduce_max, "rank 0 used op=MAX"),
    (reduce_rank_only, r"rank 0 contributed \[0.0\], expected \[1.0\]"),
    (reduce_never, "no rank called dist.all_reduce"),
])
def test_all_reduce_names_the_mistake(fn, message):
    with pytest.raises(common.CheckFailed, match=message):
        group.all_reduce(fn)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_all_reduce_on_one_rank_only_is_a_hang_explained():
    with pytest.raises(common.CheckFailed, match=r"rank 1 never called dist\.all_reduce while other ranks did"):
        group.all_reduce(reduce_only_rank0, timeout=8)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_all_reduce_that_waits_for_a_rank_elsewhere_is_stopped_early_and_names_it(monkeypatch):
    monkeypatch.setattr(common, "HANG_AFTER", 3.0)  # the learner's checks wait 8 s; the diagnosis is the same
    here = r"tests/unit/checks/test_notebook_checks\.py"  # the hang watch's line: a timeout would say "did not finish"
    with pytest.raises(common.CheckFailed, match=rf"^rank 0 waits in all_reduce #1 \(called at {here}:\d+ in "
                       rf"reduce_rank0_while_rank1_sleeps\(\)\); rank 1 never joined it: it is in "
                       rf"reduce_rank0_while_rank1_sleeps\(\) at {here}:\d+: every rank must call "
                       rf"dist\.all_reduce, or the others wait for it$"):
        group.all_reduce(reduce_rank0_while_rank1_sleeps, timeout=60)


# --------------------------------------------- the step scripts' functions, with a mistake put in

def _solution(step: str, *edits: tuple[str, str]):
    """solutions/<step>.py, each ``(old, new)`` replaced once, loaded as a module (its main does not run)."""
    path = REPO / "solutions" / f"{step}.py"
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not in {path.name} exactly once: update the mistake"
        text = text.replace(old, new)
    name = f"mutated_{step}_{abs(hash(edits))}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    exec(compile(text, str(path), "exec"), module.__dict__)
    return module


# ------------------------------------------------------------------ 01: main (in-process, faked)

def test_process_group_passes(capsys):
    group.process_group(_solution("step1_process_group").main)
    assert "joined as rank 3 of 4 on the store; left the group even when the training raised" in capsys.readouterr().out


def test_process_group_of_the_unfilled_exercise_asks_for_the_todos():
    path = REPO / "exercises" / "step1_process_group.py"
    spec = importlib.util.spec_from_file_location("exercise_step1", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(common.CheckFailed, match="main still raises NotImplementedError: fill in its TODOs"):
        group.process_group(module.main)


@pytest.mark.parametrize(("edit", "message"), [
    (("rank=launch.rank,", "rank=launch.local_rank,"), "main joined with rank=1, its local rank"),
    (('torch.device("cuda", launch.local_rank)', 'torch.device("cuda", launch.rank)'),
     "main called torch.cuda.set_device with [3]: the global rank: make cuda:LOCAL_RANK this process's device"),
    (("torch.cuda.set_device(device)", "torch.cuda.set_device(launch.rank)"),
     "called torch.cuda.set_device with [3]: the global rank"),
    (('cfg.backend or ("nccl" if torch.cuda.is_available() else "gloo")', '"gloo"'),
     "on a node with 2 GPUs main joined with backend 'gloo': use 'nccl'"),
    (("    if device.type == \"cuda\":\n        torch.cuda.set_device(device)", "    torch.cuda.set_device(device)"),
     "on a machine without GPUs main picked cpu and called torch.cuda.set_device 1 time(s)"),
    (("    dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,\n"
      "                            timeout=timedelta(seconds=cfg.timeout))\n", ""),
     "main never called dist.init_process_group"),
    (("    finally:\n        dist.destroy_process_group()", "    finally:\n        pass\n    dist.destroy_process_group()"),
     "when the training raised, main called dist.destroy_process_group 0 time(s)"),
])
def test_process_group_names_the_mistake(edit, message):
    with pytest.raises(common.CheckFailed, match=re.escape(message)):
        group.process_group(_solution("step1_process_group", edit).main)


# ------------------------------------------------------ 02 and 03: train on 2 forked ranks

SET_EPOCH = "        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("edits", "message"), [
    ((), None),
    (((SET_EPOCH, ""),), "sampler.set_epoch is never called"),
    (((SET_EPOCH, ""), ("        stats = train_epoch(model, train_loader, optimizer, env.device, bar)\n",
                        "        stats = train_epoch(model, train_loader, optimizer, env.device, bar)\n" + SET_EPOCH)),
     "in epoch 2 the loader read the sampler while it was still set to epoch 0"),
    ((("rank=env.rank, shuffle", "rank=env.local_rank, shuffle"),), "ranks 0 and 1 all read shard 0"),
])
def test_epoch_loop(edits, message, capsys):
    train = _solution("step2_sampler", *edits).train
    if message is None:
        sampler.epoch_loop(train)
        assert "the sampler was read in epochs [0, 1], each after its set_epoch" in capsys.readouterr().out
    else:
        with pytest.raises(common.CheckFailed, match=re.escape(message)):
            sampler.epoch_loop(train)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("edits", "message"), [
    ((), None),
    ((("        if env.is_main:  # only rank 0 evaluates", "        if True:  #"),), "rank 1 evaluated too"),
    ((("    if env.is_main:\n        torch.save(", "    if env.local_rank == 0:\n        torch.save("),),
     "ranks 0 and 1 all saved model.pt"),
    ((("dev_auc = evaluate(raw_model,", "dev_auc = evaluate(model,"),), "rank 0 evaluated the DDP wrapper"),
    ((("torch.save(raw_model.state_dict()", "torch.save(model.state_dict()"),), "their keys start with 'module.'"),
    ((("return total.item() / env.world_size", "return total.item()"),), "mean_over_ranks returned the sum"),
])
def test_rank0_duties(edits, message, capsys):
    train = _solution("step3_ddp", *edits).train
    if message is None:
        ddp.rank0_duties(train)
        assert "only global rank 0 evaluated and saved" in capsys.readouterr().out
    else:
        with pytest.raises(common.CheckFailed, match=re.escape(message)):
            ddp.rank0_duties(train)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rank0_duties_names_a_rank_that_skips_a_collective_without_waiting_for_the_timeout(monkeypatch):
    monkeypatch.setattr(common, "HANG_AFTER", 3.0)  # the learner's checks wait 8 s; the diagnosis is the same
    skip = ("        stats = replace(stats, loss=mean_over_ranks(",
            "        if env.is_main:\n            stats = replace(stats, loss=mean_over_ranks(")
    train = _solution("step3_ddp", skip).train
    with pytest.raises(common.CheckFailed) as err:  # the hang watch's line (a timeout would say "did not finish")
        ddp.rank0_duties(train)
    # both ranks wait (rank 0 in the all_reduce, rank 1 in the next all_gather): the first to notice speaks
    source = (REPO / "solutions" / "step3_ddp.py").read_text().splitlines()
    reduce_at, gather_at = (1 + next(i for i, line in enumerate(source) if call in line)
                            for call in ("dist.all_reduce(total", "dist.all_gather(everyone"))
    assert re.fullmatch(
        rf"rank (0 waits in all_reduce #2 \(called at solutions/step3_ddp\.py:{reduce_at} in mean_over_ranks\(\).*\); "
        rf"rank 1 never joined it: it is in all_gather #2|1 waits in all_gather #2 \(called at solutions/step3_ddp\.py:"
        rf"{gather_at} in replica_spread\(\).*\); rank 0 never joined it: it is in all_reduce #2).*: every rank must "
        r"call every collective, in the same order, or the others wait for it", str(err.value)), str(err.value)


# ------------------------------------------------------------------ 03: DDP (2 forked ranks)

def wrap_ok(model, env):
    return DDP(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)


def wrap_nothing(model, env):
    return model


def wrap_todo(model, env):
    raise NotImplementedError


def wrap_always_ids(model, env):
    return DDP(model, device_ids=[env.local_rank])


def wrap_global_rank(model, env):
    return DDP(model, device_ids=[env.rank] if env.device.type == "cuda" else None)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_wrap_passes(capsys):
    ddp.ddp_wrap(wrap_ok)
    assert "DDP made them equal" in capsys.readouterr().out


@pytest.mark.parametrize(("fn", "message"), [
    (wrap_nothing, "wrap did not return DistributedDataParallel around the model"),
    (wrap_todo, "wrap still raises NotImplementedError"),
    (wrap_always_ids, "wrap gave device_ids=[1] for a CPU model"),
    (wrap_global_rank, "as rank 3 of 4 (local rank 1) on a GPU, wrap gave device_ids=[3], the global rank"),
])
def test_ddp_wrap_names_the_mistake(fn, message):
    with pytest.raises(common.CheckFailed, match=re.escape(message)):
        ddp.ddp_wrap(fn)


@pytest.mark.parametrize(("predicted", "verdict"), [
    (None, "measured 1.50x (no prediction to compare: set predicted_speedup before the run)"),
    (1.6, "\N{CHECK MARK} you predicted 1.60x, measured 1.50x: within 0.25"),
    (2.0, "\N{BALLOT X} you predicted 2.00x, measured 1.50x: less, since every step ends with an all-reduce"),
    (1.0, "\N{BALLOT X} you predicted 1.00x, measured 1.50x: more, since each process computes half"),
])
def test_speedup_prediction_compares_and_says_why(predicted, verdict, capsys):
    ddp.speedup_prediction(predicted, {1: 1000.0, 2: 1500.0})  # a wrong guess is said, not raised
    assert verdict in capsys.readouterr().out


def by_hand_ok(model, env):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= env.world_size


def by_hand_summed(model, env):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def by_hand_nothing(model, env):
    pass


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fn", "message"), [
    (by_hand_ok, None),
    (by_hand_summed, "rank 0's gradients are the sum over the ranks, not the mean"),
    (by_hand_nothing, "rank 0's gradients are its own batch's alone: all-reduce every p.grad"),
])
def test_average_gradients(fn, message, capsys):
    if message is None:
        ddp.average_gradients(fn)
        assert "the weights match DDP's on all 2 ranks" in capsys.readouterr().out
    else:
        with pytest.raises(common.CheckFailed, match=re.escape(message)):
            ddp.average_gradients(fn)


# ------------------------------------------------------------ train loop (in-process)

def _loop_train(body):
    """A step-0 train() whose epoch loop body is ``body``."""
    from workshop_lib.data import load_splits, make_eval_loader, make_loader
    from workshop_lib.report import Reporter
    from workshop_lib.train import build_model, build_optimizer, evaluate, train_epoch

    def train(cfg, device):
        torch.manual_seed(cfg.seed)
        splits = load_splits(cfg.data, limit=cfg.limit)
        report = Reporter(cfg, "step0_baseline", device)
        loader = make_loader(splits.train, torch.utils.data.RandomSampler(splits.train), cfg.batch_size)
        dev = make_eval_loader(splits.dev)
        model = build_model(cfg, len(splits.tokenizer))
        opt = build_optimizer(cfg, model)
        best = BestModel()
        for epoch in range(cfg.epochs):
            body(epoch, model, loader, dev, opt, device, best, report, train_epoch, evaluate)
        best.restore(model)
        return report.finish(best, evaluate(model, make_eval_loader(splits.heldout), device))
    return train


def body_ok(epoch, model, loader, dev, opt, device, best, report, train_epoch, evaluate):
    stats = train_epoch(model, loader, opt, device)
    auc = evaluate(model, dev, device)
    best.update(epoch, auc, model)
    report.epoch(epoch, stats, auc)


def body_no_best(epoch, model, loader, dev, opt, device, best, report, train_epoch, evaluate):
    stats = train_epoch(model, loader, opt, device)
    report.epoch(epoch, stats, evaluate(model, dev, device))


def body_no_report(epoch, model, loader, dev, opt, device, best, report, train_epoch, evaluate):
    train_epoch(model, loader, opt, device)
    best.update(epoch, evaluate(model, dev, device), model)


@pytest.mark.timeout(120)
def test_train_loop_passes(capsys):
    baseline.train_loop(_loop_train(body_ok))
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} train ran 2 epochs")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("body", "message"), [
    (body_no_best, "call best.update"),
    (body_no_report, "0 epochs were reported"),
])
def test_train_loop_names_the_mistake(body, message):
    with pytest.raises(common.CheckFailed, match=message):
        baseline.train_loop(_loop_train(body))


# ----------------------------------------------------------------- torchrun results

class _Result(dict):
    def __init__(self, metrics, output):
        super().__init__(metrics)
        self.output = output


def test_sharded_run_checks_each_rank_and_the_drift(capsys):
    lines = ["[rank 0] rank 0: 144 of 288 training molecules per epoch",
             "[rank 1] rank 1: 144 of 288 training molecules per epoch"]
    sampler.sharded_run(_Result({"replica_spread": 0.02}, lines))
    assert "144 of 288" in capsys.readouterr().out
    with pytest.raises(common.CheckFailed, match="rank 1 trained on 288 of 288"):
        sampler.sharded_run(_Result({"replica_spread": 0.02}, [lines[0], "[rank 1] rank 1: 288 of 288 training molecules"]))
    with pytest.raises(common.CheckFailed, match="should drift apart"):
        sampler.sharded_run(_Result({"replica_spread": 0.0}, lines))
