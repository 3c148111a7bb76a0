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


def _fake_env(rank: int, world_size: int, per_node: int | None = None) -> DistEnv:
    """Who a rank would be (``per_node`` processes a node), for functions that only read the DistEnv."""
    per_node = per_node or world_size
    return DistEnv(rank, rank % per_node, world_size, per_node, torch.device("cpu"), "gloo")


# A collective that waits this long in a check (whose ranks each take a second or two) is a hang:
# the hang watch names the rank that never arrived, and the check stops there instead of at its timeout.
HANG_AFTER = 8.0


def _hang_message(diagnosis: str, fix: str) -> str:
    """The hang watch's line, and the fix unless it already says one (different shapes: the same shape)."""
    return diagnosis if "every rank must" in diagnosis else f"{diagnosis}: {fix}, or the others wait for it"


def _call(fn: Callable, name: str, *args):
    try:
        return fn(*args)
    except NotImplementedError:
        raise CheckFailed(f"{name} still raises NotImplementedError: fill in its TODO and run its cell again") from None
    except (ValueError, RuntimeError) as err:
        if "not been initialized" not in str(err):
            raise
        raise CheckFailed(f"{name} looked for a process group, and there is none here (torch: Default process group "
                          f"has not been initialized): tell DistributedSampler this rank's place from env, with "
                          f"num_replicas= and rank=") from None


def run_on_ranks(fn: Callable, nprocs: int, *args, timeout: float = 60, name: str | None = None,
                 hang_after: float | None = None,
                 fix: str = "every rank must call every collective, in the same order") -> list:
    """``fn(env, *args)`` on ``nprocs`` forked ranks; a failure or a hang becomes one CheckFailed line.

    ``hang_after``: seconds before a waiting collective counts as a hang (default :data:`HANG_AFTER`);
    ``fix``: what the line tells the learner to do about a hang.
    """
    import torch._dynamo  # noqa: F401 (DDP imports it on first use: once here, not in every forked rank)

    from workshop_lib.forklaunch import HangError, LaunchTimeout, notebook_launch
    from workshop_lib.launch import LaunchError

    try:
        return notebook_launch(fn, nprocs, *args, timeout=timeout,
                               hang_after=HANG_AFTER if hang_after is None else hang_after)
    except HangError as err:
        raise CheckFailed(_hang_message(err.diagnosis, fix)) from None
    except LaunchTimeout:
        raise CheckFailed(f"the ranks did not finish within {timeout:g}s: a rank waits in a collective that "
                          f"another rank never joins; {fix}") from None
    except LaunchError as err:
        if "NotImplementedError" in str(err):
            raise CheckFailed(f"{name or 'your function'} still raises NotImplementedError: fill in its TODO and "
                              f"run its cell again") from None
        raise CheckFailed(f"a rank failed: {str(err).splitlines()[0]}") from None


def _spied_train(env: DistEnv, train: Callable, out: str) -> list[dict]:
    """Run the learner's train with tiny settings as if each rank were alone on its node (local rank 0 on all)."""
    from dataclasses import replace

    from workshop_lib import spy

    rec = spy.Recorder()
    spy.record_calls(rec, train.__globals__, "mean_over_ranks")
    cfg = TrainConfig(limit=200, epochs=2, out=Path(out), progress=False, tensorboard=False, timeout=30)
    try:
        with spy.spying(rec, train.__globals__), contextlib.redirect_stdout(io.StringIO()):
            train(cfg, replace(env, local_rank=0, local_world_size=1))
        rec.add("end", ok=True)
    except Exception as err:  # the check names it
        rec.add("end", ok=False, error=type(err).__name__, message=(str(err).splitlines() or [""])[0][:300])
    return rec.events


def train_on_two_nodes(train: Callable, nprocs: int = 2, timeout: float = 120) -> dict[int, list[dict]]:
    """What each rank did in ``train(cfg, env)`` (200 molecules, 2 epochs), one rank per "node"."""
    with tempfile.TemporaryDirectory(prefix="train-check-") as out:
        return dict(enumerate(run_on_ranks(_spied_train, nprocs, train, out, timeout=timeout, name="train")))


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
    ranks = run_on_ranks(_spy_all_reduce, nprocs, fn, timeout=timeout, hang_after=min(HANG_AFTER, timeout / 2),
                         fix="every rank must call dist.all_reduce")
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


def shards(make_sampler: Callable, indices_for: Callable, n: int = 11, world_size: int = 4, per_node: int = 2) -> None:
    """Build each rank's sampler with ``make_sampler`` and read epochs 0 and 1 with ``indices_for``.

    The ranks are ``world_size`` made-up processes, ``per_node`` on each node, so
    their local ranks repeat. The shards must be disjoint up to DistributedSampler's
    padding, cover all ``n`` items, be shuffled, and change order between epochs.
    """
    cfg = TrainConfig()
    data = list(range(n))
    got = {}
    for rank in range(world_size):
        sampler = _call(make_sampler, "make_sampler", data, cfg, _fake_env(rank, world_size, per_node))
        for epoch in (0, 1):
            got[rank, epoch] = [int(i) for i in _call(indices_for, "indices_for", sampler, epoch)]
    per_rank = math.ceil(n / world_size)
    for rank in range(world_size):
        if len(got[rank, 0]) != per_rank:
            raise CheckFailed(f"rank {rank} got {len(got[rank, 0])} of {n} items, expected {per_rank} "
                              f"(= ceil({n}/{world_size})): pass num_replicas=env.world_size to DistributedSampler")
    for rank in range(1, world_size):
        twin = next((r for r in range(rank) if got[r, 0] == got[rank, 0]), None)
        if twin is not None and twin == rank % per_node:
            raise CheckFailed(f"rank {rank} (local rank {rank % per_node}) got the same indices as rank {twin}: pass "
                              f"the global rank, rank=env.rank; the local rank repeats on every node")
        if twin is not None:
            raise CheckFailed(f"rank {rank} got the same indices as rank {twin}: pass rank=env.rank to "
                              f"DistributedSampler")
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
    _passed(f"{world_size} ranks ({per_node} a node) x {per_rank} items: disjoint shards covering all {n} "
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


def epoch_loop(train: Callable, nprocs: int = 2, timeout: float = 120) -> None:
    """The step-2 ``train`` on 2 ranks, one per "node": each its own shard, a new order every epoch."""
    from workshop_lib import verdict

    events = train_on_two_nodes(train, nprocs, timeout)
    for rule in (verdict.open_todo, verdict.sharding, verdict.crashed, verdict.skipped_collective,
                 verdict.reshuffling):
        message = rule(events, world_size=nprocs, epochs=2)
        if message:
            raise CheckFailed(message)
    reads = [e["epoch"] for e in events[0] if e["kind"] == "read_sampler"]
    _passed(f"train: each of {nprocs} ranks read its own shard; the sampler was read in epochs {reads}, "
            f"each after its set_epoch")
