"""Each check passes the right exercise answer and names the mistake in a wrong one."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from workshop_lib import checks
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


def indices_ok(sampler, epoch):
    sampler.set_epoch(epoch)
    return list(sampler)


def indices_no_epoch(sampler, epoch):
    return list(sampler)


def test_shards_pass_and_report_padding(capsys):
    checks.shards(sampler_ok, indices_ok, n=11)
    assert "2 ranks x 6 items: disjoint shards covering all 11 (1 padded duplicate)" in capsys.readouterr().out


@pytest.mark.parametrize(("make", "indices", "message"), [
    (sampler_no_rank, indices_ok, "rank 1 got the same indices as rank 0: pass rank=env.rank"),
    (sampler_no_replicas, indices_ok, "rank 0 got 11 of 11 items, expected 6"),
    (sampler_no_shuffle, indices_ok, "pass shuffle=True"),
    (sampler_ok, indices_no_epoch, "the order is the same in epoch 0 and 1: call sampler.set_epoch"),
    (sampler_todo, indices_ok, "make_sampler still raises NotImplementedError"),
])
def test_shards_name_the_mistake(make, indices, message):
    with pytest.raises(checks.CheckFailed, match=message.replace("(", r"\(").replace(")", r"\)")):
        checks.shards(make, indices, n=11)


def test_check_failed_renders_as_one_line():
    assert checks.CheckFailed("pass rank=").__class__._render_traceback_(checks.CheckFailed("pass rank=")) == [
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


@pytest.mark.timeout(120)
def test_all_reduce_passes(capsys):
    checks.all_reduce(reduce_ok)
    assert "each of 2 ranks contributed rank + 1, all_reduce(SUM) left 3 on every rank" in capsys.readouterr().out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fn", "message"), [
    (reduce_max, "rank 0 used op=MAX"),
    (reduce_rank_only, r"rank 0 contributed \[0.0\], expected \[1.0\]"),
    (reduce_never, "no rank called dist.all_reduce"),
])
def test_all_reduce_names_the_mistake(fn, message):
    with pytest.raises(checks.CheckFailed, match=message):
        checks.all_reduce(fn)


@pytest.mark.timeout(120)
def test_all_reduce_on_one_rank_only_is_a_hang_explained():
    with pytest.raises(checks.CheckFailed, match=r"rank 1 never called dist\.all_reduce while other ranks did"):
        checks.all_reduce(reduce_only_rank0, timeout=8)


# ------------------------------------------------------------------ DDP (2 forked ranks)

def wrap_ok(model, env):
    return DDP(model)


def wrap_nothing(model, env):
    return model


def wrap_todo(model, env):
    raise NotImplementedError


@pytest.mark.timeout(120)
def test_ddp_wrap_passes(capsys):
    checks.ddp_wrap(wrap_ok)
    assert "DDP made them equal" in capsys.readouterr().out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fn", "message"), [
    (wrap_nothing, "wrap returned a SmilesLSTM, not a DistributedDataParallel"),
    (wrap_todo, "wrap still raises NotImplementedError"),
])
def test_ddp_wrap_names_the_mistake(fn, message):
    with pytest.raises(checks.CheckFailed, match=message):
        checks.ddp_wrap(fn)


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
    checks.train_loop(_loop_train(body_ok))
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} train ran 2 epochs")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("body", "message"), [
    (body_no_best, "call best.update"),
    (body_no_report, "0 epochs were reported"),
])
def test_train_loop_names_the_mistake(body, message):
    with pytest.raises(checks.CheckFailed, match=message):
        checks.train_loop(_loop_train(body))


# ----------------------------------------------------------------- torchrun results

class _Result(dict):
    def __init__(self, metrics, output):
        super().__init__(metrics)
        self.output = output


def test_sharded_run_checks_each_rank_and_the_drift(capsys):
    lines = ["[rank 0] rank 0: 144 of 288 training molecules per epoch",
             "[rank 1] rank 1: 144 of 288 training molecules per epoch"]
    checks.sharded_run(_Result({"replica_spread": 0.02}, lines))
    assert "144 of 288" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="rank 1 trained on 288 of 288"):
        checks.sharded_run(_Result({"replica_spread": 0.02}, [lines[0], "[rank 1] rank 1: 288 of 288 training molecules"]))
    with pytest.raises(checks.CheckFailed, match="should drift apart"):
        checks.sharded_run(_Result({"replica_spread": 0.0}, lines))
