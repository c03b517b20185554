"""`cp_attention`: the one attention entry point, dispatching on the bound CP transport.

u = 1 runs `ring_attention` over the group's ring; u > 1 runs the hybrid u x r of
`fcp_exec.ulysses` (u = d: pure head-parallel all-to-all). The checks here are local and raise
before any collective: shapes (including u dividing H, and H_kv with u, which are the model's
shapes and so identical on every member that runs the same model: every member raises the
same error, nobody is left waiting in an all-to-all) and the layout (`ShardLayout.build`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fcp_exec.a2a import A2AComm
from fcp_exec.attention import check_qkv_shapes, ring_attention
from fcp_exec.kernels import AttentionKernel, select_kernel
from fcp_exec.ring import RingComm
from fcp_exec.ulysses import check_heads, hybrid_attention

__all__ = ["cp_attention"]


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int],
    cu_seqlens_padded: torch.Tensor | Sequence[int],
    *,
    binding: Any,
    causal: bool | Sequence[bool] | torch.Tensor = True,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
) -> torch.Tensor:
    """Exact attention of this rank's zigzag THD shard against its whole CP group.

    binding: what `cp_context` yielded (`CPBinding`: members, index, ulysses, the r-ring and
    the all-to-all block). q [T_local, H, D], k/v [T_local, H_kv, D] with H a multiple of H_kv;
    cu_seqlens / cu_seqlens_padded: cumulative real / padded lengths of the unsharded
    sequences (padded lengths multiples of 2 * degree); causal: one bool or one per sequence.
    Returns [T_local, H, D] in q's dtype, the same for every u up to rounding.
    """
    u = int(binding.ulysses)
    if u == 1:
        return ring_attention(
            q, k, v, cu_seqlens, cu_seqlens_padded, ring=binding.ring, causal=causal,
            softmax_scale=softmax_scale, kernel=kernel,
        )  # fmt: skip
    check_qkv_shapes(q, k, v)
    check_heads(q.shape[1], k.shape[1], u)
    a2a = A2AComm(binding.a2a_ranks, binding.a2a_group)
    ring = RingComm(binding.ring_ranks)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    kern = kernel if kernel is not None else select_kernel(q.device)
    return hybrid_attention(
        q, k, v, cu_seqlens, cu_seqlens_padded, a2a=a2a, ring=ring, causal=causal,
        scale=scale, kernel=kern,
    )  # fmt: skip
