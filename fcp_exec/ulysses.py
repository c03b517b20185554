"""Exact head-parallel (Ulysses) and hybrid u x r attention over the zigzag THD shards.

A CP group of degree d = u * r; the member at ring position p = j*u + m is member m of
all-to-all block j (j = 0..r-1) and member j of ring m. The collator's shard is unchanged
(position p holds chunks p and 2d-1-p of every sequence). Block j's members together hold
exactly chunks j and 2r-1-j of the *degree-r* zigzag split: r-chunk j is d-chunks
j*u .. j*u+u-1 (the members' first chunks, in member order) and r-chunk 2r-1-j is d-chunks
(2r-1-j)*u .. (2r-j)*u-1 (their second chunks, in reverse member order). So:

1. one all-to-all in the block (scatter heads, gather tokens) gives member m the degree-r
   shard j of every sequence for query heads [m*H/u, (m+1)*H/u) and the K/V heads they read;
2. the existing exact ring attention of degree r runs over ring m on that shard
   (`_RingAttention` with a degree-r `ShardLayout` of the same cu_seqlens_padded);
3. one all-to-all back (scatter tokens, gather heads) returns the output in the d-layout.
The backward is the same path reversed (each exchange's gradient is the inverse exchange), so
forward and backward are exact: u = 1 is the ring, u = d is pure Ulysses (a ring of one).

GQA (H query, H_kv key/value heads per replica after TP; u must divide H):
- u divides H_kv: member m gets K/V heads [m*H_kv/u, (m+1)*H_kv/u), the ones its query heads read;
- H_kv divides u: K/V head h is *replicated* to the u/H_kv members whose query heads read it
  (each member gets one), and the replicas' gradients are summed back by autograd (in the
  gradient's dtype) before they leave for their owner;
- otherwise ValueError (`fcp_exec.transport_bytes.kv_heads_per_member`).

Bytes per member, layer and local token (T = N/d of a pack of N), fwd + bwd, activation bytes a,
H_kv' = max(H_kv, u) (`fcp_exec.transport_bytes`, which the planner's cost model charges):
  all-to-all: (u-1)/u * 4 * (H + H_kv') * D * a   (q, k, v and out forward; dout, dq, dk, dv back)
  r-ring:     (r-1) * 2 * H_kv' * D * (2a + 4)     (r-1 hops of the r-layout's u*T tokens at
                                                    ring_bytes_per_token(kv_heads=H_kv'/u))
q, k and v go in ONE all-to-all (concatenated per destination), so a layer makes 4 all-to-all
calls (2 forward, 2 backward) of which none overlaps compute.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from fcp_data import layout as contract
from fcp_data.errors import ConfigError
from fcp_exec.a2a import A2AComm
from fcp_exec.attention import _RingAttention
from fcp_exec.kernels import AttentionKernel
from fcp_exec.layout import ShardLayout, _as_list
from fcp_exec.ring import RingComm
from fcp_exec.transport_bytes import kv_heads_per_member

__all__ = ["block_token_index", "check_heads", "hybrid_attention"]


def check_heads(heads: int, kv_heads: int, ulysses: int) -> int:
    """K/V heads per block member, or ValueError if u cannot split these heads.

    The shapes are the model's, identical on every member of a group that runs the same model,
    so every member raises the same error before any collective."""
    if heads % ulysses:
        raise ConfigError(
            f"ulysses={ulysses} does not divide H={heads} query heads (per replica, after TP): "
            "the all-to-all gives each block member H/u heads; plan this group with a u that "
            "divides the head count"
        )
    if heads % kv_heads:
        raise ConfigError(f"H={heads} query heads is not a multiple of H_kv={kv_heads}")
    return kv_heads_per_member(kv_heads, ulysses)


def block_token_index(
    cu_seqlens_padded: torch.Tensor | Sequence[int], degree: int, ulysses: int
) -> torch.Tensor:
    """Where each token of the degree-r shard comes from, as rows of the [u * T] stack of the
    block members' local shards (member m's shard at rows m*T .. m*T+T-1).

    Per sequence (local offset o = cup/d, chunk c = padded/(2d)): the first chunks of members
    0..u-1, then the second chunks of members u-1..0 (module doc)."""
    cup = _as_list("cu_seqlens_padded", cu_seqlens_padded)
    total = cup[-1] // degree
    chunks = contract.num_chunks(degree)
    parts: list[torch.Tensor] = []
    for a, b in itertools.pairwise(cup):
        c, off = (b - a) // chunks, a // degree
        for m in range(ulysses):
            parts.append(torch.arange(m * total + off, m * total + off + c))
        for m in reversed(range(ulysses)):
            parts.append(torch.arange(m * total + off + c, m * total + off + 2 * c))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _seq_to_head(x: torch.Tensor, comm: A2AComm, perm: torch.Tensor) -> torch.Tensor:
    """[T, u*h, D] d-layout, all heads -> [u*T, h, D] r-layout, this member's h heads."""
    t, hh, dim = x.shape
    u = comm.size
    send = x.reshape(t, u, hh // u, dim).transpose(0, 1)  # slice m: heads for member m
    recv = comm.exchange(send)  # slice m: member m's tokens, my heads
    return recv.reshape(u * t, hh // u, dim).index_select(0, perm)


def _head_to_seq(y: torch.Tensor, comm: A2AComm, perm: torch.Tensor) -> torch.Tensor:
    """The inverse of `_seq_to_head`: [u*T, h, D] r-layout -> [T, u*h, D] d-layout."""
    ut, h, dim = y.shape
    u = comm.size
    flat = torch.empty_like(y).index_copy_(0, perm, y)  # back to member-major rows
    recv = comm.exchange(flat.view(u, ut // u, h, dim))  # slice m: my tokens, member m's heads
    return recv.transpose(0, 1).reshape(ut // u, u * h, dim)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: A2AComm, perm: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.fcp = (comm, perm)
        return _seq_to_head(x, comm, perm)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        comm, perm = ctx.fcp
        return _head_to_seq(dy.contiguous(), comm, perm), None, None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, comm: A2AComm, perm: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.fcp = (comm, perm)
        return _head_to_seq(y, comm, perm)

    @staticmethod
    def backward(ctx: Any, dx: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        comm, perm = ctx.fcp
        return _seq_to_head(dx.contiguous(), comm, perm), None, None


def hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: ShardLayout,
    a2a: A2AComm,
    ring: RingComm,
    scale: float,
    kernel: AttentionKernel,
) -> torch.Tensor:
    """Exact attention of this member's d-layout shard through the u x r transport.

    q [T, H, D], k/v [T, H_kv, D] (already validated by `cp_attention`); layout: the
    micro-batch's degree-d layout (its degree-r twin, the token permutation and the ring
    schedule are built on the first layer and cached on it: no host work or device read per
    layer); a2a: the block of u members in block order; ring: the r members with this member's
    block position, in block order. Returns [T, H, D] in q's dtype (padding rows 0, zero
    gradients)."""
    u, r = a2a.size, ring.size
    d = u * r
    t, heads, dim = q.shape
    kvm = check_heads(heads, k.shape[1], u)
    if layout.degree != d or layout.num_local_tokens != t:
        raise ConfigError(
            f"q has {t} tokens at degree {d} but the layout is for degree {layout.degree} with "
            f"{layout.num_local_tokens} local tokens: pass this rank's shard of the degree-{d} "
            "layout"
        )
    layout_r = layout.with_degree(r)
    device = q.device
    perm = layout.cached(
        ("perm", u, device),
        lambda: _device_index(block_token_index(_cumsum(layout.padded), d, u), device),
    )
    if kvm * u != k.shape[1]:  # replicate: member m reads K/V head m // (u / H_kv)
        rep = layout.cached(
            ("rep", u, k.shape[1], device),
            lambda: _device_index(torch.arange(u) // (u // k.shape[1]), device),
        )
        k, v = k.index_select(1, rep), v.index_select(1, rep)
    hq = heads // u
    qkv = torch.cat([x.reshape(t, u, -1, dim) for x in (q, k, v)], dim=2).reshape(
        t, u * (hq + 2 * kvm), dim
    )
    local = _SeqToHead.apply(qkv, a2a, perm)
    q_r, k_r, v_r = (p.contiguous() for p in local.split([hq, kvm, kvm], dim=1))
    sched = layout_r.schedule(ring.index, device)
    out_r = _RingAttention.apply(q_r, k_r, v_r, sched, ring, kernel, scale)
    return _HeadToSeq.apply(out_r, a2a, perm)


def _cumsum(lengths: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(lengths)]


def _device_index(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host index on the device without a host sync (pinned, non-blocking on CUDA)."""
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
