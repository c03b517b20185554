"""Transports inside a CP group: the ring and the head-parallel hybrid u x r, as the planner
prices them.

A group of degree d = u x r runs the hybrid (`fcp_exec.ulysses`): the members at ring positions
[j*u, (j+1)*u) exchange heads by all-to-all (each ends up with the degree-r zigzag shard of its
block for 1/u of the heads), the r blocks run the ring over those heads, and a second
all-to-all brings the output back. u = 1 is the ring of the paper; u = d is DeepSpeed-Ulysses.
u must divide the query heads a replica holds (H / TP); K/V heads are split when u divides
them and replicated when they divide u (each member gets the one K/V head its query heads
share; the replicas' gradients are summed), any other u is not offered.

Per member, layer and *local* token (a member holds T/d tokens of a T-token packed group):

    all-to-all  (u - 1)/u * 4 (H + max(H_kv, u)) D a

bytes (Q, K, V out and O back forward; dO out and dQ, dK, dV back backward, all in the
activation dtype, as `fcp_exec.transport_bytes` counts the real calls). Qwen3-8B in bf16
(H = 32, H_kv = 8, D = 128, 36 layers) at u = 2: 0.74 MB per local token, 1.25x the ring's
0.59 MB per *group* token, but divided by d: at d = 8 the all-to-all moves 0.09 MB (u = 2) to
0.16 MB (u = 8) per group token against the ring's 0.52 MB. The hybrid's ring moves the same
per-token bytes for max(H_kv, u)/u of the K/V heads: a share of the ring's bytes
`ring_share` = max(H_kv, u) / (u * H_kv) (1/u when u divides H_kv).

Time (model.py): T = L + max(A, C_ring(r)) + C_a2a(u) + beta1, since ring steps hide behind
attention and an all-to-all does not (attention needs its result). C_a2a = (u-1)/u *
a2a_bytes * Σs / d / v + beta3 (v: intra- or inter-node bandwidth of the slowest block).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigError

__all__ = [
    "A2A_EXCHANGES_PER_LAYER",
    "a2a_bytes_per_token",
    "blocks_span_nodes",
    "head_parallel_degrees",
    "ring_share",
]

# all-to-all calls per layer and micro-batch: Q/K/V in and O out (forward), dO in and
# dQ/dK/dV out (backward)
A2A_EXCHANGES_PER_LAYER = 4


def head_parallel_degrees(heads: int, kv_heads: int) -> tuple[int, ...]:
    """The u >= 2 a replica holding `heads` query and `kv_heads` K/V heads can run: u divides
    the query heads and either divides the K/V heads or is a multiple of them (replication).
    Qwen3-8B (32 / 8): (2, 4, 8, 16, 32); Qwen2.5-1.5B (12 / 2): (2, 4, 6, 12)."""
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ConfigError(
            f"heads={heads}, kv_heads={kv_heads}: need heads >= 1 and a multiple of kv_heads"
        )
    return tuple(
        u
        for u in range(2, heads + 1)
        if heads % u == 0 and (kv_heads % u == 0 or u % kv_heads == 0)
    )


def a2a_bytes_per_token(
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ulysses: int,
    activation_bytes: int = 2,
    layers: int = 1,
) -> float:
    """Bytes one member's all-to-alls move per local token, fwd + bwd, *without* the (u-1)/u
    factor (the comm term applies it): 4 (H + max(H_kv, u)) D a per layer."""
    kv = max(kv_heads, ulysses)
    return float(layers * 4 * (heads + kv) * head_dim * activation_bytes)


def ring_share(kv_heads: int, ulysses: int) -> float:
    """Share of the ring's per-token bytes that the hybrid's ring moves: max(H_kv, u)/(u H_kv)."""
    return max(kv_heads, ulysses) / (ulysses * kv_heads)


def blocks_span_nodes(replicas: Sequence[int], ulysses: int, replicas_per_node: int) -> bool:
    """Whether some all-to-all block (ring positions [j*u, (j+1)*u)) spans two nodes: the
    all-to-all then runs at the inter-node bandwidth."""
    reps = list(replicas)
    for j in range(0, len(reps), ulysses):
        block = reps[j : j + ulysses]
        if len({r // replicas_per_node for r in block}) > 1:
            return True
    return False
