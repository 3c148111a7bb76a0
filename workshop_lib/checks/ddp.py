"""The exercise checks of notebook 03 (DDP): each runs the learner's own code and names the mistake.

As in :mod:`workshop_lib.checks.common`: a tick and one line when the exercise works, else :class:`CheckFailed` with
one line. :func:`average_gradients` runs on 2 ranks forked by :func:`workshop_lib.lab.forklaunch.notebook_launch`
and compares one step of the learner's averaging with DDP's. The step script is checked by the script checker
(``check.script(path)``), which judges the DDP wrap by the replicas' spread after every step of a real run.
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

    from workshop_lib.checks.recorder import Collectives, Recorder
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
    rec = Recorder()
    with collectives.observing(Collectives(rec)):
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


def speedup_prediction(predicted: float | None, runs: dict[str, dict]) -> None:
    """The learner's predicted speed-up of 2 processes over 1 (1 thread each) against the run's own figures.

    ``runs``: the metrics of the "1x1", "1x2" (1 process, 2 threads) and "2x1" runs. The measured speed-up
    is the ratio of the medians of the epochs after the first; its range, the ratio of the slowest epoch to
    the fastest one either way, is how far this run's own epochs scatter: a prediction inside it is as good
    as the measurement can tell. A prediction is not code: a wrong one is printed with a cross, not raised.
    """
    import statistics

    def epochs(name: str) -> list[float]:
        return [row["samples_per_second"] for row in runs[name]["history"][1:]]

    one, two = epochs("1x1"), epochs("2x1")
    measured = statistics.median(two) / statistics.median(one)
    low, high = min(two) / max(one), max(two) / min(one)
    fair = statistics.median(two) / statistics.median(epochs("1x2"))
    said = (f"measured {measured:.2f}x (this run's epochs: {low:.2f}x to {high:.2f}x); against 1 process with 2 "
            f"threads, the same 2 cores, {fair:.2f}x")
    if predicted is None:
        print(f"{said} (no prediction to compare: set predicted_speedup before the run)")
    elif low <= predicted <= high:
        _passed(f"you predicted {predicted:.2f}x, {said}")
    else:
        _missed(f"you predicted {predicted:.2f}x, {said}")
