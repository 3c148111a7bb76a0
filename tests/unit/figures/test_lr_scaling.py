"""The learning-rate rules and the figure of benchmarks/results/lr_scaling.json."""

from __future__ import annotations

import math

import matplotlib
import pytest

from workshop_lib.figures import lr_scaling

matplotlib.use("Agg")


def test_the_rules_at_four_times_the_tuned_batch():
    assert lr_scaling.scaled(0.01, 512, tuned_at=128) == pytest.approx({"none": 0.01, "sqrt": 0.02, "linear": 0.04})
    assert lr_scaling.scaled(0.01, 128, tuned_at=128) == pytest.approx({"none": 0.01, "sqrt": 0.01, "linear": 0.01})


def test_the_results_file_has_every_rank_count_and_rule():
    runs = lr_scaling.read()
    means = lr_scaling.mean_dev(runs)
    assert {n for n, _ in means} == {1, 2, 4} and {r for _, r in means} == set(lr_scaling.RULES)
    assert all(0.5 < v < 1 and not math.isnan(v) for v in means.values())


def test_the_figure_shows_one_series_per_rule():
    fig = lr_scaling.figure(lr_scaling.read())
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [f"lr rule: {r}" for r in lr_scaling.RULES]
