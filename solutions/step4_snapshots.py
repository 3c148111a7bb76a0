# Generated from notebooks/04a_patterns.ipynb by `python -m workshop_lib.build`: do not edit.
# (and cells of notebooks/01_process_group.ipynb)
# (and cells of notebooks/02_distributed_sampler.ipynb)
# (and cells of notebooks/03_ddp.ipynb)
# Edit the cells tagged script:step4_snapshots, then rebuild.
"""Step 4: snapshots; a run that was killed or interrupted resumes where it stopped.

Step 3 plus four calls of workshop_lib.checkpoint. After every epoch global
rank 0 writes OUT/snapshot.pt atomically (model, optimizer, best model,
history); a run that finds one resumes after its last epoch. Every epoch
reseeds from (seed, epoch, rank), so a resumed run ends with the numbers of
an uninterrupted one.

    torchrun --nproc_per_node=2 solutions/step4_snapshots.py
    torchrun --nproc_per_node=2 --max-restarts=1 solutions/step4_snapshots.py   # survives a killed rank
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from workshop_lib import checkpoint, distributed
from workshop_lib.cli import run_cli
from workshop_lib.config import TrainConfig, build_parser, parse_config
from workshop_lib.data import check_shardable, load_splits, make_eval_loader, make_loader
from workshop_lib.debug import hangwatch
from workshop_lib.distributed import DistEnv
from workshop_lib.model import count_parameters
from workshop_lib.report import Reporter
from workshop_lib.train import BestModel, build_model, build_optimizer, evaluate, train_epoch


def check_all_reduce(env: DistEnv) -> None:
    """Every rank contributes rank + 1; afterwards every rank holds 1 + 2 + ... + N."""
    value = torch.tensor([env.rank + 1.0], device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = env.world_size * (env.world_size + 1) / 2
    assert value.item() == expected, f"all_reduce gave {value.item()}, expected {expected}"
    if env.is_main:
        print(f"all_reduce: sum of (rank + 1) over {env.world_size} ranks = {value.item():g} (expected {expected:g})")


def make_sampler(dataset, cfg: TrainConfig, env: DistEnv) -> DistributedSampler:
    """This rank's shard of ``dataset``: 1/N of it, in an order that set_epoch reshuffles."""
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=cfg.seed)


def replica_spread(model: torch.nn.Module, env: DistEnv) -> float:
    """Largest difference between any rank's weights and rank 0's (0.0: all replicas agree)."""
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()  # (P,)
    everyone = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(everyone, mine)
    return max((w - everyone[0]).abs().max().item() for w in everyone)


def wrap(model: torch.nn.Module, env: DistEnv) -> DDP:
    """DDP around ``model``: rank 0's weights broadcast now, the gradients averaged in every backward()."""
    return DDP(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)


def mean_over_ranks(value: float, env: DistEnv) -> float:
    """The mean of every rank's ``value``, returned on every rank."""
    total = torch.tensor([value], dtype=torch.float64, device=env.device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.item() / env.world_size


def train(cfg: TrainConfig, env: DistEnv) -> dict | None:
    torch.manual_seed(cfg.seed)
    splits = load_splits(cfg.data, cfg.smiles_col, cfg.label_col, cfg.limit,
                         cfg.heldout_frac, cfg.dev_frac, cfg.split_seed)
    check_shardable(len(splits.train), env.world_size)
    latest = checkpoint.load_latest(cfg, env, len(splits.tokenizer))  # None: no snapshot, start afresh
    report = Reporter(cfg, "step4_snapshots", env.device, env)

    sampler = make_sampler(splits.train, cfg, env)
    print(f"rank {env.rank}: {len(sampler)} of {len(splits.train)} training molecules per epoch", flush=True)
    train_loader = make_loader(splits.train, sampler, cfg.batch_size, seed=cfg.seed)
    dev_loader = make_eval_loader(splits.dev)

    model = build_model(cfg, len(splits.tokenizer)).to(env.device)
    model = wrap(model, env)  # from here on, backward() also averages the gradients across ranks
    raw_model = model.module  # the plain model inside: evaluate and save this one
    optimizer = build_optimizer(cfg, model)
    report.start(len(splits.train), len(splits.dev), len(splits.heldout), count_parameters(model), splits.source)

    best = BestModel()
    start = checkpoint.restore(latest, env, raw_model, optimizer, best, report)  # 0, or the epoch after the snapshot
    for epoch in range(start, cfg.epochs):
        checkpoint.seed_epoch(cfg.seed, epoch, env.rank)  # the same dropout masks, restarted or not
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        bar = report.progress(epoch, len(train_loader))
        stats = train_epoch(model, train_loader, optimizer, env.device, bar)
        stats = replace(stats, loss=mean_over_ranks(stats.loss, env))  # the log line: every rank's shard
        spread = replica_spread(model, env)  # every rank takes part in the all_gather
        if env.is_main:  # only rank 0 evaluates; the others wait at the next all-reduce
            dev_auc = evaluate(raw_model, dev_loader, env.device)
            best.update(epoch, dev_auc, raw_model)
            report.epoch(epoch, stats, dev_auc, bar, replica_spread=spread)
        checkpoint.save(cfg, env, epoch, raw_model, optimizer, best, report)  # every rank; rank 0 writes the file

    spread = replica_spread(model, env)  # again: a resumed run may have had no epoch left
    heldout_auc = None
    if env.is_main:
        best.restore(raw_model)
        heldout_auc = evaluate(raw_model, make_eval_loader(splits.heldout), env.device)
    if env.is_main:
        torch.save(raw_model.state_dict(), cfg.out / "model.pt")
    return report.finish(best, heldout_auc, replica_spread=spread) if env.is_main else None


def main(argv: list[str] | None = None) -> dict | None:
    cfg = parse_config(build_parser(__doc__.splitlines()[0]), argv)
    launch = distributed.read_launch_env()  # what torchrun told this process; a world of one under plain python
    backend = cfg.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    distributed.check_backend(backend, launch)  # one line, not a CUDA traceback, if this node lacks GPUs
    device = torch.device("cuda", launch.local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # one GPU per process: the local rank picks it on this node
    distributed.set_threads(launch, device)  # on CPU, each rank its share of the cores
    store = distributed.rendezvous_store(launch, cfg.timeout)  # fresh keys per restart; in memory under python
    dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                            timeout=timedelta(seconds=cfg.timeout))
    env = DistEnv(rank=dist.get_rank(), local_rank=launch.local_rank, world_size=dist.get_world_size(),
                  local_world_size=launch.local_world_size, device=device, backend=backend)
    hangwatch.install(store)  # a collective that waits too long names the rank it waits for (workshop_lib.debug)
    try:
        with distributed.failure_relay(store, env, cfg.timeout):  # a rank that fails tells the others why
            print(f"hello from {env.describe()}", flush=True)  # every rank speaks
            check_all_reduce(env)
            return train(cfg, env)
    finally:
        dist.destroy_process_group()  # always leave the group, even after an error


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
