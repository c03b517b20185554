"""The collator and fcp_exec's ring attention must agree on the layout, token for token."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.collate import pack_shard
from fcp_exec import ShardLayout, local_token_index


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 200), min_size=1, max_size=5),
    d=st.integers(1, 6),
    causal=st.lists(st.booleans(), min_size=5, max_size=5),
    unit=st.sampled_from([1, 2, 4]),
)
def test_pack_matches_fcp_exec_layout(
    lens: list[int], d: int, causal: list[bool], unit: int
) -> None:
    seqs = [np.arange(1, L + 1) + 1000 * k for k, L in enumerate(lens)]
    for i in range(d):
        s = pack_shard(seqs, degree=d, index=i, unit=unit)
        layout = ShardLayout.build(
            torch.from_numpy(s.cu_seqlens),
            torch.from_numpy(s.cu_seqlens_padded),
            d,
            causal[: len(lens)],
        )
        assert layout.num_local_tokens == len(s.tokens)
        assert list(layout.local_offsets) == s.local_cu_seqlens_padded[:-1].tolist()
        # fcp_exec indexes the padded unsharded pack; map our global positions into it
        idx = local_token_index(torch.from_numpy(s.cu_seqlens_padded), d, i).numpy()
        starts = np.repeat(s.cu_seqlens_padded[:-1], np.diff(s.local_cu_seqlens_padded))
        np.testing.assert_array_equal(idx, starts + s.position_ids)
        for k in range(len(lens)):  # real tokens per chunk agree with our padding
            held = sum(layout.real_in_chunk(k, c) for c in (i, 2 * d - 1 - i))
            assert held == s.local_cu_seqlens[k + 1] - s.local_cu_seqlens[k]
