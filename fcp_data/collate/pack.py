"""THD packing of one replica's shard of a CP group's sequences.

Labels are shifted on the *unsharded* sequence (labels[t] = tokens[t+1]) before it is cut into
zigzag chunks, so the last token of chunk i still predicts the first token of chunk i+1 even
though that token lives on another replica. The last real token of a sequence and every padding
slot get `ignore_index` and loss-mask 0: a sequence of L tokens contributes exactly L-1 loss
tokens wherever its chunks land. Position ids are global positions (RoPE must see where a token
sits in the whole sequence, not in the shard).

cu_seqlens follow Transformer Engine's THD+CP convention: `cu_seqlens` / `cu_seqlens_padded`
describe the *unsharded* sequences (real and padded lengths); TE divides the padded offsets by
the CP size itself. The local offsets (`local_cu_seqlens_padded` = padded / d) index this
replica's packed buffer; `local_cu_seqlens` counts the real tokens each sequence has here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import layout
from ..errors import ConfigError
from .zigzag import chunk_bounds, padded_seqlen

__all__ = ["IGNORE_INDEX", "PackedShard", "pack_shard", "shifted_labels"]

IGNORE_INDEX = -100
"""Label of tokens out of the loss (PyTorch's cross-entropy default `ignore_index`)."""


@dataclass(kw_only=True, slots=True)
class PackedShard:
    """One replica's packed THD buffers (numpy; `MicroBatch` turns them into tensors)."""

    tokens: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray
    local_cu_seqlens: np.ndarray
    local_cu_seqlens_padded: np.ndarray
    max_seqlen: int
    local_max_seqlen: int
    global_positions: tuple[np.ndarray, ...]
    """Per sequence, the global positions held here in local order (vision needs them)."""


def shifted_labels(
    tokens: np.ndarray, padded_len: int, ignore_index: int = IGNORE_INDEX
) -> np.ndarray:
    """Labels of a padded sequence: next token for positions 0..L-2, `ignore_index` after."""
    n = len(tokens)
    if padded_len < n:
        raise ConfigError(f"padded_len={padded_len} is shorter than the sequence ({n} tokens)")
    labels = np.full(padded_len, ignore_index, dtype=np.int64)
    if n > 1:
        labels[: n - 1] = tokens[1:]
    return labels


def pack_shard(
    sequences: Sequence[np.ndarray],
    *,
    degree: int,
    index: int,
    pad_id: int = 0,
    ignore_index: int = IGNORE_INDEX,
    masked: Sequence[bool] | None = None,
    targets: Sequence[np.ndarray | None] | None = None,
    unit: int = 1,
) -> PackedShard:
    """Pad, label, zigzag-shard and concatenate a CP group's sequences for replica `index`.

    `masked[k]` takes sequence k out of the loss entirely (a sample that failed to read and
    stands in as padding so the plan's shapes still hold). `targets[k]` (bool per token, or
    None for all) says which tokens may be predicted: label t is kept only when token t+1 is a
    target, so vision placeholders and template tokens can be left out of the loss. `unit`
    is the layout's per-chunk multiple (`Cluster.pad_unit`: TP under sequence parallel), so
    every sequence is padded to a multiple of 2 x degree x unit.
    """
    n = len(sequences)
    lens = np.array([len(s) for s in sequences], dtype=np.int64)
    if n and lens.min() < 1:
        k = int(np.argmin(lens))
        raise ConfigError(f"sequence {k} is empty; every sequence needs >= 1 token")
    plens = np.array([padded_seqlen(int(L), degree, unit) for L in lens], dtype=np.int64)
    local = layout.shard_tokens(lens, degree, unit)  # what the planner's memory check counted
    offs = np.concatenate([[0], np.cumsum(local)])
    total = int(offs[-1])
    # Preallocated outputs filled chunk by chunk with slices: no per-sequence padded copy and
    # no fancy indexing (3-4x faster than gathering by shard_indices on 30k-token sequences).
    tokens = np.empty(total, dtype=np.int64)
    labels = np.empty(total, dtype=np.int64)
    loss_mask = np.zeros(total, dtype=np.float32)
    positions = np.empty(total, dtype=np.int64)
    local_real = np.zeros(n, dtype=np.int64)
    held: list[np.ndarray] = []
    for k, seq in enumerate(sequences):
        L, P, o = int(lens[k]), int(plens[k]), int(offs[k])
        if not getattr(seq, "lazy_slices", False):  # a token-store view slices itself
            seq = np.asarray(seq)
        keep_loss = masked is None or not masked[k]
        tg = None if targets is None else targets[k]
        if tg is not None and len(tg) != L:
            raise ConfigError(f"targets of sequence {k} have {len(tg)} flags for {L} tokens")
        for a0, a1 in chunk_bounds(P, degree, index):
            w = a1 - a0
            positions[o : o + w] = np.arange(a0, a1)
            r = max(0, min(a1, L) - a0)  # real tokens in this chunk
            tokens[o : o + r] = seq[a0 : a0 + r]
            tokens[o + r : o + w] = pad_id
            q = max(0, min(a1, L - 1) - a0) if keep_loss else 0  # tokens with a next token
            labels[o : o + q] = seq[a0 + 1 : a0 + 1 + q]
            labels[o + q : o + w] = ignore_index
            loss_mask[o : o + q] = 1.0
            if tg is not None and q:
                drop = ~np.asarray(tg[a0 + 1 : a0 + 1 + q], dtype=bool)
                labels[o : o + q][drop] = ignore_index
                loss_mask[o : o + q][drop] = 0.0
            local_real[k] += r
            o += w
        held.append(positions[int(offs[k]) : int(offs[k + 1])])

    def cum(x: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(x)]).astype(np.int32)

    return PackedShard(
        tokens=tokens,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=positions,
        cu_seqlens=cum(lens),
        cu_seqlens_padded=cum(plens),
        local_cu_seqlens=cum(local_real),
        local_cu_seqlens_padded=cum(local),
        max_seqlen=int(plens.max()) if n else 0,
        local_max_seqlen=int(local.max()) if n else 0,
        global_positions=tuple(held),
    )
