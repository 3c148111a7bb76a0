# Generated from notebooks/01_process_group.ipynb by `python -m tools.build`: do not edit.
# (and cells of notebooks/00_baseline.ipynb)
# Edit the cells tagged script:step1_process_group, then rebuild.
"""Step 1: a process group started by torchrun.

torchrun starts one copy of this script per process and tells each copy its
rank. The copies join one process group, check it with an all_reduce, and
(for now) each trains the whole model on the whole data: N times the work,
no speed-up yet. Step 2 splits the data.

    torchrun --standalone --nproc_per_node=2 solutions/step1_process_group.py
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader

from workshop_lib.config import parse_args
from workshop_lib.data import collate, load_splits
from workshop_lib.metrics import BestModel, evaluate
from workshop_lib.model import SmilesLSTM
from workshop_lib.report import Reporter


def train_epoch(model, loader, optimizer, device) -> torch.Tensor:
    """One pass over ``loader``; returns [the summed loss, the number of molecules] of this process."""
    model.train()
    totals = torch.zeros(2, device=device)
    for tokens, lengths, labels in loader:
        tokens, labels = tokens.to(device), labels.to(device)
        loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        totals += torch.stack([loss.detach() * len(labels), torch.tensor(len(labels), device=device)])
    return totals


def make_loader(dataset, batch_size: int, seed: int) -> DataLoader:
    """Training batches in a new random order every epoch."""
    order = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order, collate_fn=collate)


def check_all_reduce(device: torch.device) -> None:
    """Every rank contributes rank + 1; afterwards every rank holds 1 + 2 + ... + N."""
    value = torch.tensor([dist.get_rank() + 1.0], device=device)  # (1,) this rank's contribution, on its device
    dist.all_reduce(value, op=dist.ReduceOp.SUM)  # in place: every rank now holds the sum
    world_size = dist.get_world_size()
    assert value.item() == world_size * (world_size + 1) / 2, f"all_reduce gave {value.item()}"


def setup(timeout: float) -> torch.device:
    """Join the process group that torchrun describes in the environment; return this process's device."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))  # one GPU per process on this node
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if device.type == "cuda":
        dist.init_process_group("nccl", timeout=timedelta(seconds=timeout), device_id=device)
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    return device


@record  # a rank's error and traceback go into torchrun's failure summary
def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv, __doc__)
    splits = load_splits(cfg)  # bad data stops every rank here, with one line, before any waits for another
    device = setup(cfg.timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world_size} on {device}", flush=True)  # every rank speaks
    try:
        check_all_reduce(device)
        train_loader = make_loader(splits.train, cfg.batch_size, cfg.seed)
        dev_loader = DataLoader(splits.dev, batch_size=256, collate_fn=collate)
        torch.manual_seed(cfg.seed)
        model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        report = Reporter(cfg, "step1_process_group", splits, model, world_size) if rank == 0 else None

        best = BestModel()
        for epoch in range(cfg.epochs):
            start = time.perf_counter()
            totals = train_epoch(model, train_loader, optimizer, device)
            seconds = time.perf_counter() - start
            if rank == 0:  # every rank trained the same model on the same data: rank 0 alone evaluates, reports
                dev_auc = evaluate(model, dev_loader, device)
                best.update(epoch, dev_auc, model)
                loss, samples = (totals[0] / totals[1]).item(), int(totals[1])
                report.epoch(epoch, loss, samples, seconds, dev_auc)

        if rank == 0:  # one file for the whole job, written by global rank 0
            best.restore(model)
            heldout_loader = DataLoader(splits.heldout, batch_size=256, collate_fn=collate)
            torch.save(model.state_dict(), cfg.out / "model.pt")
            report.finish(best, evaluate(model, heldout_loader, device))
    finally:
        dist.destroy_process_group()  # always leave the group, even after an error


if __name__ == "__main__":
    if "RANK" not in os.environ:  # plain python: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        raise SystemExit(f"start it with torchrun: torchrun --standalone --nproc_per_node=2 {os.path.relpath(__file__)}")
    main()
