"""Learning rate vs global batch, measured: step 3 on 1, 2 and 4 ranks, with the lr unscaled, square-root or linear.

The default ``--lr`` was tuned at the default global batch of 2 processes x 64
molecules = 128. On N ranks the global batch is 64 x N, k = 64 x N / 128 times
the tuned one, and each rule gives a learning rate:

* none: the default lr, whatever the batch;
* sqrt: lr x sqrt(k), the common practice for Adam-type optimisers;
* linear: lr x k, the SGD rule of Goyal et al. 2017 (with warm-up there; none here).

Every run is ``torchrun --standalone --nproc_per_node=N solutions/step3_ddp.py``
with the defaults otherwise (all of B3DB, ``TrainConfig().epochs`` epochs), one
thread per rank, once per seed in ``--seeds`` (the table gives the mean and the
spread over seeds: a difference smaller than the spread is noise). On a 2-core
machine 4 ranks are oversubscribed: slower, but the result (the dev ROC AUC)
does not depend on speed. At N = 2 the three rules
give the same lr, so that run is made once. Writes ``lr_scaling.json`` and
``lr_scaling.md`` to ``--results``; notebook 04a draws them.

    python benchmarks/lr_scaling.py                       # 7 settings x 3 seeds, ~10 min on 2 idle cores
    python benchmarks/lr_scaling.py --limit 400 --epochs 2 --results /tmp/lr   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parent.parent
STEP3 = REPO / "solutions" / "step3_ddp.py"
RULES = {"none": lambda k: 1.0, "sqrt": math.sqrt, "linear": lambda k: k}


def learning_rates(base_lr: float, tuned_batch: int, batch_per_rank: int, nprocs: int) -> dict[str, float]:
    """{rule: lr} for ``nprocs`` ranks of ``batch_per_rank``, from ``base_lr`` tuned at global batch ``tuned_batch``."""
    k = batch_per_rank * nprocs / tuned_batch
    return {rule: base_lr * factor(k) for rule, factor in RULES.items()}


def run(nprocs: int, lr: float, seed: int, flags: list[str], timeout: float) -> dict:
    """One step-3 run; its rank-0 metrics.json."""
    try:
        from benchmarks.bench import child_env
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from bench import child_env
    from workshop_lib.launching.launch import torchrun_argv

    with tempfile.TemporaryDirectory(prefix="lr-scaling-") as out:
        cmd = torchrun_argv(STEP3, nprocs, args=["--lr", repr(lr), "--seed", seed, "--out", out, "--no-tensorboard",
                                                 *flags])
        env = child_env(1, "cpu")  # bench.py's: no launch variables of a surrounding job, one thread per rank, gloo
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"run failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
        metrics = json.loads((Path(out) / "metrics.json").read_text())
        metrics["wall_seconds"] = time.perf_counter() - start
        return metrics


def render_markdown(result: dict) -> str:
    lines = ["# Learning rate vs global batch (step 3)", "",
             f"Machine: {result['machine']}. Command: `{result['command']}`.  ",
             f"Default lr {result['base_lr']:g}, tuned at global batch {result['tuned_batch']}; "
             f"{result['epochs']} epochs; mean (min-max) over seeds {result['seeds']}.", "",
             "| ranks | global batch | rule | lr | best dev ROC AUC | heldout ROC AUC |", "|---|---|---|---|---|---|"]
    for row in result["runs"]:
        dev, held = row["dev_roc_auc"], row["heldout_roc_auc"]
        lines.append(f"| {row['nprocs']} | {row['global_batch']} | {row['rule']} | {row['lr']:.3g} | "
                     f"{mean(dev):.3f} ({min(dev):.3f}-{max(dev):.3f}) | "
                     f"{mean(held):.3f} ({min(held):.3f}-{max(held):.3f}) |")
    return "\n".join(lines) + "\n"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", type=int, nargs="+", default=[1, 2, 4], help="rank counts to run")
    p.add_argument("--epochs", type=int, default=None, help="default: TrainConfig().epochs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed")
    p.add_argument("--limit", type=int, default=None, help="use only this many molecules (smoke runs)")
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs, run nothing")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    sys.path.insert(0, str(REPO))
    from workshop_lib.config import TrainConfig

    cfg = TrainConfig()
    tuned_batch = 2 * cfg.batch_size  # README, "Where the speed comes from": lr and epochs chosen at 2 x 64
    epochs = args.epochs or cfg.epochs
    flags = ["--epochs", str(epochs)] + (["--limit", str(args.limit)] if args.limit else [])
    plan = []
    for n in args.nprocs:
        seen: dict[float, str] = {}
        for rule, lr in learning_rates(cfg.lr, tuned_batch, cfg.batch_size, n).items():
            plan.append((n, rule, lr, seen.setdefault(round(lr, 12), rule)))  # same lr: reuse the first rule's run
    if args.dry_run:
        for n, rule, lr, same_as in plan:
            print(json.dumps({"nprocs": n, "rule": rule, "lr": lr, "run_as": same_as}))
        return 0
    done: dict[tuple[int, str], dict] = {}
    rows = []
    for n, rule, lr, same_as in plan:
        if (n, same_as) not in done:
            done[n, same_as] = []
            for seed in args.seeds:
                print(f"{n} rank(s), lr {lr:.3g} ({rule}), seed {seed} ...", flush=True)
                done[n, same_as].append(run(n, lr, seed, flags, args.timeout))
        ms = done[n, same_as]
        rows.append({"nprocs": n, "global_batch": ms[0]["global_batch_size"], "rule": rule, "lr": lr,
                     "dev_roc_auc": [m["dev_roc_auc"] for m in ms], "heldout_roc_auc": [m["heldout_roc_auc"] for m in ms],
                     "best_epoch": [m["best_epoch"] for m in ms], "wall_seconds": [m["wall_seconds"] for m in ms]})
    import platform

    import torch

    result = {"machine": f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {platform.system()}",
              "command": " ".join(["python benchmarks/lr_scaling.py", *(argv if argv is not None else sys.argv[1:])]),
              "base_lr": cfg.lr, "tuned_batch": tuned_batch, "epochs": epochs, "seeds": args.seeds,
              "limit": args.limit, "runs": rows}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "lr_scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.results / "lr_scaling.md").write_text(render_markdown(result))
    print(render_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
