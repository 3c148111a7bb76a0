"""Instant feedback for the exercises: each check runs the learner's own function and says what is wrong.

A check prints one line starting with a tick when the exercise works (and
returns None, so a notebook cell shows nothing else). When it does not, it
raises CheckFailed, whose message says what happened and what to
change; in Jupyter it shows as that one line, without a traceback.
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from workshop_lib.config import TrainConfig
from workshop_lib.distributed import DistEnv


class CheckFailed(AssertionError):
    """The exercise does not work yet; the message says what to change."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"\N{BALLOT X} {self}"]


def _passed(message: str) -> None:
    print(f"\N{CHECK MARK} {message}")


def _fake_env(rank: int, world_size: int) -> DistEnv:
    """Who a rank would be, for functions that only read the DistEnv (no process group needed)."""
    return DistEnv(rank, rank, world_size, world_size, torch.device("cpu"), "gloo")


def _call(fn: Callable, name: str, *args):
    try:
        return fn(*args)
    except NotImplementedError:
        raise CheckFailed(f"{name} still raises NotImplementedError: fill in its TODO and run its cell again") from None


# --------------------------------------------------------------------- 00 baseline


def train_loop(train: Callable, epochs: int = 2) -> None:
    """Run ``train(cfg, device)`` on 300 molecules for ``epochs`` epochs and check what it recorded."""
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(limit=300, epochs=epochs, out=Path(out), progress=False, tensorboard=False)
        quiet = io.StringIO()
        try:
            with contextlib.redirect_stdout(quiet):
                metrics = _call(train, "train", cfg, torch.device("cpu"))
        except AssertionError as err:
            if "no epoch was evaluated" in str(err):
                raise CheckFailed("no epoch was kept as best: call best.update(epoch, dev_auc, model) "
                                  "after evaluating each epoch") from None
            raise
    if not isinstance(metrics, dict):
        raise CheckFailed(f"train returned {metrics!r}, not the metrics: keep `return report.finish(best, heldout_auc)`")
    history = metrics["history"]
    if len(history) != epochs:
        raise CheckFailed(f"{len(history)} epochs were reported for cfg.epochs={epochs}: train, evaluate and "
                          f"call report.epoch once per epoch, inside the loop")
    aucs = [row["dev_roc_auc"] for row in history]
    if len(set(aucs)) == 1 and epochs > 1 and history[0]["train_loss"] == history[-1]["train_loss"]:
        raise CheckFailed("every epoch has the same loss and dev ROC AUC: call train_epoch(...) each epoch")
    best = max(range(epochs), key=lambda e: (aucs[e], -e))
    if metrics["best_epoch"] != best:
        raise CheckFailed(f"the best dev ROC AUC was in epoch {best + 1}, but epoch {metrics['best_epoch'] + 1} was "
                          f"kept: call best.update(epoch, dev_auc, model) every epoch")
    _passed(f"train ran {epochs} epochs, reported each, and kept the best (epoch {best + 1})")


# ------------------------------------------------------------------- 01 all_reduce


def _spy_all_reduce(env: DistEnv, fn: Callable) -> dict:
    """On one rank: run ``fn(env)`` while recording every dist.all_reduce call."""
    import torch.distributed as dist

    calls, real = [], dist.all_reduce

    def spy(tensor, op=dist.ReduceOp.SUM, *args, **kwargs):
        call = {"before": tensor.detach().clone().tolist(), "op": str(op).rsplit(".", 1)[-1], "after": None}
        calls.append(call)
        work = real(tensor, op, *args, **kwargs)
        call["after"] = tensor.detach().tolist()
        return work

    dist.all_reduce = spy
    try:
        fn(env)
        outcome = "ok"
    except NotImplementedError:
        outcome = "todo"
    except AssertionError as err:
        outcome = f"assert: {err}"
    except RuntimeError as err:  # a peer left while this rank waited in a collective
        outcome = f"error: {str(err).splitlines()[0][:200]}"
    finally:
        dist.all_reduce = real
    return {"rank": env.rank, "outcome": outcome, "calls": calls}


def all_reduce(fn: Callable, nprocs: int = 2, timeout: float = 30) -> None:
    """Run ``fn(env)`` on ``nprocs`` ranks; it must all_reduce(rank + 1) with SUM and see 1 + ... + N."""
    from workshop_lib.forklaunch import notebook_launch
    from workshop_lib.launch import LaunchError

    try:
        ranks = notebook_launch(_spy_all_reduce, nprocs, fn, timeout=timeout)
    except LaunchError as err:
        if "did not finish" in str(err):
            raise CheckFailed(f"the ranks did not finish within {timeout:g}s: a rank waits in a collective that "
                              f"another rank never joins; every rank must call dist.all_reduce") from None
        raise CheckFailed(f"a rank failed: {str(err).splitlines()[0]}") from None
    expected = nprocs * (nprocs + 1) / 2
    if any(r["outcome"] == "todo" for r in ranks):
        raise CheckFailed(f"{fn.__name__} still raises NotImplementedError: fill in its TODO and run its cell again")
    silent = [r["rank"] for r in ranks if not r["calls"]]
    if len(silent) == nprocs:
        raise CheckFailed("no rank called dist.all_reduce: call it on a tensor holding env.rank + 1")
    if silent:
        raise CheckFailed(f"rank {silent[0]} never called dist.all_reduce while other ranks did: every rank must "
                          f"call every collective, or the others wait for it (and fail when it leaves)")
    for r in ranks:
        call = r["calls"][0]
        if call["op"] != "SUM":
            raise CheckFailed(f"rank {r['rank']} used op={call['op']}: summing needs op=dist.ReduceOp.SUM (the default)")
        if call["before"] != [r["rank"] + 1.0]:
            raise CheckFailed(f"rank {r['rank']} contributed {call['before']}, expected [{r['rank'] + 1.0}]: "
                              f"start from torch.tensor([env.rank + 1.0])")
        if call["after"] != [expected]:
            raise CheckFailed(f"rank {r['rank']} holds {call['after']} after all_reduce, expected [{expected}]")
        if r["outcome"] != "ok":
            raise CheckFailed(f"rank {r['rank']}: {r['outcome']}")
    _passed(f"{fn.__name__}: each of {nprocs} ranks contributed rank + 1, all_reduce(SUM) left {expected:g} on every rank")


# --------------------------------------------------------------- 02 sharded data


def shards(make_sampler: Callable, indices_for: Callable, n: int = 11, world_size: int = 2) -> None:
    """Build each rank's sampler with ``make_sampler`` and read epochs 0 and 1 with ``indices_for``.

    The shards must be disjoint up to DistributedSampler's padding, cover all
    ``n`` items, be shuffled, and change order between epochs.
    """
    cfg = TrainConfig()
    data = list(range(n))
    got = {}
    for rank in range(world_size):
        sampler = _call(make_sampler, "make_sampler", data, cfg, _fake_env(rank, world_size))
        for epoch in (0, 1):
            got[rank, epoch] = [int(i) for i in _call(indices_for, "indices_for", sampler, epoch)]
    per_rank = math.ceil(n / world_size)
    for rank in range(world_size):
        if len(got[rank, 0]) != per_rank:
            raise CheckFailed(f"rank {rank} got {len(got[rank, 0])} of {n} items, expected {per_rank} "
                              f"(= ceil({n}/{world_size})): pass num_replicas=env.world_size to DistributedSampler")
    for rank in range(1, world_size):
        if got[rank, 0] == got[0, 0]:
            raise CheckFailed(f"rank {rank} got the same indices as rank 0: pass rank=env.rank to DistributedSampler")
    seen = sorted(i for rank in range(world_size) for i in got[rank, 0])
    if set(seen) != set(data):
        raise CheckFailed(f"together the ranks saw {sorted(set(seen))}, not every item of {data}")
    from torch.utils.data import DistributedSampler

    unshuffled = [list(DistributedSampler(data, world_size, r, shuffle=False)) for r in range(world_size)]
    if all(got[r, 0] == unshuffled[r] for r in range(world_size)):
        raise CheckFailed("every shard is in the data's order: pass shuffle=True to DistributedSampler")
    if got[0, 0] == got[0, 1]:
        raise CheckFailed("the order is the same in epoch 0 and 1: call sampler.set_epoch(epoch) before reading it")
    padded = len(seen) - n
    _passed(f"{world_size} ranks x {per_rank} items: disjoint shards covering all {n} "
            f"({padded} padded duplicate{'s' * (padded != 1)}), reshuffled each epoch")


def sharded_run(result: dict, nproc: int = 2) -> None:
    """A step-2 torchrun result: every rank trained on its own 1/N, and the replicas drifted apart."""
    import re

    sizes = {}
    for line in getattr(result, "output", []):
        m = re.match(r"\[rank (\d+)\] rank \d+: (\d+) of (\d+) training molecules", line)
        if m:
            sizes[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
    if sorted(sizes) != list(range(nproc)):
        raise CheckFailed(f"expected a shard line from each of ranks 0..{nproc - 1}, got ranks {sorted(sizes)}")
    for rank, (k, n) in sizes.items():
        if k != math.ceil(n / nproc):
            raise CheckFailed(f"rank {rank} trained on {k} of {n} molecules per epoch, expected "
                              f"{math.ceil(n / nproc)}: check make_sampler's num_replicas")
    spread = result.get("replica_spread")
    if spread is None or spread <= 0:
        raise CheckFailed(f"replica_spread is {spread}: without DDP the replicas should drift apart")
    k, n = sizes[0]
    _passed(f"each of {nproc} ranks trained on {k} of {n} molecules per epoch; the replicas drifted apart")


# --------------------------------------------------------------------------- 03 DDP


def _ddp_step(env: DistEnv, wrap: Callable) -> dict:
    """On one rank: differently initialised replicas, wrapped, one step on this rank's own batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(env.rank)  # a different start on every rank: DDP must make them equal
    model = SmilesLSTM(12, 8, 8)
    try:
        wrapped = wrap(model, env)
    except NotImplementedError:
        return {"outcome": "todo"}
    if not isinstance(wrapped, DDP):
        return {"outcome": f"wrap returned a {type(wrapped).__name__}, not a DistributedDataParallel: "
                           f"return DDP(model, device_ids=...) around the model"}
    if wrapped.module is not model:
        return {"outcome": "the DDP wrapper holds another model than the one passed in: wrap `model` itself"}
    g = torch.Generator().manual_seed(100 + env.rank)  # each rank its own data
    tokens = torch.randint(1, 12, (4, 6), generator=g)  # (B, T)
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0])
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(wrapped(tokens, torch.full((4,), 6)), labels)
    loss.backward()
    opt.step()
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()  # (P,)
    everyone = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(everyone, mine)
    return {"outcome": "ok", "spread": max((w - everyone[0]).abs().max().item() for w in everyone)}


def ddp_wrap(wrap: Callable, nprocs: int = 2, timeout: float = 60) -> None:
    """``wrap(model, env)`` must return DDP around ``model``, so one step leaves the replicas equal."""
    from workshop_lib.forklaunch import notebook_launch
    from workshop_lib.launch import LaunchError

    try:
        ranks = notebook_launch(_ddp_step, nprocs, wrap, timeout=timeout)
    except LaunchError as err:
        raise CheckFailed(f"a rank failed: {str(err).splitlines()[0]}") from None
    for r in ranks:
        if r["outcome"] == "todo":
            raise CheckFailed("wrap still raises NotImplementedError: fill in its TODO and run its cell again")
        if r["outcome"] != "ok":
            raise CheckFailed(r["outcome"])
    spread = max(r["spread"] for r in ranks)
    if spread != 0.0:
        raise CheckFailed(f"after one step the replicas differ by up to {spread:.3g}: the gradients were not averaged")
    _passed(f"wrap: {nprocs} replicas started different, DDP made them equal and one step kept them equal")
