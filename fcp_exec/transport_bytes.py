"""Bytes the CP transports move per member, as pure functions the planner's cost model can share.

Imports nothing (no torch): the planner may import it lazily or copy the two formulas.

Hybrid u x r (`fcp_exec.ulysses`), per layer and per *local* token (one member holds T = N/d
padded tokens of a pack of N), with H query heads, H_kv key/value heads, head dim D, activation
bytes a and H_kv' = max(H_kv, u) (K/V heads replicated up to u when H_kv < u):

- all-to-all (within the u-member block): forward sends q, k, v (H + 2 H_kv' heads) and the
  output back (H heads); backward sends dout (H) and dq, dk, dv back (H + 2 H_kv'), all in the
  activation dtype, of which the share (u-1)/u leaves the member (its own slice stays):
  ``a2a = (u-1)/u * 4 * (H + H_kv') * D * a``.
  Llama-3-8B per replica at TP=1 (H=32, H_kv=8, D=128, bf16), u=2: 40,960 B per token and layer.
- ring part (degree r over the members with the same block position): the same three passes
  as `fcp_exec.ring_attention` (K, V forward and backward, fp32 dK/dV once), r-1 hops each, of
  the r-layout shard of u*T tokens with H_kv'/u heads: per local token
  ``ring = (r-1) * 2 * H_kv' * D * (2a + 4)``, i.e. for the whole pack the cost model's
  `ring_bytes(seqlens, r, unit=u * pad_unit)` = (r-1)/r * N * alpha3 with
  alpha3 = `ring_bytes_per_token(kv_heads=H_kv'/u)` (the pack is padded to 2d = 2r*u).
For u = 1 the first term is 0 and the second is today's ring; for u = d the second is 0.
Per member and pack of N padded tokens: multiply the per-local-token figures by T = N/d.
"""

from __future__ import annotations

from fcp_data.errors import ConfigError

__all__ = ["a2a_bytes_per_token", "hybrid_ring_bytes_per_token", "kv_heads_per_member"]

_DKV_BYTES = 4  # dK/dV travel the ring in fp32 (fcp_exec.attention)


def kv_heads_per_member(kv_heads: int, ulysses: int) -> int:
    """K/V heads each block member attends with: H_kv / u, or 1 when u is a multiple of H_kv
    (the K/V head is replicated to the u / H_kv members whose query heads read it).

    Raises ValueError when neither divides the other (a member's query heads would straddle
    two K/V heads with an uneven split)."""
    if kv_heads < 1 or ulysses < 1:
        raise ConfigError(f"kv_heads={kv_heads} and ulysses={ulysses} must both be >= 1")
    if kv_heads % ulysses == 0:
        return kv_heads // ulysses
    if ulysses % kv_heads == 0:
        return 1
    raise ConfigError(
        f"ulysses={ulysses} and H_kv={kv_heads} key/value heads: one must divide the other "
        "(split K/V heads when u divides H_kv, replicate them when H_kv divides u); choose "
        "another u for this model"
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
    """Bytes one block member sends per local token over forward + backward (module doc).

    Includes the (u-1)/u factor: 0.0 for u = 1. `heads` / `kv_heads` are per model replica
    (after TP)."""
    if ulysses == 1:
        return 0.0
    kv_eff = kv_heads_per_member(kv_heads, ulysses) * ulysses
    return layers * (ulysses - 1) / ulysses * 4 * (heads + kv_eff) * head_dim * activation_bytes


def hybrid_ring_bytes_per_token(
    *,
    kv_heads: int,
    head_dim: int,
    ulysses: int,
    ring_degree: int,
    activation_bytes: int = 2,
    layers: int = 1,
) -> float:
    """Bytes one member sends on the r-ring per local token over forward + backward.

    (r-1) hops of the r-layout shard (u local shards) with H_kv'/u heads: equals
    `ring_bytes_per_token(kv_heads=H_kv'/u) * u * (r-1)`; 0 for r = 1."""
    kv_eff = kv_heads_per_member(kv_heads, ulysses) * ulysses
    r = ring_degree
    return float(layers * (r - 1) * 2 * kv_eff * head_dim * (2 * activation_bytes + _DKV_BYTES))
