"""The winning Schedule turned into the public, frozen Plan: waves, groups, digest.

Kept above the strategies (which produce Schedules and never import `plan`) so that the
planner's rooms import downwards only: api -> assemble -> strategies, cost, plan.
"""

from __future__ import annotations

from .cost.problem import Problem
from .plan import CPGroup, Plan, Wave
from .strategies.schedule import Schedule

__all__ = ["to_plan"]


def to_plan(
    sch: Schedule,
    prob: Problem,
    *,
    strategy: str,
    candidates: dict[str, float],
    lower: float,
    dropped: tuple[int, ...] = (),
) -> Plan:
    """Waves by the rule wave(g) = 1 + max wave of the previous group on any member (see
    `wave_index`); under `Cluster(sync_waves=True)` every wave is a barrier wave."""
    wave_of, barriers = sch.wave_index(prob.num_replicas)
    num_waves = int(wave_of.max()) + 1 if wave_of.size else 0
    waves: list[list[CPGroup]] = [[] for _ in range(num_waves)]
    barrier_wave = [prob.sync or w in barriers for w in range(num_waves)]
    flat, bounds = sch.sorted_members(prob.lens)
    ids_l, lens_l, causal_l = (
        flat.tolist(),
        prob.lens[flat].tolist(),
        prob.causal[flat].tolist(),
    )
    times_l = sch.times.tolist()
    if sch.replica_sets is None:
        transports = prob.group_transports(sch.starts, sch.degs, sch.units, sch.unit_group).tolist()
    elif prob.cost.has_transports:
        transports = [prob.set_transport(m, r)[1] for m, r in zip(sch.members(), sch.replica_sets)]
    else:
        transports = [1] * sch.starts.size
    for g, w in enumerate(wave_of.tolist()):
        reps = sch.replicas(g)
        a, b = bounds[g], bounds[g + 1]
        rl = reps.tolist()
        waves[w].append(
            CPGroup(
                replicas=tuple(rl),
                degree=len(rl),
                sequence_ids=tuple(ids_l[a:b]),
                seqlens=tuple(lens_l[a:b]),
                causal=tuple(causal_l[a:b]),
                predicted_time=times_l[g],
                inter_node=rl[0] // prob.replicas_per_node != rl[-1] // prob.replicas_per_node
                if sch.replica_sets is None
                else prob.cluster.spans_nodes(rl),
                ulysses=int(transports[g]),
            )
        )
    plan = Plan(
        num_replicas=prob.num_replicas,
        waves=tuple(
            Wave(groups=tuple(sorted(gs, key=lambda x: x.replicas[0])), barrier=b)
            for gs, b in zip(waves, barrier_wave)
        ),
        predicted_time=float(sch.makespan),
        lower_bound=float(lower),
        strategy=strategy,
        winner=sch.name,
        candidates={k: float(v) for k, v in candidates.items()},
        dropped=dropped,
    )
    return plan.with_digest()
