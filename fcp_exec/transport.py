"""`cp_attention`: the one attention entry point, dispatching on the bound CP transport.

u = 1 runs the ring (`fcp_exec.attention`) over the group's ring; u > 1 runs the hybrid u x r of
`fcp_exec.ulysses` (u = d: pure head-parallel all-to-all). The checks here are local and raise
before any collective: shapes (including u dividing H, and H_kv with u, which are the model's
shapes and so identical on every member that runs the same model: every member raises the
same error, nobody is left waiting in an all-to-all), the layout and the kernel.

What a layer costs the host is constant: the micro-batch's `ShardLayout` (pass `layout=`, built
once from host offsets) holds every device index and offset the transport needs, built on the
first layer and reused by the others; the binding's `ExecRuntime` holds the kernel choice and
the communication stream; P2P runs on the ring's own process group (`binding.ring_group`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fcp_exec.a2a import A2AComm
from fcp_exec.attention import (
    _RingAttention,
    check_qkv_shapes,
    qkv_shape,
    resolve_kernel,
    resolve_layout,
)
from fcp_exec.kernels import AttentionKernel
from fcp_exec.layout import ShardLayout
from fcp_exec.ring import RingComm
from fcp_exec.ulysses import check_heads, hybrid_attention
from fcp_exec.verify import verify_block_shape

__all__ = ["cp_attention", "ring_comm"]


def ring_comm(ranks: Sequence[int], binding: Any, device: torch.device) -> RingComm:
    """The RingComm of `ranks` on the binding's ring group, with the runtime's stream."""
    runtime = getattr(binding, "runtime", None)
    stream, api = runtime.comm_stream(device) if runtime is not None else (None, None)
    return RingComm(
        ranks,
        group=getattr(binding, "ring_group", None),
        stream=stream,
        stream_api=api,
        timing=bool(runtime is not None and runtime.timing),
    )


def _agree_on_shape(
    binding: Any, q: torch.Tensor, k: torch.Tensor, layout: ShardLayout, runtime: Any
) -> None:
    """Before the first transfer of a group, its members agree on the block shape (one small
    all-gather per group and block kind for the job: remembered by the runtime, else per
    micro-batch on its layout); a disagreement raises on every member, none hangs."""
    if binding.degree <= 1:
        return
    shape = (q.shape[1], k.shape[1], q.shape[2], str(q.dtype))
    key = ("agreed", tuple(binding.members), int(binding.ulysses), shape)
    seen = runtime.agreed_shapes if runtime is not None else layout.cached("agreed", set)
    if key in seen:
        return
    verify_block_shape(shape, binding.members, group=binding.group)
    seen.add(key)


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    cu_seqlens_padded: torch.Tensor | Sequence[int] | None = None,
    *,
    binding: Any,
    causal: bool | Sequence[bool] | torch.Tensor = True,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
    layout: ShardLayout | None = None,
) -> torch.Tensor:
    """Exact attention of this rank's zigzag THD shard against its whole CP group.

    binding: what `cp_context` yielded (`CPBinding`: members, index, ulysses, the r-ring, the
    all-to-all block, their groups and the runtime). q [T_local, H, D], k/v [T_local, H_kv, D]
    with H a multiple of H_kv; layout: the micro-batch's `ShardLayout` (preferred: no host
    sync), or cu_seqlens / cu_seqlens_padded: cumulative real / padded lengths of the unsharded
    sequences (padded lengths multiples of 2 * degree); causal: one bool or one per sequence.
    Returns [T_local, H, D] in q's dtype, the same for every u up to rounding.
    """
    u = int(binding.ulysses)
    check_qkv_shapes(q, k, v)
    lay = resolve_layout(layout, cu_seqlens, cu_seqlens_padded, binding.degree, causal, q.shape[0])
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    runtime = getattr(binding, "runtime", None)
    choice = runtime.kernels if runtime is not None else None
    _agree_on_shape(binding, q, k, lay, runtime)
    if u == 1:
        comm = ring_comm(binding.ring, binding, q.device)
        kern = resolve_kernel(kernel, qkv_shape(q, k), lay, choice)
        sched = lay.schedule(comm.index, q.device)
        return _RingAttention.apply(q, k, v, sched, comm, kern, scale)
    kvm = check_heads(q.shape[1], k.shape[1], u)
    a2a = lay.cached(
        ("a2a", binding.a2a_ranks, q.device),
        lambda: A2AComm(binding.a2a_ranks, binding.a2a_group),
    )
    ring = ring_comm(binding.ring_ranks, binding, q.device)
    kern = resolve_kernel(
        kernel, (q.device, q.dtype, q.shape[2], q.shape[1] // u, kvm), lay, choice
    )
    return hybrid_attention(q, k, v, layout=lay, a2a=a2a, ring=ring, scale=scale, kernel=kern)
