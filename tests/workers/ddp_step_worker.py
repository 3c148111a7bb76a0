"""One optimizer step, run by the gradient-equivalence test under torchrun (or in-process)."""

from __future__ import annotations

import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from workshop_lib import distributed
from workshop_lib.cli import exit_worker
from workshop_lib.data import TokenizedDataset
from workshop_lib.model import SmilesLSTM
from workshop_lib.tokenizer import SmilesTokenizer

SMILES = ["CCO", "c1ccccc1Cl", "CC(=O)Oc1ccccc1C(=O)O", "N", "CCN(CC)CC", "O=C=O", "C1CCCCC1N", "BrCCBr"]
LABELS = [1, 0, 1, 0, 1, 1, 0, 0]
B = 4  # per-rank batch; the single process takes 2B


def one_step(rank: int, world_size: int, steps: int = 1, ddp: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ds = TokenizedDataset(SMILES, torch.tensor(LABELS).numpy(), SmilesTokenizer.fit(SMILES))
    model = SmilesLSTM(40, 8, 12, 2, dropout=0.0)
    if ddp:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    per_rank = len(SMILES) // world_size
    batch = ds.__getitems__(list(range(rank * per_rank, (rank + 1) * per_rank)))
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch.tokens, batch.lengths), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    raw = model.module if ddp else model
    return {k: v.detach().clone() for k, v in raw.state_dict().items()}


if __name__ == "__main__":
    env = distributed.setup(timeout=60)
    try:
        state = one_step(env.rank, env.world_size, ddp=True)
        if env.is_main:
            torch.save(state, sys.argv[1])
    finally:
        distributed.teardown()
    exit_worker(0)
