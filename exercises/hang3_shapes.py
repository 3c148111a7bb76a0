# Generated from notebooks/05_when_it_hangs.ipynb by `python -m workshop_lib.build`: do not edit.
# Edit the cells tagged script:hang3_shapes, then rebuild.
# ruff: noqa (exercise version: the TODOs leave names for you to define)
"""A lab script of notebooks/05_when_it_hangs.ipynb: a small step 3 (DDP, rank-0 evaluation) with one bug to fix.

    torchrun --nproc_per_node=2 exercises/hangN_....py --limit 447 --epochs 1 --batch-size 32 --timeout 8

(exercises/ holds the broken versions, solutions/ the fixed ones.)
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from workshop_lib import distributed
from workshop_lib.cli import run_cli
from workshop_lib.config import TrainConfig, build_parser, parse_config
from workshop_lib.data import load_splits, make_eval_loader, make_loader
from workshop_lib.debug import hangwatch
from workshop_lib.train import build_model, build_optimizer, evaluate, train_epoch


def replica_spread(model: torch.nn.Module, world_size: int) -> float:
    """Largest difference between any rank's weights and rank 0's (0.0: all replicas agree). An all_gather."""
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()  # (P,)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    return max((w - everyone[0]).abs().max().item() for w in everyone)


def train(cfg: TrainConfig, rank: int, world_size: int, device: torch.device) -> None:
    splits = load_splits(cfg.data, limit=cfg.limit)
    sampler = DistributedSampler(splits.train, num_replicas=world_size, rank=rank, seed=cfg.seed)
    loader = make_loader(splits.train, sampler, cfg.batch_size, seed=cfg.seed)
    model = DDP(build_model(cfg, len(splits.tokenizer)).to(device))
    optimizer = build_optimizer(cfg, model)
    for epoch in range(cfg.epochs):
        loader.batch_sampler.set_epoch(epoch)
        stats = train_epoch(model, loader, optimizer, device)
        spread = replica_spread(model, world_size)  # an all_gather: every rank takes part
        loss = torch.tensor([stats.loss, stats.samples] if rank == 0 else [stats.loss], device=device)  # rank 0 logs both
        dist.all_reduce(loss)  # summed over the ranks
        if rank == 0:
            dev_auc = evaluate(model.module, make_eval_loader(splits.dev), device)
            print(f"epoch {epoch + 1}: {stats.steps} steps, loss {loss.item() / world_size:.4f}, "
                  f"dev ROC AUC {dev_auc:.4f}, replica spread {spread:g}")
    spread = replica_spread(model, world_size)
    if rank == 0:
        print(f"done: {stats.steps} steps per rank, replica spread {spread:g}")


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(build_parser("a hang-lab script of notebooks/05_when_it_hangs.ipynb"), argv)
    launch = distributed.read_launch_env()
    device = torch.device("cuda", launch.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=cfg.timeout))
    hangwatch.install(threshold=min(5.0, cfg.timeout / 2))  # a collective waiting this long: who is missing, where
    try:
        train(cfg, launch.rank, launch.world_size, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
