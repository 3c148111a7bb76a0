# Generated from notebooks/04a_patterns.ipynb by `python -m tools.build`: do not edit.
# (and cells of notebooks/00_baseline.ipynb)
# (and cells of notebooks/01_process_group.ipynb)
# (and cells of notebooks/02_distributed_sampler.ipynb)
# Edit the cells tagged script:step4_snapshots, then rebuild.
# ruff: noqa (exercise version: the TODOs leave names for you to define)
"""Step 4: snapshots; a run that was killed or interrupted resumes where it stopped.

Step 3 plus a snapshot after every epoch: global rank 0 writes the epoch, the
model's and the optimizer's state (and the workshop's record: settings, best
model, history) to a temporary file, then moves it onto OUT/snapshot.pt with
os.replace. A run that finds one loads it on every rank and goes on after its
epoch. Every epoch reseeds from (seed, epoch, rank), so a resumed run ends
with the numbers of an uninterrupted one.

    torchrun --standalone --nproc_per_node=2 solutions/step4_snapshots.py
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc_per_node=2 --max-restarts=1 \
        solutions/step4_snapshots.py

The variable works around a restart bug of torchrun 2.13's shared store
(docs/reference/restarts.md): with it, a restarted group joins afresh.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib import checkpoint
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


def save_snapshot(snapshot: dict, path) -> None:
    """Write ``snapshot`` to ``path`` so that a kill at any moment leaves the old file or the new one, never half."""
    # TODO: torch.save `snapshot` so that `path` is always whole, the old snapshot or the new one: write a temporary
    #       file in the same folder first, then put it in place in one step. Read: os.replace in Python's docs
    raise NotImplementedError("fill in the TODO above")


@record  # a rank's error and traceback go into torchrun's failure summary
def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv, __doc__)
    splits = load_splits(cfg)  # bad data stops every rank here, with one line, before any waits for another
    device = setup(cfg.timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world_size} on {device}", flush=True)  # every rank speaks
    try:
        check_all_reduce(device)
        resume_from = checkpoint.to_resume(cfg, rank)  # --resume, else OUT/snapshot.pt if there is one; None: afresh
        snapshot = None
        if resume_from is not None:  # every rank reads it, before anything is written
            # TODO: load the snapshot: its tensors onto this rank's device, and nothing unpickled but tensors and
            #       plain containers. Read: torch.load in the torch docs (map_location, weights_only)
            raise NotImplementedError("fill in the TODO above")
            checkpoint.refuse_another_run(snapshot, resume_from, cfg, world_size)  # other settings: one line, stop
        train_loader = make_loader(splits.train, cfg.batch_size, cfg.seed)
        dev_loader = DataLoader(splits.dev, batch_size=256, collate_fn=collate)
        torch.manual_seed(cfg.seed)
        model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout).to(device)
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # backward() now averages
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        report = Reporter(cfg, "step4_snapshots", splits, model, world_size) if rank == 0 else None

        best = BestModel()
        first_epoch = 0
        if snapshot is not None:
            # TODO: resume from the snapshot: its weights into the plain model, its state into the optimizer, and
            #       first_epoch, the first epoch not yet trained. Read: the PyTorch recipe "Saving and loading a
            #       general checkpoint in PyTorch" (pytorch.org/tutorials)
            raise NotImplementedError("fill in the TODO above")
            checkpoint.restore_history(snapshot, resume_from, best, report)  # the best model so far, the history
        for epoch in range(first_epoch, cfg.epochs):
            checkpoint.seed_epoch(cfg.seed, epoch, rank)  # the same dropout masks, restarted or not
            train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            start = time.perf_counter()
            totals = train_epoch(model, train_loader, optimizer, device)
            seconds = time.perf_counter() - start
            dist.all_reduce(totals)  # summed over the ranks: the loss of the whole epoch, every molecule
            spread = replica_spread(model)  # every rank takes part in the all_gather (a teaching probe)
            if rank == 0:  # rank 0 alone evaluates the plain model; the others go on to the next all-reduce
                dev_auc = evaluate(model.module, dev_loader, device)
                best.update(epoch, dev_auc, model.module)
                loss, samples = (totals[0] / totals[1]).item(), int(totals[1])
                report.epoch(epoch, loss, samples, seconds, dev_auc, replica_spread=spread)
                # TODO: this epoch's snapshot, a dict under the keys "epoch", "model" and "optimizer": the epoch, and
                #       the state of the plain model and of the optimizer. Read: the recipe named above, its step
                #       "Save the general checkpoint"
                raise NotImplementedError("fill in the TODO above")
                snapshot.update(checkpoint.run_record(best, report))  # this run's settings, the best model, the history
                save_snapshot(snapshot, cfg.out / checkpoint.SNAPSHOT)  # rank 0 alone writes it

        spread = replica_spread(model)  # again: a resumed run may have had no epoch left
        if rank == 0:  # one file for the whole job
            best.restore(model.module)
            heldout_loader = DataLoader(splits.heldout, batch_size=256, collate_fn=collate)
            torch.save(model.module.state_dict(), cfg.out / "model.pt")
            report.finish(best, evaluate(model.module, heldout_loader, device), replica_spread=spread)
    finally:
        dist.destroy_process_group()  # always leave the group, even after an error


if __name__ == "__main__":
    if "RANK" not in os.environ:  # plain python: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        raise SystemExit(f"start it with torchrun: torchrun --standalone --nproc_per_node=2 {os.path.relpath(__file__)}")
    main()
