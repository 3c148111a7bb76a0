"""The check of notebook 04b's optional exercise: each gradient all-reduced asynchronously as it is made.

:func:`by_hand` runs the learner's ``train_by_hand`` on 2 forked ranks beside DDP and :func:`after_backward`, from
the same weights on the same batches with SGD: DDP's weights to 1e-6; each all-reduce started without blocking and
waited for before the step, judged on the rank's record of calls by the script checker's rows
(:func:`~workshop_lib.engine.rules.blocked`, :func:`~workshop_lib.engine.rules.unwaited`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch

from workshop_lib.engine import rules
from workshop_lib.engine.common import CheckFailed, run_forked, said, verdict
from workshop_lib.engine.recorder import Recorder, _of, recording
from workshop_lib.engine.runner import Run

LR = 0.5  # plain SGD: a gradient summed instead of averaged shows as a step twice as long


def after_backward(model, optimizer, batches) -> None:
    """The version without overlap: backward() first, then one blocking all-reduce per gradient."""
    import torch.distributed as dist
    import torch.nn.functional as F

    world = dist.get_world_size()
    for b in batches:
        F.binary_cross_entropy_with_logits(model(b.tokens, b.lengths), b.labels).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad.div_(world))  # the mean over the ranks, once backward has finished
        optimizer.step()
        optimizer.zero_grad()


def _with_ddp(model, optimizer, batches) -> None:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    for b in batches:
        F.binary_cross_entropy_with_logits(ddp(b.tokens, b.lengths), b.labels).backward()
        optimizer.step()
        optimizer.zero_grad()


def _timed(fn: Callable, vocab: int, batches: list, record: bool = False):
    """Fresh weights (the same on every rank), SGD, ``fn``: per-step times, the weights, the first step's gradients,
    and with ``record``, the record of its calls and how many all-reduces ran on the weights."""
    import torch.distributed as dist

    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    model = SmilesLSTM(vocab, dropout=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    times, last, first = [], [time.perf_counter()], []

    def stamp(real):
        def spy(*args, **kwargs):
            if not first:
                first.append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())
            out = real(*args, **kwargs)
            now = time.perf_counter()
            times.append(now - last[0])
            last[0] = now
            return out
        return spy

    with mock.patch.object(optimizer, "step", stamp(optimizer.step)):  # calls through to the step
        dist.barrier()  # start together
        last[0] = time.perf_counter()
        with recording(Recorder()) if record else contextlib.nullcontext() as rec:
            fn(model, optimizer, batches)
    weights = {p.data_ptr() for p in model.parameters()}
    counts = {"events": rec.events, "weights": sum(e["data_ptr"] in weights for e in _of(
        rec.events, "collective", name="all_reduce", phase="enter"))} if record else {}
    return times, torch.nn.utils.parameters_to_vector(model.parameters()).detach(), (first or [None])[0], counts


def _on_rank(env, train_by_hand: Callable, batches_of: Callable, vocab: int, rounds: int):
    batches = batches_of(env.rank) * rounds  # more steps for the medians; the same batches for every version
    ddp_times, ddp_weights, ddp_first, _ = _timed(_with_ddp, vocab, batches)
    plain_times, _, _, _ = _timed(after_backward, vocab, batches)
    try:
        hand_times, hand_weights, first, counts = _timed(train_by_hand, vocab, batches, record=True)
    except Exception as err:  # the check names it
        return {"error": said(err, "train_by_hand")}
    return {"ddp": ddp_times, "plain": plain_times, "hand": hand_times, "ddp_weights": ddp_weights,
            "hand_weights": hand_weights, "first_grad": first, "ddp_first_grad": ddp_first,
            **counts}


def by_hand(train_by_hand: Callable, batches_of: Callable, vocab: int, nprocs: int = 2, rounds: int = 2,
            timeout: float = 60) -> None:
    """The learner's ``train_by_hand`` beside DDP and :func:`after_backward`, ``rounds`` passes over each rank's
    ``batches_of(rank)``: the weights compared, the steps timed."""
    ranks = run_forked(_on_rank, nprocs, train_by_hand, batches_of, vocab, rounds, timeout=timeout,
                       name="train_by_hand")
    failed = next((r["error"] for r in ranks if "error" in r), None)
    if failed:
        raise CheckFailed(failed)
    r = ranks[0]
    n, started = len(r["hand"]), len(rules.hand_allreduces(r["events"]))
    if started == 0:
        raise CheckFailed("no all-reduce ran in backward(): in the hook, start dist.all_reduce of param.grad with "
                          "async_op=True")
    case = rules.Case(Run({rank: out["events"] for rank, out in enumerate(ranks)}), None)
    wrong = rules.blocked(case) or rules.unwaited(case)  # the script checker's judges of gradients all-reduced by hand
    if wrong:
        raise CheckFailed(wrong)
    gap = (r["hand_weights"] - r["ddp_weights"]).abs().max().item()
    if gap > 1e-6 and r["weights"]:
        raise CheckFailed(f"after {n} steps the weights differ from DDP's by {gap:.1e}: {r['weights']} of the "
                          f"{started} all-reduces ran on the weights (param.data), not on the gradients, so "
                          f"each rank stepped on its own gradient; all-reduce param.grad, divided by the world size")
    if gap > 1e-6:
        first, reference = r["first_grad"], r["ddp_first_grad"]
        if first is not None and torch.allclose(first, nprocs * reference, atol=1e-6):
            raise CheckFailed(f"the gradients are the sum over the {nprocs} ranks, DDP's the mean: divide each by "
                              "the world size")
        raise CheckFailed(f"after {n} steps the weights differ from DDP's by {gap:.1e}: each gradient must be "
                          "all-reduced exactly once per backward, and averaged over the ranks")
    per_step = started // n
    ddp = statistics.median(r["ddp"][2:])
    print(f"step time against DDP's (1 all-reduce a step: one bucket), median of {n - 2} steps: by hand with "
          f"overlap {statistics.median(r['hand'][2:]) / ddp:.2f}x, after backward "
          f"{statistics.median(r['plain'][2:]) / ddp:.2f}x ({per_step} all-reduces a step, one per parameter)")
    verdict(None, f"train_by_hand: the weights of DDP after {n} steps, to 1e-6; each all-reduce waited for before its step")
