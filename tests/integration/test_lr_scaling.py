"""benchmarks/lr_scaling.py: the learning rates it tries, its plan, and its results from a real tiny run."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import lr_scaling
from tests.conftest import REPO
from workshop_lib.config import TrainConfig


def test_each_rule_scales_from_the_tuned_global_batch():
    lrs = lr_scaling.learning_rates(8e-3, tuned_batch=128, batch_per_rank=64, nprocs=4)  # k = 2
    assert lrs == pytest.approx({"none": 8e-3, "sqrt": 8e-3 * math.sqrt(2), "linear": 16e-3})
    assert lr_scaling.learning_rates(8e-3, 128, 64, 1)["linear"] == pytest.approx(4e-3)  # k = 1/2: scaled down
    assert set(lr_scaling.learning_rates(8e-3, 128, 64, 2).values()) == {8e-3}  # the tuned batch: one lr


def test_dry_run_runs_the_tuned_batch_once(capsys):
    assert lr_scaling.main(["--dry-run"]) == 0
    plan = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["nprocs"], p["rule"]) for p in plan] == [(n, r) for n in (1, 2, 4) for r in ("none", "sqrt", "linear")]
    assert {p["run_as"] for p in plan if p["nprocs"] == 2} == {"none"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiny_real_run_writes_the_table(tmp_path):
    # 2 ranks: the tuned global batch, so the three rules share one real run (the rules' rates are tested above)
    assert lr_scaling.main(["--nprocs", "2", "--seeds", "0", "--limit", "300", "--epochs", "1",
                            "--results", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "lr_scaling.json").read_text())
    rows = {(r["nprocs"], r["rule"]): r for r in result["runs"]}
    assert set(rows) == {(2, "none"), (2, "sqrt"), (2, "linear")}
    assert all(r["global_batch"] == 128 and r["lr"] == pytest.approx(TrainConfig().lr) for r in rows.values())
    assert rows[2, "none"]["dev_roc_auc"] == rows[2, "linear"]["dev_roc_auc"]  # one shared run at the tuned batch
    assert all(0 < auc < 1 for r in result["runs"] for auc in r["dev_roc_auc"] + r["heldout_roc_auc"])
    assert f"| 2 | 128 | linear | {TrainConfig().lr:g} |" in (tmp_path / "lr_scaling.md").read_text()


def test_the_shipped_results_cover_every_rank_count_and_rule():
    result = json.loads((REPO / "benchmarks" / "results" / "lr_scaling.json").read_text())
    assert {(r["nprocs"], r["rule"]) for r in result["runs"]} == {(n, r) for n in (1, 2, 4)
                                                                  for r in ("none", "sqrt", "linear")}
    assert result["limit"] is None and result["epochs"] == TrainConfig().epochs  # the full data, the default epochs
    assert all(len(r["dev_roc_auc"]) == len(result["seeds"]) for r in result["runs"])
