"""The ring all-reduce, simulated step by step: 2(N-1) steps, every rank ends with every sum, 2(N-1) chunks sent."""

from __future__ import annotations

import matplotlib
import pytest

from workshop_lib.scaling import ring

matplotlib.use("Agg")


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_after_2_n_minus_1_steps_every_rank_holds_every_sum(n):
    values = [[float(10 * r + c) for c in range(n)] for r in range(n)]
    states = ring.steps(values)
    assert len(states) - 1 == 2 * (n - 1)
    assert ring.everyone_holds_the_sum(states[-1], values)
    assert not any(ring.everyone_holds_the_sum(s, values) for s in states[:-1])  # not one step sooner
    assert ring.chunks_sent_per_rank(states) == 2 * (n - 1)  # 2(N-1) chunks of S/N: the cost model's bytes


def test_reduce_scatter_leaves_each_rank_one_complete_chunk():
    n = 4
    values = [[1.0] * n for _ in range(n)]
    after = ring.steps(values)[n - 1]  # the last reduce-scatter step
    assert after.phase == "reduce-scatter"
    complete = [[c for c in range(n) if len(after.held[r][c].sources) == n] for r in range(n)]
    assert complete == [[(r + 1) % n] for r in range(n)]
    assert [st.phase for st in ring.steps(values)[n:]] == ["all-gather"] * (n - 1)


def test_every_step_sends_one_chunk_to_the_next_rank():
    for st in ring.steps([[0.0] * 3 for _ in range(3)])[1:]:
        assert sorted((src, dst) for src, dst, _ in st.sends) == [(0, 1), (1, 2), (2, 0)]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="N chunks each"):
        ring.steps([[1.0, 2.0], [3.0]])


def test_the_figure_has_a_panel_per_state():
    states = ring.steps([[1.0] * 4 for _ in range(4)])
    fig = ring.figure(states)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titled[0] == "start" and titled[-1] == "step 6: all-gather" and len(titled) == 7
