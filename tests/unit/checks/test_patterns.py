"""Notebook 04a's checks: each passes the right code and names the mistake in each wrong one.

The accumulation loop and step 4's ``train`` run on 2 forked ranks, as in the
notebook; the prediction check reads hand-built records, and the recorder is
checked against a real DDP model.
"""

from __future__ import annotations

import contextlib
import runpy
import types

import pytest
import torch.nn.functional as F

from workshop_lib.checks import patterns
from workshop_lib.checks.common import CheckFailed
from workshop_lib.data import load_splits
from workshop_lib.lab import forklaunch
from workshop_lib.paths import DEFAULT_DATA, REPO_ROOT

SPLITS = None
STEP4 = REPO_ROOT / "solutions" / "step4_snapshots.py"


def batches_of(rank: int):
    global SPLITS
    if SPLITS is None:
        SPLITS = load_splits(DEFAULT_DATA, limit=400)
    return [SPLITS.train.__getitems__(range((rank * 8 + k) * 8, (rank * 8 + k + 1) * 8)) for k in range(8)]


def vocab() -> int:
    batches_of(0)
    return len(SPLITS.tokenizer)


# ------------------------------------------------------------------------- the prediction


def events(*backwards):
    return [{"kind": "collective", "name": "all_reduce", "phase": "enter", "backward": b} for b in backwards]


def test_a_right_prediction_passes_and_says_where(capsys):
    patterns.allreduce_count(1, events(4))
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} DDP ran 1 all-reduce in 4 backward() calls (in backward 4)")


@pytest.mark.parametrize(("predicted", "named"), [
    (4, "you predicted 4; DDP ran 1 all-reduce in 4 backward() calls (in backward 4): inside no_sync()"),
    (0, "you predicted 0; DDP ran 1 all-reduce in 4 backward() calls (in backward 4): every backward() outside"),
    (None, "predicted_allreduces is None: write your prediction as a whole number first"),
    ("1", "predicted_allreduces is '1'"),
])
def test_a_wrong_prediction_is_named(predicted, named):
    with pytest.raises(CheckFailed) as err:
        patterns.allreduce_count(predicted, events(4))
    assert str(err.value).startswith(named), str(err.value)


def _count(env, vocab_size: int, use_no_sync: bool):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.model import SmilesLSTM

    model = DDP(SmilesLSTM(vocab_size, dropout=0.0))
    with patterns.recording_allreduces(model) as seen:
        for k, b in enumerate(batches_of(env.rank)[:4]):
            with model.no_sync() if use_no_sync and k < 3 else contextlib.nullcontext():
                F.binary_cross_entropy_with_logits(model(b.tokens, b.lengths), b.labels).backward()
    return [e["backward"] for e in seen]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_recorder_sees_each_of_ddps_allreduces_and_its_backward():
    assert forklaunch.notebook_launch(_count, 2, vocab(), True, timeout=90) == [[4], [4]]
    assert forklaunch.notebook_launch(_count, 2, vocab(), False, timeout=90)[0] == [1, 2, 3, 4]


# ------------------------------------------------------------------- the accumulation loop


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


def todo(*args):
    raise NotImplementedError("fill in the TODO above")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_accumulating_loop_passes(capsys):
    patterns.accumulation(make_loop(), batches_of, vocab())
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} train_accumulating: 2 steps of 4 micro-batches x 2 ranks")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("loop", "named"), [
    (todo, "still raises NotImplementedError"),
    (make_loop(no_sync_all_but_last=False), "8 all-reduces for 8 micro-batches"),
    (make_loop(forward_outside=True), "(the forward too)"),
    (make_loop(divide=False), "divide every micro-batch's loss by accum (4)"),
    (make_loop(zero_grad=False), "call optimizer.zero_grad() after every optimizer.step()"),
    (make_loop(sync_first=True), "the replicas drifted apart: a step used gradients that were not all-reduced"),
], ids=["todo", "no no_sync", "forward outside no_sync", "loss not divided", "no zero_grad", "sync on the first"])
def test_each_accumulation_mistake_is_named(loop, named):
    with pytest.raises(CheckFailed) as err:
        patterns.accumulation(loop, batches_of, vocab())
    assert named in str(err.value), str(err.value)


# ------------------------------------------------------------------------- step 4's train


def step4_train(*drop: str, replace: tuple[str, str] | None = None):
    """Step 4's train from solutions/step4_snapshots.py, without the lines that contain any of ``drop``."""
    lines = [line for line in STEP4.read_text().splitlines() if not any(d in line for d in drop)]
    source = "\n".join(lines)
    if replace:
        source = source.replace(*replace)
    module = types.ModuleType("step4_variant")
    module.__file__ = str(STEP4)
    exec(compile(source, str(STEP4), "exec"), module.__dict__)  # the repository's own script, changed
    return module.train


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_step4s_train_passes(capsys):
    patterns.snapshots(runpy.run_path(str(STEP4))["train"])
    out = capsys.readouterr().out
    assert "--epochs 2: trained epochs 1, 2; snapshot.pt holds epoch 2" in out
    assert ("--epochs 3: resuming from snapshot.pt: epoch 2/3 was done; trained epoch 3; snapshot.pt holds epoch 3"
            in out)
    assert out.rstrip().endswith("\N{CHECK MARK} train: the second run resumed after epoch 2 and trained only epoch 3; "
                                 "metrics.json holds all 3")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("train", "named"), [
    (lambda: step4_train("checkpoint.save("), "no snapshot.pt in --out after 2 epochs: call checkpoint.save("),
    (lambda: step4_train("checkpoint.load_latest(", replace=("checkpoint.restore(latest", "checkpoint.restore(None")),
     "the second run started again from epoch 1: before the loop, load the latest snapshot"),
    (lambda: step4_train(replace=("range(start, cfg.epochs)", "range(cfg.epochs)")),
     "the second run found the snapshot but trained from epoch 1 again: start the loop at the epoch"),
], ids=["no save", "no resume", "loop from 0"])
def test_each_snapshot_mistake_is_named(train, named):
    with pytest.raises(CheckFailed) as err:
        patterns.snapshots(train())
    assert str(err.value).startswith(named), str(err.value)
