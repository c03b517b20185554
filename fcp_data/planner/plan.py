"""The Plan: what every replica agrees to run for one global batch.

A plan is pure data (msgspec Structs, frozen) so that it can be made inside a DataLoader worker,
pickled to the training process, saved as JSON for the plan viewer and compared across replicas
by its digest. Vocabulary (docs/design.md): a *replica* is one model copy; a *CP group* is the
set of replicas that run one atomic group of sequences with ring attention at some *degree*; a
*wave* is one round of concurrent CP groups; a global batch is one or more waves.
"""

from __future__ import annotations

import hashlib

import msgspec

from ..errors import ConfigError

__all__ = ["CPGroup", "Plan", "RankPlan", "Wave", "structure_digest"]


class CPGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One CP group of one wave: `degree` replicas running `sequence_ids` as one packed group.

    `ulysses` is the group's transport: u = 1 is the point-to-point ring over all `degree`
    members; u > 1 (a divisor of `degree`) is the head-parallel hybrid u x r: members at ring
    positions [j*u, (j+1)*u) exchange heads by all-to-all and the r = degree / u such blocks
    run a ring among the members with the same position in their block. The zigzag shard a
    member holds is the same for every u (position i holds chunks i and 2d-1-i).
    """

    replicas: tuple[int, ...]
    degree: int
    sequence_ids: tuple[int, ...]
    seqlens: tuple[int, ...]
    causal: tuple[bool, ...]
    predicted_time: float
    inter_node: bool = False
    ulysses: int = 1

    @property
    def ring_degree(self) -> int:
        """r = degree / ulysses: the members of the ring part of the transport."""
        return self.degree // self.ulysses

    @property
    def num_tokens(self) -> int:
        return sum(self.seqlens)


class Wave(msgspec.Struct, frozen=True, kw_only=True):
    """One micro-batch round. `barrier` marks a wave after which every replica synchronises.

    fcp's own plans need no barrier (a group starts when its members are free) unless the
    framework imposes one: under `Cluster(sync_waves=True)` (FSDP / ZeRO-3, whose per-layer
    all-gathers span every rank) every wave is a barrier wave. The megatron-core hybrid-CP
    baseline puts a barrier after each of its groups and is scored so.
    """

    groups: tuple[CPGroup, ...]
    barrier: bool = False


class RankPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One replica's view of one wave: what `fcp_exec.cp_context` and the collator consume.

    A replica that has no group in a wave gets an *empty* RankPlan (`degree == 0`). It still
    yields one micro-batch per wave and knows which one closes the global batch (`wave ==
    num_waves - 1`): by default the loader's placeholder (2 x pad-unit loss-free tokens at
    degree 1, which the plan's predicted time counts; `Cluster.idle`), or a zero-token one that
    waits for no one under `idle="empty"`.
    """

    replica: int
    wave: int
    num_waves: int
    group_replicas: tuple[int, ...]
    index_in_group: int
    degree: int
    sequence_ids: tuple[int, ...]
    seqlens: tuple[int, ...]
    causal: tuple[bool, ...]
    predicted_time: float
    digest: str
    ulysses: int = 1

    @property
    def ring_degree(self) -> int:
        """r = degree / ulysses (0 for an empty RankPlan)."""
        return self.degree // self.ulysses if self.degree else 0

    @property
    def is_empty(self) -> bool:
        return self.degree == 0

    @property
    def is_last_wave(self) -> bool:
        return self.wave == self.num_waves - 1


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """The plan of one global batch.

    `predicted_time` is the critical path under the execution model: waves are scanned in order,
    a group starts when all its members are free (after any barrier) and occupies them for its
    predicted time, a replica that sits a wave out runs its placeholder micro-batch there
    (unless `Cluster(idle="empty")`); the gradient all-reduce after the last wave is the only
    global barrier unless `Cluster(sync_waves=True)` puts one after every wave.
    `candidates` holds every candidate's predicted time, `winner` the one kept. `dropped` lists
    sequence ids that a drop policy removed (too long for the whole cluster); they are counted,
    never silently lost. `digest` hashes the structure (see `structure_digest`).
    """

    num_replicas: int
    waves: tuple[Wave, ...]
    predicted_time: float
    lower_bound: float
    strategy: str
    winner: str
    candidates: dict[str, float] = {}
    dropped: tuple[int, ...] = ()
    digest: str = ""

    # ---- views -------------------------------------------------------------------------
    @property
    def num_waves(self) -> int:
        return len(self.waves)

    @property
    def groups(self) -> list[CPGroup]:
        return [g for w in self.waves for g in w.groups]

    @property
    def degrees(self) -> list[int]:
        return [g.degree for g in self.groups]

    @property
    def ratio_to_bound(self) -> float:
        return self.predicted_time / self.lower_bound if self.lower_bound > 0 else 1.0

    def sequence_ids(self) -> list[int]:
        return [s for g in self.groups for s in g.sequence_ids]

    def for_replica(self, replica: int, wave: int) -> RankPlan:
        """The RankPlan of `replica` in `wave` (an empty one when the replica sits it out)."""
        if not 0 <= replica < self.num_replicas:
            raise ConfigError(
                f"replica={replica} is outside [0, {self.num_replicas}) for this plan"
            )
        if not 0 <= wave < self.num_waves:
            raise ConfigError(f"wave={wave} is outside [0, {self.num_waves}) for this plan")
        for g in self.waves[wave].groups:
            if replica in g.replicas:
                return RankPlan(
                    replica=replica,
                    wave=wave,
                    num_waves=self.num_waves,
                    group_replicas=g.replicas,
                    index_in_group=g.replicas.index(replica),
                    degree=g.degree,
                    sequence_ids=g.sequence_ids,
                    seqlens=g.seqlens,
                    causal=g.causal,
                    predicted_time=g.predicted_time,
                    digest=self.digest,
                    ulysses=g.ulysses,
                )
        return RankPlan(
            replica=replica,
            wave=wave,
            num_waves=self.num_waves,
            group_replicas=(),
            index_in_group=-1,
            degree=0,
            sequence_ids=(),
            seqlens=(),
            causal=(),
            predicted_time=0.0,
            digest=self.digest,
        )

    def rank_plans(self, replica: int) -> list[RankPlan]:
        """Every wave's RankPlan for one replica, in order."""
        return [self.for_replica(replica, w) for w in range(self.num_waves)]

    # ---- serialisation -----------------------------------------------------------------
    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    def to_msgpack(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> Plan:
        return msgspec.json.decode(data, type=cls)

    @classmethod
    def from_msgpack(cls, data: bytes) -> Plan:
        return msgspec.msgpack.decode(data, type=cls)

    def with_digest(self) -> Plan:
        return msgspec.structs.replace(self, digest=structure_digest(self))


def structure_digest(plan: Plan) -> str:
    """A stable hex digest of what the replicas must agree on.

    It covers the replica count and, per wave, each group's replicas, sequence ids, lengths,
    causal flags and barrier flag: the structure that decides who talks to whom and who loads
    what. A group's transport (`ulysses` > 1) is appended to its entry only when it is not the
    ring, so a ring-only plan keeps the digest it had before transports existed. Predicted
    times are floats that may differ in the last bit between machines (FMA, numba versions), so
    they are left out: two replicas with the same structure run the same collectives.
    """
    payload = [
        plan.num_replicas,
        [
            [
                w.barrier,
                [
                    [g.replicas, g.sequence_ids, g.seqlens, g.causal]
                    + ([g.ulysses] if g.ulysses != 1 else [])
                    for g in w.groups
                ],
            ]
            for w in plan.waves
        ],
        plan.dropped,
    ]
    return hashlib.blake2b(msgspec.msgpack.encode(payload), digest_size=16).hexdigest()
