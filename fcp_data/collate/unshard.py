"""Shard and unshard per-token values of a CP group: the arithmetic of the zigzag layout.

`pack_shard` lays a group's sequences out on its members (chunk i and chunk 2d-1-i of every
sequence on member i, packed THD). What a batch carries beside its tokens (advantages, old
log-probs, any per-token field) must land in exactly the same slots, and what a model returns
per slot (log-probs, values) must go back to one tensor per sequence in sample order. Both
directions live here, beside `pack`, as pure functions of the lengths, the degree and the pad
unit: `shard_field` and `held_positions` go forward, `sequence_slots`, `unshard_group` and
`unshard_replicas` go back (`fcp_exec.gather` moves the buffers between processes and calls
them; `fcp_data.inmemory` shards its fields with them).

**Alignment.** "label": slot t carries token t+1 (what the model predicts there; padding and
the last real slot hold 0 going forward, and value 0 of a sequence, which nothing predicts,
is `fill` coming back); "token": slot t carries token t.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from .. import layout
from ..errors import ConfigError

if TYPE_CHECKING:  # types only: the arithmetic needs no planner
    from ..planner import Plan, RankPlan

__all__ = [
    "ALIGNMENTS",
    "Alignment",
    "check_align",
    "held_positions",
    "local_num_tokens",
    "sequence_slots",
    "shard_field",
    "unshard_group",
    "unshard_replicas",
]

Alignment = Literal["label", "token"]
ALIGNMENTS = ("label", "token")
"""label: slot t carries token t+1 (what the model predicts there); token: slot t, token t."""

_SHIFT = MappingProxyType({"label": 1, "token": 0})


def held_positions(
    seqlens: Sequence[int], degree: int, index: int, unit: int = 1
) -> tuple[list[np.ndarray], np.ndarray]:
    """Per sequence, the global positions member `index` holds in local order (chunk i, then
    chunk 2d-1-i), and the offsets of each sequence in its packed buffer ([n + 1]): exactly
    what `pack_shard` lays out (its `global_positions`, `local_cu_seqlens_padded`)."""
    held: list[np.ndarray] = []
    sizes = []
    for L in seqlens:
        c = layout.chunk_length(int(L), degree, unit)
        a, b = layout.chunk_ids(degree, index)
        held.append(np.concatenate([np.arange(a * c, (a + 1) * c), np.arange(b * c, (b + 1) * c)]))
        sizes.append(2 * c)
    return held, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def local_num_tokens(rank_plan: RankPlan, unit: int = 1) -> int:
    """Slots one replica's micro-batch of a wave holds for its group's sequences (0 when it
    sits the wave out: its placeholder carries no sequence)."""
    if rank_plan.is_empty:
        return 0
    return int(sum(layout.shard_tokens(int(L), rank_plan.degree, unit) for L in rank_plan.seqlens))


def shard_field(
    values: Sequence[torch.Tensor],
    seqlens: Sequence[int],
    *,
    degree: int,
    index: int,
    unit: int = 1,
    align: Alignment = "label",
) -> torch.Tensor:
    """Member `index`'s packed shard of one per-token field of a group's sequences.

    values[k]: token-aligned values of sequence k ([L_k, ...]). Slot t of sequence k's shard
    holds the value at global position p(t) ("token") or p(t)+1 ("label"), 0 where that is past
    the sequence (padding; the last real slot under "label"). Same slots as `pack_shard`.
    """
    shift = check_align(align)
    held, offs = held_positions(seqlens, degree, index, unit)
    first = values[0]
    out = torch.zeros((int(offs[-1]), *first.shape[1:]), dtype=first.dtype, device=first.device)
    for k, (v, pos) in enumerate(zip(values, held)):
        src = torch.from_numpy(pos + shift)
        keep = src < v.shape[0]
        o = int(offs[k])
        out[o : o + len(pos)][keep] = v[src[keep].to(v.device)].to(out.device)
    return out


def sequence_slots(seqlens: Sequence[int], degree: int, unit: int = 1) -> list[np.ndarray]:
    """Where each token of a group's sequences lives once the members' buffers are joined.

    With the d members' packed buffers concatenated in ring order (member i's buffer at
    i * B, B = the group's local token count), entry p of array k is the index holding global
    position p of sequence k, p < L_k. Position p lies in chunk c = p // C (C = padded / 2d),
    held by member c when c < d, else by member 2d-1-c as its second chunk.
    """
    lens = [int(L) for L in seqlens]
    per = np.array([layout.shard_tokens(L, degree, unit) for L in lens], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(per)])
    total = int(offs[-1])
    out = []
    for k, L in enumerate(lens):
        c_len = layout.chunk_length(L, degree, unit)
        p = np.arange(L, dtype=np.int64)
        chunk, within = np.divmod(p, c_len)
        first = chunk < degree
        member = np.where(first, chunk, 2 * degree - 1 - chunk)
        local = offs[k] + np.where(first, 0, c_len) + within
        out.append(member * total + local)
    return out


def check_align(align: str) -> int:
    """The slot shift of an alignment (1 for "label", 0 for "token"); ConfigError otherwise."""
    if align not in _SHIFT:
        raise ConfigError(f"align={align!r} is not one of {ALIGNMENTS}")
    return _SHIFT[align]


def unshard_group(
    buffers: Sequence[torch.Tensor],
    seqlens: Sequence[int],
    *,
    degree: int,
    unit: int = 1,
    align: Alignment = "label",
    fill: float = 0.0,
) -> list[torch.Tensor]:
    """One tensor per sequence of a CP group from its members' per-slot outputs (pure).

    buffers[i]: member i's (ring position i) output for the group's micro-batch, [B, ...] with
    B its local token count. Returns [L_k, ...] per sequence, padding dropped: under "token"
    value p is slot p's output; under "label" (slot t predicts token t+1) value k is the output
    of the slot that predicted token k, and value 0, which no slot predicts, is `fill`.
    The exact inverse of `shard_field` (and of the packing of tokens and labels).
    """
    shift = check_align(align)
    if len(buffers) != degree:
        raise ConfigError(f"got {len(buffers)} buffers for a degree-{degree} group; need {degree}")
    want = int(sum(layout.shard_tokens(int(L), degree, unit) for L in seqlens))
    for i, b in enumerate(buffers):
        if b.ndim < 1 or b.shape[0] != want or b.shape[1:] != buffers[0].shape[1:]:
            raise ConfigError(
                f"member {i}'s buffer has shape {tuple(b.shape)}; the group's sequences "
                f"{tuple(int(L) for L in seqlens)} at degree {degree} need [{want}, ...] on "
                "every member"
            )
    joined = torch.cat(list(buffers)) if degree > 1 else buffers[0]
    out: list[torch.Tensor] = []
    for L, slots in zip(seqlens, sequence_slots(seqlens, degree, unit)):
        idx = torch.from_numpy(slots).to(joined.device)
        if shift == 0:
            out.append(joined[idx])
            continue
        seq = joined.new_full((int(L), *joined.shape[1:]), fill)
        seq[1:] = joined[idx[:-1]]
        out.append(seq)
    return out


def unshard_replicas(
    plan: Plan,
    outputs: Callable[[int, int], torch.Tensor | None] | Sequence[Sequence[torch.Tensor | None]],
    *,
    num_sequences: int,
    unit: int = 1,
    align: Alignment = "label",
    fill: float = 0.0,
) -> list[torch.Tensor | None]:
    """Every sequence of a batch from every replica's per-slot outputs (pure; for all-gathers).

    outputs[r][w] (or outputs(r, w)): replica r's output of wave w, [local tokens, ...]; only
    entries of replicas that have a group in that wave are read. Returns a list over the batch
    in sample order, None for sequences the plan dropped.
    """
    get = outputs if callable(outputs) else (lambda r, w: outputs[r][w])
    result: list[torch.Tensor | None] = [None] * num_sequences
    for w, wave in enumerate(plan.waves):
        for g in wave.groups:
            bufs = [get(r, w) for r in g.replicas]
            missing = [r for r, b in zip(g.replicas, bufs) if b is None]
            if missing:
                raise ConfigError(
                    f"wave {w}: no output from replicas {missing} of group {g.replicas}"
                )
            seqs = unshard_group(
                bufs, g.seqlens, degree=g.degree, unit=unit, align=align, fill=fill
            )
            for s, t in zip(g.sequence_ids, seqs):
                result[s] = t
    return result


# ---- micro-batches -----------------------------------------------------------------------------
