"""Benchmark: the original workshop's recipe vs this workshop's defaults, and DDP scaling.

One run on one machine measures

* recipes: ``benchmarks/original_recipe.py`` (the original workshop's recipe,
  one process, torch's default threads) and ``torchrun --nproc_per_node=2
  solutions/step3_ddp.py`` (this workshop's defaults), on the shipped B3DB table
  and on ``--data CSV``: seconds per epoch, training samples/s, wall time from
  the command's start to its exit, heldout ROC AUC, peak memory per rank;
* scaling: training samples/s of 1 process x T threads and of K processes x 1
  thread, each at the same global batch: the default one (where the targets are
  judged), then larger ones, since the speed-up of K processes grows with the
  work per step (gloo on CPU; on GPUs, K processes x 1 GPU, nccl). The step
  scripts pick nccl whenever CUDA is available: a CPU job runs with
  ``CUDA_VISIBLE_DEVICES=`` so that it is gloo on the CPU on a GPU node too;
* notebooks (``--notebooks``): the wall time of ``pytest --nbval notebooks/``;
* model (``--parts model``, ``benchmarks/model_part.py``): the scaling model's
  inputs measured here, its predicted samples/s and speed-up beside the scaling
  table (this run's, or the one in ``results.json``), a published check and
  projections to 1,024 ranks.

and writes ``results.json``, ``results.md`` and ``scaling.png`` (``model.json`` and
``model.md`` for the model) to ``--results``.

    python benchmarks/bench.py --data BBBP.csv --notebooks    # everything, ~30 min on 2 cores
    python benchmarks/bench.py --data BBBP.csv --quick        # every code path, tiny, ~1-2 min
    python benchmarks/bench.py --parts scaling --scaling-flags "--hidden 128"   # scaling of a bigger model
    python benchmarks/bench.py --parts model                  # the scaling model against results.json, ~30 s
    python benchmarks/bench.py --dry-run                      # print the plan, run nothing
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "dataset" / "b3db_classification.csv"
STEP3 = REPO / "solutions" / "step3_ddp.py"
ORIGINAL = REPO / "benchmarks" / "original_recipe.py"
RANK_RSS = REPO / "benchmarks" / "rank_rss.py"
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")


@dataclass
class Job:
    """One command to time: what it is, how it is launched, how often."""

    group: str  # "recipe" | "scaling" | "notebooks"
    name: str  # "original" / "workshop" / "1x2" ...
    dataset: str  # "B3DB (shipped)" / the --data file's name / ""
    cmd: list[str]
    threads: int | None  # OMP_NUM_THREADS for the children; None: leave unset (torch's default)
    repeats: int
    procs: int = 1
    global_batch: int | None = None
    device: str = "cpu"  # "cpu": run with CUDA_VISIBLE_DEVICES= (gloo, even on a GPU node); "cuda": nccl
    runs: list[dict] = field(default_factory=list)


def machine() -> dict:
    import platform

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cpu_cores": os.cpu_count(), "gpus": gpus,
            "gpu": torch.cuda.get_device_name(0) if gpus else None,
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}


def torchrun(nproc: int, script: Path, *args: object) -> list[str]:
    from workshop_lib.launching.launch import torchrun_argv

    return torchrun_argv(script, nproc, args=args)


def plan(args: argparse.Namespace, info: dict) -> list[Job]:
    from workshop_lib.config import TrainConfig

    d = TrainConfig()
    quick = ["--limit", "300", "--epochs", "1"] if args.quick else []
    datasets = [("B3DB (shipped)", SHIPPED)] + ([(Path(args.data).name, Path(args.data))] if args.data else [])
    jobs: list[Job] = []
    if "recipes" in args.parts:
        for label, path in datasets:
            orig_runs = args.original_repeats if path != SHIPPED else args.original_repeats_shipped
            if orig_runs:
                jobs.append(Job("recipe", "original", label,
                                [sys.executable, str(ORIGINAL), "--data", str(path), *quick],
                                threads=None, repeats=1 if args.quick else orig_runs, global_batch=256))
            nproc = info["gpus"] or 2
            jobs.append(Job("recipe", "workshop", label,
                            torchrun(nproc, RANK_RSS, "{rss}", STEP3, "--data", path, *quick),
                            threads=None, repeats=1 if args.quick else args.repeats, procs=nproc,
                            global_batch=d.batch_size * nproc, device="cuda" if info["gpus"] else "cpu"))
    if "scaling" in args.parts:
        epochs = ["--epochs", "2" if args.quick else str(args.scaling_epochs)]
        limit = ["--limit", "600"] if args.quick else []
        common = ["--data", str(SHIPPED), *epochs, *limit, "--no-tensorboard", *args.scaling_flags]
        reps = 1 if args.quick else args.repeats
        batches = args.global_batch or [d.batch_size * 2 * f for f in (1, 2, 4)]  # the default first
        for g in batches[:1] if args.quick else batches:
            jobs += scaling_jobs(g, common, reps, info)
    if args.notebooks and not sorted((REPO / "notebooks").glob("*.ipynb")):
        print("--notebooks: notebooks/ holds no notebook yet; not timed", file=sys.stderr)
    elif args.notebooks:
        jobs.append(Job("notebooks", "pytest --nbval notebooks/", "",
                        [sys.executable, "-m", "pytest", "-q", "--nbval",
                         str(REPO / "notebooks")], threads=None, repeats=1))
    return jobs


def scaling_jobs(g: int, common: list[str], reps: int, info: dict) -> list[Job]:
    """1 process x T threads and K processes x 1 thread (or K GPUs), all at global batch ``g``."""
    jobs: list[Job] = []
    if info["gpus"]:  # K processes x 1 GPU each, nccl
        for k in [k for k in range(1, info["gpus"] + 1) if g % k == 0]:
            jobs.append(Job("scaling", f"{k}x1 GPU", "B3DB (shipped)",
                            torchrun(k, STEP3, *common, "--batch-size", g // k),
                            threads=None, repeats=reps, procs=k, global_batch=g, device="cuda"))
        return jobs
    cores = info["cpu_cores"] or 1
    counts = sorted(c for c in {1, 2, cores} | {2**i for i in range(1, 8)} if c <= cores)
    for t in counts:
        jobs.append(Job("scaling", f"1x{t}", "B3DB (shipped)",
                        torchrun(1, STEP3, *common, "--batch-size", g),
                        threads=t, repeats=reps, procs=1, global_batch=g))
    for k in [k for k in counts if k > 1 and g % k == 0]:
        jobs.append(Job("scaling", f"{k}x1", "B3DB (shipped)",
                        torchrun(k, STEP3, *common, "--batch-size", g // k),
                        threads=1, repeats=reps, procs=k, global_batch=g))
    return jobs


def child_env(threads: int | None, device: str = "cpu") -> dict[str, str]:
    """A job's environment: no launch variables of a surrounding job; ``threads`` per process; the GPUs hidden
    for a CPU job (the scripts then pick gloo on the CPU, as there is no --backend flag)."""
    env = {k: v for k, v in os.environ.items() if k not in (*LAUNCH_VARS, "OMP_NUM_THREADS")}
    env["PYTHONUNBUFFERED"] = "1"
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_once(job: Job, work: Path, timeout: float) -> dict:
    """Run ``job`` once; wall time from start to exit, plus what its metrics.json says."""
    out, rss = work / "out", work / "rss"
    cmd = [c.replace("{rss}", str(rss)) for c in job.cmd]
    if job.group != "notebooks":
        cmd += ["--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(job.threads, job.device), capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RuntimeError(f"{job.group}/{job.name} on {job.dataset or '-'} failed ({proc.returncode}):\n{tail}")
    run = {"wall_seconds": wall}
    if job.group != "notebooks":
        run.update(collect(out, rss))
    return run


def collect(out: Path, rss: Path | None = None) -> dict:
    """The figures of one finished run: its ``metrics.json`` and the ranks' peak memory."""
    m = json.loads((Path(out) / "metrics.json").read_text())
    hist = m["history"]
    steady = hist[1:] or hist  # the first epoch warms up allocators and caches
    run = dict(heldout_roc_auc=m["heldout_roc_auc"], epochs=len(hist),
               seconds_per_epoch=statistics.median(h["seconds"] for h in hist),
               train_samples_per_second=m["train_samples_per_second"],
               steady_samples_per_second=statistics.median(h["samples_per_second"] for h in steady),
               threads_per_process=m.get("threads_per_process"))
    if "max_rss_mb" in m:  # the original recipe: one process, records its own
        run["rss_mb_per_rank"] = [m["max_rss_mb"]]
    elif rss is not None and Path(rss).is_dir():
        ranks = sorted((json.loads(p.read_text()) for p in Path(rss).glob("rank*.json")), key=lambda r: r["rank"])
        run["rss_mb_per_rank"] = [r["max_rss_mb"] for r in ranks]
    return run


def med(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(job: Job) -> dict:
    s = {k: med(job.runs, k) for k in ("wall_seconds", "seconds_per_epoch", "train_samples_per_second",
                                        "steady_samples_per_second", "heldout_roc_auc")}
    peaks = [max(r["rss_mb_per_rank"]) for r in job.runs if r.get("rss_mb_per_rank")]
    s["peak_rss_mb_per_rank"] = statistics.median(peaks) if peaks else None
    s["runs"] = len(job.runs)
    return s


def ratios(jobs: list[Job]) -> dict:
    """The issue's targets, each a ratio of two figures from this one run."""
    by = {(j.group, j.name, j.dataset): summarize(j) for j in jobs if j.runs}
    r: dict[str, float] = {}
    for (g, name, ds), s in by.items():
        orig = by.get(("recipe", "original", ds))
        if g == "recipe" and name == "workshop" and orig:
            r[f"{ds}: original wall / workshop wall (target >= 6)"] = orig["wall_seconds"] / s["wall_seconds"]
            if orig["peak_rss_mb_per_rank"] and s["peak_rss_mb_per_rank"]:
                r[f"{ds}: workshop peak RSS per rank / original (target <= 0.5)"] = (
                    s["peak_rss_mb_per_rank"] / orig["peak_rss_mb_per_rank"])
    scaling = [j for j in jobs if j.group == "scaling" and j.runs]
    default = scaling[0].global_batch if scaling else None  # the plan puts the default global batch first
    sps = scaling_figures(jobs)
    for g in dict.fromkeys(j.global_batch for j in scaling):
        at = "" if g == default else f" at global batch {g}"
        if ("2x1", g) in sps and ("1x2", g) in sps:
            r[f"2 procs x 1 thread / 1 proc x 2 threads{at} (target > 1.1)"] = sps["2x1", g] / sps["1x2", g]
        if ("2x1", g) in sps and ("1x1", g) in sps:
            r[f"2 procs x 1 thread / 1 proc x 1 thread{at} (target >= 1.8)"] = sps["2x1", g] / sps["1x1", g]
    return r


def scaling_figures(jobs: list[Job]) -> dict[tuple[str, int | None], float]:
    """Median steady samples/s of each scaling job that ran, keyed by (name, global batch)."""
    return {(j.name, j.global_batch): summarize(j)["steady_samples_per_second"]
            for j in jobs if j.group == "scaling" and j.runs}


def extra_flags(cmd: list[str]) -> list[str]:
    """The --scaling-flags inside a scaling job's command."""
    if "--no-tensorboard" in cmd and "--batch-size" in cmd:
        return cmd[cmd.index("--no-tensorboard") + 1:cmd.index("--batch-size")]
    return []


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_markdown(jobs: list[Job], info: dict, command: str) -> str:
    lines = [f"# Benchmark results\n\nMachine: {info['cpu_cores']} CPU cores, "
             f"{info['gpus']} GPU(s){' (' + info['gpu'] + ')' if info['gpu'] else ''}, torch {info['torch']}, "
             f"Python {info['python']}.  \nCommand: `{command}`  \nEach figure is the median over the runs shown.\n"]
    rec = [j for j in jobs if j.group == "recipe" and j.runs]
    if rec:
        lines += ["## Recipes\n",
                  "| recipe | data | runs | s/epoch (train) | train samples/s | wall s (start to exit) "
                  "| heldout ROC AUC | peak RSS/rank MB |",
                  "|---|---|---|---|---|---|---|---|"]
        for j in rec:
            s = summarize(j)
            ep = j.runs[0].get("epochs")
            what = (f"original (1 proc, batch 256, 3x128 BiLSTM, {ep} ep)" if j.name == "original"
                    else f"workshop step3 ({j.procs} procs, global batch {j.global_batch}, {ep} ep)")
            lines.append(f"| {what} | {j.dataset} | {s['runs']} | {fmt(s['seconds_per_epoch'], '.2f')} "
                         f"| {fmt(s['train_samples_per_second'], ',.0f')} | {fmt(s['wall_seconds'], '.1f')} "
                         f"| {fmt(s['heldout_roc_auc'], '.3f')} | {fmt(s['peak_rss_mb_per_rank'], ',.0f')} |")
        lines.append("")
    sc = [j for j in jobs if j.group == "scaling" and j.runs]
    if sc:
        flags = " ".join(extra_flags(sc[0].cmd))
        lines += [f"## Scaling (B3DB, samples/s after the first epoch{', step3 ' + flags if flags else ''})\n",
                  f"The first global batch, {sc[0].global_batch}, is the workshop's default for 2 processes; "
                  "the targets are judged there.\n",
                  "| global batch | processes x threads | runs | batch per process | training samples/s "
                  "| vs 1x1 at this global batch |",
                  "|---|---|---|---|---|---|"]
        sps = scaling_figures(jobs)
        for j in sc:
            s = summarize(j)
            base = sps.get(("1x1", j.global_batch)) or sps.get(("1x1 GPU", j.global_batch))
            lines.append(f"| {j.global_batch} | {j.name} | {s['runs']} | {j.global_batch // j.procs} "
                         f"| {fmt(s['steady_samples_per_second'], ',.0f')} "
                         f"| {fmt(s['steady_samples_per_second'] / base if base else None, '.2f')}x |")
        lines.append("")
    nb = [j for j in jobs if j.group == "notebooks" and j.runs]
    if nb:
        lines += ["## Notebooks\n", f"`pytest --nbval notebooks/`: {summarize(nb[0])['wall_seconds']:.1f} s wall\n"]
    r = ratios(jobs)
    if r:
        lines += ["## Targets (ratios within this run)\n", "| ratio | value |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in r.items()] + [""]
    return "\n".join(lines)


def render_plot(jobs: list[Job], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    sc = [j for j in jobs if j.group == "scaling" and j.runs]
    default = [j for j in sc if j.global_batch == sc[0].global_batch]
    ax = axes[0]
    threads = sorted((j.threads, summarize(j)["steady_samples_per_second"]) for j in default
                     if j.procs == 1 and j.device == "cpu")
    procs = sorted((j.procs, summarize(j)["steady_samples_per_second"]) for j in default
                   if j.threads == 1 or j.device == "cuda")
    gpu = bool(sc) and sc[0].device == "cuda"
    for pts, label in ((threads, "1 process x T threads"),
                       (procs, "K processes x 1 GPU" if gpu else "K processes x 1 thread")):
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set(xlabel="T threads, or K processes", ylabel="training samples/s",
           title=f"DDP scaling, global batch {sc[0].global_batch if sc else '-'} (the default)")
    if procs:
        ks = sorted({k for k, _ in threads + procs})
        ax.plot(ks, [procs[0][1] * k / procs[0][0] for k in ks], "k--", alpha=0.4, label="linear in K")
        ax.set_xticks(ks)
        ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]  # the speed-up of K processes over 1 process, against the work in each step
    sps = scaling_figures(jobs)
    batches = sorted({g for _, g in sps})
    for other, style in (("1x1", "o-"), ("1x2", "s--")):
        pts = [(g, sps["2x1", g] / sps[other, g]) for g in batches if ("2x1", g) in sps and (other, g) in sps]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=f"2 procs x 1 thread / {other[0]} proc x {other[2]} "
                                                       f"thread{'s' if other[2] != '1' else ''}")
    if batches:
        ax.axhline(1.8, color="tab:red", alpha=0.4, label="target vs 1x1 (1.8)")
        ax.axhline(2.0, color="k", ls=":", alpha=0.4, label="perfect (2.0)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(g) for g in batches])
        ax.legend(fontsize=8)
    ax.set(xlabel="global batch (per process: half of it)", ylabel="speed-up",
           title="More work per step: the all-reduce matters less")
    ax.grid(alpha=0.3)
    ax = axes[2]
    rec = [j for j in jobs if j.group == "recipe" and j.runs]
    names = [f"{j.name}\n{j.dataset}" for j in rec]
    walls = [summarize(j)["wall_seconds"] for j in rec]
    bars = ax.bar(range(len(rec)), walls, color=["tab:gray" if j.name == "original" else "tab:blue" for j in rec])
    for b, j in zip(bars, rec, strict=True):
        auc = summarize(j)["heldout_roc_auc"]
        ax.annotate(f"AUC {auc:.3f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom")
    ax.set_xticks(range(len(rec)), names, fontsize=8)
    ax.set(ylabel="wall seconds, start to exit", title="Time to the final model")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results(jobs: list[Job], info: dict, command: str, results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    data = {"machine": info, "command": command, "ratios": ratios(jobs),
            "jobs": [{**asdict(j), "summary": summarize(j)} for j in jobs if j.runs]}
    (results / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    (results / "results.md").write_text(render_markdown(jobs, info, command))
    render_plot(jobs, results / "scaling.png")


def batch_list(text: str) -> list[int]:
    try:
        batches = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of whole numbers, e.g. 128,256") from None
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more positive global batches, e.g. 128,256")
    return batches


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="a BBBP-format CSV to benchmark besides the shipped table")
    p.add_argument("--parts", default="recipes,scaling", help="comma list of: recipes, scaling, model")
    p.add_argument("--notebooks", action="store_true", help="also time pytest --nbval notebooks/")
    p.add_argument("--repeats", type=int, default=3, help="runs per workshop/scaling figure (median)")
    p.add_argument("--original-repeats", type=int, default=3, help="runs of the original recipe on --data")
    p.add_argument("--original-repeats-shipped", type=int, default=1,
                   help="runs of the original recipe on the shipped B3DB (~11 min each on 2 cores; 0 skips)")
    p.add_argument("--global-batch", type=batch_list, default=None,
                   help="scaling: comma list of global batches, the first judged against the targets "
                        "(default: 2, 4 and 8 x the default batch per process)")
    p.add_argument("--scaling-flags", type=str.split, default=[],
                   help='extra step3 flags for the scaling runs, e.g. "--hidden 128 --layers 3"')
    p.add_argument("--scaling-epochs", type=int, default=4)
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    p.add_argument("--quick", action="store_true", help="tiny settings, one run each: checks every code path")
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON lines, run nothing")
    args = p.parse_args(argv)
    args.parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if bad := args.parts - {"recipes", "scaling", "model"}:
        p.error(f"unknown --parts {', '.join(sorted(bad))}")
    if args.data and not Path(args.data).is_file():
        p.error(f"--data {args.data} not found")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    info = machine()
    jobs = plan(args, info)
    command = "python benchmarks/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        for j in jobs:
            d = asdict(j)
            d.pop("runs")
            print(json.dumps(d))
        if "model" in args.parts:
            print(json.dumps({"group": "model", "name": "scaling model", "writes": ["model.json", "model.md"]}))
        return 0
    if jobs:
        run_jobs(jobs, args, info, command)
    if "model" in args.parts:
        try:
            from benchmarks import model_part
        except ImportError:  # run as a script: benchmarks/ itself is on sys.path
            import model_part

        figures = scaling_figures(jobs) if "scaling" in args.parts else None
        print(model_part.run(args.results, figures, quick=args.quick, command=command).read_text())
    return 0


def run_jobs(jobs: list[Job], args: argparse.Namespace, info: dict, command: str) -> None:
    total = sum(j.repeats for j in jobs)
    done, t0 = 0, time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        for rep in range(max(j.repeats for j in jobs)):  # interleave repeats: drift hits every job alike
            for i, j in enumerate(jobs):
                if rep >= j.repeats:
                    continue
                # One fresh --out per job and repeat: a shared one would resume (or refuse) another run.
                run_dir = work / f"{i:02d}-{j.group}-{j.name}-{rep}".replace(" ", "_").replace("/", "_")
                j.runs.append(run_once(j, run_dir, args.timeout))
                done += 1
                r = j.runs[-1]
                print(f"[{done}/{total} {time.perf_counter() - t0:.0f}s] {j.group} {j.name} {j.dataset}: "
                      f"wall {r['wall_seconds']:.1f}s"
                      + (f", {r['steady_samples_per_second']:.0f} samples/s, heldout {r['heldout_roc_auc']:.3f}"
                         if "heldout_roc_auc" in r else ""), flush=True)
                write_results(jobs, info, command, args.results)  # partial results survive an interruption
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print((args.results / "results.md").read_text())


if __name__ == "__main__":
    raise SystemExit(main())
