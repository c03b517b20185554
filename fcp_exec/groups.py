"""Replica -> global rank mapping and a bounded cache of CP process groups.

A plan speaks of replicas (model copies); a process group needs global ranks. Under
megatron-core's default order "tp-cp-ep-dp-pp" with the DP x CP domain seen as N replicas,
replica n's (tp_rank, pp_rank) device is global rank tp_rank + TP*n + TP*N*pp_rank, so the CP
group of a ring is, for each (tp_rank, pp_rank), the same TP/PP position on every member.

`dist.new_group` is collective over the whole world: every rank must create every group, in the
same order, or the job deadlocks. Every replica holds the full plan, so `CPGroupCache.prepare`
takes all rings of a wave and creates whatever is missing in plan order; since all ranks make
the same calls, their LRU states (and hence evictions, which destroy the group) stay identical.
Creating a gloo group of 2-5 ranks costs a few ms on one host; a cache hit is a dict lookup.

Under TP x PP a ring needs TP x PP CP groups plus PP TP x CP groups, so one global batch at
TP = 8 can need ~100 groups. A group with the hybrid transport u x r (`CPGroup.ulysses` = u > 1)
also needs its r all-to-all blocks of u members at every (tp_rank, pp_rank): r x TP x PP more
(for u = d the block is the CP group itself, so none), and, for 1 < u < d, its u rings of r
members (the ring's P2P runs on the ring's own group, never the world's): u x TP x PP more.
`prepare_plan` pins every group of the batch (and `prepare` those of the wave in flight):
eviction only ever takes groups of earlier batches, so a group is never destroyed between its
creation and its use. Under megatron's pipeline schedule all groups of a batch must exist before
the schedule runs (creating one inside a stage's forward deadlocks the stages that are waiting
in send/recv), which is what `prepare_plan` is for.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from fcp_data.errors import ConfigError
from fcp_exec.runtime import ExecRuntime

if TYPE_CHECKING:  # the planner package costs ~2 s to import (numba); types only
    from fcp_data.planner.plan import Plan

__all__ = ["CPGroupCache", "ReplicaRanks", "wave_specs"]


@dataclass(kw_only=True, slots=True, frozen=True)
class ReplicaRanks:
    """How replicas sit in the global rank space (megatron-core order, TP fastest, PP slowest)."""

    world_size: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "tensor_parallel", "pipeline_parallel"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name}={v!r} must be an integer >= 1")
        per = self.tensor_parallel * self.pipeline_parallel
        if self.world_size % per:
            raise ConfigError(
                f"world_size={self.world_size} is not a multiple of TP*PP="
                f"{self.tensor_parallel}*{self.pipeline_parallel}; fix the parallel sizes"
            )

    @property
    def num_replicas(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)

    def global_rank(self, replica: int, tp_rank: int = 0, pp_rank: int = 0) -> int:
        if not 0 <= replica < self.num_replicas:
            raise ConfigError(f"replica={replica} outside [0, {self.num_replicas})")
        tp = self.tensor_parallel
        return tp_rank + tp * replica + tp * self.num_replicas * pp_rank

    def position(self, global_rank: int) -> tuple[int, int, int]:
        """(replica, tp_rank, pp_rank) of a global rank."""
        tp, n = self.tensor_parallel, self.num_replicas
        return (global_rank // tp) % n, global_rank % tp, global_rank // (tp * n)

    def ring(self, replicas: Sequence[int], global_rank: int) -> tuple[int, ...]:
        """Global ranks, in ring order, of the CP group `global_rank` belongs to."""
        _, tp_rank, pp_rank = self.position(global_rank)
        return tuple(self.global_rank(r, tp_rank, pp_rank) for r in replicas)

    def tp_cp_ranks(self, replicas: Sequence[int], global_rank: int) -> tuple[int, ...]:
        """Global ranks of the combined TP x CP group (every TP rank of every member)."""
        _, _, pp_rank = self.position(global_rank)
        return tuple(
            sorted(
                self.global_rank(r, t, pp_rank)
                for r in replicas
                for t in range(self.tensor_parallel)
            )
        )

    def all_rank_sets(self, replicas: Sequence[int], ulysses: int = 1) -> list[tuple[int, ...]]:
        """Every CP, TP x CP and (u > 1) all-to-all block and r-ring rank tuple of a group, in a
        fixed order (for collective creation). Block j is ring positions j*u .. j*u+u-1 at
        every (tp_rank, pp_rank): r blocks per TP x PP position, none when u = 1; ring m is
        positions m, m+u, ...: u rings per position when 1 < u < d (their P2P runs on them)."""
        if ulysses < 1 or len(replicas) % ulysses:
            raise ConfigError(
                f"ulysses={ulysses} does not divide the degree {len(replicas)} of group "
                f"{tuple(replicas)}; the plan is corrupt"
            )
        out: list[tuple[int, ...]] = []
        for pp in range(self.pipeline_parallel):
            for t in range(self.tensor_parallel):
                out.append(tuple(self.global_rank(r, t, pp) for r in replicas))
            if self.tensor_parallel > 1:
                out.append(self.tp_cp_ranks(replicas, self.global_rank(replicas[0], 0, pp)))
            if ulysses > 1:
                for t in range(self.tensor_parallel):
                    for j in range(0, len(replicas), ulysses):
                        block = replicas[j : j + ulysses]
                        out.append(tuple(self.global_rank(r, t, pp) for r in block))
            if 1 < ulysses < len(replicas):  # the r-rings carry the ring's P2P
                for t in range(self.tensor_parallel):
                    for m in range(ulysses):
                        out.append(tuple(self.global_rank(r, t, pp) for r in replicas[m::ulysses]))
        return out


# A group to prepare: its replicas (a ring, u = 1) or a `CPGroup` (`.replicas`, `.ulysses`).
GroupSpec = Any


@dataclass(frozen=True, slots=True)
class _Spec:
    replicas: tuple[int, ...]
    ulysses: int = 1


def wave_specs(
    wave_groups: Sequence[Sequence[int]], wave_ulysses: Sequence[int] | None = None
) -> list[GroupSpec]:
    """A wave's groups as `prepare` takes them: replica tuples with their transport (u) when
    `wave_ulysses` gives one per group (a micro-batch's `wave_ulysses`), else rings."""
    if not wave_ulysses:
        return [tuple(int(r) for r in g) for g in wave_groups]
    if len(wave_ulysses) != len(wave_groups):
        raise ConfigError(
            f"wave_ulysses has {len(wave_ulysses)} entries for {len(wave_groups)} wave groups: "
            "pass the micro-batch's own wave_groups and wave_ulysses together"
        )
    return [_Spec(tuple(int(r) for r in g), int(u)) for g, u in zip(wave_groups, wave_ulysses)]


def _spec(group: GroupSpec) -> tuple[tuple[int, ...], int]:
    if hasattr(group, "replicas"):
        return tuple(group.replicas), int(getattr(group, "ulysses", 1))
    return tuple(int(r) for r in group), 1


class CPGroupCache:
    """LRU cache of process groups keyed by their global-rank tuple; evicted groups destroyed.

    The cache is an object the training loop holds (no module state). `capacity` bounds live
    communicators: NCCL keeps buffers per communicator (tens of MB each). None (the default)
    keeps up to 64 groups of earlier batches and grows past that to hold every group of the
    batch in flight; an explicit capacity is a hard bound, and a batch that needs more raises
    ConfigError before any of its groups is used. `stats()` reports live communicators (now
    and peak), what was created and evicted, and what creating them cost. `runtime` is the
    job's `ExecRuntime` (kernel choice, communication streams) that `cp_context` hands on.
    """

    def __init__(
        self,
        ranks: ReplicaRanks,
        *,
        capacity: int | None = None,
        backend: str | None = None,
        runtime: ExecRuntime | None = None,
    ):
        if capacity is not None and (isinstance(capacity, bool) or capacity < 1):
            raise ConfigError(f"capacity={capacity!r}: the cache must hold at least one group")
        self.ranks = ranks
        self.capacity = capacity
        self.backend = backend
        self._groups: OrderedDict[tuple[int, ...], dist.ProcessGroup] = OrderedDict()
        self._plan_pins: frozenset[tuple[int, ...]] = frozenset()
        self._wave_pins: frozenset[tuple[int, ...]] = frozenset()
        self._dp_groups: dict[tuple[int, ...], dist.ProcessGroup] | None = None
        self.created = 0
        self.evicted = 0
        self.create_seconds = 0.0
        self.peak_live = 0
        self.runtime = runtime if runtime is not None else ExecRuntime()

    def __len__(self) -> int:
        return len(self._groups)

    def stats(self) -> dict[str, float]:
        """Live communicators now and at most so far (the bound: `capacity`, else 64 plus the
        batch in flight), groups created and evicted, seconds spent creating them."""
        return {
            "live": len(self._groups),
            "peak_live": self.peak_live,
            "capacity": self.capacity if self.capacity is not None else 64,
            "created": self.created,
            "evicted": self.evicted,
            "create_seconds": self.create_seconds,
        }

    def __contains__(self, ranks: Sequence[int]) -> bool:
        return tuple(sorted(ranks)) in self._groups

    def prepare(self, rings: Iterable[GroupSpec]) -> None:
        """Create the groups of these rings (replica indices, or `CPGroup`s, whose u > 1 adds
        the all-to-all block groups) that are missing. COLLECTIVE: every rank must call it with
        the same rings in the same order (e.g. all of a wave's `CPGroup`s)."""
        keys = self._keys(rings)
        self._wave_pins = frozenset(keys)
        self._check_fits(self._plan_pins | self._wave_pins, "one wave and its batch")
        for key in keys:
            self._touch_or_create(key)

    def prepare_plan(self, plan: Plan) -> None:
        """Create every group of a global-batch `fcp_data.planner.Plan` (all waves, in order)
        and pin them until the next `prepare_plan`. COLLECTIVE. Call it before the first
        micro-batch of the batch (before megatron's pipeline schedule runs); raises
        ConfigError when an explicit capacity cannot hold the batch's groups."""
        if plan.num_replicas != self.ranks.num_replicas:
            raise ConfigError(
                f"the plan is for {plan.num_replicas} replicas but the ranks hold "
                f"{self.ranks.num_replicas} (world {self.ranks.world_size} / TP "
                f"{self.ranks.tensor_parallel} / PP {self.ranks.pipeline_parallel}); build the "
                "Cluster with num_replicas = world_size // (TP * PP)"
            )
        self._pin_batch([list(wave.groups) for wave in plan.waves])

    def prepare_batch(self, micro_batches: Sequence[Any]) -> None:
        """`prepare_plan` from one global batch's micro-batches (each carries its wave's
        `wave_groups`): what a training loop holds when it runs megatron's pipeline schedule
        over a batch. COLLECTIVE: every rank passes its own micro-batches of the same batch.
        A micro-batch's transports come from `wave_ulysses` (one u per wave group) when it has
        them; without them every group is a ring, and a micro-batch whose own RankPlan says
        u > 1 raises ConfigError (pass prepare_plan(plan) instead)."""
        waves: dict[int, list[GroupSpec]] = {}
        for mb in micro_batches:
            groups = [tuple(g) for g in mb.wave_groups]
            us = tuple(getattr(mb, "wave_ulysses", None) or (1,) * len(groups))
            own = getattr(getattr(mb, "rank_plan", None), "ulysses", 1)
            if own != 1 and not getattr(mb, "wave_ulysses", None):
                raise ConfigError(
                    f"micro-batch of wave {mb.wave} runs u={own} but carries no wave_ulysses: "
                    "prepare its block groups with CPGroupCache.prepare_plan(plan)"
                )
            specs = [_Spec(g, u) for g, u in zip(groups, us, strict=True)]
            waves.setdefault(int(mb.wave), specs)
        missing = [w for w in range(max(waves, default=-1) + 1) if w not in waves]
        if missing:
            raise ConfigError(
                f"prepare_batch got waves {sorted(waves)} but not {missing}: pass every "
                "micro-batch of the global batch (one per wave)"
            )
        self._pin_batch([waves[w] for w in sorted(waves)])

    def _pin_batch(self, waves: list[list[GroupSpec]]) -> None:
        keys = self._keys(ring for wave in waves for ring in wave)
        self._plan_pins = frozenset(keys)
        self._wave_pins = frozenset()
        self._check_fits(self._plan_pins, "one global batch")
        for key in keys:
            self._touch_or_create(key)

    def groups_needed(self, plan: Plan) -> int:
        """Distinct process groups (CP, TP x CP and all-to-all blocks, every PP stage) one
        batch's plan needs."""
        return len(self._keys(g for wave in plan.waves for g in wave.groups))

    def _keys(self, rings: Iterable[GroupSpec]) -> list[tuple[int, ...]]:
        keys: dict[tuple[int, ...], None] = {}  # ordered, each once
        for group in rings:
            replicas, ulysses = _spec(group)
            for key in self.ranks.all_rank_sets(replicas, ulysses):
                keys[tuple(sorted(key))] = None
        return list(keys)

    def _check_fits(self, pins: frozenset[tuple[int, ...]], what: str) -> None:
        if self.capacity is not None and len(pins) > self.capacity:
            raise ConfigError(
                f"{what} needs {len(pins)} process groups (CP, TP x CP and all-to-all groups of "
                f"every ring and PP stage; TP={self.ranks.tensor_parallel}, "
                f"PP={self.ranks.pipeline_parallel}) but CPGroupCache(capacity="
                f"{self.capacity}); raise capacity to at least {len(pins)} or leave it None"
            )

    def data_parallel_group(self) -> dist.ProcessGroup | None:
        """The group of every replica at this rank's (TP rank, PP stage): the domain fcp's
        gradient sum runs over. None (the world) when TP = PP = 1. COLLECTIVE on first call
        (one `new_group` per TP x PP position, on every rank); kept for the cache's life."""
        r = self.ranks
        if r.tensor_parallel * r.pipeline_parallel == 1:
            return None
        if self._dp_groups is None:
            self._dp_groups = {}
            for pp in range(r.pipeline_parallel):
                for tp in range(r.tensor_parallel):
                    key = tuple(r.global_rank(n, tp, pp) for n in range(r.num_replicas))
                    self._dp_groups[key] = dist.new_group(list(key), backend=self.backend)
        _, tp, pp = r.position(dist.get_rank())
        key = tuple(r.global_rank(n, tp, pp) for n in range(r.num_replicas))
        return self._dp_groups[key]

    def get(self, ranks: Sequence[int]) -> dist.ProcessGroup:
        """The cached group of these global ranks; LookupError (never a hang) when missing.

        torch orders a group's members by global rank, so rings that are rotations or
        permutations of one rank set share one group (group.rank() is the sorted position).
        """
        key = tuple(sorted(ranks))
        if key not in self._groups:
            raise LookupError(
                f"no process group for global ranks {key}: call CPGroupCache.prepare(rings) "
                "with all rings of the wave on every rank before cp_context"
            )
        self._groups.move_to_end(key)
        return self._groups[key]

    def _touch_or_create(self, key: tuple[int, ...]) -> None:
        if key in self._groups:
            self._groups.move_to_end(key)
            return
        start = time.perf_counter()
        group = dist.new_group(list(key), backend=self.backend)
        self.create_seconds += time.perf_counter() - start
        self.created += 1
        self._groups[key] = group
        self.peak_live = max(self.peak_live, len(self._groups))
        bound = 64 if self.capacity is None else self.capacity
        pins = self._plan_pins | self._wave_pins
        while len(self._groups) > bound:
            victim = next((k for k in self._groups if k not in pins), None)
            if victim is None:  # only groups of the batch in flight: keep them all
                break
            old = self._groups.pop(victim)
            self.evicted += 1
            if old is not None and old != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(old)

    def clear(self) -> None:
        """Destroy every cached group (collective in the same sense as `prepare`)."""
        while self._groups:
            _, old = self._groups.popitem(last=False)
            if old is not None and old != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(old)
        self._plan_pins = self._wave_pins = frozenset()
