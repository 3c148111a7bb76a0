# Generated from notebooks/02_distributed_sampler.ipynb by `python -m tools.build`: do not edit.
# (and cells of notebooks/00_baseline.ipynb)
# (and cells of notebooks/01_process_group.ipynb)
# Edit the cells tagged script:step2_sampler, then rebuild.
"""Step 2: DistributedSampler gives every rank its own shard of the data.

Each rank now trains on 1/N of the molecules per epoch, so an epoch takes
1/N of the time. But nothing keeps the N models in step: each follows its
own shard's gradients, and their weights drift apart (printed every epoch).
Step 3 fixes that with DistributedDataParallel.

    torchrun --standalone --nproc_per_node=2 solutions/step2_sampler.py
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, DistributedSampler

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


def make_loader(dataset, batch_size: int, seed: int) -> DataLoader:
    """This rank's shard of the training batches: 1/N of ``dataset``, reshuffled by set_epoch."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate)


def replica_spread(model: torch.nn.Module) -> float:
    """Largest difference between any rank's weights and rank 0's (0.0: all replicas agree)."""
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()  # (P,)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)  # the whole model, each epoch: a teaching probe, to delete in your own project
    return max((w - everyone[0]).abs().max().item() for w in everyone)


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
        report = Reporter(cfg, "step2_sampler", splits, model, world_size) if rank == 0 else None

        best = BestModel()
        for epoch in range(cfg.epochs):
            train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            start = time.perf_counter()
            totals = train_epoch(model, train_loader, optimizer, device)
            seconds = time.perf_counter() - start
            dist.all_reduce(totals)  # summed over the ranks: the loss of the whole epoch, every molecule
            spread = replica_spread(model)  # every rank takes part in the all_gather (a teaching probe)
            if rank == 0:  # rank 0 evaluates its own replica and reports
                dev_auc = evaluate(model, dev_loader, device)
                best.update(epoch, dev_auc, model)
                loss, samples = (totals[0] / totals[1]).item(), int(totals[1])
                report.epoch(epoch, loss, samples, seconds, dev_auc, replica_spread=spread)

        if rank == 0:  # one file for the whole job: rank 0's replica
            best.restore(model)
            heldout_loader = DataLoader(splits.heldout, batch_size=256, collate_fn=collate)
            torch.save(model.state_dict(), cfg.out / "model.pt")
            report.finish(best, evaluate(model, heldout_loader, device), replica_spread=spread)
    finally:
        dist.destroy_process_group()  # always leave the group, even after an error


if __name__ == "__main__":
    if "RANK" not in os.environ:  # plain python: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        raise SystemExit(f"start it with torchrun: torchrun --standalone --nproc_per_node=2 {os.path.relpath(__file__)}")
    main()
