"""``bench.py --parts model``: fit the scaling model here, and set its predictions beside the measured scaling.

It measures the model's inputs on this machine (``workshop_lib.scaling.measure``:
a step's compute against the batch, alone and with 2 ranks at once, the wait for
the slower rank, gloo all-reduce time against message size), predicts samples/s
of 1 x 1 and 2 x 1 at each global batch of the scaling table, and compares them
with the scaling table in ``results.json`` (this run's, or the last one's). It
writes ``model.json`` and ``model.md`` beside ``results.md``, with the published
check (Horovod, 512 GPUs) and the projections to 1,024 ranks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from workshop_lib.scaling import cost, published
from workshop_lib.scaling.measure import MachineFit, measure


def measured_scaling(results: Path, figures: dict | None = None) -> tuple[dict, str]:
    """{(name, global batch): steady samples/s} and where they come from: this run's jobs, else results.json."""
    if figures:
        return figures, "this run"
    path = results / "results.json"
    if not path.is_file():
        return {}, "none (run --parts scaling)"
    data = json.loads(path.read_text())
    found = {(j["name"], j["global_batch"]): j["summary"]["steady_samples_per_second"]
             for j in data["jobs"] if j["group"] == "scaling"}
    return found, f"results.json (`{data.get('command', '?')}`)"


def compare(fit: MachineFit, figures: dict, batches: list[int]) -> list[dict]:
    """Predicted against measured samples/s and speed-up for 1 x 1 and N x 1 at each global batch."""
    rows = []
    for g in batches:
        one, many = fit.predict(g, 1), fit.predict(g, fit.nprocs)
        m1, mn = figures.get(("1x1", g)), figures.get((f"{fit.nprocs}x1", g))
        for name, s, m in (("1x1", one, m1), (f"{fit.nprocs}x1", many, mn)):
            rows.append({"global_batch": g, "config": name, "compute_ms": 1e3 * s.compute,
                         "allreduce_ms": 1e3 * s.exposed, "straggler_ms": 1e3 * s.straggler,
                         "step_ms": 1e3 * s.seconds, "predicted": s.samples_per_second, "measured": m,
                         "error": s.samples_per_second / m - 1 if m else None})
        speedup = many.samples_per_second / one.samples_per_second
        rows.append({"global_batch": g, "config": f"speed-up {fit.nprocs}x1 / 1x1", "predicted": speedup,
                     "measured": mn / m1 if m1 and mn else None,
                     "error": speedup / (mn / m1) - 1 if m1 and mn else None})
    return rows


def projections(fit: MachineFit) -> list[dict]:
    lstm = fit.workload(64)
    links = {"loopback (measured here)": fit.loopback(), **published.LINKS}
    rows = []
    for work in (lstm, *published.WORKLOADS.values()):
        for lname, link in links.items():
            for r in cost.project(work, link, cost.ranks(link.max_ranks, 2)):
                rows.append({"model": work.name, "link": lname, **r})
    return rows


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.0f}%"


def render(fit: MachineFit, rows: list[dict], source: str, proj: list[dict], checks: list[dict],
           seconds: float, load: tuple[float, float]) -> str:
    ms = lambda c: ", ".join(f"{int(b)}: {1e3 * t:.1f}" for b, t in zip(c.batches, c.seconds, strict=True))  # noqa: E731
    fixed, per = fit.alone.linear()
    lines = [
        "# Scaling model: predicted vs measured\n",
        f"Inputs measured by this run ({seconds:.0f} s), one thread per rank. Load average {load[0]:.1f} at the "
        f"start, {load[1]:.1f} at the end, on {os.cpu_count()} cores"
        + (": **other work shared the cores, so these timings are not this machine's**" if max(load) > 0.5 * (
            os.cpu_count() or 1) else "") + ".\n",
        f"- gloo all-reduce on {fit.nprocs} ranks, fitted to the ring: alpha = {1e6 * fit.alpha:.0f} us per step, "
        f"beta = {fit.beta / 1e6:,.0f} MB/s; the LSTM's {fit.params:,} float32 gradients "
        f"({4 * fit.params / 1e3:.0f} KB) then take "
        f"{1e3 * cost.allreduce_seconds(4 * fit.params, fit.nprocs, fit.alpha, fit.beta):.2f} ms",
        f"- compute per step, 1 rank alone, ms by batch: {ms(fit.alone)} "
        f"(least squares: {1e3 * fixed:.1f} ms + {1e6 * per:.0f} us per molecule)",
        f"- compute per step with {fit.nprocs} ranks at once, ms by per-rank batch: {ms(fit.together)}",
        "- wait for the slower rank, ms by per-rank batch: "
        + ", ".join(f"{b}: {1e3 * t:.1f}" for b, t in fit.straggler.items()),
        "- (diagnostic, not a model input) all-reduce inside a step, seen by the last rank to arrive, ms: "
        + ", ".join(f"{b}: {1e3 * t:.1f}" for b, t in fit.allreduce_in_step.items()),
        f"\nMeasured samples/s from {source}.\n",
        "| global batch | config | compute ms | all-reduce ms | straggler ms | step ms | predicted | measured | error |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["config"].startswith("speed-up"):
            lines.append(f"| {r['global_batch']} | **{r['config']}** | | | | | **{r['predicted']:.2f}x** "
                         f"| **{'-' if r['measured'] is None else format(r['measured'], '.2f') + 'x'}** "
                         f"| **{_pct(r['error'])}** |")
        else:
            lines.append(f"| {r['global_batch']} | {r['config']} | {r['compute_ms']:.1f} | {r['allreduce_ms']:.2f} "
                         f"| {r['straggler_ms']:.1f} | {r['step_ms']:.1f} | {r['predicted']:,.0f} "
                         f"| {'-' if r['measured'] is None else format(r['measured'], ',.0f')} | {_pct(r['error'])} |")
    lines += ["\n## Checked against a published result\n", published.HOROVOD["source"] + ".\n",
              "| model | parameters | overlap | predicted efficiency at 512 | published | difference |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {c['model']} | {c['params'] / 1e6:.1f}M | {c['overlap']:.0%} | {c['predicted_efficiency']:.0%} "
              f"| {c['published_efficiency']:.0%} | {c['error_points']:+.0f} points |" for c in checks]
    lines += ["\n## Projections (efficiency = speed-up / N; per-rank batch fixed, no overlap)\n"]
    ns = sorted({r["n"] for r in proj})
    lines += ["| model | link | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|---|" + "---|" * len(ns)]
    for key in dict.fromkeys((r["model"], r["link"]) for r in proj):
        eff = {r["n"]: r["efficiency"] for r in proj if (r["model"], r["link"]) == key}
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{eff[n]:.0%}" if n in eff else "" for n in ns) + " |")
    return "\n".join(lines) + "\n"


def run(results: Path, figures: dict | None = None, quick: bool = False, command: str = "") -> Path:
    """Measure, predict, compare; write ``model.json`` and ``model.md`` to ``results``; return the .md path."""
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    figures, source = measured_scaling(results, figures)
    batches = sorted({g for (name, g) in figures if name == "1x1"}) or [128, 256, 512]
    if quick:
        fit = measure(batches=(64, 128), rank_batches=(64,), repeats=1, limit=1000, timeout=120)
        batches = [128]
    else:
        fit = measure(batches=tuple(sorted({64, *batches})), rank_batches=tuple(g // 2 for g in batches))
    seconds, load = time.perf_counter() - start, (load0, os.getloadavg()[0])
    rows, proj = compare(fit, figures, batches), projections(fit)
    checks = published.horovod_check(0.0) + published.horovod_check(1.0)
    results.mkdir(parents=True, exist_ok=True)
    (results / "model.json").write_text(json.dumps(
        {"command": command, "measured_from": source, "fit": fit.as_dict(), "seconds": seconds, "load_average": load,
         "compare": rows, "horovod_check": checks, "projections": proj}, indent=2) + "\n")
    md = results / "model.md"
    md.write_text(render(fit, rows, source, proj, checks, seconds, load))
    return md
