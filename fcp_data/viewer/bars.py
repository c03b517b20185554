"""Bars on a replica x time chart, under the planner simulator's execution model.

A CP group starts when all its members are free and occupies them for its predicted time; a
replica that sits a wave out spends one placeholder micro-batch there (no bar: it trains
nothing; none under `Cluster(idle="empty")`); a barrier wave, or every wave under
`Cluster(sync_waves=True)`, synchronises every replica (see fcp_data.planner.simulate). Bars
start exactly when the simulator starts their groups, so the last bar's end is the plan's
simulated makespan (the tests check it against `score_plan`) unless a trailing placeholder,
about one beta1, ends later.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..planner import Cluster, CostModel, Plan
from ..planner.cost.transports import blocks_span_nodes

__all__ = ["Bar", "WaveSpan", "timeline", "wave_spans"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Bar:
    """One CP group on the timeline (the simulator's start time and predicted duration)."""

    wave: int
    replicas: tuple[int, ...]
    degree: int
    num_sequences: int
    tokens: int
    start: float
    duration: float
    ulysses: int = 1  # the group's transport: 1 the ring, u > 1 the hybrid u x (degree / u)

    @property
    def transport(self) -> str:
        """ "ring", or "u×r" for the head-parallel hybrid (all-to-all over u, ring over r)."""
        return "ring" if self.ulysses == 1 else f"{self.ulysses}×{self.degree // self.ulysses}"

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(kw_only=True, slots=True, frozen=True)
class WaveSpan:
    """When one wave runs: from its first group's start to its last group's end."""

    wave: int
    start: float
    end: float
    barrier: bool


def timeline(
    plan: Plan, seqlens: np.ndarray, cluster: Cluster, cost: CostModel, causal: np.ndarray
) -> tuple[list[Bar], list[float]]:
    """Bars of every CP group and the times of the barriers (one per barrier wave)."""
    speed = cluster.speeds()
    idle_s = cost.placeholder_seconds(cluster)
    free = np.zeros(cluster.num_replicas)
    bars: list[Bar] = []
    barriers: list[float] = []
    for w, wave in enumerate(plan.waves):
        idle = np.ones(cluster.num_replicas, dtype=bool)
        for g in wave.groups:
            ids, reps = list(g.sequence_ids), list(g.replicas)
            t = cost.group_time(
                seqlens[ids],
                g.degree,
                causal=causal[ids],
                inter_node=cluster.spans_nodes(reps),
                speed=float(speed[reps].min()),
                blocks_inter_node=lambda u, r=reps: blocks_span_nodes(
                    r, u, cluster.replicas_per_node
                ),
                ulysses=g.ulysses,
            )
            start = float(free[reps].max())
            free[reps] = start + t
            idle[reps] = False
            bars.append(
                Bar(
                    wave=w,
                    replicas=tuple(reps),
                    degree=g.degree,
                    num_sequences=len(ids),
                    tokens=g.num_tokens,
                    start=start,
                    duration=t,
                    ulysses=g.ulysses,
                )
            )
        free[idle] += idle_s[idle]
        if wave.barrier or cluster.sync_waves:
            free[:] = free.max()
            barriers.append(float(free.max()))
    return bars, barriers


def wave_spans(plan: Plan, bars: list[Bar]) -> list[WaveSpan]:
    """One span per non-empty wave, in wave order (spans of barrier-free waves may overlap)."""
    spans: list[WaveSpan] = []
    for w, wave in enumerate(plan.waves):
        mine = [b for b in bars if b.wave == w]
        if mine:
            spans.append(
                WaveSpan(
                    wave=w,
                    start=min(b.start for b in mine),
                    end=max(b.end for b in mine),
                    barrier=wave.barrier,
                )
            )
    return spans
