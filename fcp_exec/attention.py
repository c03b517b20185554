"""Exact ring attention over packed varlen THD shards (zigzag layout, any degree d >= 1).

Forward: d steps; at step s member i holds the KV of member (i - s) mod d and makes the varlen
kernel calls of its `fcp_exec.schedule.RingSchedule` (one call per step for causal packs,
whatever the number of sequences), merging each into an fp32 running (out, lse) with an
in-place log-sum-exp merge of six whole-tensor ops, while the next KV is already on the wire.
d = 1 is one causal call and nothing else: no fp32 accumulator, no merge, no copy.
Backward: the KV ring runs again and each call's dK/dV (from the *global* out and lse, so the
steps sum exactly) is added, in fp32, to an accumulator that travels with its KV; dQ
accumulates locally. A member keeps the step-0 (diagonal) dK/dV of its own KV at home, so the
accumulator starts one member later and arrives home after d-1 hops, not d: per member and
layer the ring moves (d-1)/d * T * 2*H_kv*D * (2 * activation bytes + 4) bytes for T padded
tokens (K/V forward and backward, dK/dV in fp32 for exact sums), which is what the cost model's
`ring_bytes_per_token` charges. The dK/dV hop of step s overlaps the calls of step s+1.
GQA is native: kernels take H_kv-headed K/V, nothing is expanded here.
Measured: fp32 within ~1e-6 of a float64 reference for d = 1..5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from fcp_data.errors import ConfigError
from fcp_exec.kernels import AttentionKernel, KernelChoice
from fcp_exec.layout import ShardLayout
from fcp_exec.ring import RingComm
from fcp_exec.schedule import Call, RingSchedule, Rows

__all__ = [
    "check_qkv_shapes",
    "qkv_shape",
    "resolve_kernel",
    "resolve_layout",
    "ring_attention",
]

_TAG_KV, _TAG_DKV = 17, 18


def _take(x: torch.Tensor, rows: Rows, dim: int = 0) -> torch.Tensor:
    """Rows of x along `dim`: x itself, a view (slice) or one gather (index)."""
    if rows is None:
        return x
    if isinstance(rows, slice):
        return x[rows] if dim == 0 else x.narrow(dim, rows.start, rows.stop - rows.start)
    return x.index_select(dim, rows)


def _merge_(out: torch.Tensor, lse: torch.Tensor, b_out: torch.Tensor, b_lse: torch.Tensor) -> None:
    """In place: (out [T, H, D] fp32, lse [H, T]) <- their log-sum-exp merge with a block.

    Every row here has a finite LSE on both sides (the schedule never gives a row no key), so
    the sigmoid form is exact and NaN-free: w = sigmoid(b - a) is the block's share."""
    t = b_lse - lse
    w = torch.sigmoid(t).transpose(0, 1).unsqueeze(-1)
    lse.add_(F.softplus(t))
    out.lerp_(b_out.float(), w)


def _merge_rows(
    acc: torch.Tensor, lse: torch.Tensor, rows: Rows, b_out: torch.Tensor, b_lse: torch.Tensor
) -> None:
    if rows is None or isinstance(rows, slice):
        _merge_(_take(acc, rows), _take(lse, rows, 1), b_out, b_lse)
        return
    a, m = acc.index_select(0, rows), lse.index_select(1, rows)
    _merge_(a, m, b_out, b_lse)
    acc.index_copy_(0, rows, a)
    lse.index_copy_(1, rows, m)


def _write_rows(dst: torch.Tensor, rows: Rows, src: torch.Tensor, dim: int = 0) -> None:
    if rows is None:
        dst.copy_(src)
    elif isinstance(rows, slice):
        _take(dst, rows, dim).copy_(src)
    else:
        dst.index_copy_(dim, rows, src.to(dst.dtype))


def _add_rows(dst: torch.Tensor, rows: Rows, src: torch.Tensor, dim: int = 0) -> None:
    if rows is None or isinstance(rows, slice):
        _take(dst, rows, dim).add_(src)
    else:
        dst.index_add_(dim, rows, src.to(dst.dtype))


def _whole(calls: tuple[Call, ...]) -> Call | None:
    """The single call when a step is one call over the whole buffer (every causal pack)."""
    if len(calls) == 1 and calls[0].q_rows is None and calls[0].k_rows is None:
        return calls[0]
    return None


def _local(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    calls: tuple[Call, ...],
    kernel: AttentionKernel,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """d = 1: the calls write disjoint rows; no fp32 accumulator, no merge."""
    one = _whole(calls)
    if one is not None:
        return kernel.forward(q, k, v, one.seg, causal=one.causal, scale=scale)
    out = torch.zeros_like(q)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for c in calls:
        o, m = kernel.forward(
            _take(q, c.q_rows),
            _take(k, c.k_rows),
            _take(v, c.k_rows),
            c.seg,
            causal=c.causal,
            scale=scale,
        )
        _write_rows(out, c.q_rows, o)
        _write_rows(lse, c.q_rows, m, dim=1)
    return out, lse


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sched: RingSchedule,
        comm: RingComm,
        kernel: AttentionKernel,
        scale: float,
    ) -> torch.Tensor:
        d = sched.degree
        if d == 1:
            out, lse = _local(q, k, v, sched.steps[0], kernel, scale)
        else:
            kv = torch.stack((k, v))  # one buffer on the wire
            spare = torch.empty_like(kv)  # two KV buffers take turns: no allocation per step
            acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
            for step in range(d):
                nxt = comm.exchange(kv, tag=_TAG_KV, recv=spare) if step + 1 < d else None
                for c in sched.steps[step]:
                    held = _take(kv, c.k_rows, 1)
                    o, m = kernel.forward(
                        _take(q, c.q_rows),
                        held[0],
                        held[1],
                        c.seg,
                        causal=c.causal,
                        scale=scale,
                    )
                    if step == 0:  # step 0 covers every row once: nothing to merge yet
                        _write_rows(acc, c.q_rows, o)
                        _write_rows(lse, c.q_rows, m, dim=1)
                    else:
                        _merge_rows(acc, lse, c.q_rows, o, m)
                if nxt is not None:
                    comm.wait(_TAG_KV)
                    kv, spare = nxt, kv
            out = acc.to(q.dtype)
        if sched.pad_rows is not None:  # padding rows: output 0, and an LSE of +inf, so
            # every backward call sees their softmax weights as exp(s - inf) = 0: they add
            # exactly 0 to every gradient whatever the upstream gradient (no copy of dout)
            out.index_fill_(0, sched.pad_rows, 0.0)
            lse.index_fill_(1, sched.pad_rows, math.inf)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.fcp = (sched, comm, kernel, scale)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        sched, comm, kernel, scale = ctx.fcp
        dout = dout.to(q.dtype)
        if sched.degree == 1:
            return (
                *_local_backward(dout, q, k, v, out, lse, sched.steps[0], kernel, scale),
                None,
                None,
                None,
                None,
            )
        side: dict[int, tuple[torch.Tensor, ...]] = {}  # a call's Q-side rows, gathered once

        def run(c: Call, held: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if id(c) not in side:
                r = c.q_rows
                side[id(c)] = (
                    _take(dout, r),
                    _take(q, r),
                    _take(out, r),
                    _take(lse, r, 1).contiguous(),
                )
            g_out, qq, oo, ll = side[id(c)]
            kk = _take(held, c.k_rows, 1)
            return kernel.backward(
                g_out, qq, kk[0], kk[1], oo, ll, c.seg, causal=c.causal, scale=scale
            )

        d = sched.degree
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack((k, v))
        spare = torch.empty_like(kv)
        own = torch.zeros_like(kv)  # step 0's dK/dV of this member's own KV: kept here
        dkv_in: torch.Tensor | None = None
        for step in range(d):
            nxt = comm.exchange(kv, tag=_TAG_KV, recv=spare) if step + 1 < d else None
            if step == 0:
                for c in sched.steps[0]:  # disjoint rows: written, not added
                    gq, gk, gv = run(c, kv)
                    _write_rows(dq, c.q_rows, gq)
                    _write_rows(own, c.k_rows, torch.stack((gk, gv)), dim=1)
            else:
                if dkv_in is not None:
                    comm.wait(_TAG_DKV)  # the hop posted last step ran during this compute
                    acc = dkv_in
                else:
                    acc = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
                for c in sched.steps[step]:
                    gq, gk, gv = run(c, kv)
                    _add_rows(dq, c.q_rows, gq)
                    if c.k_rows is None or isinstance(c.k_rows, slice):
                        _add_rows(acc[0], c.k_rows, gk)
                        _add_rows(acc[1], c.k_rows, gv)
                    else:
                        _add_rows(acc, c.k_rows, torch.stack((gk, gv)), dim=1)
                dkv_in = comm.exchange(acc, tag=_TAG_DKV)
            if nxt is not None:
                comm.wait(_TAG_KV)
                kv, spare = nxt, kv
        assert dkv_in is not None  # d > 1: d - 1 hops were posted
        comm.wait(_TAG_DKV)  # hop d-1: the other members' dK/dV of this member's KV
        dkv = dkv_in.add_(own)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


def _local_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    calls: tuple[Call, ...],
    kernel: AttentionKernel,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    one = _whole(calls)
    if one is not None:
        return kernel.backward(dout, q, k, v, out, lse, one.seg, causal=one.causal, scale=scale)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for c in calls:
        r, kr = c.q_rows, c.k_rows
        gq, gk, gv = kernel.backward(
            _take(dout, r),
            _take(q, r),
            _take(k, kr),
            _take(v, kr),
            _take(out, r),
            _take(lse, r, 1).contiguous(),
            c.seg,
            causal=c.causal,
            scale=scale,
        )
        _write_rows(dq, r, gq)
        _write_rows(dk, kr, gk)
        _write_rows(dv, kr, gv)
    return dq, dk, dv


def check_qkv_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError unless q, k, v are [T_local, heads, head_dim] with k, v alike, matching q in
    tokens and head_dim, and H a multiple of H_kv (shared by every transport's entry point)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ConfigError(
            f"q, k, v must be [T_local, heads, head_dim]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ConfigError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must match each other and q "
            f"{tuple(q.shape)} in tokens and head_dim"
        )
    if q.shape[1] % k.shape[1]:
        raise ConfigError(
            f"H={q.shape[1]} query heads is not a multiple of H_kv={k.shape[1]} key/value "
            "heads; GQA needs num_attention_heads % num_query_groups == 0"
        )


def resolve_layout(
    layout: ShardLayout | None,
    cu_seqlens: torch.Tensor | Sequence[int] | None,
    cu_seqlens_padded: torch.Tensor | Sequence[int] | None,
    degree: int,
    causal: bool | Sequence[bool] | torch.Tensor,
    num_tokens: int,
) -> ShardLayout:
    """The micro-batch's layout at `degree`: the prebuilt one (no host work, no device read)
    or one built from the offsets (a host sync when they are device tensors); ValueError when
    it does not describe a shard of `num_tokens` rows."""
    if layout is None:
        if cu_seqlens is None or cu_seqlens_padded is None:
            raise ConfigError(
                "pass the micro-batch's layout= (ShardLayout, built once per micro-batch) or "
                "its cu_seqlens and cu_seqlens_padded"
            )
        layout = ShardLayout.build(cu_seqlens, cu_seqlens_padded, degree, causal)
    elif layout.degree != degree:
        layout = layout.with_degree(degree)
    if layout.num_local_tokens != num_tokens:
        raise ConfigError(
            f"q has {num_tokens} tokens but cu_seqlens_padded[-1] / degree {degree} = "
            f"{layout.num_local_tokens}: pass this rank's shard and the cumulative lengths of "
            "the unsharded, padded sequences"
        )
    return layout


def resolve_kernel(
    kernel: AttentionKernel | None,
    shape: tuple[torch.device, torch.dtype, int, int, int],
    layout: ShardLayout,
    choice: KernelChoice | None = None,
) -> AttentionKernel:
    """The kernel for blocks of `shape` (device, dtype, head_dim, heads, kv_heads): the
    caller's (checked against these blocks before the first step), else the choice of
    `choice` (the binding's runtime, measured once per job), else one chosen for this
    micro-batch (cached on its layout)."""
    device, dtype, head_dim, heads, kv_heads = shape
    if kernel is not None:
        kernel.check(dtype=dtype, head_dim=head_dim, heads=heads, kv_heads=kv_heads)
        return kernel
    if choice is None:
        choice = layout.cached("kernels", KernelChoice)
    return choice.get(device, dtype, head_dim, heads, kv_heads)


def qkv_shape(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.device, torch.dtype, int, int, int]:
    """(device, dtype, head_dim, heads, kv_heads) of one attention call's blocks."""
    return q.device, q.dtype, q.shape[2], q.shape[1], k.shape[1]


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    cu_seqlens_padded: torch.Tensor | Sequence[int] | None = None,
    *,
    ring: Sequence[int] | RingComm,
    causal: bool | Sequence[bool] | torch.Tensor = True,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
    layout: ShardLayout | None = None,
    group: Any = None,
) -> torch.Tensor:
    """Exact attention of this rank's THD shard against its whole CP group.

    q: [T_local, H, D]; k, v: [T_local, H_kv, D] with H a multiple of H_kv (GQA, native);
    layout: the micro-batch's `ShardLayout` (built once from host offsets, then every layer
    reuses its device schedule: no host sync), or cu_seqlens / cu_seqlens_padded: cumulative
    real / padded lengths of the *unsharded* sequences (padded lengths multiples of
    2 * len(ring); device tensors are read back once per call); ring: the group's global ranks
    in ring order (this rank included) or a `RingComm`; group: the CP group's process group,
    which carries the ring's P2P (None: the default group); causal: one bool or one per
    sequence (ignored with layout=). Returns [T_local, H, D] in q's dtype; padding rows are 0
    and get zero gradients.
    """
    comm = ring if isinstance(ring, RingComm) else RingComm(ring, group=group)
    check_qkv_shapes(q, k, v)
    lay = resolve_layout(layout, cu_seqlens, cu_seqlens_padded, comm.size, causal, q.shape[0])
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    kern = resolve_kernel(kernel, qkv_shape(q, k), lay)
    return _RingAttention.apply(q, k, v, lay.schedule(comm.index, q.device), comm, kern, scale)
