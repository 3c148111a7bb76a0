"""One optimizer step, for the gradient-equivalence test (tests/unit/core/test_ddp.py): on forked ranks with DDP, or
in-process without it."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from workshop_lib.data import TokenizedDataset, collate
from workshop_lib.model import SmilesLSTM
from workshop_lib.tokenizer import SmilesTokenizer

SMILES = ["CCO", "c1ccccc1Cl", "CC(=O)Oc1ccccc1C(=O)O", "N", "CCN(CC)CC", "O=C=O", "C1CCCCC1N", "BrCCBr"]
LABELS = [1, 0, 1, 0, 1, 1, 0, 0]


def one_step(rank: int, world_size: int, steps: int = 1, ddp: bool = False) -> dict[str, torch.Tensor]:
    """``steps`` SGD steps on this rank's 1/world_size of the molecules; the plain model's weights after."""
    torch.manual_seed(0)
    ds = TokenizedDataset(SMILES, np.array(LABELS), SmilesTokenizer.fit(SMILES))
    model = SmilesLSTM(40, 8, 12, 2, dropout=0.0)
    if ddp:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    per_rank = len(SMILES) // world_size
    tokens, lengths, labels = collate([ds[i] for i in range(rank * per_rank, (rank + 1) * per_rank)])
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    plain = model.module if ddp else model
    return {k: v.detach().clone() for k, v in plain.state_dict().items()}

