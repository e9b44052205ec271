"""Samplers: a DistributedSampler that can resume mid-epoch, and exact evaluation shards."""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler whose epoch can start part-way, for resuming from a mid-epoch checkpoint.

    The order within an epoch depends only on (seed, epoch), as in DistributedSampler, so
    skipping the first ``start`` indices reproduces exactly what an uninterrupted run sees.
    Call ``set_epoch(epoch)`` every epoch, before iterating; ``set_start`` applies to the next
    iteration only.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start = 0

    def set_start(self, start: int) -> None:
        self._start = start

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        start, self._start = self._start, 0
        return iter(indices[start:])

    def __len__(self) -> int:
        return self.num_samples - self._start


def shard_indices(n: int, rank: int, world: int) -> list[int]:
    """Every sample exactly once across ranks (no padding), for exact evaluation metrics."""
    return list(range(rank, n, world))
