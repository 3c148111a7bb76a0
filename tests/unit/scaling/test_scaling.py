"""The scaling model (workshop_lib/scaling/cost.py), its measured inputs, the bench part and the notebook's sliders."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys

import pytest

from tests.conftest import REPO, cpu_env
from workshop_lib.errors import WorkshopError
from workshop_lib.scaling import cost, published
from workshop_lib.scaling.cost import ComputeCurve, allreduce_seconds, fit_alpha_beta
from workshop_lib.scaling.explorer import Explorer
from workshop_lib.scaling.measure import MachineFit

# ------------------------------------------------------------------------------- the ring


@pytest.mark.parametrize(("nbytes", "n", "alpha", "beta", "expected"), [
    (1e6, 1, 1e-5, 1e9, 0.0),  # one rank: nothing to reduce
    (1e6, 2, 0.0, 1e9, 1e-3),  # 2 ranks: each sends and receives half, twice: S/beta
    (4e6, 4, 1e-5, 1e9, 6 * (1e-5 + 1e-3)),  # 2(N-1) = 6 steps of alpha + (S/N)/beta
    (0.0, 8, 1e-5, 1e9, 0.0),
])
def test_ring_allreduce_known_cases(nbytes, n, alpha, beta, expected):
    assert allreduce_seconds(nbytes, n, alpha, beta) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("n", [2, 3, 8, 64, 1024])
def test_without_latency_the_bus_bandwidth_is_beta(n):
    # nccl-tests: busBw = algBw * 2(n-1)/n, with algBw = S / t. The ring uses each link at beta.
    nbytes, beta = 256e6, 100e9
    t = allreduce_seconds(nbytes, n, 0.0, beta)
    assert nbytes / t * 2 * (n - 1) / n == pytest.approx(beta)


def test_ring_tends_to_twice_the_bytes_over_beta_and_tree_pays_log_latency():
    assert allreduce_seconds(1e9, 1_000_000, 0.0, 1e9) == pytest.approx(2.0, rel=1e-5)
    assert allreduce_seconds(1e6, 8, 1e-5, 1e9, "tree") == pytest.approx(6 * (1e-5 + 1e-3))
    assert allreduce_seconds(1e6, 1024, 1e-5, 1e9, "double-tree") == pytest.approx(20 * 1e-5 + 2 * 1023 / 1024 * 1e-3)
    assert allreduce_seconds(1e6, 2, 1e-5, 1e9, buckets=3) == pytest.approx(2 * (3e-5 + 0.5e-3))
    with pytest.raises(WorkshopError, match="unknown all-reduce algorithm"):
        allreduce_seconds(1e6, 2, 1e-5, 1e9, "butterfly")


@pytest.mark.parametrize(("n", "alpha", "beta"), [(2, 60e-6, 1.5e9), (2, 5e-6, 40e9), (4, 20e-6, 10e9)])
def test_the_fit_recovers_alpha_and_beta_from_synthetic_timings(n, alpha, beta):
    rng = random.Random(0)
    sizes = [2**k for k in range(10, 25)]
    times = [allreduce_seconds(s, n, alpha, beta) * (1 + rng.uniform(-0.03, 0.03)) for s in sizes]
    a, b = fit_alpha_beta(sizes, times, n)
    assert a == pytest.approx(alpha, rel=0.1)
    assert b == pytest.approx(beta, rel=0.1)


def test_the_fit_needs_two_sizes():
    with pytest.raises(WorkshopError, match="at least 2 message sizes"):
        fit_alpha_beta([1024, 1024], [1e-4, 1e-4], 2)


def test_compute_curve_interpolates_and_extends():
    c = ComputeCurve((128, 64, 256), (0.02, 0.01, 0.05))  # given unsorted
    assert c.batches == (64.0, 128.0, 256.0)
    assert c(96) == pytest.approx(0.015)
    assert c(512) == pytest.approx(0.05 + 0.03 * 2)  # the last segment, extended
    assert c(32) == pytest.approx(0.005)  # below: the first point, in proportion
    assert ComputeCurve((256,), (0.1,))(128) == pytest.approx(0.05)  # one point: proportional
    fixed, per = ComputeCurve((1, 2, 3), (3.0, 5.0, 7.0)).linear()
    assert (fixed, per) == (pytest.approx(1.0), pytest.approx(2.0))


# ------------------------------------------------------------------ the model's terms


def test_a_step_adds_compute_the_exposed_all_reduce_and_the_straggler():
    work = cost.Workload("w", 1e6, ComputeCurve((32,), (0.03,)), batch=32)
    link = cost.Link("l", 1e-5, 1e9, 8)
    ar = allreduce_seconds(4e6, 4, 1e-5, 1e9)
    s = cost.step(work, link, 4, contention=1.5, straggler=0.002)
    assert (s.compute, s.exposed, s.straggler) == (pytest.approx(0.045), pytest.approx(ar), 0.002)
    assert s.samples_per_second == pytest.approx(4 * 32 / (0.045 + ar + 0.002))
    hidden = cost.step(work, link, 4, overlap=1.0)  # backward (2/3 of 30 ms) is longer than the all-reduce
    assert hidden.exposed == 0.0 and hidden.allreduce == pytest.approx(ar)
    accum = cost.step(work, link, 4, accumulation=4)  # 4 micro-batches, one all-reduce
    assert accum.compute == pytest.approx(0.12) and accum.exposed == pytest.approx(ar) and accum.samples == 128
    with pytest.raises(WorkshopError, match="not a share"):
        cost.step(work, link, 2, overlap=1.5)


def test_large_parameter_models_scale_worse_than_compute_heavy_ones():
    checks = {c["model"]: c for c in published.horovod_check(0.0)}
    assert checks["VGG-16"]["predicted_efficiency"] < checks["ResNet-101"]["predicted_efficiency"]
    for c in checks.values():  # within 15 points of Horovod's published figures
        assert abs(c["error_points"]) < 15
    ib = published.LINKS["InfiniBand NDR, nodes of 8"]
    for work in published.WORKLOADS.values():
        eff = [r["efficiency"] for r in cost.project(work, ib)]
        assert eff[0] == pytest.approx(1.0) and all(a >= b for a, b in itertools.pairwise(eff))


# ------------------------------------------------- predictions from the measured inputs


def _from_dict(d: dict) -> MachineFit:
    """The fit as ``MachineFit.as_dict`` wrote it (benchmarks/results/model.json)."""
    curve = lambda m: ComputeCurve(tuple(float(k) for k in m), tuple(m.values()))  # noqa: E731
    ints = lambda m: {int(float(k)): v for k, v in m.items()}  # noqa: E731
    return MachineFit(d["params"], d["nprocs"], d["alpha_s"], d["beta_bytes_per_s"],
                      [tuple(p) for p in d["allreduce_points"]], curve(d["alone"]), curve(d["together"]),
                      ints(d["straggler_s"]), ints(d.get("allreduce_in_step_s", {})))


def _fit(alpha=200e-6, beta=1.5e9, together64=0.0135, straggler64=0.001) -> MachineFit:
    return MachineFit(params=21_153, nprocs=2, alpha=alpha, beta=beta, allreduce_points=[(1024, 4e-4), (1 << 20, 1e-3)],
                      alone=ComputeCurve((64, 128, 256), (0.0081, 0.0186, 0.041)),
                      together=ComputeCurve((64, 128), (together64, 0.02)),
                      straggler={64: straggler64, 128: 0.002}, allreduce_in_step={64: 0.003, 128: 0.003})


def test_the_prediction_for_the_measured_configurations_comes_from_the_measured_inputs():
    fit = _fit()
    assert fit.predict(128, 1).seconds == pytest.approx(0.0186)  # 1 x 1: the lone step at 128
    ring = allreduce_seconds(4 * 21_153, 2, 200e-6, 1.5e9)
    assert fit.predict(128, 2).seconds == pytest.approx(0.0135 + ring + 0.001)  # 2 x 1: per-rank batch 64
    # every input moves the prediction: none of it is a constant of the model
    base = fit.predict(128, 2).seconds
    for changed in (_fit(alpha=400e-6), _fit(beta=0.5e9), _fit(together64=0.02), _fit(straggler64=0.004)):
        assert changed.predict(128, 2).seconds > base
    again = _from_dict(json.loads(json.dumps(fit.as_dict())))  # as model.json stores it
    assert again.predict(128, 2).seconds == pytest.approx(base)


def test_the_bench_table_sets_predictions_from_the_fit_beside_the_measured_figures():
    from benchmarks import model_part

    fit = _fit()
    rows = model_part.compare(fit, {("1x1", 128): 5000.0, ("2x1", 128): 8000.0}, [128])
    one, two, speedup = rows
    assert one["predicted"] == pytest.approx(128 / 0.0186) and one["measured"] == 5000.0
    assert two["predicted"] == pytest.approx(fit.predict(128, 2).samples_per_second)
    assert speedup["predicted"] == pytest.approx(two["predicted"] / one["predicted"])
    assert speedup["measured"] == pytest.approx(1.6) and speedup["error"] == pytest.approx(speedup["predicted"] / 1.6 - 1)
    assert model_part.compare(fit, {}, [128])[2]["measured"] is None  # no scaling run: nothing invented


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bench_parts_model_measures_here_and_writes_its_table(tmp_path):
    scaling_jobs = [{"group": "scaling", "name": name, "global_batch": 128,
                     "summary": {"steady_samples_per_second": sps}} for name, sps in (("1x1", 4000.0), ("2x1", 6000.0))]
    (tmp_path / "results.json").write_text(json.dumps({"command": "a test", "jobs": scaling_jobs}))
    proc = subprocess.run([sys.executable, "benchmarks/bench.py", "--parts", "model", "--quick", "--results",
                           str(tmp_path)], cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "model.json").read_text())
    fit = _from_dict(data["fit"])
    assert fit.params > 10_000 and fit.alpha >= 0 and fit.beta > 0 and len(fit.allreduce_points) >= 5
    assert all(t > 0 for t in fit.alone.seconds + fit.together.seconds)
    rows = {r["config"]: r for r in data["compare"]}
    assert rows["1x1"]["measured"] == 4000.0 and rows["2x1"]["measured"] == 6000.0
    assert rows["2x1"]["predicted"] == pytest.approx(fit.predict(128, 2).samples_per_second)  # from what it measured
    md = (tmp_path / "model.md").read_text()
    assert "| 128 | 2x1 |" in md and "6,000" in md and "Horovod" in md and "N=1024" in md


# ------------------------------------------------------------------------ the sliders


def test_the_sliders_callback_updates_the_plot_data():
    ex = Explorer()
    before = list(ex.line.get_ydata())
    eff = ex.update(params_m=500, batch=64, bandwidth_gbs=5, overlap=0.0)
    after = list(ex.line.get_ydata())
    assert after == list(eff.values()) and after != before
    assert after[0] == pytest.approx(1.0) and after[-1] < before[-1]  # a big model on a thin link scales worse
    hidden = ex.update(params_m=500, batch=64, bandwidth_gbs=5, overlap=1.0)
    assert hidden[1024] > eff[1024]  # overlap hides part of the all-reduce
    bigger = ex.update(params_m=500, batch=512, bandwidth_gbs=5, overlap=0.0)
    assert bigger[1024] > eff[1024]  # more work per all-reduce
    assert ex.ax.get_title().startswith("500M parameters")


def test_moving_a_slider_calls_the_callback():
    pytest.importorskip("ipywidgets")
    ex = Explorer()
    ex.widgets()
    first = list(ex.line.get_ydata())
    ex.sliders["bandwidth_gbs"].value = 1.0
    assert ", 1 GB/s," in ex.ax.get_title()
    assert list(ex.line.get_ydata()) == ex.curve(ex.work.params / 1e6, ex.work.batch, 1.0, 0.0)
    assert ex.line.get_ydata()[-1] < first[-1]


def test_the_read_off_and_the_predictions_are_checked_against_the_model(capsys):
    from workshop_lib.engine.common import CheckFailed
    from workshop_lib.scaling.explorer import check, doubling_stops_paying

    rows = cost.project(published.WORKLOADS["ResNet-50"], published.LINKS["Ethernet 25 Gb/s, nodes of 8"],
                           global_batch=4096)
    n = doubling_stops_paying(rows)
    by_n = {r["n"]: r["samples_per_second"] for r in rows}
    assert by_n[2 * n] / by_n[n] < 1.1 <= by_n[n] / by_n[n // 2]  # the first doubling that adds < 10%
    nvlink = cost.project(published.WORKLOADS["ResNet-50"], published.LINKS["NVLink, 8 GPUs"], global_batch=4096)
    assert doubling_stops_paying(nvlink) is None  # within one NVLink node it always pays
    check("accumulation", 0.63, 0.65)
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} 65% (you said 63%): k micro-batches")
    with pytest.raises(CheckFailed, match=r"you predicted 27%, the model gives 65%: k micro-batches"):
        check("accumulation", 0.27, 0.65)
    check("accumulation", 65, 0.65)  # a percent, where the question asks for a share: read as the 65% meant
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} 65% (you said 65%): k micro-batches")
    with pytest.raises(CheckFailed, match=r"you predicted 1\.35%, the model gives 65%: k micro-batches"):
        check("accumulation", 1.35, 0.65)  # 1.35 for 1.35%, not a typo for 0.0135
    check("overlap", 46, 47.6)
    with pytest.raises(CheckFailed, match=r"you predicted 0 ms, the model gives 48 ms: backward"):
        check("overlap", 0, 47.6)
    with pytest.raises(CheckFailed, match="write the all-reduce time left exposed"):
        check("overlap", None, 47.6)
