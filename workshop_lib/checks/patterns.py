"""The checks of notebook 04a: gradient accumulation with ``no_sync``, the all-reduces it runs, predicted; autocast."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from workshop_lib.engine import rules
from workshop_lib.engine.common import CheckFailed, judge_prediction, run_forked, said, still_todo, verdict
from workshop_lib.engine.recorder import Recorder, _of, recording
from workshop_lib.engine.runner import Run

LR = 0.5  # plain SGD in the check: unlike AdamW, its step shows a wrongly scaled gradient


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _loop_on_rank(env, train_accumulating: Callable, batches_of: Callable, vocab: int, accum: int):
    """One rank: a fresh DDP model and SGD, the learner's loop over this rank's micro-batches; how it ended, the record
    of its calls (DDP's all-reduces among them), the weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    model = DDP(SmilesLSTM(vocab, dropout=0.0))  # no dropout: the weights can be compared exactly
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    try:
        with recording_allreduces(model) as events:
            train_accumulating(model, optimizer, batches_of(env.rank), accum)
    except Exception as err:  # any mistake becomes the check's one line
        return said(err, "train_accumulating"), None, None
    return None, events, _weights(model.module)


def _reference(batches_of: Callable, vocab: int, nprocs: int, accum: int, scale: float = 1.0,
               zero_grad: bool = True) -> torch.Tensor:
    """One process, one SGD step per big batch (all ranks' k-th group of micro-batches together)."""
    import torch.nn.functional as F

    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    model = SmilesLSTM(vocab, dropout=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank = [batches_of(r) for r in range(nprocs)]
    for start in range(0, len(per_rank[0]), accum):
        group = [b for rank in per_rank for b in rank[start:start + accum]]
        n = sum(len(b.labels) for b in group)
        loss = sum(F.binary_cross_entropy_with_logits(model(b.tokens, b.lengths), b.labels, reduction="sum")
                   for b in group) / n
        (loss * scale).backward()
        optimizer.step()
        if zero_grad:
            optimizer.zero_grad()
    return _weights(model)


def accumulation(train_accumulating: Callable, batches_of: Callable, vocab: int, accum: int = 4,
                 nprocs: int = 2, timeout: float = 90) -> None:
    """``train_accumulating(model, optimizer, batches_of(rank), accum)`` on forked ranks: the weights of one process
    stepping once per ``accum`` micro-batches of every rank, and one all-reduce per step."""
    ranks = run_forked(_loop_on_rank, nprocs, train_accumulating, batches_of, vocab, accum, timeout=timeout,
                         name="train_accumulating")
    failed = next((r[0] for r in ranks if r[0]), None)
    if failed:
        raise CheckFailed(failed)
    steps, weights = len(batches_of(0)) // accum, [r[2] for r in ranks]
    case = rules.Case(Run({rank: r[1] for rank, r in enumerate(ranks)}, {rank: [w.numpy()] for rank, w in
                                                                           enumerate(weights)}), None)
    wrong = rules.accumulation(case)  # the script checker's judge: one all-reduce per optimizer step
    if wrong:
        raise CheckFailed(wrong)
    count = (rules.accumulating(case) or (0, [], 0))[2]
    if torch.allclose(weights[0], _reference(batches_of, vocab, nprocs, accum), atol=1e-5):
        verdict(None, f"train_accumulating: {steps} steps of {accum} micro-batches x {nprocs} ranks, {count} all-reduces, "
                "and the weights of one process stepping on the big batches")
        return
    if torch.allclose(weights[0], _reference(batches_of, vocab, nprocs, accum, scale=accum), atol=1e-5):
        raise CheckFailed(f"each step moved {accum}x too far: divide every micro-batch's loss by accum ({accum}), "
                          "so that the accumulated gradient is the mean over the big batch")
    if torch.allclose(weights[0], _reference(batches_of, vocab, nprocs, accum, zero_grad=False), atol=1e-5):
        raise CheckFailed("each step also added the previous steps' gradients: call optimizer.zero_grad() after "
                          "every optimizer.step()")
    raise CheckFailed(f"the weights differ from {steps} steps of one process on the big batches: step and zero the "
                      f"gradients once every {accum} micro-batches, after the last one's backward")


# ------------------------------------------------------------------ all-reduces, predicted and counted


@contextlib.contextmanager
def recording_allreduces(model) -> Iterator[list[dict]]:
    """The record of the calls in the block (:func:`~workshop_lib.engine.recorder.recording`), where every all-reduce
    DDP runs for ``model`` is one, with its backward()'s number (after a "comm_hook" event that says so): torch's own
    ``allreduce_hook`` (which changes nothing DDP computes) sends each bucket through ``dist.all_reduce``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model.register_comm_hook(None, default_hooks.allreduce_hook)
    with recording(Recorder()) as rec:
        rec.add("comm_hook", line=False, hook="allreduce_hook")
        yield rec.events


def allreduce_count(predicted, events: list[dict], backwards: int = 4) -> None:
    """The learner's prediction against the all-reduces recorded in ``backwards`` backward() calls; never raised."""
    ran = _of(events, "collective", name="all_reduce", phase="enter")
    where = ", ".join(str(e["backward"]) for e in ran if e.get("backward")) or "none"
    whole = isinstance(predicted, int) and not isinstance(predicted, bool)
    why = ("inside no_sync() backward() only adds into .grad; the one backward outside it all-reduces the sum"
           if not whole or predicted >= len(ran) else
           "every backward() outside no_sync() all-reduces the gradients it finds")
    judge_prediction("the all-reduces", predicted, f"{len(ran)} in {backwards} backward() calls (in backward {where})",
                     whole and predicted == len(ran), why)


# ------------------------------------------------------------------ 3. mixed precision, on this machine

SIXTEEN_BITS = (torch.bfloat16, torch.float16)  # the types torch's autocast computes in (CPU autocast: only these)


def _dtype(made: dict) -> torch.dtype:
    """The dtype an autocast of the record computes in: the one given, else its device's default."""
    return getattr(torch, made["dtype"]) if made["dtype"] else torch.get_autocast_dtype(made["device_type"])


def _autocast_mistake(made: list[dict], device: torch.device, error: Exception | None) -> str | None:
    """What keeps the learner's autocast (the record's ``autocast`` events) from computing in 16 bits on ``device``;
    None if nothing."""
    if not made:
        return ("no torch.autocast ran: run the forward and the loss inside `with torch.autocast(device_type=..., "
                "dtype=...):`")
    a = made[-1]
    where = f" (line {a['line']})" if a["line"] else ""
    dtype = _dtype(a)
    said = f"torch.autocast(device_type={a['device_type']!r}, dtype={dtype}){where}"
    if a["device_type"] != device.type:
        return (f"{said} on a model on the {device.type.upper()}: autocast acts only on {a['device_type']} ops, so "
                f"this forward ran in float32 (torch disables it, with a warning, where there is no "
                f"{a['device_type']}); take the device type from the tensors' device: device_type=device.type")
    if not a["enabled"]:
        return f"{said} with enabled=False: the forward ran in float32; leave enabled at its default, True"
    if device.type == "cpu" and dtype == torch.float16:
        torch_said = f" (torch: {str(error).split('. ')[0][:120]})" if error is not None else ""
        return (f"{said} on a CPU: oneDNN, which runs the LSTM there, has no float16 kernel for most CPUs{torch_said}; "
                f"on a CPU use dtype=torch.bfloat16 (float16 is for GPUs, with a GradScaler)")
    if dtype not in SIXTEEN_BITS:
        return (f"{said}: autocast computes in a 16-bit type, and disables itself for {dtype}; use "
                f"dtype=torch.bfloat16")
    return None


def autocast(autocast_loss: Callable, batch, vocab: int) -> None:
    """``autocast_loss(model, batch)`` on this machine's CPU, inside :func:`~workshop_lib.precision.lstm_fallback`: a
    forward in 16 bits under ``torch.autocast`` and a float32 loss, or the autocast argument a CPU cannot run, with the
    learner's line. On the CPU only: CUDA initialised in the kernel would stop the notebook's later forked ranks."""
    import warnings

    from workshop_lib import precision
    from workshop_lib.model import SmilesLSTM

    device = torch.device("cpu")
    torch.manual_seed(0)
    model = SmilesLSTM(vocab, dropout=0.0)
    logits = []
    model.head.register_forward_hook(lambda module, inputs, output: logits.append(output.dtype))
    rec, error, loss = Recorder(), None, None
    # The fallback first: its probe of this CPU (an autocast of its own) runs before the learner's code is recorded.
    with warnings.catch_warnings(), precision.lstm_fallback(device):  # this CPU's limit, not the lesson's
        warnings.simplefilter("ignore")  # torch's warning where autocast disables itself: the verdict says it
        try:
            with recording(rec):
                loss = autocast_loss(model, batch)
        except NotImplementedError:
            raise CheckFailed(still_todo("autocast_loss")) from None
        except Exception as err:  # judged below, with the autocast that caused it
            error = err
    made = _of(rec.events, "autocast")
    wrong = _autocast_mistake(made, device, error)
    if wrong:
        raise CheckFailed(wrong)
    if error is not None:
        raise CheckFailed(said(error, "autocast_loss"))
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise CheckFailed(f"autocast_loss returned {type(loss).__name__}: return the loss, one number (a 0-dim tensor)")
    if not logits or logits[0] not in SIXTEEN_BITS:
        raise CheckFailed(f"the model's output came back {logits[0] if logits else 'never'}: run the forward, "
                          f"model(b.tokens, b.lengths), inside the with torch.autocast(...) block")
    if loss.dtype != torch.float32:
        raise CheckFailed(f"the loss is {loss.dtype}: compute it from the logits as they come, inside the block, "
                          f"where autocast keeps losses in float32")
    verdict(None, f"autocast_loss: under torch.autocast(device_type={made[-1]['device_type']!r}, dtype={_dtype(made[-1])}) "
            f"the logits came back {logits[0]} and the loss {loss.dtype}")
