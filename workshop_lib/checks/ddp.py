"""The exercise checks of notebook 03 (DDP): each runs the learner's own code and names the mistake.

As in :mod:`workshop_lib.checks.common`: a tick and one line when the exercise works,
else :class:`CheckFailed` with one line. :func:`average_gradients` runs on 2 ranks
forked by :func:`workshop_lib.lab.forklaunch.notebook_launch` and compares one
step of the learner's averaging with DDP's. The step script is checked by the
script checker (``check.script(path)``), which judges the DDP wrap by the
replicas' spread after every step of a real run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from workshop_lib.checks.common import CheckFailed, _missed, _passed, run_forked
from workshop_lib.checks.script import check as script  # noqa: F401 (check.script(path) in the notebook)

# ------------------------------------------------------------------ gradients by hand


def _by_hand(env, fn: Callable) -> dict:
    """One step of a plain model with ``fn`` averaging its gradients, and one of the same model under DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.checks import record
    from workshop_lib.debug import collectives
    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    plain = SmilesLSTM(12, 8, 8, 1, 0.0)  # no dropout: both copies must compute the same thing
    wrapped = DDP(copy.deepcopy(plain))
    g = torch.Generator().manual_seed(100 + env.rank)  # each rank its own batch
    tokens = torch.randint(1, 12, (4, 6), generator=g)  # (B, T)
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0])
    for model in (plain, wrapped):
        torch.nn.functional.binary_cross_entropy_with_logits(model(tokens, torch.full((4,), 6)), labels).backward()
    local = [p.grad.clone() for p in plain.parameters()]
    rec = record.Recorder()
    with collectives.observing(record.Collectives(rec)):
        fn(plain)
    ops = [e.get("op") for e in rec.events if e["kind"] == "collective" and e["phase"] == "enter"]
    ddp_grads = [p.grad for p in wrapped.module.parameters()]
    mine = list(plain.parameters())

    def gap(scale: float, reference) -> float:
        return max((p.grad - scale * r).abs().max().item() for p, r in zip(mine, reference, strict=True))

    for model in (plain, wrapped.module):
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
    weights = max((a - b).abs().max().item() for a, b in zip(mine, wrapped.module.parameters(), strict=True))
    return {"ops": ops, "weights": weights, "summed": gap(env.world_size, ddp_grads), "unchanged": gap(1, local)}


def average_gradients(fn: Callable, nprocs: int = 2, timeout: float = 60) -> None:
    """``fn(model)`` must leave every p.grad the mean over the ranks: one step then matches DDP's to 1e-6."""
    ranks = run_forked(_by_hand, nprocs, fn, timeout=timeout, name="average_gradients")
    for rank, r in enumerate(ranks):
        if r["weights"] <= 1e-6:
            continue
        op = next((o for o in r["ops"] if o and o != "SUM"), None)
        if op:
            raise CheckFailed(f"rank {rank} all-reduced with op={op}: sum the gradients (ReduceOp.SUM), then divide")
        if not r["ops"] or r["unchanged"] <= 1e-7:
            raise CheckFailed(f"rank {rank}'s gradients are its own batch's alone: all-reduce every p.grad")
        if r["summed"] <= 1e-6:
            raise CheckFailed(f"rank {rank}'s gradients are the sum over the ranks, not the mean: divide each by "
                              f"dist.get_world_size() after the all-reduce")
        raise CheckFailed(f"after one step rank {rank}'s weights differ from DDP's by {r['weights']:.3g} (> 1e-6)")
    worst = max(r["weights"] for r in ranks)
    _passed(f"average_gradients: after one step the weights match DDP's on all {nprocs} ranks (largest difference "
            f"{worst:.1e}, within 1e-6)")


# ------------------------------------------------------------------ the speed-up


def speedup_prediction(predicted: float | None, speed: dict[int, float], close: float = 0.25) -> None:
    """The learner's predicted speed-up of 2 processes over 1 against the measured one (``speed``: samples/s by
    processes). A prediction is not code: a wrong one is printed with a cross and the reason, not raised."""
    measured = speed[2] / speed[1]
    why = ("every step ends with an all-reduce that each rank must reach before it steps (gloo over loopback TCP "
           "here: several round trips, costly against this small model's step), and two busy processes share the "
           "machine's cores, caches and memory bandwidth; a larger step per all-reduce (a bigger batch or model) "
           "gets nearer 2x")
    if predicted is None:
        print(f"measured {measured:.2f}x (no prediction to compare: set predicted_speedup before the run); {why}")
    elif abs(predicted - measured) <= close:
        _passed(f"you predicted {predicted:.2f}x, measured {measured:.2f}x: within {close:g}; {why}")
    elif predicted > measured:
        _missed(f"you predicted {predicted:.2f}x, measured {measured:.2f}x: less, since {why}")
    else:
        _missed(f"you predicted {predicted:.2f}x, measured {measured:.2f}x: more, since each process computes half of "
                f"the global batch in the time one took for all of it, and the all-reduce costs less than that half")
