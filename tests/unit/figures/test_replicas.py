"""What each rank holds: the spreads from hand-made tensors, the figure, and a real 2-rank run of steps 1, 2, 3."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.data import collate
from workshop_lib.errors import WorkshopError
from workshop_lib.figures import replicas

matplotlib.use("Agg")


def held(kind: int, w1: float, g1: float, own1: float | None = None) -> replicas.Held:
    """2 ranks, 6 parameters (the shown slice: the first 4), 3 steps; rank 1 off by w1 (weights) and g1 (grads)."""
    zero = torch.zeros(6)
    own1 = g1 if own1 is None else own1
    return replicas.Held(kind, 8, [[0, 2, 4, 6], [1, 3, 5, 7]] if kind > 1 else [list(range(8))] * 2,
                         own_grads=[zero, zero + own1], grads=[zero, zero + g1],
                         weights=[[zero + s for s in (0.1, 0.2, 0.3)], [zero + s * (1 + w1) for s in (0.1, 0.2, 0.3)]],
                         start=zero, shown=slice(0, 4))


def test_spreads_and_shared_molecules():
    h = held(2, w1=0.5, g1=0.25)
    assert h.shared == 0 and held(1, 0, 0).shared == 8
    assert h.spread == pytest.approx([0.05, 0.1, 0.15])
    assert h.grad_spread == pytest.approx(0.25) and h.own_grad_spread == pytest.approx(0.25)
    ddp = held(3, w1=0.0, g1=0.0, own1=0.25)
    assert ddp.spread == [0.0, 0.0, 0.0] and ddp.grad_spread == 0 < ddp.own_grad_spread


def test_summary_says_what_the_ranks_share_and_how_far_they_differ():
    text = replicas.summary({2: held(2, 0.5, 0.25), 3: held(3, 0.0, 0.0, own1=0.25)})
    assert text.splitlines() == [
        "step 2: the ranks share 0 of 8 molecules; after the first backward() their gradients differ by up to 2.5e-01; "
        "after 3 steps their weights by 1.5e-01",
        "step 3: the ranks share 0 of 8 molecules; after the first backward() their gradients differ by up to 0 "
        "(their own batches' by 2.5e-01); after 3 steps their weights by 0"]


def test_figure_draws_each_kinds_weights_rank_against_rank_and_the_spread_in_at_most_4_panels():
    fig = replicas.figure({2: held(2, 0.5, 0.25), 3: held(3, 0.0, 0.0, own1=0.25)})
    two, three, spread = fig.axes
    assert two.get_title() == "step 2: a shard each, no DDP:\napart by up to 0.15"
    assert three.get_title() == "step 3: a shard each, DDP:\nevery weight equal"
    (x2, y2), (x3, y3) = (ax.collections[0].get_offsets().T for ax in (two, three))
    assert list(x2) == pytest.approx([0.3] * 6) and list(y2) == pytest.approx([0.45] * 6)  # the epoch's change, per rank
    assert list(x3) == list(y3)  # on the diagonal: equal
    assert [list(line.get_ydata()) for line in spread.get_lines()] == [pytest.approx([0.05, 0.1, 0.15]), [0.0] * 3]
    assert [t.get_text() for t in spread.get_legend().get_texts()] == ["step 2", "step 3 (DDP)"]
    assert min(t.get_fontsize() for t in two.get_xticklabels()) >= 14  # read from the back of a room
    assert len(replicas.figure({k: held(k, 0.5 * (k == 2), 0.0) for k in (1, 2, 3)}).axes) == 4


def test_record_refuses_steps_2_and_3_without_the_learners_make_loader():
    with pytest.raises(WorkshopError, match="need your make_loader"):
        replicas.record(kinds=(1, 3))


def make_loader(dataset, batch_size: int, seed: int) -> DataLoader:
    """Step 2's, as a learner writes it: the sampler asks the process group for the ranks."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_two_rank_run_drifts_without_ddp_and_stays_equal_with_it():
    got = replicas.record(make_loader, kinds=(1, 2, 3), limit=300)
    one, two, three = got[1], got[2], got[3]
    assert one.shared == one.n_train and two.shared == three.shared == 0  # all the data, then disjoint shards
    assert one.spread[-1] == 0 and one.grad_spread == 0  # step 1: two copies of one run
    assert two.grad_spread > 0 and all(b > a for a, b in zip(two.spread, two.spread[1:], strict=False))  # drifting
    assert three.own_grad_spread > 0 and three.grad_spread == 0 and max(three.spread) == 0  # DDP: the mean, equal
    mean = (three.own_grads[0] + three.own_grads[1]) / 2
    assert torch.allclose(three.grads[0], mean, atol=1e-6)  # what backward() leaves is the mean of the own batches
    assert torch.equal(three.own_grads[0], two.own_grads[0])  # the same seed, data and first batch in steps 2 and 3
    assert all(torch.equal(g, o) for g, o in zip(two.grads, two.own_grads, strict=True))  # no DDP: p.grad is its own
    assert len(replicas.figure({2: two, 3: three}).axes) == 3  # 03's figure: two scatters and the spread
