"""One planning problem in array form, and the schedule form every candidate produces.

`Problem` validates the inputs once (lengths, causal flags, cluster, cost model) and
precomputes per-sequence aggregates so that candidates and the scorer share them. A `Schedule`
is the candidate-neutral result: CP groups in execution order, each a contiguous window of
replicas (start, degree) running a set of sequences. Its makespan is the critical path of
DESIGN.md; `to_plan` turns the winner into the public, frozen Plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .cluster import Cluster
from .cost import CostModel
from .kernels import critical_path
from .plan import CPGroup, Plan, Wave

__all__ = ["Problem", "Schedule", "lower_bound"]


def _as_lengths(seqlens: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(seqlens)
    if arr.ndim != 1:
        raise ValueError(f"seqlens must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("seqlens is empty: a global batch needs at least one sequence")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            bad = arr[~np.isfinite(arr) | (arr != np.round(arr))][:3]
            raise ValueError(f"seqlens must be whole token counts, got {bad.tolist()}")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"seqlens must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(arr < 1):
        idx = np.flatnonzero(arr < 1)[:3]
        raise ValueError(
            f"sequence lengths must be >= 1 token; sequence ids {idx.tolist()} have "
            f"{arr[idx].tolist()} (drop empty samples before planning)"
        )
    return arr


@dataclass(slots=True)
class Problem:
    """Validated inputs and per-sequence aggregates of one global batch."""

    cost: CostModel
    cluster: Cluster
    lens: np.ndarray
    causal: np.ndarray
    cap: int
    n: int
    rpn: int
    speed: np.ndarray
    p: np.ndarray
    allowed: np.ndarray
    att: np.ndarray = field(init=False)
    lin: np.ndarray = field(init=False)
    comm: np.ndarray = field(init=False)
    work: np.ndarray = field(init=False)
    dmin: np.ndarray = field(init=False)
    order: np.ndarray = field(init=False)
    overhead: np.ndarray = field(init=False)

    @classmethod
    def build(
        cls,
        seqlens: Sequence[int] | np.ndarray,
        cluster: Cluster,
        cost: CostModel,
        *,
        causal: bool | Sequence[bool] | np.ndarray = True,
        pow2: bool = False,
        seed: int = 0,
    ) -> Problem:
        if not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a fcp_data.planner.Cluster, got {type(cluster)}")
        if not isinstance(cost, CostModel):
            raise TypeError(f"cost must be a fcp_data.planner.CostModel, got {type(cost)}")
        lens = _as_lengths(seqlens)
        c = np.asarray(causal)
        if c.ndim == 0:
            c = np.full(lens.shape, bool(c))
        elif c.shape != lens.shape:
            raise ValueError(
                f"causal has {c.size} flags for {lens.size} sequences: give one bool or one "
                "per sequence"
            )
        c = c.astype(bool)
        n = cluster.num_replicas
        allowed = np.zeros(n + 1, dtype=np.bool_)
        if pow2:
            d = 1
            while d <= n:
                allowed[d] = True
                d *= 2
        else:
            allowed[1:] = True
        p = np.array([cost.beta1, cost.beta2, cost.intra_node_bandwidth, cost.inter_node_bandwidth])
        prob = cls(
            cost=cost,
            cluster=cluster,
            lens=lens,
            causal=c,
            cap=cost.capacity_tokens(cluster),
            n=n,
            rpn=cluster.replicas_per_node,
            speed=cluster.speeds(),
            p=p,
            allowed=allowed,
        )
        prob._aggregate(seed)
        return prob

    def _aggregate(self, seed: int) -> None:
        s = self.lens.astype(np.float64)
        eta = np.where(self.causal, 0.0, self.cost.eta_full)
        self.att = self.cost.alpha1 * (1.0 + eta) * s * s
        self.lin = self.cost.alpha2 * s
        self.comm = self.cost.alpha3 * s
        self.work = self.att + self.lin
        self.dmin = self.min_degrees(self.lens)
        # β1 share of each sequence: a micro-batch of d × cap tokens pays β1 once per replica.
        self.overhead = self.p[0] * self.lens / self.cap
        # Longest first; equal lengths in an order fixed by the seed (deterministic).
        tie = np.random.default_rng(seed).permutation(self.lens.size)
        self.order = np.lexsort((tie, -self.work)).astype(np.int64)

    def min_degrees(self, lens: np.ndarray) -> np.ndarray:
        """Smallest allowed degree holding each sequence alone (0 where none does)."""
        d = np.maximum(1, -(-lens // self.cap))
        for _ in range(8):  # padding adds at most 2d-1 tokens: a few steps settle it
            local = np.where(d == 1, lens, -(-lens // (2 * d)) * 2)
            over = local > self.cap
            if not over.any():
                break
            d = d + over
        allowed_deg = np.flatnonzero(self.allowed)
        pos = np.searchsorted(allowed_deg, d)
        out = np.where(
            pos < allowed_deg.size, allowed_deg[np.minimum(pos, allowed_deg.size - 1)], 0
        )
        return out.astype(np.int64)

    def group_times(
        self, starts: np.ndarray, degs: np.ndarray, units: np.ndarray, unit_group: np.ndarray
    ) -> np.ndarray:
        """Predicted time of each group (window + its sequences), vectorised over groups."""
        g = starts.size
        att = np.bincount(unit_group, weights=self.att[units], minlength=g)
        lin = np.bincount(unit_group, weights=self.lin[units], minlength=g)
        comm = np.bincount(unit_group, weights=self.comm[units], minlength=g)
        return self.window_times(att, lin, comm, starts, degs)

    def set_time(self, members: np.ndarray, replicas: np.ndarray) -> float:
        """Time of one group on an arbitrary replica set (slow path, baselines only)."""
        nodes = {int(r) // self.rpn for r in replicas}
        return self.cost.time_from_aggregates(
            float(self.att[members].sum()),
            float(self.lin[members].sum()),
            float(self.comm[members].sum()),
            len(replicas),
            inter_node=len(nodes) > 1,
            speed=float(self.speed[replicas].min()),
        )

    def window_times(
        self,
        att: np.ndarray,
        lin: np.ndarray,
        comm: np.ndarray,
        starts: np.ndarray,
        degs: np.ndarray,
    ) -> np.ndarray:
        d = degs.astype(np.float64)
        inter = (starts // self.rpn) != ((starts + degs - 1) // self.rpn)
        if self.cluster.heterogeneous:
            sp = np.array([self.speed[s : s + k].min() for s, k in zip(starts, degs)])
        else:
            sp = np.ones(len(starts))
        bw = np.where(inter, self.p[3], self.p[2])
        c = np.where(degs > 1, (d - 1) / d * comm / bw + self.p[1] * (d - 1), 0.0)
        return lin / d / sp + np.maximum(att / d / sp, c) + self.p[0] / sp


def lower_bound(prob: Problem, keep: np.ndarray | None = None) -> float:
    """A lower bound on any plan's makespan for the sequences `keep` (default: all).

    Two classic terms and their combination:
    - work: d·A and d·L do not depend on d, so no plan does less than W = Σ work
      replica-seconds: M ≥ W / Σ speed;
    - the most expensive sequence alone: M ≥ min_d T(s_max, d) on the fastest replicas;
    - combined: if s_max runs at degree d it holds d replicas for T_d, during which they do
      nothing else, so M ≥ min_d max(T_d, (W − w_max + d · speed_min · T_d) / Σ speed).
    The combined term is never below either classic one (it is their max when the longest
    sequence is cheap) and is the one that binds when one sequence needs most of the cluster.
    """
    ids = np.arange(prob.lens.size) if keep is None else keep
    if ids.size == 0:
        return 0.0
    total_speed = float(prob.speed.sum())
    work = float(prob.work[ids].sum())
    top = ids[np.argmax(prob.work[ids])]
    rest = work - float(prob.work[top])
    fastest, slowest = float(prob.speed.max()), float(prob.speed.min())
    s = int(prob.lens[top])
    d = np.arange(1, prob.n + 1)  # every degree: the bound holds for all strategies
    local = np.where(d == 1, s, -(-s // (2 * d)) * 2)
    d = d[local <= prob.cap]
    if d.size == 0:
        return work / total_speed
    bw = np.where(d > prob.rpn, prob.p[3], prob.p[2])
    comm = np.where(d > 1, (d - 1) / d * prob.comm[top] / bw + prob.p[1] * (d - 1), 0.0)
    t = prob.lin[top] / d / fastest + np.maximum(prob.att[top] / d / fastest, comm)
    t = t + prob.p[0] / fastest
    best = float(np.min(np.maximum(t, (rest + d * slowest * t) / total_speed)))
    return max(work / total_speed, best)


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
            self.makespan = float(critical_path(self.starts, self.degs, self.times, prob.n))
            return self
        free = np.zeros(prob.n)
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
        last = np.full(prob.n, -1, np.int64)
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
                    inter_node=rl[0] // prob.rpn != rl[-1] // prob.rpn
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
            num_replicas=prob.n,
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
