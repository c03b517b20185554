"""Property tests of the zigzag layout: any lengths, any degree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.collate import (
    chunk_bounds,
    padded_seqlen,
    shard_indices,
    shard_sequence,
    unshard_sequence,
)


@settings(max_examples=200, deadline=None)
@given(L=st.integers(1, 5000), d=st.integers(1, 17))
def test_shards_reassemble_to_padded_sequence(L: int, d: int) -> None:
    P = padded_seqlen(L, d)
    assert P % (2 * d) == 0 and L <= P < L + 2 * d
    seq = np.arange(P) * 7 + 3
    shards = [shard_sequence(seq, d, i) for i in range(d)]
    assert {len(s) for s in shards} == {P // d}  # equal shard size on every replica
    np.testing.assert_array_equal(unshard_sequence(shards, d), seq)
    # every position held exactly once
    held = np.concatenate([shard_indices(P, d, i) for i in range(d)])
    np.testing.assert_array_equal(np.sort(held), np.arange(P))


@settings(max_examples=100, deadline=None)
@given(d=st.integers(1, 12), c=st.integers(1, 50))
def test_replica_holds_chunks_i_and_mirror(d: int, c: int) -> None:
    P = 2 * d * c
    for i in range(d):
        (a0, a1), (b0, b1) = chunk_bounds(P, d, i)
        assert (a0 // c, b0 // c) == (i, 2 * d - 1 - i)
        assert a1 - a0 == b1 - b0 == c
        # zigzag balances causal work: chunk k costs ~(k + 1/2); every replica gets 2d units
        assert (a0 // c + 0.5) + (b0 // c + 0.5) == 2 * d


def test_degree_one_still_pads_to_two() -> None:
    assert padded_seqlen(5, 1) == 6 and padded_seqlen(6, 1) == 6
    np.testing.assert_array_equal(shard_indices(6, 1, 0), np.arange(6))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: padded_seqlen(5, 0), "degree=0"),
        (lambda: chunk_bounds(8, 2, 2), r"index_in_group=2 is outside \[0, 2\)"),
        (lambda: chunk_bounds(10, 2, 0), "not a multiple of 2\\*degree=4"),
        (lambda: unshard_sequence([np.zeros(4)], 2), "got 1 shards"),
    ],
)
def test_bad_input_names_value(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
