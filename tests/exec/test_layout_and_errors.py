"""Layout arithmetic and bad-input errors: pure functions, no process group needed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_exec import RingComm, ShardLayout, local_token_index, ring_attention
from fcp_exec.layout import step_blocks


def test_shards_partition_the_pack_in_zigzag_order() -> None:
    cu_p = [0, 8, 20]  # lengths 8 and 12, degree 2 -> chunks of 2 and 3
    parts = [local_token_index(cu_p, 2, i).tolist() for i in range(2)]
    assert parts[0] == [0, 1, 6, 7, 8, 9, 10, 17, 18, 19]
    assert parts[1] == [2, 3, 4, 5, 11, 12, 13, 14, 15, 16]
    assert sorted(parts[0] + parts[1]) == list(range(20))


@settings(max_examples=60, deadline=None)
@given(
    d=st.integers(1, 6),
    seqs=st.lists(st.tuples(st.integers(0, 30), st.booleans()), min_size=1, max_size=4),
)
def test_blocks_cover_each_visible_pair_exactly_once(d: int, seqs: list[tuple[int, bool]]) -> None:
    """Summed over members and ring steps, the blocks visit every (query, key) pair the mask
    allows exactly once and nothing else: no pair lost, none double counted, no padding."""
    seqlens = [n for n, _ in seqs]
    causal = [c for _, c in seqs]
    chunk = 2 * d
    padded = [max(chunk, -(-n // chunk) * chunk) for n in seqlens]
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()])
    cu_p = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()])
    layout = ShardLayout.build(cu, cu_p, d, causal)
    seen: dict[tuple[int, int], int] = {}
    for me in range(d):
        mine = local_token_index(cu_p, d, me)
        for src in range(d):
            theirs = local_token_index(cu_p, d, src)
            for b in step_blocks(layout, me, src):
                for i in range(b.q_len):
                    for j in range(b.k_len if not b.causal else i + 1):
                        key = (int(mine[b.q_start + i]), int(theirs[b.k_start + j]))
                        seen[key] = seen.get(key, 0) + 1
    want = {
        (a + i, a + j)
        for a, n, c in zip(cu_p[:-1].tolist(), seqlens, causal)
        for i in range(n)
        for j in range(i + 1 if c else n)
    }
    assert set(seen) == want
    assert set(seen.values()) <= {1}


def _qkv(t: int, h: int = 4, hkv: int = 2) -> tuple[torch.Tensor, ...]:
    return torch.randn(t, h, 8), torch.randn(t, hkv, 8), torch.randn(t, hkv, 8)


@pytest.mark.parametrize(
    ("ring", "match"),
    [((1, 2), "does not contain this process"), ((0, 0), "more than once"), ((), "empty")],
)
def test_bad_rings_are_rejected_before_any_communication(ring: tuple[int, ...], match: str) -> None:
    q, k, v = _qkv(4)
    with pytest.raises(ValueError, match=match):
        ring_attention(q, k, v, [0, 3], [0, 4], ring=ring)


def test_multi_member_ring_without_distributed_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        RingComm([0, 1])


@pytest.mark.parametrize(
    ("cu", "cu_p", "tokens", "match"),
    [
        ([0, 3], [0, 3], 3, "not a multiple of 2\\*degree=2"),
        ([0, 5], [0, 4], 4, "padded length 4"),
        ([0, 3], [0, 4], 6, "q has 6 tokens"),
        ([0, 3, 5], [0, 4], 4, "3 entries"),
        ([1, 3], [0, 4], 4, "must start at 0"),
    ],
)
def test_layout_errors_name_the_value(
    cu: list[int], cu_p: list[int], tokens: int, match: str
) -> None:
    q, k, v = _qkv(tokens)
    with pytest.raises(ValueError, match=match):
        ring_attention(q, k, v, cu, cu_p, ring=[0])


def test_gqa_head_mismatch_and_causal_flag_count() -> None:
    q, k, v = _qkv(4, h=3, hkv=2)
    with pytest.raises(ValueError, match="H=3 query heads is not a multiple of H_kv=2"):
        ring_attention(q, k, v, [0, 3], [0, 4], ring=[0])
    q, k, v = _qkv(4)
    with pytest.raises(ValueError, match="causal has 2 flags for 1 sequences"):
        ring_attention(q, k, v, [0, 3], [0, 4], ring=[0], causal=[True, False])


def test_empty_and_all_padding_sequences_give_zeros_not_nan() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(8))
    out = ring_attention(q, k, v, [0, 0, 3], [0, 4, 8], ring=[0], causal=[True, False])
    out.sum().backward()
    assert torch.isfinite(out).all() and (out[:4] == 0).all() and (out[7] == 0).all()
    assert q.grad is not None and (q.grad[:4] == 0).all() and torch.isfinite(q.grad).all()
