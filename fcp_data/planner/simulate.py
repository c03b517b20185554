"""Score any Plan under a cost model, independently of how it was made.

The execution model (docs/design.md): replicas run their micro-batches in wave order; a CP group
starts when all its members are free (and after any barrier wave) and occupies them for its
predicted time; the gradient all-reduce after the last wave is the only global barrier. A
replica that sits a wave out runs a placeholder micro-batch there (`Cluster.idle`
"placeholder" or "fill"; `CostModel.placeholder_seconds`) in its own order of micro-batches, so
it may delay the replica's next group; under `Cluster(sync_waves=True)` every wave ends with a
barrier. The scorer recomputes every group's time from the sequence lengths with
`CostModel.group_time`, so it checks the planner rather than trusting it. `check_plan` verifies
a plan's invariants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, PlanningError
from ..layout import shard_tokens
from .bounds import lower_bound
from .cost.cluster import Cluster
from .cost.model import CostModel
from .cost.problem import Problem
from .cost.transports import blocks_span_nodes
from .cost.vision import VisionLoad, member_units
from .cost.vision_work import VisionWork
from .plan import Plan

__all__ = ["Score", "check_plan", "lower_bound_of", "score_plan"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Score:
    """makespan: critical path (s); busy: per-replica seconds in CP groups; utilization: Σbusy /
    (N · makespan); lower_bound and ratio = makespan / lower_bound; idle_slots: (replica, wave)
    slots without a group (each runs a placeholder unless `Cluster(idle="empty")`)."""

    makespan: float
    busy: np.ndarray
    utilization: float
    lower_bound: float
    ratio: float
    group_times: list[float]
    idle_slots: int = 0


def lower_bound_of(
    seqlens: Sequence[int] | np.ndarray,
    cluster: Cluster,
    cost: CostModel,
    *,
    causal: bool | Sequence[bool] | np.ndarray = True,
    exclude: Sequence[int] = (),
    vision: VisionWork | None = None,
) -> float:
    """max(total work / Σ speed, the longest sequence's best time); see bounds.lower_bound."""
    prob = Problem.build(seqlens, cluster, cost, causal=causal)
    if vision is not None and cost.vision is not None:
        load = VisionLoad.build(vision, cost.vision, prob.lens)
        prob = Problem.build(seqlens, cluster, cost, causal=causal, vision=load)
    keep = np.ones(prob.lens.size, dtype=bool)
    keep[list(exclude)] = False
    keep &= prob.dmin > 0
    return lower_bound(prob, np.flatnonzero(keep))


def _causal_array(causal: bool | Sequence[bool] | np.ndarray, n: int) -> np.ndarray:
    c = np.asarray(causal)
    return np.full(n, bool(c)) if c.ndim == 0 else c.astype(bool)


def _vision_seconds(load: VisionLoad, lens: np.ndarray, ids: list[int], degree: int) -> float:
    """The busiest member's vision time: per member, Σ seconds per unit × units it holds."""
    per_member = np.zeros(degree)
    for i in ids:
        if load.unit_s[i] > 0:
            per_member += load.unit_s[i] * member_units(load.work, i, int(lens[i]), degree)
    return float(per_member.max())


def score_plan(
    plan: Plan,
    seqlens: Sequence[int] | np.ndarray,
    cluster: Cluster,
    cost: CostModel,
    *,
    causal: bool | Sequence[bool] | np.ndarray = True,
    vision: VisionWork | None = None,
) -> Score:
    """Critical path of `plan`; with `vision`, each group also spends its busiest member's
    decode + encoder time for the units it holds (priced by `cost.vision`).

    Each (replica, wave) slot without a group costs the replica one placeholder micro-batch
    (`cost.placeholder_seconds(cluster)`, none under `Cluster(idle="empty")`) after its
    micro-batches of the earlier waves; `busy` and `utilization` count groups only (a
    placeholder trains nothing) and `idle_slots` counts such slots. A wave ends with a barrier
    when it is marked so or the cluster has `sync_waves`.
    """
    lens = np.asarray(seqlens, dtype=np.int64)
    caus = _causal_array(causal, lens.size)
    load = None
    if vision is not None:
        if cost.vision is None:
            raise ConfigError(
                f"score_plan(vision=...) needs a cost model with vision terms, not {cost.name!r}"
            )
        load = VisionLoad.build(vision, cost.vision, lens)
    speed = cluster.speeds()
    idle_s = cost.placeholder_seconds(cluster)
    free = np.zeros(cluster.num_replicas)
    busy = np.zeros(cluster.num_replicas)
    times: list[float] = []
    idle_slots = 0
    for wave in plan.waves:
        idle = np.ones(cluster.num_replicas, dtype=bool)
        for g in wave.groups:
            ids = list(g.sequence_ids)
            reps = list(g.replicas)
            t = cost.group_time(
                lens[ids],
                g.degree,
                causal=caus[ids],
                inter_node=cluster.spans_nodes(reps),
                speed=float(speed[reps].min()),
                blocks_inter_node=lambda u, r=reps: blocks_span_nodes(
                    r, u, cluster.replicas_per_node
                ),
                ulysses=g.ulysses,
            )
            if load is not None:
                t += _vision_seconds(load, lens, ids, g.degree) / float(speed[reps].min())
            free[reps] = free[reps].max() + t
            busy[reps] += t
            idle[reps] = False
            times.append(t)
        if cluster.prices_idle:
            free[idle] += idle_s[idle]
        idle_slots += int(idle.sum())
        if wave.barrier or cluster.sync_waves:
            free[:] = free.max()
    makespan = float(free.max())
    lower = lower_bound_of(lens, cluster, cost, causal=caus, exclude=plan.dropped, vision=vision)
    util = float(busy.sum() / (cluster.num_replicas * makespan)) if makespan > 0 else 0.0
    return Score(
        makespan=makespan,
        busy=busy,
        utilization=util,
        lower_bound=lower,
        ratio=makespan / lower if lower > 0 else 1.0,
        group_times=times,
        idle_slots=idle_slots,
    )


def check_plan(
    plan: Plan, seqlens: Sequence[int] | np.ndarray, cluster: Cluster, cost: CostModel
) -> None:
    """Raise ValueError listing every broken invariant of `plan` for these lengths.

    Memory is checked on the shard the collator allocates: Σ_k shard_tokens(s_k, d,
    cluster.pad_unit) <= capacity on every group (a 21-token sequence alone at d = 1 holds 22
    tokens; at TP = 8 under sequence parallel 32).
    """
    lens = np.asarray(seqlens, dtype=np.int64)
    cap = cost.capacity_tokens(cluster)
    unit = cluster.pad_unit
    problems: list[str] = []
    if plan.num_replicas != cluster.num_replicas:
        problems.append(
            f"plan is for {plan.num_replicas} replicas, cluster has {cluster.num_replicas}"
        )
    seen = np.zeros(lens.size, dtype=np.int64)
    for w, wave in enumerate(plan.waves):
        used: set[int] = set()
        for g in wave.groups:
            if g.degree != len(g.replicas) or g.degree < 1:
                problems.append(f"wave {w}: degree {g.degree} != {len(g.replicas)} replicas")
            if len(set(g.replicas)) != len(g.replicas):
                problems.append(f"wave {w}: duplicate replicas in {g.replicas}")
            if used & set(g.replicas):
                problems.append(
                    f"wave {w}: replicas {sorted(used & set(g.replicas))} in two groups"
                )
            used |= set(g.replicas)
            if any(not 0 <= r < cluster.num_replicas for r in g.replicas):
                problems.append(f"wave {w}: replica outside [0, {cluster.num_replicas})")
            ids = np.asarray(g.sequence_ids, dtype=np.int64)
            if ids.size == 0:
                problems.append(f"wave {w}: group on {g.replicas} runs no sequence")
                continue
            np.add.at(seen, ids, 1)
            if tuple(lens[ids].tolist()) != g.seqlens:
                problems.append(f"wave {w}: group seqlens {g.seqlens} differ from the input")
            local = int(np.sum(shard_tokens(lens[ids], g.degree, unit)))
            if local > cap:
                problems.append(
                    f"wave {w}: group on {g.replicas} holds {local} tokens per replica > {cap}"
                )
    dropped = np.asarray(plan.dropped, dtype=np.int64)
    if dropped.size:
        np.add.at(seen, dropped, 1)
    if np.any(seen != 1):
        bad = np.flatnonzero(seen != 1)[:5]
        problems.append(f"sequences {bad.tolist()} placed {seen[bad].tolist()} times (want 1)")
    if problems:
        raise PlanningError("invalid plan: " + "; ".join(problems))
