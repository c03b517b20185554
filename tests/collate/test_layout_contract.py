"""The planner's memory check and the collator's shards agree at every degree, d = 1 included.

For every degree d <= 16 and length 1..4d, causal and full: the tokens the planner counts
per member (its compiled kernels, its vectorised minimum-degree search, `CostModel.min_degree`)
equal the tokens `pack_shard` really puts on each member, and the minimum degree the planner
picks is the smallest degree at which the collator's real shard fits.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from fcp_data import layout
from fcp_data.collate import pack_shard
from fcp_data.planner import Cluster, CostModel
from fcp_data.planner.cost.problem import Problem
from fcp_data.planner.kernels import shard_tokens as compiled_shard_tokens

MAX_DEGREE = 16
COST = CostModel(alpha1=1e-9, alpha2=1e-6)


def _collator_tokens(seqlens: list[int], degree: int) -> list[int]:
    """Tokens each member of a degree-d group holds after `pack_shard` (padding included)."""
    seqs = [np.arange(1, n + 1) for n in seqlens]
    return [len(pack_shard(seqs, degree=degree, index=i).tokens) for i in range(degree)]


@functools.cache
def _first_member_tokens(n: int, degree: int) -> int:
    """`_collator_tokens([n], degree)[0]`, packed once per (n, degree) for every cap and causal
    flag of the min-degree test (it was packed 12 times over, every member, ~1 min of a run)."""
    return len(pack_shard([np.arange(1, n + 1)], degree=degree, index=0).tokens)


@pytest.mark.parametrize("degree", range(1, MAX_DEGREE + 1))
def test_planner_counts_what_the_collator_allocates(degree: int) -> None:
    lengths = range(1, 4 * degree + 1)
    for n in lengths:
        held = _collator_tokens([n], degree)
        assert len(set(held)) == 1, held  # every member holds the same number of tokens
        assert layout.shard_tokens(n, degree) == held[0]
        assert compiled_shard_tokens(n, degree) == held[0]
        assert layout.padded_length(n, degree) == held[0] * degree
    # a whole group: the per-member memory is the sum over its sequences
    group = list(lengths)
    want = _collator_tokens(group, degree)[0]
    assert int(np.sum(layout.shard_tokens(np.array(group), degree))) == want
    assert sum(int(compiled_shard_tokens(n, degree)) for n in group) == want


@pytest.mark.parametrize("causal", [True, False])
def test_min_degree_is_the_smallest_degree_whose_real_shard_fits(causal: bool) -> None:
    for cap in (1, 2, 3, 5, 8, 13):
        cluster = Cluster(MAX_DEGREE, replicas_per_node=8, tokens_per_replica=cap)
        lengths = np.arange(1, 4 * MAX_DEGREE + 1)
        prob = Problem.build(lengths, cluster, COST, causal=causal)
        for n, planned in zip(lengths.tolist(), prob.dmin.tolist()):
            fits = [d for d in range(1, MAX_DEGREE + 1) if _first_member_tokens(n, d) <= cap]
            assert planned == (fits[0] if fits else 0), (n, cap)
            if fits:
                assert COST.min_degree([n], cluster) == fits[0]
