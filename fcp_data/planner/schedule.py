"""The schedule form every candidate produces, its score, and its turn into a Plan.

A `Schedule` is the candidate-neutral result: CP groups in execution order, each a contiguous
window of replicas (start, degree) running a set of sequences. Its makespan is the critical
path of docs/design.md; `to_plan` turns the winner into the public, frozen Plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kernels import critical_path
from .plan import CPGroup, Plan, Wave
from .problem import Problem

__all__ = ["Schedule"]


@dataclass(slots=True)
class Schedule:
    """CP groups in execution order: windows (start, degree) and the sequences each runs.

    Sequences are kept flat: `units[i]` runs in group `unit_group[i]` (no per-group arrays on the
    hot path; `members()` splits them when a plan is built).
    """

    name: str
    starts: np.ndarray
    degs: np.ndarray
    units: np.ndarray
    unit_group: np.ndarray
    barrier_after: list[bool] | None = None
    replica_sets: list[np.ndarray] | None = None
    times: np.ndarray = field(init=False)
    makespan: float = field(init=False)

    def members(self) -> list[np.ndarray]:
        srt = np.argsort(self.unit_group, kind="stable")
        counts = np.bincount(self.unit_group, minlength=self.starts.size)
        return np.split(self.units[srt], np.cumsum(counts)[:-1])

    def _sorted_members(self, lens: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """All units as one array, group by group, each group longest first (ties by id), and
        the group boundaries: one sort instead of one per group."""
        srt = np.lexsort((self.units, -lens[self.units], self.unit_group))
        counts = np.bincount(self.unit_group, minlength=self.starts.size)
        return self.units[srt], np.concatenate([[0], np.cumsum(counts)]).tolist()

    def replicas(self, g: int) -> np.ndarray:
        if self.replica_sets is not None:
            return self.replica_sets[g]
        s = int(self.starts[g])
        return np.arange(s, s + int(self.degs[g]))

    def score(self, prob: Problem) -> Schedule:
        if self.replica_sets is None:
            self.times = prob.group_times(self.starts, self.degs, self.units, self.unit_group)
        else:
            self.times = np.array(
                [prob.set_time(m, r) for m, r in zip(self.members(), self.replica_sets)]
            )
        if self.barrier_after is None and self.replica_sets is None:
            self.makespan = float(
                critical_path(self.starts, self.degs, self.times, prob.num_replicas)
            )
            return self
        free = np.zeros(prob.num_replicas)
        for g, t in enumerate(self.times):
            r = self.replicas(g)
            free[r] = free[r].max() + t
            if self.barrier_after is not None and self.barrier_after[g]:
                free[:] = free.max()
        self.makespan = float(free.max())
        return self

    def to_plan(
        self,
        prob: Problem,
        *,
        strategy: str,
        candidates: dict[str, float],
        lower: float,
        dropped: tuple[int, ...] = (),
    ) -> Plan:
        """Waves by the rule wave(g) = 1 + max wave of the previous group on any member."""
        last = np.full(prob.num_replicas, -1, np.int64)
        waves: list[list[CPGroup]] = []
        barrier_wave: list[bool] = []
        floor = 0
        flat, bounds = self._sorted_members(prob.lens)
        ids_l, lens_l, causal_l = (
            flat.tolist(),
            prob.lens[flat].tolist(),
            prob.causal[flat].tolist(),
        )
        times_l = self.times.tolist()
        for g in range(self.starts.size):
            reps = self.replicas(g)
            w = max(floor, int(last[reps].max()) + 1)
            last[reps] = w
            while len(waves) <= w:
                waves.append([])
                barrier_wave.append(False)
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
                    if self.replica_sets is None
                    else prob.cluster.spans_nodes(rl),
                )
            )
            if self.barrier_after is not None and self.barrier_after[g]:
                wb = int(last.max())
                barrier_wave[wb] = True
                floor = wb + 1
                last[:] = wb
        plan = Plan(
            num_replicas=prob.num_replicas,
            waves=tuple(
                Wave(groups=tuple(sorted(gs, key=lambda x: x.replicas[0])), barrier=b)
                for gs, b in zip(waves, barrier_wave)
            ),
            predicted_time=float(self.makespan),
            lower_bound=float(lower),
            strategy=strategy,
            winner=self.name,
            candidates={k: float(v) for k, v in candidates.items()},
            dropped=dropped,
        )
        return plan.with_digest()
