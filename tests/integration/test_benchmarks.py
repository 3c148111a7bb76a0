"""The benchmark script: its plan (--dry-run), and its report built from a real tiny run.

The benchmark itself is a script, not a timed test: these only check that it
measures what the issue asks for and that its report is made from real runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from benchmarks import bench, original_recipe
from tests.conftest import REPO, cpu_env
from workshop_lib.config import TrainConfig


@pytest.mark.timeout(60)
def test_dry_run_plans_both_recipes_and_scaling_at_each_global_batch(bbbp_style_csv):
    proc = subprocess.run([sys.executable, "benchmarks/bench.py", "--dry-run", "--data", str(bbbp_style_csv),
                           "--notebooks"], capture_output=True, text=True, timeout=50, cwd=REPO, env=cpu_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = [json.loads(line) for line in proc.stdout.splitlines()]
    recipes = {(j["name"], j["dataset"]) for j in jobs if j["group"] == "recipe"}
    assert recipes == {(n, d) for n in ("original", "workshop") for d in ("B3DB (shipped)", "tiny.csv")}
    original = next(j for j in jobs if j["name"] == "original" and j["dataset"] == "tiny.csv")
    assert original["threads"] is None and original["repeats"] == 3  # torch's default threads, median of 3
    workshop = next(j for j in jobs if j["name"] == "workshop")
    shipped = str(REPO / "dataset" / "b3db_classification.csv")
    assert "--nproc_per_node=2" in workshop["cmd"] and workshop["cmd"][-2:] == ["--data", shipped]
    scaling = [j for j in jobs if j["group"] == "scaling"]
    default = TrainConfig().batch_size * 2  # two processes at the default batch each
    assert scaling[0]["global_batch"] == default  # the first is the one the targets are judged at
    assert {j["global_batch"] for j in scaling} == {default, 2 * default, 4 * default}
    for g in (default, 2 * default, 4 * default):
        assert {j["name"] for j in scaling if j["global_batch"] == g} >= {"1x1", "1x2", "2x1"}
    for j in scaling:
        per_process = int(j["cmd"][j["cmd"].index("--batch-size") + 1])
        assert per_process * j["procs"] == j["global_batch"]
        assert f"--nproc_per_node={j['procs']}" in j["cmd"]
        assert j["threads"] == (int(j["name"].split("x")[1]) if j["procs"] == 1 else 1)
        assert not {"--backend", "--no-progress"} & set(j["cmd"])  # flags the scripts no longer have
        assert j["device"] == "cpu"  # run with CUDA_VISIBLE_DEVICES=: gloo, on a GPU node too
    assert any(j["group"] == "notebooks" and "--nbval" in j["cmd"] for j in jobs)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.timeout(60)
def test_report_is_built_from_a_real_run(tmp_path, small_csv, one_thread):
    short = pd.read_csv(small_csv)
    short = short[short.smiles.str.len() < 40].head(120)  # the 3x128 BiLSTM is slow on long molecules
    short.to_csv(tmp_path / "short.csv", index=False)
    out = tmp_path / "original"
    metrics = original_recipe.main(["--data", str(tmp_path / "short.csv"), "--epochs", "1", "--out", str(out)])
    run = {"wall_seconds": metrics["train_seconds"] + 0.5, **bench.collect(out)}
    assert run["heldout_roc_auc"] == metrics["heldout_roc_auc"]
    assert run["rss_mb_per_rank"][0] > 50  # a Python process with torch loaded
    job = bench.Job("recipe", "original", "short.csv", [], threads=None, repeats=1, runs=[run])
    results = tmp_path / "results"
    bench.write_results([job], bench.machine(), "python benchmarks/bench.py --quick", results)
    md = (results / "results.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| original"))
    assert f"| {metrics['heldout_roc_auc']:.3f} |" in row and "short.csv" in row
    assert (results / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((results / "results.json").read_text())
    assert saved["jobs"][0]["summary"]["heldout_roc_auc"] == metrics["heldout_roc_auc"]


def test_ratios_compare_figures_of_the_same_run():
    def job(group, name, **figures):
        return bench.Job(group, name, "d.csv" if group == "recipe" else "B3DB (shipped)", [], None, 1,
                         runs=[{"rss_mb_per_rank": [figures.pop("rss", 100.0)], **figures}])

    def at(j, g):
        j.global_batch = g
        return j

    jobs = [job("recipe", "original", wall_seconds=180.0, rss=1400.0),
            job("recipe", "workshop", wall_seconds=15.0, rss=350.0),
            at(job("scaling", "1x1", steady_samples_per_second=1000.0), 128),
            at(job("scaling", "1x2", steady_samples_per_second=1200.0), 128),
            at(job("scaling", "2x1", steady_samples_per_second=1900.0), 128),
            at(job("scaling", "1x1", steady_samples_per_second=900.0), 512),
            at(job("scaling", "2x1", steady_samples_per_second=2000.0), 512)]
    r = bench.ratios(jobs)
    assert r["d.csv: original wall / workshop wall (target >= 6)"] == pytest.approx(12.0)
    assert r["d.csv: workshop peak RSS per rank / original (target <= 0.5)"] == pytest.approx(0.25)
    assert r["2 procs x 1 thread / 1 proc x 2 threads (target > 1.1)"] == pytest.approx(1900 / 1200)
    assert r["2 procs x 1 thread / 1 proc x 1 thread (target >= 1.8)"] == pytest.approx(1.9)
    # Other global batches are reported beside the default, never mixed with it.
    assert r["2 procs x 1 thread / 1 proc x 1 thread at global batch 512 (target >= 1.8)"] == pytest.approx(2000 / 900)
    assert not any("512" in k and "2 threads" in k for k in r)  # no 1x2 run at 512: no ratio made up


def test_a_cpu_job_hides_the_gpus_and_a_gpu_job_does_not(monkeypatch):
    """No --backend flag: the scripts pick nccl whenever CUDA is available, so a CPU job hides the GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("RANK", "3")  # a surrounding job's launch variables never reach a benchmark's
    assert bench.child_env(1, "cpu")["CUDA_VISIBLE_DEVICES"] == ""
    assert bench.child_env(None, "cuda")["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "RANK" not in bench.child_env(1) and bench.child_env(1)["OMP_NUM_THREADS"] == "1"


@pytest.mark.timeout(120)
def test_rank_rss_records_every_rank_of_a_real_torchrun(tmp_path):
    """The runpy wrapper records each rank's peak memory when the step script ends."""
    rss = tmp_path / "rss"
    cmd = bench.torchrun(2, bench.RANK_RSS, rss, bench.STEP3, "--limit", "120", "--epochs", "1", "--no-tensorboard",
                         "--out", tmp_path / "out")
    proc = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = bench.collect(tmp_path / "out", rss)
    assert len(run["rss_mb_per_rank"]) == 2 and min(run["rss_mb_per_rank"]) > 50  # both ranks, torch loaded


def test_every_job_and_repeat_gets_its_own_out_directory(tmp_path, monkeypatch):
    """Scaling jobs at two global batches share a name ("1x1"); a shared --out would resume or refuse."""
    dirs: list = []
    monkeypatch.setattr(bench, "run_once", lambda job, work, timeout: dirs.append(work) or {"wall_seconds": 0.0})
    monkeypatch.setattr(bench, "write_results", lambda *a, **k: None)
    (tmp_path / "results.md").write_text("")
    jobs = [bench.Job("scaling", "1x1", "B3DB (shipped)", ["x"], threads=1, repeats=2, procs=1, global_batch=g)
            for g in (128, 256)]
    args = type("Args", (), {"timeout": 1.0, "results": tmp_path})()
    bench.run_jobs(jobs, args, {}, "cmd")
    assert len(dirs) == 4 and len(set(dirs)) == 4
