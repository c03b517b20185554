"""One replica's share of an in-memory batch: plan it, then build its micro-batches.

`shard_batch` plans the batch's lengths with `plan_global_batch` (pure: every replica that
holds the same batch gets the same plan and digest with no collective) and packs this
replica's micro-batches exactly as the loader's `BatchBuilder` does: zigzag shards packed THD,
a placeholder (or an empty micro-batch under `Cluster(idle="empty")`) for a wave the replica
sits out, `wave_groups` / `wave_ulysses`, `global_num_loss_tokens` counted from the plan. The
batch's fields ride along in the same slots (`fcp_data.collate.unshard.shard_field`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ..collate import MicroBatch, pack_shard
from ..collate.unshard import shard_field
from ..errors import ConfigError
from .batch import InMemoryBatch

if TYPE_CHECKING:  # types only; shard_batch imports the planner when it plans
    from ..planner import Cluster, CostModel, Plan

__all__ = ["InMemoryMicroBatch", "ShardedBatch", "shard_batch"]


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
    from ..planner import Wave, plan_global_batch

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
