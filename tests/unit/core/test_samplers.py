"""DistributedSampler's contract (steps 2-4 give it to a plain DataLoader), and 04b's bucketing sampler that keeps it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler

from workshop_lib.samplers import BucketBatchSampler


class _Sized(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


def shards(n: int, world: int, epoch: int | None, sampler_cls=DistributedSampler, **kw) -> list[list[int]]:
    out = []
    for rank in range(world):
        s = sampler_cls(_Sized(n), num_replicas=world, rank=rank, shuffle=True, seed=3, **kw)
        if epoch is not None:
            s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize(("n", "world"), [(100, 2), (101, 2), (97, 4)])
def test_distributed_sampler_shards_are_disjoint_and_cover(n, world):
    parts = shards(n, world, epoch=0, drop_last=True)
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat))  # drop_last: disjoint, nothing repeated
    padded = [i for p in shards(n, world, epoch=0) for i in p]
    assert set(padded) == set(range(n))  # default: covers everything
    assert len(padded) - n == (-n) % world  # ... by repeating a few to even the shards


def test_set_epoch_reshuffles_and_its_absence_does_not():
    assert shards(100, 2, epoch=0) != shards(100, 2, epoch=1)
    s = DistributedSampler(_Sized(100), num_replicas=2, rank=0, seed=3)
    assert list(s) == list(s)  # no set_epoch: the same order every epoch


def bucketed(n, world, epoch, batch_size=8):
    lengths = torch.randint(1, 80, (n,), generator=torch.Generator().manual_seed(0))
    out = []
    for rank in range(world):
        s = BucketBatchSampler(DistributedSampler(_Sized(n), num_replicas=world, rank=rank, seed=3, drop_last=True),
                               lengths, batch_size, window=4)
        s.set_epoch(epoch)
        out.append(list(s))
    return out, lengths


def test_bucketing_keeps_the_distributed_contract():
    parts, _ = bucketed(203, 2, epoch=0)
    ranks = [[i for b in p for i in b] for p in parts]
    assert not set(ranks[0]) & set(ranks[1])
    assert len(ranks[0]) == len(set(ranks[0])) == 101
    assert len(parts[0]) == len(parts[1]) == 13  # same step count on every rank: no DDP hang
    epoch1, _ = bucketed(203, 2, epoch=1)
    assert parts != epoch1
    assert bucketed(203, 2, epoch=0)[0] == parts


def test_bucketing_groups_similar_lengths():
    parts, lengths = bucketed(800, 1, epoch=0, batch_size=16)
    spread = sum(int(lengths[b].max() - lengths[b].min()) for b in parts[0]) / len(parts[0])
    rand = torch.randperm(800, generator=torch.Generator().manual_seed(1)).split(16)
    rand_spread = sum(int(lengths[b].max() - lengths[b].min()) for b in rand) / len(rand)
    assert spread < rand_spread / 3


def test_bucketing_a_random_sampler_changes_order_each_pass():
    lengths = torch.arange(50)
    s = BucketBatchSampler(RandomSampler(_Sized(50), generator=torch.Generator().manual_seed(0)), lengths, 5)
    first, second = list(s), list(s)
    assert first != second
    assert sorted(i for b in first for i in b) == list(range(50))



def test_fewer_molecules_than_ranks_still_gives_every_rank_as_many_steps():
    """3 molecules on 4 ranks: DistributedSampler repeats some, so no rank waits in a collective the others skip."""
    parts = shards(3, 4, epoch=0)
    assert [len(p) for p in parts] == [1, 1, 1, 1]
    assert {i for p in parts for i in p} == {0, 1, 2}
