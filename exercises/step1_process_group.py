# Generated from notebooks/01_process_group.ipynb by `python -m workshop_lib.build`: do not edit.
# Edit the cells tagged script:step1_process_group, then rebuild.
# ruff: noqa (exercise version: the TODOs leave names for you to define)
"""Step 1: a process group started by torchrun.

torchrun starts one copy of this script per process and tells each copy its
rank. The copies join one process group, check it with an all_reduce, and
(for now) each trains the whole model on the whole data: N times the work,
no speed-up yet. Step 2 splits the data.

    torchrun --nproc_per_node=2 solutions/step1_process_group.py
    python solutions/step1_process_group.py          # a group of one
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import RandomSampler

from workshop_lib import distributed
from workshop_lib.cli import run_cli
from workshop_lib.config import TrainConfig, build_parser, parse_config
from workshop_lib.data import load_splits, make_eval_loader, make_loader
from workshop_lib.debug import hangwatch
from workshop_lib.distributed import DistEnv
from workshop_lib.model import count_parameters
from workshop_lib.report import Reporter
from workshop_lib.train import BestModel, build_model, build_optimizer, evaluate, train_epoch


def check_all_reduce(env: DistEnv) -> None:
    """Every rank contributes rank + 1; afterwards every rank holds 1 + 2 + ... + N."""
    # TODO: make `value`, a one-element tensor on env.device holding this rank's contribution, and sum it over
    #       all ranks in place. Read: section 3 above; torch.distributed.all_reduce in the torch docs.
    raise NotImplementedError("fill in the TODO above")
    expected = env.world_size * (env.world_size + 1) / 2
    assert value.item() == expected, f"all_reduce gave {value.item()}, expected {expected}"
    if env.is_main:
        print(f"all_reduce: sum of (rank + 1) over {env.world_size} ranks = {value.item():g} (expected {expected:g})")


def train(cfg: TrainConfig, env: DistEnv) -> dict | None:
    torch.manual_seed(cfg.seed)
    splits = load_splits(cfg.data, cfg.smiles_col, cfg.label_col, cfg.limit,
                         cfg.heldout_frac, cfg.dev_frac, cfg.split_seed)
    report = Reporter(cfg, "step1_process_group", env.device, env)

    sampler = RandomSampler(splits.train, generator=torch.Generator().manual_seed(cfg.seed))
    train_loader = make_loader(splits.train, sampler, cfg.batch_size, seed=cfg.seed)
    dev_loader = make_eval_loader(splits.dev)

    model = build_model(cfg, len(splits.tokenizer)).to(env.device)
    optimizer = build_optimizer(cfg, model)
    report.start(len(splits.train), len(splits.dev), len(splits.heldout), count_parameters(model), splits.source)

    best = BestModel()
    for epoch in range(cfg.epochs):
        bar = report.progress(epoch, len(train_loader))
        stats = train_epoch(model, train_loader, optimizer, env.device, bar)
        dev_auc = evaluate(model, dev_loader, env.device)
        best.update(epoch, dev_auc, model)
        report.epoch(epoch, stats, dev_auc, bar)

    best.restore(model)
    heldout_auc = evaluate(model, make_eval_loader(splits.heldout), env.device)
    return report.finish(best, heldout_auc)


def main(argv: list[str] | None = None) -> dict | None:
    cfg = parse_config(build_parser(__doc__.splitlines()[0]), argv)
    launch = distributed.read_launch_env()  # what torchrun told this process; a world of one under plain python
    # TODO: pick `backend` (cfg.backend, else the one for this machine) and `device`, this process's own, and
    #       make that device the current one on a GPU. Read: section 2 above; torch.cuda.set_device in the docs.
    raise NotImplementedError("fill in the TODO above")
    distributed.set_threads(launch, device)  # on CPU, each rank its share of the cores
    store = distributed.rendezvous_store(launch, cfg.timeout)  # fresh keys per restart; in memory under python
    # TODO: join this job's process group on `store`, giving up on a missing peer after cfg.timeout seconds.
    #       Read: torch.distributed.init_process_group in the docs (with a store, what else it must be told).
    raise NotImplementedError("fill in the TODO above")
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
