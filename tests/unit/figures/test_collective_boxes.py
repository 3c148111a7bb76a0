"""workshop_lib.figures.collective_boxes: what each collective left on each rank, printed, asserted and drawn."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from workshop_lib.figures import collective_boxes

matplotlib.use("Agg")


def run(world: int) -> list[dict]:
    """What the collectives give when rank r holds [1, 2, ..., world] x 10**r (computed, not run)."""
    before = [torch.arange(1.0, world + 1) * 10**r for r in range(world)]
    total = torch.stack(before).sum(0)
    return [{"before": b, "all_reduce": total, "broadcast": before[0], "all_gather": torch.cat(before),
             "reduce_scatter": total[r:r + 1]} for r, b in enumerate(before)]


def test_two_ranks_print_what_each_holds_after_each_collective(capsys):
    fig = collective_boxes.before_after(run(2))
    assert capsys.readouterr().out.splitlines() == [
        "all_reduce:     rank 0 [11, 22]   rank 1 [11, 22]   (every rank: the element-wise sum)",
        "broadcast:      rank 0 [1, 2]   rank 1 [1, 2]   (every rank: rank 0's tensor)",
        "all_gather:     rank 0 [1, 2, 10, 20]   rank 1 [1, 2, 10, 20]   (every rank: every rank's tensor, in rank order)",
        "reduce_scatter: rank 0 [11]   rank 1 [22]   (rank r: the sum of everyone's part r)"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts if t.get_text().startswith("rank ")] == ["rank 0", "rank 1"]
    boxes = list(ax.patches)
    assert len(boxes) == 2 * (2 + 2 + 2 + 4 + 1)  # per rank: before, all_reduce, broadcast, all_gather, reduce_scatter
    colours = {t.get_text(): p.get_facecolor() for t, p in zip(
        [t for t in ax.texts if t.get_text().replace(".", "").isdigit()], boxes, strict=True)}
    assert colours["11"] == matplotlib.colors.to_rgba(collective_boxes.SUM_COLOUR)  # a sum: grey
    assert colours["10"] == matplotlib.colors.to_rgba(collective_boxes.RANK_COLOURS[1])  # rank 1's own value


def test_four_ranks_draw_too(capsys):
    collective_boxes.before_after(run(4))
    assert "reduce_scatter: rank 0 [1111]   rank 1 [2222]   rank 2 [3333]   rank 3 [4444]" in capsys.readouterr().out


def test_a_result_a_collective_does_not_promise_is_named():
    results = run(2)
    results[1]["broadcast"] = results[1]["before"]  # rank 1 kept its own tensor
    with pytest.raises(AssertionError, match=r"broadcast left \[10.0, 20.0\] on rank 1: not what it promises"):
        collective_boxes.before_after(results)
