"""The exercise checks of notebook 02 (DistributedSampler): disjoint shards, reshuffled every epoch; the spread predicted."""

from __future__ import annotations

import math
from collections.abc import Callable

from workshop_lib.checks.common import CheckFailed, _call, _fake_env, _missed, _passed, train_on_two_nodes
from workshop_lib.config import TrainConfig


def shards(make_sampler: Callable, n: int = 11, world_size: int = 4, per_node: int = 2) -> None:
    """Build each rank's sampler with ``make_sampler`` and read its epochs 0 and 1 (``set_epoch`` before each).

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
            if not hasattr(sampler, "set_epoch"):
                raise CheckFailed(f"make_sampler returned a {type(sampler).__name__}, which has no set_epoch: "
                                  f"return a DistributedSampler")
            sampler.set_epoch(epoch)
            got[rank, epoch] = [int(i) for i in sampler]
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
    from workshop_lib.checks import rules, step_rules

    events = train_on_two_nodes(train, nprocs, timeout)
    for rule in (rules.open_todo, step_rules.sharding, rules.crashed, rules.skipped_collective,
                 step_rules.reshuffling):
        message = rule(events, world_size=nprocs, epochs=2)
        if message:
            raise CheckFailed(message)
    reads = [e["epoch"] for e in events[0] if e["kind"] == "read_sampler"]
    _passed(f"train: each of {nprocs} ranks read its own shard; the sampler was read in epochs {reads}, "
            f"each after its set_epoch")



def spread_prediction(predicted: float | None, result: dict) -> None:
    """The learner's predicted replica spread after epoch 1 of step 2, against the run's ``result`` (metrics.json).

    A prediction is not code: a wrong one is printed with a cross and the reason, not raised.
    """
    spreads = [row["replica_spread"] for row in result["history"]]
    first = result["history"][0]  # metrics.json counts every rank's molecules; a rank's last batch may be short
    per_rank = round(first["samples_per_second"] * first["seconds"] / result["world_size"])
    actual, steps, lr = spreads[0], math.ceil(per_rank / result["batch_size_per_process"]), result["config"]["lr"]
    print("the replicas' weights differ by up to " + ", ".join(f"{s:.4f} after epoch {e + 1}"
                                                               for e, s in enumerate(spreads)))
    why = (f"each rank took {steps} AdamW steps in epoch 1, each moving a weight by up to about lr = {lr:g}, in a "
           f"direction set by its own shard: 2 replicas can end up to about 2 x {steps} x {lr:g} = {2 * steps * lr:g} "
           f"apart")
    if predicted is None:
        print(f"(no prediction to compare: set predicted_spread before the run) {why}")
    elif predicted > 0 and abs(math.log10(predicted / actual)) <= 1:
        _passed(f"you predicted {predicted:g}: the right order of magnitude; {why}")
    elif predicted <= 0:
        _missed(f"you predicted {predicted:g}: the replicas stay equal only if every rank takes the same step; {why}")
    else:
        _missed(f"you predicted {predicted:g}, more than 10 times {'above' if predicted > actual else 'below'} the "
                f"measured {actual:.4f}: {why}")
