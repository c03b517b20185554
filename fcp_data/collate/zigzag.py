"""Zigzag sharding of one sequence over a CP group (Transformer Engine's THD CP layout).

A sequence of length L run by a CP group of degree d is padded to a multiple of 2d and cut into
2d equal chunks; replica i of the group holds chunks i and 2d-1-i (the contract, shared with the
planner's memory check, is `fcp_data.layout`). Under causal attention chunk
k costs about k+1 units, so pairing chunk i with chunk 2d-1-i gives every replica the same
2d+1 units: with d = 4 a contiguous split would give the last replica 7x the first one's work.
Full-attention sequences use the same layout (their cost is balanced either way), so that
megatron-core components that slice by CP rank (TE `get_batch_on_this_cp_rank`,
`thd_get_partitioned_indices`) agree with us for every sequence. At d = 1 the replica holds the
whole sequence, still padded to a multiple of 2 so TE's padded-THD convention holds.

Everything here is index arithmetic on numpy arrays: no torch, no process group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import layout
from ..errors import ConfigError

__all__ = [
    "chunk_bounds",
    "padded_seqlen",
    "shard_indices",
    "shard_sequence",
    "unshard_sequence",
]


def _check(degree: int, index: int | None = None) -> None:
    if isinstance(degree, bool) or int(degree) != degree or degree < 1:
        raise ConfigError(f"degree={degree!r} must be an integer >= 1 (the CP group size)")
    if index is not None and not 0 <= index < degree:
        raise ConfigError(
            f"index_in_group={index!r} is outside [0, {degree}) for a degree-{degree} group"
        )


def padded_seqlen(seqlen: int, degree: int, unit: int = 1) -> int:
    """L padded to a multiple of 2d x unit (2 at d = 1, unit 1): the length TE's THD CP layout
    needs; `unit` is TP under sequence parallel (`fcp_data.layout.pad_unit`)."""
    _check(degree)
    if seqlen < 0:
        raise ConfigError(f"seqlen={seqlen} must be >= 0")
    if isinstance(unit, bool) or int(unit) != unit or unit < 1:
        raise ConfigError(f"unit={unit!r} must be an integer >= 1 (TP under sequence parallel)")
    return int(layout.padded_length(int(seqlen), int(degree), int(unit)))


def chunk_bounds(
    padded_len: int, degree: int, index: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """[start, end) of the two chunks replica `index` holds: chunk i and chunk 2d-1-i."""
    _check(degree, index)
    chunks = layout.num_chunks(degree)
    if padded_len % chunks:
        raise ConfigError(
            f"padded_len={padded_len} is not a multiple of 2*degree={chunks}; pad it with "
            "padded_seqlen(seqlen, degree) first"
        )
    c = padded_len // chunks
    first_chunk, second_chunk = layout.chunk_ids(degree, index)
    return (first_chunk * c, (first_chunk + 1) * c), (second_chunk * c, (second_chunk + 1) * c)


def shard_indices(padded_len: int, degree: int, index: int) -> np.ndarray:
    """Global positions held by replica `index`, in local order (chunk i, then chunk 2d-1-i)."""
    (a0, a1), (b0, b1) = chunk_bounds(padded_len, degree, index)
    return np.concatenate([np.arange(a0, a1), np.arange(b0, b1)]).astype(np.int64)


def shard_sequence(values: np.ndarray, degree: int, index: int) -> np.ndarray:
    """The local shard of an already padded per-token array (tokens, labels, positions...)."""
    (a0, a1), (b0, b1) = chunk_bounds(len(values), degree, index)
    return np.concatenate([values[a0:a1], values[b0:b1]])


def unshard_sequence(shards: Sequence[np.ndarray], degree: int) -> np.ndarray:
    """Inverse of `shard_sequence`: the padded sequence from the d shards in group order."""
    _check(degree)
    if len(shards) != degree:
        raise ConfigError(f"got {len(shards)} shards for a degree-{degree} group; need {degree}")
    sizes = {len(s) for s in shards}
    if len(sizes) != 1 or next(iter(sizes)) % 2:
        raise ConfigError(f"shards must have one even length each, got lengths {sorted(sizes)}")
    c = len(shards[0]) // layout.CHUNKS_PER_MEMBER
    out = np.empty((layout.num_chunks(degree) * c, *shards[0].shape[1:]), dtype=shards[0].dtype)
    for i, s in enumerate(shards):
        first_chunk, second_chunk = layout.chunk_ids(degree, i)
        out[first_chunk * c : (first_chunk + 1) * c] = s[:c]
        out[second_chunk * c : (second_chunk + 1) * c] = s[c:]
    return out
