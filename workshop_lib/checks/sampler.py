"""The checks of notebook 02: the shards each rank's loader read, on real ranks at two world sizes (judged as
:mod:`shards` judges a script's run), and the predicted replica spread."""

from __future__ import annotations

import ast
import contextlib
import io
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.data import TokenizedDataset
from workshop_lib.debug.launchenv import launch_variables
from workshop_lib.engine import rules, torch_errors
from workshop_lib.engine import shards as judged
from workshop_lib.engine.branches import called
from workshop_lib.engine.common import CheckFailed, is_number, judge_prediction, run_forked, said, verdict
from workshop_lib.engine.recorder import Recorder, passes, recording

# (ranks, ranks a node): as the script checker runs a script (torchrun --nnodes=2 --nproc_per_node=1: LOCAL_RANK 0
# on both), then one node of 3: a loader sized for a fixed number of ranks, or placed by a node's numbers, shows
WORLDS = ((2, 1), (3, 3))
SEED = 5  # the seed of a second make_loader, which its DistributedSampler must take


def tiny_dataset(n: int, vocab: int = 12) -> TokenizedDataset:
    """``n`` made-up molecules (random tokens, 3 to 8 long) as the domain's own dataset class."""
    g = torch.Generator().manual_seed(0)
    data = TokenizedDataset.__new__(TokenizedDataset)
    data.lengths = torch.randint(3, 9, (n,), generator=g)  # (N,)
    data.tokens = torch.randint(1, vocab, (n, 8), generator=g) * (torch.arange(8) < data.lengths[:, None])  # (N, 8)
    data.labels = (torch.arange(n) % 2).float()  # (N,)
    data.smiles = [f"m{i}" for i in range(n)]
    return data


def _read(env, make_loader: Callable, n: int, epochs: int, per_node: int) -> dict:
    """On one rank, with torchrun's variables for ``per_node`` ranks a node: what its loader read epoch by epoch (the
    recorder's events), how make_loader ended (None: well, else the one line), and the seed a second one takes."""
    os.environ.update(launch_variables(env.rank, env.world_size, per_node))
    dataset, rec, loader, end, seed = tiny_dataset(n), Recorder(), None, None, None
    rec.splits[id(dataset)] = "train"
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            with recording(rec):
                loader = make_loader(dataset, 2, 0)
                if not isinstance(loader, DataLoader):
                    end = (f"make_loader returned a {type(loader).__name__}, not a DataLoader: return "
                           f"DataLoader(dataset, batch_size=..., sampler=..., collate_fn=collate)")
                for epoch in range(epochs if end is None else 0):
                    if hasattr(loader.sampler, "set_epoch"):
                        loader.sampler.set_epoch(epoch)
                    for _ in loader:
                        pass
            sampler = make_loader(dataset, 2, SEED).sampler if end is None else None
            seed = sampler.seed if isinstance(sampler, DistributedSampler) else None
        except Exception as err:
            setup = rules.set_up(rec.events, str(err))  # a DataLoader without collate_fn: its line, not the loop's
            end = said(err, "make_loader", setup and setup + torch_errors.explain(str(err)))
    return {"events": rec.events, "end": end, "seed": seed}


def _measured(reads: dict[int, list[list[int]]], n: int, per_node: int) -> str:
    """What the ranks read in the first epoch, said exactly: items a rank, padded duplicates, items left out."""
    sizes = sorted({len(r[0]) for r in reads.values()})
    read = [i for r in reads.values() for i in r[0]]
    padded, covered = len(read) - len(set(read)), len(set(read))
    extra = [f"{padded} padded duplicate{'s' * (padded != 1)}"] * bool(padded) + [f"{n - covered} left out"] * (
        covered < n)
    return (f"{len(reads)} ranks ({per_node} a node) x {'-'.join(map(str, sizes))} items, "
            f"{f'all {n}' if covered == n else f'{covered} of {n}'}" + (f" ({', '.join(extra)})" if extra else ""))


def shards(make_loader: Callable, n: int = 11, epochs: int = 2) -> None:
    """``make_loader(dataset, batch_size, seed)`` on real ranks at each of :data:`WORLDS`: disjoint shards, all of the
    items together, a new order each epoch, the seed it is given; the ✓ says what each world size read."""
    measured, wrong = [], None
    for world, per_node in WORLDS:
        ranks = dict(enumerate(run_forked(_read, world, make_loader, n, epochs, per_node, name="make_loader")))
        reads = {r: passes(out["events"], "train") for r, out in ranks.items()}
        wrong = _mistake(ranks, reads, n, epochs)
        if wrong:
            break
        measured.append(_measured(reads, n, per_node))
    verdict(wrong, f"{'; '.join(measured)}: disjoint shards, a new order each epoch")


def _mistake(ranks: dict[int, dict], reads: dict[int, list[list[int]]], n: int, epochs: int) -> str | None:
    """What the ranks' loaders did wrong at this world size, read as :mod:`shards` reads a script's run; else None."""
    world, events = len(ranks), {r: out["events"] for r, out in ranks.items()}
    ends = {r: out["end"] for r, out in ranks.items() if out["end"]}
    if ends:
        r, end = min(ends.items())
        why = judged.cause("raised", events, "train", world) if any(
            e["kind"] == "sampler" for ev in events.values() for e in ev) else ""
        who = "" if len(ends) == world else f"rank {r} of {world}: "  # every rank: the same mistake
        return f"{who}{end}" + (f"; {why}" if why else "")
    found = judged.read_mistake(reads, n, epochs, what="items")
    if found is not None:
        why = judged.cause(found[0], events, "train", world)
        return f"{world} ranks: {found[1]}: {why}" if why else f"{world} ranks: {found[1]}"
    seed = ranks[0]["seed"]
    return None if seed in (None, SEED) else (
        f"make_loader(dataset, batch_size, seed={SEED}) built its DistributedSampler with seed={seed}: pass seed=seed, "
        f"so that a run's --seed changes the shuffle (the same on every rank)")


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
    calls = sorted(ast.walk(ast.parse(Path(path).read_text())), key=lambda n: getattr(n, "lineno", 0)) if path else ()
    line = next((n.lineno for n in calls if called(n) == "all_reduce" and "AVG" in ast.unparse(n)), None)
    at = f", line {line}" if line else ""
    return (f"the run logged {logged} molecules in epoch 1 of {train}: the molecule count was averaged (op=AVG{at}): "
            f"sum the totals with ReduceOp.SUM and divide once")

