"""Notebook 04a's checks: each passes the right code and names the mistake in each wrong one.

The accumulation loop runs on 2 forked ranks, as in the notebook; the
prediction check reads hand-built records, and the recorder is checked against a
real DDP model. Step 4's script check is test_script.py's.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from workshop_lib.checks import patterns
from workshop_lib.config import TrainConfig
from workshop_lib.data import collate, load_splits
from workshop_lib.engine.common import CheckFailed
from workshop_lib.engine.recorder import _of
from workshop_lib.launching import forklaunch

SPLITS = None


def batches_of(rank: int):
    global SPLITS
    if SPLITS is None:
        SPLITS = load_splits(TrainConfig(limit=400))
    return [collate([SPLITS.train[i] for i in range((rank * 8 + k) * 8, (rank * 8 + k + 1) * 8)]) for k in range(8)]


def vocab() -> int:
    batches_of(0)
    return len(SPLITS.tokenizer)


# ------------------------------------------------------------------------- the prediction


def events(*backwards):
    return [{"kind": "collective", "name": "all_reduce", "phase": "enter", "backward": b} for b in backwards]


def test_a_right_prediction_passes_and_says_where(capsys):
    patterns.allreduce_count(1, events(4))
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} the all-reduces: you predicted 1, measured 1 in 4 "
                                              "backward() calls (in backward 4)")


@pytest.mark.parametrize(("predicted", "named"), [
    (4, "you predicted 4, measured 1 in 4 backward() calls (in backward 4); inside no_sync()"),
    (0, "you predicted 0, measured 1 in 4 backward() calls (in backward 4); every backward() outside"),
    (None, "no prediction, measured 1 in 4 backward() calls"),
    ("1", "you predicted '1', measured 1"),
])
def test_a_wrong_prediction_is_said_with_a_cross_never_raised(predicted, named, capsys):
    patterns.allreduce_count(predicted, events(4))
    out = capsys.readouterr().out
    assert out.startswith("\N{BALLOT X} the all-reduces: " + named), out


def _count(env, vocab_size: int, use_no_sync: bool):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.model import SmilesLSTM

    model = DDP(SmilesLSTM(vocab_size, dropout=0.0))
    with patterns.recording_allreduces(model) as seen:
        for k, b in enumerate(batches_of(env.rank)[:4]):
            with model.no_sync() if use_no_sync and k < 3 else contextlib.nullcontext():
                F.binary_cross_entropy_with_logits(model(b.tokens, b.lengths), b.labels).backward()
    allreduces = _of(seen, "collective", name="all_reduce", phase="enter")
    return [(e["backward"], e["device"], e["dtype"], e["async_op"]) for e in allreduces]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_recorder_sees_each_of_ddps_allreduces_and_its_backward():
    bucket = ("cpu", "float32", True)  # DDP's one bucket, all-reduced through torch's allreduce_hook (async)
    assert forklaunch.notebook_launch(_count, 2, vocab(), True, timeout=90) == [[(4, *bucket)], [(4, *bucket)]]
    assert forklaunch.notebook_launch(_count, 2, vocab(), False, timeout=90)[0] == [(k, *bucket) for k in (1, 2, 3, 4)]


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


def _line_of(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


BACKWARD = _line_of(make_loop, "            else:") + 3  # the backward() of a forward inside the with block
STEP = _line_of(make_loop, "optimizer.step()")


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
    (make_loop(no_sync_all_but_last=False), f"the gradients were all-reduced in all 8 backward() calls (line {BACKWARD}), "
                                            f"4 per optimizer step (line {STEP}): DDP all-reduces in every backward() "
                                            "whose forward ran outside no_sync(), where one per step suffices"),
    (make_loop(forward_outside=True), "(the forward too)"),
    (make_loop(divide=False), "divide every micro-batch's loss by accum (4)"),
    (make_loop(zero_grad=False), "call optimizer.zero_grad() after every optimizer.step()"),
    (make_loop(sync_first=True), "the replicas drifted apart: a step used gradients that were not all-reduced"),
], ids=["todo", "no no_sync", "forward outside no_sync", "loss not divided", "no zero_grad", "sync on the first"])
def test_each_accumulation_mistake_is_named(loop, named):
    with pytest.raises(CheckFailed) as err:
        patterns.accumulation(loop, batches_of, vocab())
    assert named in str(err.value), str(err.value)


# ------------------------------------------------------------------------- mixed precision (section 3)


def make_autocast_loss(device_type=None, dtype=torch.bfloat16, enabled=True, autocast=True):
    """The learner's autocast_loss, right by default; each argument one way to get it wrong."""

    def autocast_loss(model, b):
        device = next(model.parameters()).device
        kind = device_type or device.type
        cast = torch.autocast(device_type=kind, dtype=dtype, enabled=enabled) if autocast else contextlib.nullcontext()
        with cast:
            logits = model(b.tokens, b.lengths)
            return F.binary_cross_entropy_with_logits(logits, b.labels)
    return autocast_loss


def autocast_todo(model, b):
    raise NotImplementedError("fill in the TODO above")


AUTOCAST_LINE = _line_of(make_autocast_loss, "cast = torch.autocast(")


@pytest.mark.timeout(60)
def test_autocast_on_this_machines_device_in_bfloat16_passes(capsys):
    patterns.autocast(make_autocast_loss(), batches_of(0)[0], vocab())
    said = capsys.readouterr().out
    assert said == ("\N{CHECK MARK} autocast_loss: under torch.autocast(device_type='cpu', dtype=torch.bfloat16) the "
                    "logits came back torch.bfloat16 and the loss torch.float32\n"), said


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("fn", "named"), [
    (autocast_todo, "autocast_loss still raises NotImplementedError"),
    (make_autocast_loss(autocast=False), "no torch.autocast ran: run the forward and the loss inside"),
    (make_autocast_loss(dtype=torch.float16),  # oneDNN's error where it has no float16 LSTM; named by the dtype
     f"torch.autocast(device_type='cpu', dtype=torch.float16) (line {AUTOCAST_LINE}) on a CPU: oneDNN, which runs the "
     "LSTM there, has no float16 kernel for most CPUs"),
    (make_autocast_loss(device_type="cuda"),  # on a CPU: torch disables it with a warning, and the forward is float32
     f"torch.autocast(device_type='cuda', dtype=torch.bfloat16) (line {AUTOCAST_LINE}) on a model on the CPU: "
     "autocast acts only on cuda ops, so this forward ran in float32"),
    (make_autocast_loss(enabled=False), f"torch.autocast(device_type='cpu', dtype=torch.bfloat16) (line "
                                        f"{AUTOCAST_LINE}) with enabled=False"),
    (make_autocast_loss(dtype=torch.float32), f"torch.autocast(device_type='cpu', dtype=torch.float32) (line "
                                              f"{AUTOCAST_LINE}): autocast computes in a 16-bit type"),
], ids=["todo", "no autocast", "float16 on a CPU", "cuda on a CPU", "disabled", "float32"])
def test_each_autocast_mistake_is_named_with_its_line(fn, named):
    with pytest.raises(CheckFailed) as err:
        patterns.autocast(fn, batches_of(0)[0], vocab())
    assert str(err.value).startswith(named), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.timeout(60)
def test_no_autocast_is_named_in_a_fresh_kernel_where_the_cpu_probes_own_autocast_runs_first():
    from workshop_lib import precision

    precision.cpu_bf16_lstm.cache_clear()  # as in a fresh kernel: the check's fallback probes this CPU first
    with pytest.raises(CheckFailed) as err:
        patterns.autocast(make_autocast_loss(autocast=False), batches_of(0)[0], vocab())
    assert str(err.value).startswith("no torch.autocast ran: run the forward and the loss inside"), str(err.value)


def test_the_check_cell_run_before_its_prediction_cell_says_so_not_a_name_error():
    """04a's check cell, as written in the notebook, in a kernel where the prediction cell has not run."""
    import nbformat

    from tests.conftest import REPO
    from workshop_lib import check

    cell = next(c.source for c in nbformat.read(REPO / "notebooks" / "04a_patterns.ipynb", as_version=4).cells
                if c.get("id") == "nb04a-accum-run")
    gate = next(line for line in cell.splitlines() if "predict_first" in line)
    with pytest.raises(CheckFailed) as err:
        exec(gate, {"check": check})  # the notebook's own line
    assert str(err.value) == "`predicted_allreduces` is not set yet: run the prediction cell above first, then this cell"
    with pytest.raises(CheckFailed, match="predict first: set `predicted_allreduces` in the cell above"):
        exec(gate, {"check": check, "predicted_allreduces": None})
    exec(gate, {"check": check, "predicted_allreduces": 1})  # a prediction: the run goes on
