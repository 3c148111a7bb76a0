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
from workshop_lib.checks.common import predict_first as predict_first  # the notebook's gate before a run
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


SAME_GLOBAL, SAME_PER_RANK, DDP_RUN = "1x2, batch 128", "1x2, batch 64", "2x1, batch 64 each"


def speedup_prediction(predicted: float | None, runs: dict[str, dict]) -> None:
    """The learner's predicted speed-up of 2 processes over 1 process at one global batch, against the runs.

    ``runs``: the metrics of :data:`SAME_GLOBAL` (1 process, 2 threads, batch 128), :data:`SAME_PER_RANK` (the same
    at batch 64) and :data:`DDP_RUN` (2 processes of 1 thread, batch 64 each). The measured speed-up is the ratio of
    the medians of the epochs after the first; its range, the ratio of the slowest epoch to the fastest one either
    way, is how far this run's own epochs scatter. The gain is then split in two: a batch of 64 pads less than one
    of 128 (the same process at both), and data parallelism at the same batch per rank. A prediction is not code:
    a wrong one is printed with a cross, not raised.
    """
    import statistics

    def epochs(name: str) -> list[float]:
        return [row["samples_per_second"] for row in runs[name]["history"][1:]]

    def median(name: str) -> float:
        return statistics.median(epochs(name))

    one, two = epochs(SAME_GLOBAL), epochs(DDP_RUN)
    measured, low, high = median(DDP_RUN) / median(SAME_GLOBAL), min(two) / max(one), max(two) / min(one)
    said = (f"measured {measured:.2f}x (this run's epochs: {low:.2f}x to {high:.2f}x): the batch of 64 instead of 128 "
            f"gives {median(SAME_PER_RANK) / median(SAME_GLOBAL):.2f}x ({SAME_PER_RANK} over {SAME_GLOBAL}), times "
            f"data parallelism at the same batch per rank {median(DDP_RUN) / median(SAME_PER_RANK):.2f}x ({DDP_RUN} "
            f"over {SAME_PER_RANK})")
    if predicted is None:
        print(f"{said} (no prediction to compare: set predicted_speedup before the run)")
    elif low <= predicted <= high:
        _passed(f"you predicted {predicted:.2f}x, {said}")
    else:
        _missed(f"you predicted {predicted:.2f}x, {said}")


def token_rates(runs: dict[str, dict]) -> None:
    """Each run's molecules/s, tokens/s and tokens computed/s (padding included), from its metrics and its data."""
    import statistics

    from workshop_lib.config import parse_args
    from workshop_lib.data import load_splits

    print(f"{'run':20} {'molecules/s':>12} {'tokens/s':>10} {'computed/s':>11}  (tokens computed per token held)")
    for name, metrics in runs.items():
        cfg = metrics["config"]
        lengths = load_splits(parse_args(["--limit", str(cfg["limit"]), "--data", cfg["data"]])).train.lengths
        batch = metrics["batch_size_per_process"]
        order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0))
        padded = sum(int(b.max()) * len(b) for b in lengths[order].split(batch)) / int(lengths.sum())
        rate = statistics.median(row["samples_per_second"] for row in metrics["history"][1:])
        held = rate * float(lengths.float().mean())
        print(f"{name:20} {rate:12,.0f} {held:10,.0f} {held * padded:11,.0f}  ({padded:.2f}x at batch {batch})")


def terminal_run(out, path) -> None:
    """The learner's own torchrun of step 3: its metrics.json (newer than the script) and model.pt, judged."""
    from pathlib import Path

    from workshop_lib.checks.rules import read_metrics

    out, path = Path(out), Path(path)
    metrics = read_metrics(out)
    if metrics is None:
        raise CheckFailed(f"no {out.name}/metrics.json: run the torchrun command above (with --out {out.name}) first")
    if (out / "metrics.json").stat().st_mtime < path.stat().st_mtime:
        raise CheckFailed(f"{out.name}/metrics.json is older than {path.name}: run the torchrun command again")
    spreads = [row["replica_spread"] for row in metrics["history"]]
    if metrics["world_size"] < 2 or metrics["script"] != "step3_ddp":
        raise CheckFailed(f"{out.name} holds a run of {metrics['script']} on {metrics['world_size']} process(es): "
                          f"start step 3 with --nproc_per_node=2")
    if any(spreads):
        raise CheckFailed(f"the replicas drifted apart in your run (spread {max(spreads):.3g}): is the model wrapped?")
    keys = list(torch.load(out / "model.pt", map_location="cpu", weights_only=True))
    if any(k.startswith("module.") for k in keys):
        raise CheckFailed("model.pt holds the wrapper's keys (module.*): save model.module.state_dict()")
    _passed(f"your run: {metrics['world_size']} ranks, {len(spreads)} epochs, every replica equal after each "
            f"(spread 0), model.pt the plain model's {len(keys)} tensors, dev ROC AUC {metrics['dev_roc_auc']:.2f}")
