"""The checks of notebook 03 (DDP): the predicted speed-up, the token rates, the learner's own torchrun run."""

from __future__ import annotations

import torch

from workshop_lib.engine.common import CheckFailed, first, is_number, judge_prediction, verdict

SAME_GLOBAL, SAME_PER_RANK, DDP_RUN = "1x2, batch 128", "1x2, batch 64", "2x1, batch 64 each"


TOLERANCE = 0.2  # right: within this share beyond the range of speed-ups that the runs' epochs give
TOO_NOISY = 0.3  # the epochs' speed-ups stray further than this share from the median: no prediction can be judged


def speedup_prediction(predicted: float | None, runs: dict[str, dict]) -> None:
    """The predicted speed-up of :data:`DDP_RUN` over :data:`SAME_GLOBAL`, judged against the band that the runs'
    own noise sets, split into padding (:data:`SAME_PER_RANK`) and data parallelism; never raised.

    Each epoch after the first is a timed run: the speed-up lies between the slowest 2-process epoch over the fastest
    1-process one and the reverse. A prediction within :data:`TOLERANCE` of that range is right. Where the range
    strays more than :data:`TOO_NOISY` from the median, or the runs show a machine busy with other programs (2
    processes slower than 1, or more than twice as fast at the same batch per rank), nothing is judged, and it says why.
    """
    import statistics

    def epochs(name: str) -> list[float]:
        return [row["samples_per_second"] for row in runs[name]["history"][1:]]

    def median(name: str) -> float:
        return statistics.median(epochs(name))

    one, two = epochs(SAME_GLOBAL), epochs(DDP_RUN)
    measured, low, high = median(DDP_RUN) / median(SAME_GLOBAL), min(two) / max(one), max(two) / min(one)
    noise = max(high / measured - 1, 1 - low / measured)
    parallel = median(DDP_RUN) / median(SAME_PER_RANK)  # data parallelism's own share: 2 processes give 2x at most
    ranged = f"this run's epochs: {low:.2f}x to {high:.2f}x (\N{PLUS-MINUS SIGN}{noise:.0%})"
    split = (f"the batch of 64 instead of 128 gives {median(SAME_PER_RANK) / median(SAME_GLOBAL):.2f}x ({SAME_PER_RANK} "
             f"over {SAME_GLOBAL}), times data parallelism at the same batch per rank {parallel:.2f}x ({DDP_RUN} over "
             f"{SAME_PER_RANK})")
    number = is_number(predicted)
    shown = f"{predicted:.2f}x" if number else None
    busy = [f"this machine's timings varied by \N{PLUS-MINUS SIGN}{noise:.0%} across epochs (speed-ups {low:.2f}x "
            f"to {high:.2f}x): too noisy to judge a prediction"] if noise > TOO_NOISY else []
    if measured < 1:
        busy.append("2 processes ran slower than 1: they need both cores at once, for each step ends in an "
                    "all-reduce that waits for the slower process, so a core taken by another program stalls both "
                    "(the machine's load, not DDP)")
    if parallel > 2 * (1 + TOLERANCE):
        busy.append(f"at the same batch per rank 2 processes ran {parallel:.1f}x faster than 1, more than 2 processes "
                    f"can: the 1-process runs were held up, their 2 threads meeting at the end of every parallel "
                    f"operation, so a core taken by another program stalls both")
    if busy:
        judge_prediction("the speed-up", predicted, f"{measured:.2f}x", None,
                         f"not judged: {'; '.join(busy if noise > TOO_NOISY else [ranged, *busy])}; close other "
                         f"programs and rerun this cell", shown=shown)
        return
    right = number and low / (1 + TOLERANCE) <= predicted <= high * (1 + TOLERANCE)
    judge_prediction("the speed-up", predicted, f"{measured:.2f}x", right,
                     f"{ranged}, right within {TOLERANCE:.0%} of that; {split}", shown=shown)


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

    from workshop_lib.engine.rules import read_metrics

    out, path = Path(out), Path(path)
    metrics = read_metrics(out)
    if metrics is None or (out / "metrics.json").stat().st_mtime < path.stat().st_mtime:
        raise CheckFailed(f"no {out.name}/metrics.json: run the torchrun command above (with --out {out.name}) first"
                          if metrics is None else f"{out.name}/metrics.json is older than {path.name}: run the torchrun "
                                                  f"command again")
    spreads = [row["replica_spread"] for row in metrics["history"]]
    keys = list(torch.load(out / "model.pt", map_location="cpu", weights_only=True))
    verdict(first((metrics["world_size"] < 2 or metrics["script"] != "step3_ddp",
                   f"{out.name} holds a run of {metrics['script']} on {metrics['world_size']} process(es): start step 3 "
                   f"with --nproc_per_node=2"),
                  (any(spreads), lambda: f"the replicas drifted apart in your run (spread {max(spreads):.3g}): is "
                                         f"the model wrapped?"),
                  (any(k.startswith("module.") for k in keys),
                   "model.pt holds the wrapper's keys (module.*): save model.module.state_dict()")),
            f"your run: {metrics['world_size']} ranks, {len(spreads)} epochs, every replica equal after each (spread 0), "
            f"model.pt the plain model's {len(keys)} tensors, dev ROC AUC {metrics['dev_roc_auc']:.2f}")
