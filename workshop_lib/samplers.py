"""Length bucketing: training batches of similar-length molecules that keep a DistributedSampler's contract.

The step scripts do not use it: they batch with a plain ``DataLoader(...,
batch_size=B, sampler=DistributedSampler(...))``, as one would at work.
Notebook 04b measures what bucketing buys this model on a CPU, where a padded
LSTM pays for every pad: pass ``batch_sampler=BucketBatchSampler(sampler,
dataset.lengths, B)`` to the DataLoader instead of ``batch_size`` and ``sampler``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class BucketBatchSampler(Sampler[list[int]]):
    """Group the indices of any sampler into batches of similar-length molecules.

    It draws the sampler's order (a DistributedSampler's shard, say), sorts each
    window of ``window`` batches by length, cuts it into batches, and shuffles
    the batch order. So it keeps the wrapped sampler's contract: the same
    indices (disjoint across ranks, covering the data), a new order after
    ``set_epoch``, and the same number of batches on every rank. Short batches
    are cheap batches: an LSTM runs as many steps as its longest molecule.
    """

    def __init__(self, sampler: Sampler[int], lengths: torch.Tensor, batch_size: int,
                 window: int = 32, seed: int = 0):
        self.sampler, self.lengths, self.batch_size = sampler, lengths, batch_size
        self.window, self.seed, self._calls = window, seed, 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        # Follow the wrapped sampler's epoch when it has one (DistributedSampler);
        # otherwise each pass is a new epoch.
        epoch = getattr(self.sampler, "epoch", self._calls)
        self._calls += 1
        order = torch.as_tensor(list(self.sampler), dtype=torch.int64)
        span = self.window * self.batch_size
        chunks = [c[torch.argsort(self.lengths[c], stable=True)] for c in order.split(span)]
        batches = torch.cat(chunks).split(self.batch_size)
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        for b in torch.randperm(len(batches), generator=g).tolist():
            yield batches[b].tolist()
