"""THD packing: labels shifted before sharding, loss mask, positions, cu_seqlens."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data import layout
from fcp_data.collate import IGNORE_INDEX, pack_shard, padded_seqlen, unshard_sequence


def _reassemble(shards, d: int, field: str) -> list[np.ndarray]:
    """Per sequence, the padded unsharded array of `field` from the d replicas' buffers."""
    out = []
    for k in range(len(shards[0].cu_seqlens) - 1):
        parts = []
        for s in shards:
            a, b = s.local_cu_seqlens_padded[k], s.local_cu_seqlens_padded[k + 1]
            parts.append(getattr(s, field)[a:b])
        out.append(unshard_sequence(parts, d))
    return out


@settings(max_examples=150, deadline=None)
@given(
    lens=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    d=st.integers(1, 9),
    seed=st.integers(0, 2**31 - 1),
    unit=st.sampled_from([1, 1, 2, 4, 8]),
)
def test_pack_reassembles_tokens_labels_positions(
    lens: list[int], d: int, seed: int, unit: int
) -> None:
    """`unit` is TP under sequence parallel: every row must then be a multiple of it."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(1, 50_000, size=L) for L in lens]
    shards = [pack_shard(seqs, degree=d, index=i, pad_id=0, unit=unit) for i in range(d)]
    assert len({len(s.tokens) for s in shards}) == 1  # equal work per replica
    assert len(shards[0].tokens) % unit == 0  # megatron splits the row over TP ranks
    assert len(shards[0].tokens) == sum(layout.shard_tokens(L, d, unit) for L in lens)
    total_loss = sum(float(s.loss_mask.sum()) for s in shards)
    assert total_loss == sum(L - 1 for L in lens)  # L-1 loss tokens per sequence, exactly
    toks = _reassemble(shards, d, "tokens")
    labs = _reassemble(shards, d, "labels")
    poss = _reassemble(shards, d, "position_ids")
    for k, (seq, L) in enumerate(zip(seqs, lens)):
        P = padded_seqlen(L, d, unit)
        assert P % (2 * d * unit) == 0 and P - 2 * d * unit < L  # the fewest pad tokens
        np.testing.assert_array_equal(toks[k][:L], seq)
        assert (toks[k][L:] == 0).all()
        np.testing.assert_array_equal(labs[k][: L - 1], seq[1:])  # next-token labels
        assert (labs[k][L - 1 :] == IGNORE_INDEX).all()  # last token + padding out of loss
        np.testing.assert_array_equal(poss[k], np.arange(P))  # global positions
    s0 = shards[0]
    np.testing.assert_array_equal(s0.cu_seqlens, np.concatenate([[0], np.cumsum(lens)]))
    plens = [padded_seqlen(L, d, unit) for L in lens]
    np.testing.assert_array_equal(s0.cu_seqlens_padded, np.concatenate([[0], np.cumsum(plens)]))
    assert s0.cu_seqlens.dtype == np.int32 and s0.cu_seqlens_padded.dtype == np.int32
    assert s0.max_seqlen == max(plens) and s0.local_max_seqlen == max(plens) // d
    real_held = sum(int(s.local_cu_seqlens[-1]) for s in shards)
    assert real_held == sum(lens)


def test_label_crosses_chunk_boundary_to_other_replica() -> None:
    # L = 16, d = 2: chunks of 4; replica 0 holds [0:4] and [12:16], replica 1 [4:8] and [8:12].
    seq = np.arange(100, 116)
    r0 = pack_shard([seq], degree=2, index=0)
    r1 = pack_shard([seq], degree=2, index=1)
    np.testing.assert_array_equal(r0.position_ids, [0, 1, 2, 3, 12, 13, 14, 15])
    np.testing.assert_array_equal(r1.position_ids, [4, 5, 6, 7, 8, 9, 10, 11])
    assert r0.labels[3] == 104  # token 3 (replica 0) predicts token 4 (held by replica 1)
    assert r1.labels[3] == 108  # token 7 predicts token 8, the next chunk
    assert r1.labels[7] == 112  # token 11 (replica 1) predicts token 12 (replica 0)
    assert r0.labels[-1] == IGNORE_INDEX and r0.loss_mask[-1] == 0


def test_empty_group_packs_to_nothing() -> None:
    s = pack_shard([], degree=3, index=1)
    assert s.tokens.size == 0 and s.cu_seqlens.tolist() == [0] and s.max_seqlen == 0
