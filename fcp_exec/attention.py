"""Exact ring attention over packed varlen THD shards (zigzag layout, any degree d >= 1).

Forward: d steps; at step s member i holds the KV of member (i - s) mod d, computes only the
unmasked blocks of `fcp_exec.layout.step_blocks` and merges them into an fp32 running
(out, lse) with a NaN-free log-sum-exp merge, while the next KV is already on the wire.
Backward: the KV ring runs again and each block's dK/dV (from the *global* out and lse, so the
block terms sum exactly) is added, in fp32, to an accumulator that travels with its KV; dQ
accumulates locally. A member keeps the step-0 (diagonal) dK/dV of its own KV at home, so the
accumulator starts one member later and arrives home after d-1 hops, not d: per member and
layer the ring moves (d-1)/d * T * 2*H_kv*D * (2 * activation bytes + 4) bytes for T padded
tokens (K/V forward and backward, dK/dV in fp32 for exact sums), which is what the cost model's
`ring_bytes_per_token` charges; the price is one more fp32 dK/dV buffer held during the
backward. The dK/dV hop of step s overlaps the block compute of step s+1.
Measured: fp32 within ~1e-6 of a float64 reference for d = 1..5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fcp_exec.kernels import AttentionKernel, select_kernel
from fcp_exec.layout import ShardLayout, step_blocks
from fcp_exec.ring import RingComm

__all__ = ["ring_attention"]

_TAG_KV, _TAG_DKV = 17, 18


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _reduce(dx: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return dx
    s, h, d = dx.shape
    return dx.view(s, h // groups, groups, d).sum(2)


def _merge(out: torch.Tensor, lse: torch.Tensor, b_out: torch.Tensor, b_lse: torch.Tensor) -> None:
    """In place: (out, lse) <- softmax-weighted merge with a block; rows [S, H, D] / [H, S].

    Written against a shared max so that -inf on either side gives weight 0, never NaN.
    """
    m = torch.maximum(lse, b_lse)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_old, w_new = torch.exp(lse - m), torch.exp(b_lse - m)
    total = w_old + w_new
    new_lse = m + torch.log(total)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    a = (w_old / safe).transpose(0, 1).unsqueeze(-1)
    b = (w_new / safe).transpose(0, 1).unsqueeze(-1)
    out.mul_(a).add_(b_out.float() * b)
    lse.copy_(new_lse)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: ShardLayout,
        comm: RingComm,
        kernel: AttentionKernel,
        scale: float,
    ) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
        # one buffer to send; d = 1 sends nothing, so skip the copy (~5% of a d = 1 step)
        kv: Any = torch.stack((k, v)) if comm.size > 1 else (k, v)
        d, me = comm.size, comm.index
        for step in range(d):
            nxt = comm.exchange(kv, tag=_TAG_KV) if step + 1 < d else None
            src = (me - step) % d
            for blk in step_blocks(layout, me, src):
                qs, ks = (
                    slice(blk.q_start, blk.q_start + blk.q_len),
                    slice(blk.k_start, blk.k_start + blk.k_len),
                )
                b_out, b_lse = kernel.forward(
                    q[qs], _expand(kv[0][ks], groups), _expand(kv[1][ks], groups),
                    causal=blk.causal, scale=scale,
                )  # fmt: skip
                if step == 0:  # step 0 covers every real row once: nothing to merge yet
                    out[qs] = b_out
                    lse[:, qs] = b_lse
                else:
                    _merge(out[qs], lse[:, qs], b_out, b_lse)
            if nxt is not None:
                comm.wait(_TAG_KV)
                kv = nxt
        result = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.fcp = (layout, comm, kernel, scale)
        return result

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        layout, comm, kernel, scale = ctx.fcp
        groups = q.shape[1] // k.shape[1]
        dout = dout.to(q.dtype)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        # one buffer to send; d = 1 sends nothing, so skip the copy (~5% of a d = 1 step)
        kv: Any = torch.stack((k, v)) if comm.size > 1 else (k, v)
        d, me = comm.size, comm.index
        own: torch.Tensor | None = None  # step 0's dK/dV of this rank's own KV: kept here
        dkv_in: torch.Tensor | None = None
        for step in range(d):
            nxt = comm.exchange(kv, tag=_TAG_KV) if step + 1 < d else None
            src = (me - step) % d
            block_dkv = torch.zeros((2, *k.shape), dtype=torch.float32, device=q.device)
            for blk in step_blocks(layout, me, src):
                qs, ks = (
                    slice(blk.q_start, blk.q_start + blk.q_len),
                    slice(blk.k_start, blk.k_start + blk.k_len),
                )
                bq, bk, bv = kernel.backward(
                    dout[qs], q[qs], _expand(kv[0][ks], groups), _expand(kv[1][ks], groups),
                    out[qs], lse[:, qs], causal=blk.causal, scale=scale,
                )  # fmt: skip
                # one block per sequence per step: K/V rows of a step are written once, and
                # step 0 covers every real query row, so only later steps accumulate into dq
                if step == 0:
                    dq[qs] = bq
                else:
                    dq[qs] += bq
                block_dkv[0, ks] = _reduce(bk, groups)
                block_dkv[1, ks] = _reduce(bv, groups)
            if step == 0:
                own = block_dkv
            else:
                if dkv_in is not None:
                    comm.wait(_TAG_DKV)  # the hop posted last step ran during this compute
                    block_dkv += dkv_in
                dkv_in = comm.exchange(block_dkv, tag=_TAG_DKV)
            if nxt is not None:
                comm.wait(_TAG_KV)
                kv = nxt
        assert own is not None
        dkv = own
        if dkv_in is not None:
            comm.wait(_TAG_DKV)  # hop d-1: the other members' dK/dV of this rank's KV
            dkv = own + dkv_in
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


def check_qkv_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError unless q, k, v are [T_local, heads, head_dim] with k, v alike and matching q
    in tokens and head_dim (shared by every transport's entry point)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"q, k, v must be [T_local, heads, head_dim]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must match each other and q "
            f"{tuple(q.shape)} in tokens and head_dim"
        )


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int],
    cu_seqlens_padded: torch.Tensor | Sequence[int],
    *,
    ring: Sequence[int] | RingComm,
    causal: bool | Sequence[bool] | torch.Tensor = True,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
) -> torch.Tensor:
    """Exact attention of this rank's THD shard against its whole CP group.

    q: [T_local, H, D]; k, v: [T_local, H_kv, D] with H a multiple of H_kv (GQA);
    cu_seqlens / cu_seqlens_padded: int32 cumulative real / padded lengths of the *unsharded*
    sequences (padded lengths multiples of 2 * len(ring)); ring: the group's global ranks in
    ring order (this rank included) or a `RingComm`; causal: one bool or one per sequence.
    Returns [T_local, H, D] in q's dtype; padding rows are 0 and get zero gradients.
    """
    comm = ring if isinstance(ring, RingComm) else RingComm(ring)
    check_qkv_shapes(q, k, v)
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"H={q.shape[1]} query heads is not a multiple of H_kv={k.shape[1]} key/value "
            "heads; GQA needs num_attention_heads % num_query_groups == 0"
        )
    layout = ShardLayout.build(cu_seqlens, cu_seqlens_padded, comm.size, causal)
    if layout.num_local_tokens != q.shape[0]:
        raise ValueError(
            f"q has {q.shape[0]} tokens but cu_seqlens_padded[-1] / degree {comm.size} = "
            f"{layout.num_local_tokens}: pass this rank's shard and the cumulative lengths of "
            "the unsharded, padded sequences"
        )
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    kern = kernel if kernel is not None else select_kernel(q.device)
    return _RingAttention.apply(q, k, v, layout, comm, kern, scale)
