"""The THD zigzag layout contract: how a CP group of degree d pads and splits each sequence.

One definition read by both sides: the planner's memory check (`planner.cost.model`,
`planner.cost.problem`, `planner.bounds`, the compiled `kernels.core.shard_tokens`), the collator
(`collate.zigzag`, `collate.pack`) and the ring attention schedule (`fcp_exec.layout`).

A sequence of L tokens run by a degree-d group is padded to a multiple of 2d (Transformer
Engine's THD context-parallel layout, which megatron-core's `get_batch_on_this_cp_rank` and
`thd_get_partitioned_indices` also slice by) and cut into 2d equal chunks; member i holds
chunks i and 2d-1-i. So each member holds ceil(L / 2d) * 2 tokens of it: L = 21 at d = 2 is
padded to 24 and each member holds 12. The rule is the same for every degree, d = 1 included
(an odd sequence is padded by one token, so the local pack keeps TE's padded-THD offsets),
and for full-attention sequences (their work is balanced by any split, but megatron-core slices
every sequence of a pack the same way).

**Sequence parallel.** Under tensor parallelism with sequence parallel on, megatron-core splits
each packed row along the sequence across the TP ranks, so every row must be a multiple of TP.
The layout keeps that per sequence: with `unit` = TP (`pad_unit(tp, sequence_parallel=True)`)
every chunk is a multiple of `unit`, i.e. a sequence is padded to a multiple of 2d x TP, so any
pack of such sequences is a multiple of TP on every member (Megatron-LM pads packed sequences
to 2 x CP x TP the same way). Without sequence parallel `unit` is 1 and nothing changes:
L = 21 at d = 2 and TP = 4 under sequence parallel pads to 32 (each member holds 16 = 4 x 4).

Functions are plain integer arithmetic on lengths >= 0 (ceil(a / b) written (a + b - 1) // b,
which numba compiles to one unsigned-style division): they take ints or numpy integer arrays
alike, and numba compiles them unchanged for the planner's kernels. numba's on-disk cache
tracks each kernel's own file only: after editing this module, delete the `*.nbi` / `*.nbc`
files under `fcp_data/planner` so the kernels that inline these functions are recompiled.
"""

from __future__ import annotations

__all__ = [
    "CHUNKS_PER_MEMBER",
    "chunk_ids",
    "chunk_length",
    "min_degree",
    "num_chunks",
    "pad_unit",
    "padded_length",
    "shard_tokens",
]

CHUNKS_PER_MEMBER = 2
"""Each member holds two chunks (i and 2d-1-i): the causal triangle splits evenly."""


def pad_unit(tensor_parallel: int = 1, sequence_parallel: bool = False) -> int:
    """The per-chunk multiple a parallel layout needs: TP under sequence parallel, else 1."""
    return tensor_parallel if sequence_parallel else 1


def num_chunks(degree: int) -> int:
    """Chunks a sequence is cut into for a degree-d group: 2d."""
    return CHUNKS_PER_MEMBER * degree


def padded_length(seqlen: int, degree: int, unit: int = 1) -> int:
    """L padded to a multiple of 2d x unit: 21 -> 22 at d = 1, 24 at d = 2 or 3, 32 at d = 2
    with unit 4 (TP = 4 under sequence parallel)."""
    chunks = CHUNKS_PER_MEMBER * degree * unit
    return (seqlen + chunks - 1) // chunks * chunks


def chunk_length(seqlen: int, degree: int, unit: int = 1) -> int:
    """Tokens per chunk (padding included): padded_length / 2d, a multiple of `unit`."""
    chunks = CHUNKS_PER_MEMBER * degree * unit
    return (seqlen + chunks - 1) // chunks * unit


def shard_tokens(seqlen: int, degree: int, unit: int = 1) -> int:
    """Tokens one member holds of one sequence (padding included): padded_length / d.

    Summed over a group's sequences this is the memory each member needs, in tokens; the
    planner checks it against the replica's capacity and the collator allocates exactly it.
    Always a multiple of 2 x unit, so a member's packed row is a multiple of TP under
    sequence parallel.
    """
    chunks = CHUNKS_PER_MEMBER * degree * unit
    return (seqlen + chunks - 1) // chunks * CHUNKS_PER_MEMBER * unit


def min_degree(seqlen: int, capacity: int, unit: int = 1) -> int:
    """Smallest degree at which one member's shard of a sequence fits `capacity` tokens.

    `shard_tokens` = 2u * ceil(L / 2du) falls with d, so this is ceil(L / (2u * (capacity //
    2u))): L = 21 in 10 tokens needs d = 3 (8 tokens each; d = 2 gives 12). 0 when no degree
    can work (capacity < 2u: every member holds at least one unit of each of its two chunks).
    """
    chunk_capacity = capacity // (CHUNKS_PER_MEMBER * unit)
    if chunk_capacity < 1:
        return 0 * seqlen
    most = CHUNKS_PER_MEMBER * unit * chunk_capacity  # tokens of one sequence d = 1 holds
    return (seqlen + most - 1) // most


def chunk_ids(degree: int, index: int) -> tuple[int, int]:
    """The two chunks member `index` of a degree-d group holds, in local order: i, 2d-1-i."""
    return index, CHUNKS_PER_MEMBER * degree - 1 - index
