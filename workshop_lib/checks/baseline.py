"""The exercise check of notebook 00 (the baseline): the training loop of ``train_epoch``, judged by what it did.

The learner's ``train_epoch(model, loader, optimizer, device)`` runs over 3 batches (4 + 4 + 2 molecules) of a tiny
model without dropout, with SGD. The same loop, written out here, runs on a copy from the same weights: the
learner's weights must end where it ends (each batch's own gradients, one step per batch), and the returned tensor
must hold the sum of each batch's loss times its molecules, and the molecules.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from workshop_lib.checks.common import CheckFailed, _call, _passed
from workshop_lib.checks.recorder import Collectives, Recorder
from workshop_lib.data import TokenizedDataset, collate
from workshop_lib.debug import collectives

VOCAB, SIZES, LR = 12, (4, 4, 2), 0.5


def tiny_dataset(n: int, seed: int = 0) -> TokenizedDataset:
    """``n`` made-up molecules (random tokens, 3 to 8 long) as the domain's own dataset class."""
    g = torch.Generator().manual_seed(seed)
    data = TokenizedDataset.__new__(TokenizedDataset)
    data.lengths = torch.randint(3, 9, (n,), generator=g)  # (N,)
    data.tokens = torch.randint(1, VOCAB, (n, 8), generator=g) * (torch.arange(8) < data.lengths[:, None])  # (N, 8)
    data.labels = (torch.arange(n) % 2).float()  # (N,)
    data.smiles = [f"m{i}" for i in range(n)]
    return data


def _model() -> torch.nn.Module:
    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    return SmilesLSTM(VOCAB, 8, 8, 1, 0.0)  # no dropout: two copies compute the same thing


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _reference(model, loader, zero_grad: bool = True) -> tuple[torch.Tensor, float, float]:
    """The textbook loop on ``model``: its weights after, the loss sum, the sum of the batch means."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    total = means = 0.0
    for tokens, lengths, labels in loader:
        loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
        means += loss.item()
    return _weights(model), total, means


def train_epoch(fn: Callable) -> None:
    """The learner's ``train_epoch``: each batch's own gradients, one optimizer step a batch, the right sums."""
    n = sum(SIZES)
    loader = DataLoader(tiny_dataset(n), batch_size=SIZES[0], collate_fn=collate)  # no shuffle: 4, 4, 2
    model = _model()
    start = _weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    stepped = []
    optimizer.register_step_post_hook(lambda *_: stepped.append(1))
    rec = Recorder()  # counts the loss.backward() calls (rec.backwards)
    with collectives.observing(Collectives(rec)), contextlib.redirect_stdout(io.StringIO()):
        totals = _call(fn, "train_epoch", model, loader, optimizer, torch.device("cpu"))
    want, total, means = _reference(copy.deepcopy(_model()), loader)
    if not isinstance(totals, torch.Tensor) or totals.shape != (2,):
        raise CheckFailed(f"train_epoch returned {totals!r}, not a tensor [loss sum, molecules]: keep "
                          f"`return totals`")
    batches = len(SIZES)
    if rec.backwards != batches:
        raise CheckFailed(f"loss.backward() ran {rec.backwards} time(s) for {batches} batches: once per batch, "
                          f"inside the loop, so that each step has its batch's gradients")
    if len(stepped) != batches:
        raise CheckFailed(f"optimizer.step() ran {len(stepped)} time(s) for {batches} batches: once per batch, "
                          f"after loss.backward()")
    got = _weights(model)
    if torch.equal(got, start):
        raise CheckFailed("the weights did not move: optimizer.step() found no gradients; call loss.backward() before "
                          "optimizer.step(), and optimizer.zero_grad() before loss.backward(), not between them")
    if not torch.allclose(got, want, atol=1e-6):
        summed, _, _ = _reference(copy.deepcopy(_model()), loader, zero_grad=False)
        if torch.allclose(got, summed, atol=1e-6):
            raise CheckFailed("each step also used the gradients of the batches before it: call optimizer.zero_grad() "
                              "in every batch, before loss.backward()")
        gap = (got - want).abs().max().item()
        raise CheckFailed(f"after {batches} batches the weights differ from one SGD step per batch on its own loss by "
                          f"{gap:.2g}: compute the loss of the batch's logits against its labels, then zero_grad, "
                          f"backward, step")
    if int(totals[1]) != n:
        raise CheckFailed(f"train_epoch returned {int(totals[1])} molecules, not the {n} of its {batches} batches: "
                          f"add len(labels) for each batch")
    if abs(float(totals[0]) - total) > 1e-4 * max(1.0, total):
        why = (": weigh each batch's mean loss by its molecules (loss * len(labels))"
               if abs(float(totals[0]) - means) <= 1e-4 * max(1.0, means) else "")
        raise CheckFailed(f"train_epoch returned a loss sum of {float(totals[0]):.4f}, not {total:.4f}, the batches' "
                          f"losses times their molecules{why}")
    _passed(f"train_epoch: {batches} batches ({' + '.join(map(str, SIZES))} molecules), {batches} optimizer steps, each "
            f"on its batch's own gradients (the weights match the textbook loop's); returned [loss sum {total:.4f}, "
            f"{n} molecules]")
