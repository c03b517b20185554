"""Idle slots and barriers: the "fill" policy and lane alignment under sync_waves.

`fill_idle` gives idle (replica, wave) slots real work where that is no slower; `align_waves`
runs each lane's micro-batches longest first when every wave ends with a barrier.

Under `Cluster(idle="placeholder")` a replica that has no CP group in a wave runs a placeholder
micro-batch (about beta1: 1.79 ms for Qwen3-8B on one H200) and trains nothing. With
`idle="fill"` the planner first tries to put useful work there, in the spirit of
megatron-core's `fill_empty_gpus` (its hybrid-CP scheduler doubles the smallest group until no
GPU is empty). Unlike that scheduler, a move is kept only when the predicted makespan (idle
slots priced, barriers included) does not grow, so filling never costs time:

- **widen**: a group of the wave whose window borders a run of idle replicas takes some of them
  (the whole run first, then fewer), at an allowed degree, when its own time does not grow
  either: more members split attention and the per-token layers, the ring adds (d - 1)/d of
  the bytes and a latency step per member;
- **move**: a run of idle replicas that no neighbour can absorb takes the shortest sequence of
  the wave's slowest multi-sequence group that fits it, as a new group of the smallest degree
  that holds it.

Waves are kept: the schedule is put in wave order (which changes no replica's sequence of
micro-batches, so not its time), a widened group stays in its wave and a new group lands in
the first wave its replicas are all idle since their last group (the slot it was made for or
an earlier one). Memory holds: a wider group holds less per member (shard_tokens falls
with d) and a moved sequence gets a degree that holds it. Every sequence stays in exactly one
group. The caller keeps the filled schedule only if its exact score is no worse.
"""

from __future__ import annotations

import numpy as np

from ..cost.problem import Problem
from ..kernels import group_waves, priced_critical_path
from .schedule import Schedule

__all__ = ["align_waves", "fill_idle"]

MAX_DEGREE_TRIES = 4  # widths tried per (run, neighbour): the whole run, then fewer replicas


def _group_time(prob: Problem, start: int, degree: int, members: np.ndarray) -> float:
    """One group's predicted time on window (start, degree), by the formula of
    `Problem.window_times` (the filled schedule is scored exactly again at the end)."""
    if prob.vision is not None:
        return float(
            prob.group_times(
                np.array([start], np.int64),
                np.array([degree], np.int64),
                members,
                np.zeros(members.size, np.int64),
            )[0]
        )
    rpn = prob.replicas_per_node
    speed = float(prob.speed[start : start + degree].min()) if prob.cluster.heterogeneous else 1.0
    return prob.cost.time_from_aggregates(
        float(prob.att[members].sum()),
        float(prob.lin_llm[members].sum()),
        float(prob.comm[members].sum()),
        degree,
        inter_node=start // rpn != (start + degree - 1) // rpn,
        speed=speed,
    )


class _Filler:
    """A window schedule in wave order, edited in place and scored after every trial move."""

    def __init__(self, prob: Problem, sch: Schedule) -> None:
        self.prob = prob
        self.starts = sch.starts.astype(np.int64)
        self.degs = sch.degs.astype(np.int64)
        self.times = sch.times.astype(np.float64)
        self.members = sch.members()
        self._in_wave_order()
        self.makespan = self._score(self.starts, self.degs, self.times)

    def _in_wave_order(self) -> None:
        """Groups sorted by wave (stable), which changes no replica's sequence of micro-batches
        and so no time; then own[w, r], the group replica r runs in wave w (-1: idle).

        A moved sequence's new group lands in the first wave its replicas are all idle since
        their last group: the wave of the slot it fills or an earlier one.
        """
        wave = group_waves(self.starts, self.degs, self.prob.num_replicas)
        order = np.argsort(wave, kind="stable")
        self.starts, self.degs, self.times = self.starts[order], self.degs[order], self.times[order]
        self.members = [self.members[g] for g in order.tolist()]
        self.wave = wave[order]
        self.own = np.full((int(self.wave[-1]) + 1, self.prob.num_replicas), -1, np.int64)
        for g, (w, s, d) in enumerate(zip(self.wave.tolist(), self.starts, self.degs)):
            self.own[w, s : s + d] = g

    def _score(self, starts: np.ndarray, degs: np.ndarray, times: np.ndarray) -> float:
        assert self.prob.idle_s is not None
        return float(
            priced_critical_path(
                starts, degs, times, self.prob.num_replicas, self.prob.idle_s, self.prob.sync
            )
        )

    def _runs(self, w: int) -> list[tuple[int, int]]:
        """The runs [a, b) of replicas idle in wave `w`."""
        idle = np.concatenate([[False], self.own[w] < 0, [False]])
        edges = np.flatnonzero(idle[1:] != idle[:-1])
        return list(zip(edges[::2].tolist(), edges[1::2].tolist()))

    def _widen(self, g: int, a: int, b: int, left: bool) -> bool:
        """Widen group g over idle replicas [a, b) beside it; True if a width was accepted."""
        prob = self.prob
        s, d = int(self.starts[g]), int(self.degs[g])
        widths = [k for k in range(b - a, 0, -1) if prob.allowed[d + k]][:MAX_DEGREE_TRIES]
        for k in widths:
            start = s - k if left else s
            t = _group_time(prob, start, d + k, self.members[g])
            if t > self.times[g]:
                continue
            starts, degs, times = self.starts.copy(), self.degs.copy(), self.times.copy()
            starts[g], degs[g], times[g] = start, d + k, t
            span = self._score(starts, degs, times)
            if span <= self.makespan:
                self.starts, self.degs, self.times, self.makespan = starts, degs, times, span
                self.own[self.wave[g], start : start + d + k] = g
                return True
        return False

    def _move(self, w: int, a: int, b: int) -> bool:
        """Move the shortest fitting sequence of wave w's slowest multi-sequence group into a
        new group on idle replicas [a, b); True if accepted."""
        prob = self.prob
        in_wave = np.flatnonzero(self.wave == w)
        donors = [int(g) for g in in_wave if self.members[g].size > 1]
        if not donors:
            return False
        g = max(donors, key=lambda x: self.times[x])
        mem = self.members[g]
        for u in sorted(mem.tolist(), key=lambda x: (int(prob.lens[x]), x)):
            d = int(prob.dmin[u])
            if d < 1 or d > b - a:
                continue
            rest = mem[mem != u]
            one = np.array([u], np.int64)
            pos = int(in_wave[-1]) + 1
            starts = np.insert(self.starts, pos, a)
            degs = np.insert(self.degs, pos, d)
            times = np.insert(self.times, pos, _group_time(prob, a, d, one))
            times[g] = _group_time(prob, int(self.starts[g]), int(self.degs[g]), rest)
            span = self._score(starts, degs, times)
            if span <= self.makespan:
                self.starts, self.degs, self.times, self.makespan = starts, degs, times, span
                self.members[g] = rest
                self.members.insert(pos, one)
                self._in_wave_order()
                return True
            return False  # the shortest sequence did not pay: longer ones would cost more
        return False

    def run(self) -> None:
        n = self.prob.num_replicas
        for w in range(self.own.shape[0]):
            for a, b in self._runs(w):
                owner = self.own[w]
                left = int(owner[a - 1]) if a > 0 else -1  # the group ending just before the run
                right = int(owner[b]) if b < n else -1  # the group starting just after it
                sides = [(g, side) for g, side in ((left, False), (right, True)) if g >= 0]
                sides.sort(key=lambda x: -self.times[x[0]])  # the slower neighbour first
                done = False
                for g, is_left_of_group in sides:
                    if self._widen(g, a, b, left=is_left_of_group):
                        done = True
                        break
                if not done:
                    self._move(w, a, b)

    def schedule(self, name: str) -> Schedule:
        counts = [m.size for m in self.members]
        return Schedule(
            name=name,
            starts=self.starts.copy(),
            degs=self.degs.copy(),
            units=np.concatenate(self.members).astype(np.int64),
            unit_group=np.repeat(np.arange(len(counts), dtype=np.int64), counts),
        )


def fill_idle(prob: Problem, sch: Schedule) -> Schedule | None:
    """`sch` with idle slots given real work where the makespan does not grow, scored; None
    when nothing could be filled or the schedule is not on contiguous windows (the
    megatron-core hybrid baseline)."""
    if sch.replica_sets is not None or sch.barrier_after is not None or sch.starts.size == 0:
        return None
    filler = _Filler(prob, sch)
    before = (filler.starts.tobytes(), filler.degs.tobytes())
    filler.run()
    if (filler.starts.tobytes(), filler.degs.tobytes()) == before:
        return None
    return filler.schedule(f"{sch.name}+fill").score(prob)


def align_waves(prob: Problem, sch: Schedule) -> Schedule | None:
    """Under `Cluster(sync_waves=True)`, each lane's micro-batches longest first; None when
    `sch` ends in no lanes or is already so ordered.

    With a barrier after every wave, a lane plan's k-th micro-batches run together and the wave
    lasts as long as the longest of them: the step is Σ_k max over lanes of the k-th time. For
    fixed lane contents that sum is smallest when every lane runs its micro-batches longest
    first (for any time τ, at least as many waves last more than τ as the lane with the most
    micro-batches longer than τ has; sorted queues meet that count for every τ). Lanes are
    the disjoint windows of the schedule's longest suffix of groups on such windows, so a
    prologue of wide groups stays where it is.
    """
    if sch.replica_sets is not None or sch.barrier_after is not None or sch.starts.size < 2:
        return None
    windows: dict[tuple[int, int], list[int]] = {}
    covered = bytearray(prob.num_replicas)
    first = sch.starts.size
    starts, degs = sch.starts.tolist(), sch.degs.tolist()
    for g in range(len(starts) - 1, -1, -1):  # the longest suffix on disjoint windows
        key = (starts[g], degs[g])
        queue = windows.get(key)
        if queue is None:
            if any(covered[key[0] : key[0] + key[1]]):
                break
            covered[key[0] : key[0] + key[1]] = b"\x01" * key[1]
            queue = windows[key] = []
        queue.append(g)
        first = g
    if len(windows) < 2:
        return None
    times = sch.times.tolist()
    queues = [sorted(q, key=lambda g: (-times[g], g)) for q in windows.values()]
    if all(q == sorted(q) for q in queues):
        return None
    rounds = max(len(q) for q in queues)
    suffix = [q[k] for k in range(rounds) for q in queues if k < len(q)]
    order = np.array([*range(first), *suffix], np.int64)
    new_of = np.empty_like(order)
    new_of[order] = np.arange(order.size)
    return Schedule(
        name=f"{sch.name}+aligned",
        starts=sch.starts[order].copy(),
        degs=sch.degs[order].copy(),
        units=sch.units.copy(),
        unit_group=new_of[sch.unit_group],
    ).score(prob)
