"""In-memory global batches: plan a batch you already hold, shard it per replica, put outputs back.

RL post-training (GRPO, PPO, ...) holds its global batch in memory: rollouts of prompt +
response token ids with per-token masks, advantages and log-probs. This module is the loader's
front end for such a batch; it reads no shard and talks to no process:

    batch = InMemoryBatch(token_ids, loss_mask=response_masks,
                          fields={"old_logprobs": old}, sequence_fields={"advantage": adv})
    sharded = shard_batch(batch, cluster, cost, replica=rank)   # plan_global_batch, then pack
    for mb in sharded.micro_batches:                             # one MicroBatch per wave
        ...  # the loader's layout: cp_context, fcp_exec.hf / megatron work unchanged
        mb.fields["old_logprobs"]                                # sharded like mb.labels

and after the step `fcp_exec.gather_sequences` / `fcp_exec.all_gather_sequences` turn per-token
outputs (log-probs, values, entropies) back into one tensor per original sequence, with
`unshard_group` / `unshard_replicas` below as their pure arithmetic.

**The plan.** `shard_batch` calls `plan_global_batch` on the batch's lengths, so every replica
that holds the same batch gets the same plan and digest with no collective (the planner is
pure), exactly as every DataLoader worker of `FCPDataLoader` does. Micro-batches follow the
loader bit for bit: zigzag shards packed THD (`fcp_data.collate.pack_shard`), a placeholder
(or an empty micro-batch under `Cluster(idle="empty")`) for a wave the replica sits out,
`wave_groups` / `wave_ulysses`, and `global_num_loss_tokens` counted from the plan.

**Alignment.** Every per-token input is *token-aligned*: value k belongs to token k of its
sequence, the same length as the token ids. `loss_mask` says which tokens are predicted
(the response): as in the loader, slot t of a micro-batch predicts token t+1 (`labels[t]`), so
`mb.loss_mask[t]` is the mask of token t+1 and a sequence contributes the masked tokens of
positions 1..L-1. Per-token `fields` are shifted the same way by default ("label" alignment):
`mb.fields[name][t]` is the value of token t+1, next to the model's output for it (an old
log-prob next to the new one, an advantage next to its ratio). Names in `token_aligned` are not
shifted: slot t holds the value of token t (inputs of the forward, such as token-type ids).
Padding and the last real slot of a label-aligned field hold 0 (False), always under loss mask
0. Gathering inverts both: a label-aligned output comes back as L values with value k the
output for token k (k = 0, which nothing predicts, is `fill`). `labels` is `ignore_index`
outside the loss mask, as in the loader; `mb.next_tokens` is the token each slot predicts
everywhere, to score prompts too.

Every replica validates the whole batch (not only its own sequences), so a bad input raises the
same error on every replica instead of a hang in a peer: one `np.asarray` per sequence for
Python lists (0.08 s per million ids, measured), dtype and length checks for arrays and tensors
(0.004 s per million ids).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from . import layout
from .collate import MicroBatch, pack_shard
from .errors import ConfigError, FCPError

if TYPE_CHECKING:  # types only; shard_batch imports the planner when it plans
    from .planner import Cluster, CostModel, Plan, RankPlan

__all__ = [
    "ALIGNMENTS",
    "BatchInputError",
    "InMemoryBatch",
    "InMemoryMicroBatch",
    "ShardedBatch",
    "held_positions",
    "local_num_tokens",
    "sequence_slots",
    "shard_batch",
    "shard_field",
    "unshard_group",
    "unshard_replicas",
]

Alignment = Literal["label", "token"]
ALIGNMENTS = ("label", "token")
"""label: slot t carries token t+1 (what the model predicts there); token: slot t, token t."""

_SHIFT = {"label": 1, "token": 0}


class BatchInputError(FCPError, ValueError):
    """An in-memory batch that cannot be planned: names the field, the sequence and the values.

    `field` is "tokens", "loss_mask", a field's name, or None for the batch as a whole;
    `sequence` the index of the offending sequence in the batch (None when not one sequence).
    """

    def __init__(self, message: str, *, field: str | None = None, sequence: int | None = None):
        super().__init__(message)
        self.field, self.sequence = field, sequence

    def __reduce__(self) -> tuple[Any, ...]:  # keeps field and sequence across processes
        return _rebuild_input_error, (str(self), self.field, self.sequence)


def _rebuild_input_error(message: str, field: str | None, sequence: int | None) -> BatchInputError:
    return BatchInputError(message, field=field, sequence=sequence)


# ---- input validation ----------------------------------------------------------------------
_INT_KINDS = ("i", "u")


def _token_array(seq: object, k: int) -> np.ndarray:
    """Sequence k as int64 numpy (no copy for int64 arrays and CPU tensors)."""
    if isinstance(seq, torch.Tensor):
        if seq.dtype.is_floating_point or seq.dtype.is_complex or seq.dtype == torch.bool:
            raise BatchInputError(
                f"sequence {k} has dtype {seq.dtype}: token ids must be integers "
                "(torch.int64 / int32 / ...)",
                field="tokens",
                sequence=k,
            )
        arr = seq.detach().cpu().numpy()
    else:
        try:
            arr = np.asarray(seq)
        except (TypeError, ValueError) as e:  # ragged nested lists and the like
            raise BatchInputError(
                f"sequence {k} is not a 1-D sequence of token ids ({e})",
                field="tokens",
                sequence=k,
            ) from None
        if arr.size == 0 and arr.ndim == 1:
            arr = arr.astype(np.int64)  # [] reads as float64; reported as empty below
        if arr.dtype.kind not in _INT_KINDS:
            raise BatchInputError(
                f"sequence {k} has dtype {arr.dtype} (first value {arr.reshape(-1)[:1].tolist()})"
                ": token ids must be integers, not floats, bools or strings",
                field="tokens",
                sequence=k,
            )
    if arr.ndim != 1:
        raise BatchInputError(
            f"sequence {k} has shape {tuple(arr.shape)}: token ids are one 1-D sequence per "
            "sample (concatenate prompt and response; no batch dimension)",
            field="tokens",
            sequence=k,
        )
    if arr.size == 0:
        raise BatchInputError(
            f"sequence {k} is empty: every sequence needs at least 1 token (leave empty "
            "rollouts out of the batch)",
            field="tokens",
            sequence=k,
        )
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        p = int(np.argmax(arr < 0))
        raise BatchInputError(
            f"sequence {k} has a negative token id {int(arr[p])} at position {p}",
            field="tokens",
            sequence=k,
        )
    if (
        arr.dtype.kind == "u"
        and arr.dtype.itemsize == 8
        and int(arr.max()) > np.iinfo(np.int64).max
    ):
        raise BatchInputError(
            f"sequence {k} has a token id above int64's range", field="tokens", sequence=k
        )
    return arr.astype(np.int64, copy=False)


def _per_sequence(name: str, values: Any, n: int) -> Sequence[Any]:
    if (
        isinstance(values, (str, bytes))
        or not hasattr(values, "__len__")
        or getattr(values, "ndim", 1) == 0
    ):
        raise BatchInputError(
            f"{name!r} must be a sequence with one entry per sequence (a list of arrays or "
            f"tensors), got {type(values).__name__}",
            field=name,
        )
    if len(values) != n:
        raise BatchInputError(
            f"{name!r} has {len(values)} entries for a batch of {n} sequences",
            field=name,
        )
    return values


def _as_tensor(value: object, name: str, k: int) -> torch.Tensor:
    try:
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as e:
        raise BatchInputError(
            f"field {name!r}: sequence {k} is not an array of numbers ({e})",
            field=name,
            sequence=k,
        ) from None
    if t.ndim == 0:
        raise BatchInputError(
            f"field {name!r}: sequence {k} is a scalar; a per-token field has one value per token "
            "(per-sequence values go in sequence_fields)",
            field=name,
            sequence=k,
        )
    return t


def _token_field(name: str, values: object, lens: np.ndarray) -> tuple[torch.Tensor, ...]:
    """A per-token field as one tensor per sequence: lengths, dtype and trailing shape checked."""
    entries = _per_sequence(name, values, len(lens))
    out: list[torch.Tensor] = []
    for k, v in enumerate(entries):
        t = _as_tensor(v, name, k)
        if t.shape[0] != lens[k]:
            raise BatchInputError(
                f"field {name!r}: sequence {k} has {t.shape[0]} values for {int(lens[k])} tokens",
                field=name,
                sequence=k,
            )
        if out and (t.dtype != out[0].dtype or t.shape[1:] != out[0].shape[1:]):
            raise BatchInputError(
                f"field {name!r}: sequence {k} has dtype {t.dtype} and per-token shape "
                f"{tuple(t.shape[1:])} but sequence 0 has {out[0].dtype} and "
                f"{tuple(out[0].shape[1:])}; one dtype and shape per field",
                field=name,
                sequence=k,
            )
        if out and t.device != out[0].device:
            t = t.to(out[0].device)
        out.append(t)
    return tuple(out)


def _mask(values: object, lens: np.ndarray) -> tuple[np.ndarray, ...]:
    """loss_mask as bool numpy per sequence (0/1 or bool values only)."""
    out: list[np.ndarray] = []
    for k, t in enumerate(_token_field("loss_mask", values, lens)):
        if t.ndim != 1:
            raise BatchInputError(
                f"loss_mask: sequence {k} has shape {tuple(t.shape)}; one flag per token",
                field="loss_mask",
                sequence=k,
            )
        arr = t.detach().cpu().numpy()
        if arr.dtype != np.bool_ and not np.isin(arr, (0, 1)).all():
            bad = arr[~np.isin(arr, (0, 1))][:3].tolist()
            raise BatchInputError(
                f"loss_mask: sequence {k} has values {bad}; a mask holds 0/1 or bools (weights "
                "per token go in a field and multiply the loss)",
                field="loss_mask",
                sequence=k,
            )
        out.append(arr.astype(bool, copy=False))
    return tuple(out)


def _flag(value: object, k: int | None) -> bool:
    """One attention flag: a bool (Python, NumPy, a 0-d bool tensor) or the integer 0 / 1."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return bool(value)
    where = "causal" if k is None else f"causal[{k}]"
    raise BatchInputError(
        f"{where} is {value!r} ({type(value).__name__}); a causal flag is True / False (or 0 / "
        "1): True for causal attention, False for full attention (a string such as 'no' is "
        "not read as a flag: bool('no') is True)",
        field="causal",
        sequence=k,
    )


def _causal_flags(causal: object, shape: tuple[int, ...]) -> np.ndarray:
    """`causal` as one bool per sequence: a single flag is broadcast; every value is checked
    (np.asarray(["no", "yes"], dtype=bool) was [True, True])."""
    if isinstance(causal, (str, bytes)) or not hasattr(causal, "__len__"):
        return np.full(shape, _flag(causal, None), dtype=bool)
    if isinstance(causal, torch.Tensor):
        causal = causal.detach().cpu().numpy()
    if isinstance(causal, np.ndarray):
        if causal.ndim == 0:
            return np.full(shape, _flag(causal.item(), None), dtype=bool)
        if causal.dtype == np.bool_:
            return causal.astype(bool)
        values = causal.reshape(-1).tolist() if causal.ndim == 1 else [causal]
    else:
        values = list(causal)  # type: ignore[call-overload]
    return np.array([_flag(v, k) for k, v in enumerate(values)], dtype=bool)


def _sequence_field(name: str, values: object, n: int) -> torch.Tensor:
    entries = _per_sequence(name, values, n)
    try:
        if isinstance(entries, torch.Tensor):
            t = entries
        elif isinstance(entries, np.ndarray):
            t = torch.as_tensor(entries)
        elif all(isinstance(e, torch.Tensor) for e in entries):
            t = torch.stack(list(entries))
        else:
            t = torch.as_tensor(np.asarray(list(entries)))
    except (TypeError, ValueError, RuntimeError) as e:
        raise BatchInputError(
            f"sequence field {name!r}: its {n} entries do not form one array ({e}); give one "
            "number (or equal-shape array) per sequence",
            field=name,
        ) from None
    return t


@dataclass(frozen=True, slots=True, init=False)
class InMemoryBatch:
    """One global batch held in memory: token ids, loss mask, per-token and per-sequence fields.

    sequences: one 1-D integer sequence per sample (lists, numpy arrays, tensors), >= 1 token
    each. loss_mask: optional, one 0/1 (or bool) per token, token-aligned: 1 where the token is
    predicted and scored (the response of a rollout); default every token but the first of each
    sequence. fields: optional per-token values by name (advantages, old / reference log-probs,
    anything), each one tensor-like per sequence whose first dimension is that sequence's
    length (a trailing shape, e.g. top-k ids, is kept). token_aligned: names of `fields` not to
    shift (module docstring). sequence_fields: optional per-sequence values by name (rewards,
    group ids, a per-sequence advantage), first dimension the batch size. causal: one flag or
    one per sequence. keys: one name per sequence for messages (default "0", "1", ...).
    Validation happens here, identically on every replica: a bad input raises BatchInputError
    naming the field, the sequence index and the lengths.
    """

    tokens: tuple[np.ndarray, ...]
    seqlens: np.ndarray
    loss_mask: tuple[np.ndarray, ...] | None
    fields: dict[str, tuple[torch.Tensor, ...]]
    token_aligned: frozenset[str]
    sequence_fields: dict[str, torch.Tensor]
    causal: np.ndarray
    keys: tuple[str, ...]

    def __init__(
        self,
        sequences: Sequence[Any],
        *,
        loss_mask: Sequence[Any] | None = None,
        fields: Mapping[str, Sequence[Any]] | None = None,
        token_aligned: Collection[str] = (),
        sequence_fields: Mapping[str, Any] | None = None,
        causal: bool | Sequence[bool] | np.ndarray = True,
        keys: Sequence[str] | None = None,
    ) -> None:
        if isinstance(sequences, (str, bytes, torch.Tensor, np.ndarray)) or not hasattr(
            sequences, "__len__"
        ):
            raise BatchInputError(
                "sequences must be a list with one 1-D sequence of token ids per sample, got "
                f"{type(sequences).__name__} (split a padded [B, S] tensor into its rows first)",
                field="tokens",
            )
        if len(sequences) == 0:
            raise BatchInputError(
                "an in-memory batch needs at least one sequence, got 0", field="tokens"
            )
        toks = tuple(_token_array(s, k) for k, s in enumerate(sequences))
        lens = np.array([len(t) for t in toks], dtype=np.int64)
        n = len(toks)
        mask = None if loss_mask is None else _mask(loss_mask, lens)
        fields = dict(fields or {})
        for name in fields:
            if not isinstance(name, str) or not name:
                raise BatchInputError(f"field names must be non-empty strings, got {name!r}")
        tok_fields = {name: _token_field(name, v, lens) for name, v in fields.items()}
        unknown = sorted(set(token_aligned) - set(tok_fields))
        if unknown:
            raise BatchInputError(
                f"token_aligned names {unknown} that are not fields (fields: {sorted(tok_fields)})"
            )
        seq_fields = {
            name: _sequence_field(name, v, n) for name, v in dict(sequence_fields or {}).items()
        }
        flags = _causal_flags(causal, lens.shape)
        if flags.shape != lens.shape:
            raise BatchInputError(
                f"causal has {flags.size} flags for {n} sequences; give one flag or one per "
                "sequence",
                field="causal",
            )
        if keys is None:
            names = tuple(str(k) for k in range(n))
        else:
            names = tuple(str(k) for k in _per_sequence("keys", keys, n))
        object.__setattr__(self, "tokens", toks)
        object.__setattr__(self, "seqlens", lens)
        object.__setattr__(self, "loss_mask", mask)
        object.__setattr__(self, "fields", tok_fields)
        object.__setattr__(self, "token_aligned", frozenset(token_aligned))
        object.__setattr__(self, "sequence_fields", seq_fields)
        object.__setattr__(self, "causal", np.array(flags, dtype=bool))
        object.__setattr__(self, "keys", names)

    def __len__(self) -> int:
        return len(self.tokens)

    def loss_tokens(self, k: int) -> int:
        """Tokens sequence k contributes to the loss: masked tokens at positions 1..L-1."""
        if self.loss_mask is None:
            return int(self.seqlens[k]) - 1
        return int(self.loss_mask[k][1:].sum())

    def alignment(self, name: str) -> Alignment:
        return "token" if name in self.token_aligned else "label"


# ---- layout arithmetic ------------------------------------------------------------------------
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
    if align not in _SHIFT:
        raise ConfigError(f"align={align!r} is not one of {ALIGNMENTS}")
    held, offs = held_positions(seqlens, degree, index, unit)
    first = values[0]
    out = torch.zeros((int(offs[-1]), *first.shape[1:]), dtype=first.dtype, device=first.device)
    for k, (v, pos) in enumerate(zip(values, held)):
        src = torch.from_numpy(pos + _SHIFT[align])
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


def _check_align(align: str) -> int:
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
    shift = _check_align(align)
    if len(buffers) != degree:
        raise ValueError(f"got {len(buffers)} buffers for a degree-{degree} group; need {degree}")
    want = int(sum(layout.shard_tokens(int(L), degree, unit) for L in seqlens))
    for i, b in enumerate(buffers):
        if b.ndim < 1 or b.shape[0] != want or b.shape[1:] != buffers[0].shape[1:]:
            raise ValueError(
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
                raise ValueError(
                    f"wave {w}: no output from replicas {missing} of group {g.replicas}"
                )
            seqs = unshard_group(
                bufs, g.seqlens, degree=g.degree, unit=unit, align=align, fill=fill
            )
            for s, t in zip(g.sequence_ids, seqs):
                result[s] = t
    return result


# ---- micro-batches -----------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class InMemoryMicroBatch(MicroBatch):
    """A loader `MicroBatch` plus the batch's fields, sharded the same way.

    `fields[name]`: [T, ...] per-token values in this micro-batch's slots (label-aligned unless
    the batch lists the name in `token_aligned`); zeros on a placeholder. `sequence_fields[name]`:
    [n, ...] values of its n sequences (`sample_ids` order; n = 0 on a placeholder);
    `per_token(name)` spreads one over the sequence's slots.
    """

    fields: dict[str, torch.Tensor] = field(default_factory=dict)
    sequence_fields: dict[str, torch.Tensor] = field(default_factory=dict)
    next_tokens: torch.Tensor | None = None
    """[T] int64: the token each slot predicts, outside the loss mask too (0 on padding and
    the last real slot): `labels` without the mask, to score every token (a prompt's
    log-probs for a KL term, say), where `labels` is ignore_index outside the loss mask."""

    def per_token(self, name: str) -> torch.Tensor:
        """Sequence field `name` repeated over each sequence's slots: [T, ...] (0 on a
        placeholder), e.g. a per-sequence advantage next to every token of its sequence."""
        v = self.sequence_fields[name]
        if not self.sample_ids:
            return v.new_zeros((self.num_tokens, *v.shape[1:]))
        sizes = torch.diff(self.local_cu_seqlens_padded.to(torch.int64)).to(v.device)
        return torch.repeat_interleave(v, sizes, dim=0)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> InMemoryMicroBatch:
        """A copy with every tensor on `device`, fields included."""
        moved = MicroBatch.to(self, device, non_blocking=non_blocking)
        assert isinstance(moved, InMemoryMicroBatch)
        return replace(
            moved,
            fields={k: v.to(device, non_blocking=non_blocking) for k, v in self.fields.items()},
            sequence_fields={
                k: v.to(device, non_blocking=non_blocking) for k, v in self.sequence_fields.items()
            },
        )

    def pin_memory(self) -> InMemoryMicroBatch:
        pinned = MicroBatch.pin_memory(self)
        assert isinstance(pinned, InMemoryMicroBatch)
        return replace(
            pinned,
            fields={k: v.pin_memory() for k, v in self.fields.items()},
            sequence_fields={k: v.pin_memory() for k, v in self.sequence_fields.items()},
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardedBatch:
    """One replica's share of an in-memory batch: the plan and one micro-batch per wave.

    Every replica of the job builds its own from the same `InMemoryBatch` and gets the same
    `plan` (same `digest`). `dropped` lists the batch indices the plan left out
    (`on_too_long="drop"`); they have no micro-batch anywhere and gather back as None.
    """

    batch: InMemoryBatch
    plan: Plan
    replica: int
    cluster: Cluster
    micro_batches: tuple[InMemoryMicroBatch, ...]
    global_num_loss_tokens: int

    @property
    def digest(self) -> str:
        return self.plan.digest

    @property
    def num_waves(self) -> int:
        return self.plan.num_waves

    @property
    def dropped(self) -> tuple[int, ...]:
        return tuple(self.plan.dropped)

    @property
    def unit(self) -> int:
        return self.cluster.pad_unit

    def sequence_ids(self) -> list[int]:
        """Batch indices this replica holds a shard of, in micro-batch order."""
        return [s for mb in self.micro_batches for s in mb.rank_plan.sequence_ids]

    def with_fields(
        self,
        fields: Mapping[str, Sequence[Any]] | None = None,
        *,
        token_aligned: Collection[str] = (),
        sequence_fields: Mapping[str, Any] | None = None,
    ) -> ShardedBatch:
        """The same plan and micro-batches with more fields (validated and sharded like the
        first ones), without planning again: e.g. old log-probs computed by a first pass.
        A name already present is replaced."""
        b = self.batch
        extra = InMemoryBatch(
            list(b.tokens),
            fields=fields,
            token_aligned=token_aligned,
            sequence_fields=sequence_fields,
        )
        merged = _merged(b, extra)
        mbs = tuple(
            replace(
                mb,
                fields={**mb.fields, **_shard_fields(extra, mb, self.cluster)},
                sequence_fields={**mb.sequence_fields, **_sequence_rows(extra, mb)},
            )
            for mb in self.micro_batches
        )
        return replace(self, batch=merged, micro_batches=mbs)


def _merged(base: InMemoryBatch, extra: InMemoryBatch) -> InMemoryBatch:
    """`base` with `extra`'s fields added (same sequences)."""
    out = object.__new__(InMemoryBatch)
    for f in fields(InMemoryBatch):
        object.__setattr__(out, f.name, getattr(base, f.name))
    object.__setattr__(out, "fields", {**base.fields, **extra.fields})
    aligned = (base.token_aligned - set(extra.fields)) | extra.token_aligned
    object.__setattr__(out, "token_aligned", frozenset(aligned))
    object.__setattr__(out, "sequence_fields", {**base.sequence_fields, **extra.sequence_fields})
    return out


def _shard_fields(
    batch: InMemoryBatch, mb: MicroBatch, cluster: Cluster
) -> dict[str, torch.Tensor]:
    rp = mb.rank_plan
    out: dict[str, torch.Tensor] = {}
    for name, values in batch.fields.items():
        if rp.is_empty:  # placeholder (2 x unit zeros) or empty micro-batch (none)
            v = values[0]
            out[name] = torch.zeros((mb.num_tokens, *v.shape[1:]), dtype=v.dtype, device=v.device)
            continue
        out[name] = shard_field(
            [values[s] for s in rp.sequence_ids],
            rp.seqlens,
            degree=rp.degree,
            index=rp.index_in_group,
            unit=cluster.pad_unit,
            align=batch.alignment(name),
        )
    return out


def _next_tokens(batch: InMemoryBatch, mb: MicroBatch, cluster: Cluster) -> torch.Tensor:
    rp = mb.rank_plan
    if rp.is_empty:
        return torch.zeros(mb.num_tokens, dtype=torch.int64)
    seqs = [torch.from_numpy(batch.tokens[s]) for s in rp.sequence_ids]
    return shard_field(
        seqs,
        rp.seqlens,
        degree=rp.degree,
        index=rp.index_in_group,
        unit=cluster.pad_unit,
        align="label",
    )


def _sequence_rows(batch: InMemoryBatch, mb: MicroBatch) -> dict[str, torch.Tensor]:
    ids = torch.tensor(mb.rank_plan.sequence_ids, dtype=torch.int64)
    return {name: v[ids.to(v.device)] for name, v in batch.sequence_fields.items()}


def shard_batch(
    batch: InMemoryBatch,
    cluster: Cluster,
    cost: CostModel,
    *,
    replica: int,
    strategy: str = "fcp",
    seed: int = 0,
    on_too_long: Literal["raise", "drop"] = "raise",
    pad_id: int = 0,
    planner: Callable[..., Plan] | None = None,
) -> ShardedBatch:
    """Plan `batch` for `cluster` and build replica `replica`'s micro-batches (pure).

    Every replica calls it with the same batch and arguments and gets the same plan (digest):
    `plan_global_batch(batch.seqlens, cluster, cost, causal=batch.causal, strategy=strategy,
    seed=seed, on_too_long=on_too_long)`, or `planner` with that signature (a fixed plan in
    tests). A sequence too long for the whole cluster raises the planner's ValueError naming
    its index and length, or under on_too_long="drop" is left out and listed in `dropped`.
    The micro-batches are the loader's (`BatchBuilder`): a placeholder of 2 x pad-unit
    loss-free tokens for a wave this replica sits out (`Cluster(idle="empty")`: zero tokens),
    `global_num_loss_tokens` the masked tokens of every planned sequence.
    """
    from .planner import Wave, plan_global_batch

    if not isinstance(batch, InMemoryBatch):
        raise ConfigError(f"batch must be an InMemoryBatch, got {type(batch).__name__}")
    n_rep = cluster.num_replicas
    if (
        isinstance(replica, bool)
        or not isinstance(replica, (int, np.integer))
        or not (0 <= replica < n_rep)
    ):
        raise ConfigError(f"replica={replica!r} is outside [0, {n_rep}) for this cluster")
    if on_too_long not in ("raise", "drop"):
        raise ConfigError(f"on_too_long={on_too_long!r} is not one of ('raise', 'drop')")
    plan = (planner or plan_global_batch)(
        batch.seqlens,
        cluster,
        cost,
        causal=batch.causal,
        strategy=strategy,
        seed=seed,
        on_too_long=on_too_long,
    )
    if plan.num_replicas != n_rep:
        raise ConfigError(
            f"the planner returned a plan for {plan.num_replicas} replicas; the cluster has {n_rep}"
        )
    if plan.num_waves == 0:  # every sequence dropped: one empty wave, as the loader does
        import msgspec

        plan = msgspec.structs.replace(plan, waves=(Wave(groups=()),)).with_digest()
    placed = plan.sequence_ids()
    global_loss = sum(batch.loss_tokens(s) for s in placed)
    unit = cluster.pad_unit
    mbs: list[InMemoryMicroBatch] = []
    for w in range(plan.num_waves):
        rp = plan.for_replica(int(replica), w)
        common: dict[str, Any] = {
            "global_num_loss_tokens": global_loss,
            "wave_groups": tuple(g.replicas for g in plan.waves[w].groups),
        }
        if rp.is_empty and cluster.idle == "empty":
            mb = InMemoryMicroBatch.empty(rp, **common)
        elif rp.is_empty:
            mb = InMemoryMicroBatch.placeholder(rp, unit=unit, pad_id=pad_id, **common)
        else:
            packed = pack_shard(
                [batch.tokens[s] for s in rp.sequence_ids],
                degree=rp.degree,
                index=rp.index_in_group,
                pad_id=pad_id,
                targets=None
                if batch.loss_mask is None
                else [batch.loss_mask[s] for s in rp.sequence_ids],
                unit=unit,
            )
            mb = InMemoryMicroBatch.from_packed(
                packed,
                rank_plan=rp,
                sample_ids=tuple(rp.sequence_ids),
                keys=tuple(batch.keys[s] for s in rp.sequence_ids),
                **common,
            )
        assert isinstance(mb, InMemoryMicroBatch)
        us = tuple(g.ulysses for g in plan.waves[w].groups)
        if any(u != 1 for u in us):  # head-parallel groups: the cache needs their blocks too
            mb.wave_ulysses = us
        mb.fields = _shard_fields(batch, mb, cluster)
        mb.next_tokens = _next_tokens(batch, mb, cluster)
        mb.sequence_fields = _sequence_rows(batch, mb)
        mbs.append(mb)
    return ShardedBatch(
        batch=batch,
        plan=plan,
        replica=int(replica),
        cluster=cluster,
        micro_batches=tuple(mbs),
        global_num_loss_tokens=global_loss,
    )
