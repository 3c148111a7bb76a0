"""The checks of notebook 02: the shards each made-up rank's loader read (judged as :mod:`shards` judges a run),
and the predicted replica spread."""

from __future__ import annotations

import ast
import contextlib
import io
import math
import os
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from workshop_lib.checks import shards as judged
from workshop_lib.checks.common import CheckFailed, _call, _passed, is_number, judge_prediction
from workshop_lib.checks.recorder import Recorder, passes, recording
from workshop_lib.data import TokenizedDataset
from workshop_lib.debug.launchenv import launch_variables


def tiny_dataset(n: int, vocab: int = 12) -> TokenizedDataset:
    """``n`` made-up molecules (random tokens, 3 to 8 long) as the domain's own dataset class."""
    g = torch.Generator().manual_seed(0)
    data = TokenizedDataset.__new__(TokenizedDataset)
    data.lengths = torch.randint(3, 9, (n,), generator=g)  # (N,)
    data.tokens = torch.randint(1, vocab, (n, 8), generator=g) * (torch.arange(8) < data.lengths[:, None])  # (N, 8)
    data.labels = (torch.arange(n) % 2).float()  # (N,)
    data.smiles = [f"m{i}" for i in range(n)]
    return data


def _as_rank(rank: int, world_size: int, per_node: int) -> contextlib.ExitStack:
    """This process as made-up ``rank`` of ``world_size``: torchrun's variables, and the group's answers."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict(os.environ, launch_variables(rank, world_size, per_node)))
    for name, fake in (("get_rank", lambda group=None: rank), ("get_world_size", lambda group=None: world_size),
                       ("is_initialized", lambda: True)):
        stack.enter_context(mock.patch.object(dist, name, fake))
    return stack


def _read(make_loader: Callable, dataset, rank: int, world_size: int, per_node: int, epochs: int) -> list[dict]:
    """What one made-up rank's loader read, epoch by epoch (the recorder's events)."""
    rec = Recorder()
    rec.splits[id(dataset)] = "train"
    with _as_rank(rank, world_size, per_node), recording(rec), contextlib.redirect_stdout(io.StringIO()):
        loader = _call(make_loader, "make_loader", dataset, 2, 0)
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise CheckFailed(f"make_loader returned a {type(loader).__name__}, not a DataLoader: return "
                              f"DataLoader(dataset, batch_size=..., sampler=..., collate_fn=collate)")
        for epoch in range(epochs):
            if hasattr(loader.sampler, "set_epoch"):
                loader.sampler.set_epoch(epoch)
            for _ in loader:
                pass
    return rec.events


def shards(make_loader: Callable, n: int = 11, world_size: int = 4, per_node: int = 2, epochs: int = 2) -> None:
    """``make_loader(dataset, batch_size, seed)`` as each of ``world_size`` made-up ranks (``per_node`` a node, nothing
    joined): disjoint shards, all of the items together, a new order each epoch."""
    dataset = tiny_dataset(n)
    ranks = {r: _read(make_loader, dataset, r, world_size, per_node, epochs) for r in range(world_size)}
    reads = {r: passes(events, "train") for r, events in ranks.items()}
    found = judged.read_mistake(reads, n, epochs, what="items")
    if found is not None:
        kind, measured = found
        why = judged.cause(kind, ranks, "train", world_size)
        raise CheckFailed(f"{measured}: {why}" if why else measured)
    _seed_passed(make_loader, dataset, world_size, per_node)
    share = math.ceil(n / world_size)
    padded = share * world_size - n
    _passed(f"{world_size} ranks ({per_node} a node) x {share} items: disjoint shards covering all {n} ({padded} padded "
            f"duplicate{'s' * (padded != 1)}), a new order each epoch")


def _seed_passed(make_loader: Callable, dataset, world_size: int, per_node: int, seed: int = 5) -> None:
    """The seed make_loader is given reaches its DistributedSampler (the reads above all used seed 0, its default)."""
    with _as_rank(0, world_size, per_node), contextlib.redirect_stdout(io.StringIO()):
        sampler = _call(make_loader, "make_loader", dataset, 2, seed).sampler
    if isinstance(sampler, torch.utils.data.DistributedSampler) and sampler.seed != seed:
        raise CheckFailed(f"make_loader(dataset, batch_size, seed={seed}) built its DistributedSampler with "
                          f"seed={sampler.seed}: pass seed=seed, so that a run's --seed changes the shuffle (the same "
                          f"on every rank)")


def spread_prediction(predicted: float | None, result: dict, path: str | Path | None = None) -> None:
    """The predicted replica spread after epoch 1 of step 2 against the run's metrics.json, right within a factor of
    10 (the spread moves by tens of percent from run to run), never raised. The steps are counted from the training
    split, not from the molecules the run logged: a count averaged over the ranks is named (its line in ``path``,
    the learner's script)."""
    from workshop_lib.config import parse_args
    from workshop_lib.data import load_splits
    from workshop_lib.metrics import logged_samples

    spreads = [row["replica_spread"] for row in result["history"]]
    cfg, first, world = result["config"], result["history"][0], result["world_size"]
    train = len(load_splits(parse_args(["--limit", str(cfg["limit"]), "--data", cfg["data"]])).train)
    actual, steps, lr = spreads[0], math.ceil(train / world / result["batch_size_per_process"]), cfg["lr"]
    print("the replicas' weights differ by up to " + ", ".join(f"{s:.4f} after epoch {e + 1}"
                                                               for e, s in enumerate(spreads)))
    why = (f"each rank took {steps} AdamW steps in epoch 1, each moving a weight by up to about lr = {lr:g}, in a "
           f"direction set by its own shard: 2 replicas can end up to about 2 x {steps} x {lr:g} = {2 * steps * lr:g} "
           f"apart")
    number = is_number(predicted)
    right = number and predicted > 0 and abs(math.log10(predicted / actual)) <= 1
    if number and predicted <= 0:
        why = f"the replicas stay equal only if every rank takes the same step; {why}"
    elif number and not right:
        why = f"more than 10 times {'above' if predicted > actual else 'below'} the measured spread; {why}"
    judge_prediction("the replica spread after epoch 1", predicted, f"{actual:.4f}", right, why,
                     shown=f"{predicted:g}" if number else None)
    logged = logged_samples(first)  # every rank's molecules (padded), summed
    if world > 1 and abs(logged * world - train) <= world:  # averaged instead: a mistake of the run, said last
        raise CheckFailed(averaged_count(path, logged, train))


def averaged_count(path: str | Path | None, logged: int, train: int) -> str:
    """The molecules of an epoch logged as 1/world size of the split: a count all-reduced with op=AVG."""
    line = next((n.lineno for n in _calls(path, "all_reduce") if "AVG" in ast.unparse(n)), None) if path else None
    at = f", line {line}" if line else ""
    return (f"the run logged {logged} molecules in epoch 1 of {train}: the molecule count was averaged (op=AVG{at}): "
            f"sum the totals with ReduceOp.SUM and divide once")


def _calls(path: str | Path, name: str) -> list[ast.Call]:
    """The calls of ``name`` (``dist.name(...)`` or ``name(...)``) in the script, in order."""
    tree = ast.parse(Path(path).read_text())
    return sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and getattr(n.func, "attr", getattr(n.func, "id", None)) == name), key=lambda n: n.lineno)
