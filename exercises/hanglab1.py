# Generated from notebooks/05_when_it_hangs.ipynb by `python -m tools.build`: do not edit.
# Edit the cells tagged script:hanglab1, then rebuild.
"""A lab script of notebooks/05_when_it_hangs.ipynb: a small step 3 (DDP, rank-0 evaluation) with one bug to fix.

    torchrun --standalone --nproc_per_node=2 exercises/hanglabN.py --limit 447 --epochs 1 --batch-size 32 --timeout 60

exercises/ holds the broken versions, solutions/ the fixed ones. While it hangs, `python -m workshop_lib.diagnose` in
another terminal prints each stack; `torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch exercises/hanglabN.py`
runs it with the hang watch attached. The notebook gives each lab its batch size (BATCH in workshop_lib/checks/hang_runs.py).
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.config import TrainConfig, parse_args
from workshop_lib.data import collate, load_splits
from workshop_lib.metrics import evaluate
from workshop_lib.model import SmilesLSTM


def replica_spread(model: torch.nn.Module, world_size: int) -> float:
    """Largest difference between any rank's weights and rank 0's (0.0: all replicas agree). An all_gather."""
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()  # (P,)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    return max((w - everyone[0]).abs().max().item() for w in everyone)


def global_mean(value: float, device: torch.device) -> float:
    """The mean of ``value`` over the ranks. An all_reduce."""
    total = torch.tensor([value], device=device)  # (1,)
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def train(cfg: TrainConfig, rank: int, world_size: int, device: torch.device) -> None:
    splits = load_splits(cfg)
    sampler = DistributedSampler(splits.train, num_replicas=world_size, rank=rank, seed=cfg.seed)
    loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collate)
    dev_loader = DataLoader(splits.dev, batch_size=256, collate_fn=collate)
    torch.manual_seed(cfg.seed)
    model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)
    model = DDP(model.to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    for epoch in range(cfg.epochs):
        loader.sampler.set_epoch(epoch)
        model.train()
        steps, total = 0, 0.0
        for tokens, lengths, labels in loader:
            tokens, labels = tokens.to(device), labels.to(device)
            loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps, total = steps + 1, total + loss.item()
        spread = replica_spread(model, world_size)  # the replicas' largest difference
        if rank == 0:
            dev_auc = evaluate(model.module, dev_loader, device)
            print(f"epoch {epoch + 1}: {steps} steps, loss {global_mean(total / steps, device):.4f}, "
                  f"dev ROC AUC {dev_auc:.4f}, replica spread {spread:g}")
    spread = replica_spread(model, world_size)
    if rank == 0:
        print(f"done: {steps} steps per rank, replica spread {spread:g}")


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv, __doc__)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))  # one GPU per process on this node
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timedelta(seconds=cfg.timeout), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.timeout))
    try:
        train(cfg, dist.get_rank(), dist.get_world_size(), device)
    finally:
        dist.destroy_process_group()  # always leave the group, even after an error


if __name__ == "__main__":
    main()
