"""Global batches as a pure function of (seed, epoch, batch index): the elastic part.

The order of samples in an epoch is one permutation drawn from (seed, epoch) alone, and global
batch b is the slice [b*G, (b+1)*G) of it. Nothing depends on the number of replicas or
workers, so a run resumed on 3 replicas instead of 4 continues with exactly the samples the
4-replica run would have seen next; only the plans (who runs what) change. Resume state is
therefore a few integers, not sample buffers (cf. llm-foundry #1277: counting emitted packed
batches instead of source samples repeats data after resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import ConfigError, OutOfRangeError

__all__ = ["GlobalBatchSampler", "OrderedBatches", "global_batch"]


class OrderedBatches(Protocol):
    """What a sampler provides for `global_batch`: an epoch's order and its batch count."""

    @property
    def global_batch_size(self) -> int: ...

    def num_batches(self) -> int: ...

    def order(self, epoch: int) -> np.ndarray: ...


def global_batch(
    sampler: OrderedBatches, epoch: int, index: int, order: np.ndarray | None = None
) -> np.ndarray:
    """Index positions of global batch `index` of `epoch`: the slice [index*G, (index+1)*G)
    of the epoch's order (`order`: a cached `order(epoch)`).

    The one `batch()` of every sampler (`GlobalBatchSampler`, the blend's `BlendSampler`):
    they differ only in how an epoch's order is drawn.
    """
    nb = sampler.num_batches()
    if not 0 <= index < nb:
        raise OutOfRangeError(f"batch index={index} is outside [0, {nb}) for this epoch")
    o = sampler.order(epoch) if order is None else order
    g = sampler.global_batch_size
    return o[index * g : (index + 1) * g]


@dataclass(kw_only=True, slots=True, frozen=True)
class GlobalBatchSampler:
    """Deterministic global batches of index positions over `num_samples` samples.

    `drop_last=False` (default) keeps the short last batch, so an epoch visits every sample
    exactly once; `shuffle=False` keeps index order (debugging, benchmarks).
    """

    num_samples: int
    global_batch_size: int
    seed: int = 0
    drop_last: bool = False
    shuffle: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.global_batch_size, bool) or int(self.global_batch_size) < 1:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size!r} must be an integer >= 1 "
                "(sequences per optimizer step, summed over all replicas)"
            )
        if self.num_samples < 1:
            raise ConfigError(f"num_samples={self.num_samples}: the source holds no samples")
        if self.drop_last and self.num_samples < self.global_batch_size:
            raise ConfigError(
                f"drop_last=True with global_batch_size={self.global_batch_size} > "
                f"num_samples={self.num_samples} leaves no batch; lower the batch size"
            )

    def num_batches(self) -> int:
        n, g = self.num_samples, self.global_batch_size
        return n // g if self.drop_last else -(-n // g)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's permutation of 0..num_samples-1 (seeded by (seed, epoch) only)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.default_rng([int(self.seed), int(epoch)])
        return rng.permutation(self.num_samples).astype(np.int64)

    batch = global_batch
    """Index positions of global batch `index` of `epoch` (`order`: a cached `order(epoch)`)."""
