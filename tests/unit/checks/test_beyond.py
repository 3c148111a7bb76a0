"""Notebook 04's exercise check passes the right loop and names the mistake in each wrong one."""

from __future__ import annotations

import contextlib

import pytest
import torch.nn.functional as F

from workshop_lib.checks import beyond
from workshop_lib.checks.common import CheckFailed
from workshop_lib.data import load_splits
from workshop_lib.paths import DEFAULT_DATA

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # each case forks 2 ranks

SPLITS = None


def batches_of(rank: int):
    global SPLITS
    if SPLITS is None:
        SPLITS = load_splits(DEFAULT_DATA, limit=400)
    return [SPLITS.train.__getitems__(range((rank * 8 + k) * 8, (rank * 8 + k + 1) * 8)) for k in range(8)]


def vocab() -> int:
    batches_of(0)
    return len(SPLITS.tokenizer)


def make_loop(no_sync_all_but_last=True, divide=True, zero_grad=True, forward_outside=False, sync_first=False):
    def loop(model, optimizer, batches, accum):
        for i, b in enumerate(batches):
            last = (i + 1) % accum == 0
            first = i % accum == 0
            skip = (not first) if sync_first else (not last)
            ctx = model.no_sync() if (no_sync_all_but_last and skip) else contextlib.nullcontext()
            if forward_outside:
                logits = model(b.tokens, b.lengths)
                with ctx:
                    (F.binary_cross_entropy_with_logits(logits, b.labels) / (accum if divide else 1)).backward()
            else:
                with ctx:
                    logits = model(b.tokens, b.lengths)
                    (F.binary_cross_entropy_with_logits(logits, b.labels) / (accum if divide else 1)).backward()
            if last:
                optimizer.step()
                if zero_grad:
                    optimizer.zero_grad()
    return loop


def todo(model, optimizer, batches, accum):
    raise NotImplementedError("fill in the TODO above")


def test_the_solution_passes(capsys):
    beyond.accumulation(make_loop(), batches_of, vocab())
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} train_accumulating: 2 steps of 4 micro-batches x 2 ranks")


@pytest.mark.parametrize(("loop", "named"), [
    (todo, "still raises NotImplementedError"),
    (make_loop(no_sync_all_but_last=False), "8 all-reduces for 8 micro-batches"),
    (make_loop(forward_outside=True), "(the forward too)"),
    (make_loop(divide=False), "divide every micro-batch's loss by accum (4)"),
    (make_loop(zero_grad=False), "call optimizer.zero_grad() after every optimizer.step()"),
    (make_loop(sync_first=True), "the replicas drifted apart: a step used gradients that were not all-reduced"),
], ids=["todo", "no no_sync", "forward outside no_sync", "loss not divided", "no zero_grad", "sync on the first"])
def test_each_mistake_is_named(loop, named):
    with pytest.raises(CheckFailed, match=None) as err:
        beyond.accumulation(loop, batches_of, vocab())
    assert named in str(err.value), str(err.value)
