"""Global batches: a pure function of (seed, epoch, index), independent of replicas/workers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.loader.sampler import GlobalBatchSampler


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 500),
    g=st.integers(1, 64),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 1000),
    drop_last=st.booleans(),
)
def test_batches_partition_the_epoch(
    n: int, g: int, seed: int, epoch: int, drop_last: bool
) -> None:
    if drop_last and n < g:
        with pytest.raises(ValueError, match="leaves no batch"):
            GlobalBatchSampler(num_samples=n, global_batch_size=g, drop_last=drop_last)
        return
    s = GlobalBatchSampler(num_samples=n, global_batch_size=g, seed=seed, drop_last=drop_last)
    batches = [s.batch(epoch, b) for b in range(s.num_batches())]
    ids = np.concatenate(batches)
    assert len(set(ids.tolist())) == len(ids)  # no sample twice in an epoch
    assert len(ids) == (n // g * g if drop_last else n)  # every sample once unless dropped
    assert all(len(b) == g for b in batches[:-1]) and 1 <= len(batches[-1]) <= g
    again = GlobalBatchSampler(num_samples=n, global_batch_size=g, seed=seed, drop_last=drop_last)
    assert all(np.array_equal(a, again.batch(epoch, b)) for b, a in enumerate(batches))


def test_epochs_and_seeds_reshuffle() -> None:
    s = GlobalBatchSampler(num_samples=1000, global_batch_size=10, seed=1)
    assert not np.array_equal(s.order(0), s.order(1))
    t = GlobalBatchSampler(num_samples=1000, global_batch_size=10, seed=2)
    assert not np.array_equal(s.order(0), t.order(0))
    with pytest.raises(IndexError, match=r"batch index=100 is outside \[0, 100\)"):
        s.batch(0, 100)
