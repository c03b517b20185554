"""The schedule form every candidate produces, its score, and its turn into a Plan.

A `Schedule` is the candidate-neutral result: CP groups in execution order, each a contiguous
window of replicas (start, degree) running a set of sequences. Its makespan is the critical
path of docs/design.md; `planner.assemble.to_plan` turns the winner into the public, frozen
Plan (strategies never import the planner above them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.problem import Problem
from ..kernels import critical_path, group_waves, priced_critical_path

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

    def sorted_members(self, lens: np.ndarray) -> tuple[np.ndarray, list[int]]:
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
        windows = self.barrier_after is None and self.replica_sets is None
        if prob.priced:  # placeholders in idle slots and/or a barrier after every wave
            if windows:
                self.makespan = float(
                    priced_critical_path(
                        self.starts,
                        self.degs,
                        self.times,
                        prob.num_replicas,
                        prob.idle_s,
                        prob.sync,
                    )
                )
            else:
                self.makespan = self._priced_makespan(prob)
            return self
        if windows:
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

    def wave_index(self, num_replicas: int) -> tuple[np.ndarray, set[int]]:
        """The wave of each group and the waves that end with a barrier.

        wave(g) = 1 + the latest wave of an earlier group on one of its replicas, and no earlier
        than the wave after the last barrier (a group marked `barrier_after` closes the latest
        wave so far).
        """
        if self.barrier_after is None and self.replica_sets is None:
            return group_waves(self.starts, self.degs, num_replicas), set()
        last = np.full(num_replicas, -1, np.int64)
        wave = np.empty(self.starts.size, np.int64)
        barriers: set[int] = set()
        floor = 0
        for g in range(self.starts.size):
            reps = self.replicas(g)
            w = max(floor, int(last[reps].max()) + 1)
            last[reps] = w
            wave[g] = w
            if self.barrier_after is not None and self.barrier_after[g]:
                wb = int(last.max())
                barriers.add(wb)
                floor = wb + 1
                last[:] = wb
        return wave, barriers

    def _priced_makespan(self, prob: Problem) -> float:
        """The priced critical path of a schedule on replica sets or with barriers, wave by wave
        as `simulate.score_plan` runs a plan."""
        wave, barriers = self.wave_index(prob.num_replicas)
        assert prob.idle_s is not None
        free = np.zeros(prob.num_replicas)
        num_waves = int(wave.max()) + 1 if wave.size else 0
        by_wave = np.argsort(wave, kind="stable")
        cut = np.searchsorted(wave[by_wave], np.arange(num_waves + 1))
        for w in range(num_waves):
            idle = np.ones(prob.num_replicas, dtype=bool)
            for g in by_wave[cut[w] : cut[w + 1]].tolist():
                r = self.replicas(g)
                free[r] = free[r].max() + self.times[g]
                idle[r] = False
            free[idle] += prob.idle_s[idle]
            if prob.sync or w in barriers:
                free[:] = free.max()
        return float(free.max())
