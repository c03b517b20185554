"""The paper's candidate: waves, Stage 1 BFD atomic groups, Stage 2 2D-DP per wave.

Stage 1 packs sequences, longest first, into bins: a sequence that fits no open bin opens one at
its minimum degree (memory d_min × E), shorter ones best-fit into the headroom. The bins are
the atomic groups. When their minimum degrees do not fit N replicas at once the batch is split
into waves, atomic groups dealt longest first to the wave with the least work that still has
room; several wave counts are tried. Stage 2 gives each wave's groups their degrees with the
exact DP of Eq. 11 (`kernels.dp_degrees`), placement puts them on concrete replicas, and the
biggest groups of a wave go to the windows that free up first.
"""

from __future__ import annotations

import numpy as np

from .kernels import bfd_pack, dp_degrees
from .placement import place_degrees
from .problem import Problem, Schedule

__all__ = ["atomic_groups", "paper_schedule"]


def atomic_groups(prob: Problem, units: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Stage 1: (sequence ids of each atomic group, its minimum degree)."""
    order = prob.order if units is None else units
    bin_of, bin_d, nbins = bfd_pack(prob.lens, order, prob.cap, prob.dmin, 0)
    b = bin_of[order]
    srt = np.argsort(b, kind="stable")
    groups = np.split(order[srt], np.cumsum(np.bincount(b, minlength=nbins))[:-1])
    return groups, bin_d


def _split_waves(work: np.ndarray, dmin: np.ndarray, n: int, waves: int) -> list[list[int]] | None:
    load = np.zeros(waves)
    room = np.full(waves, n, np.int64)
    out: list[list[int]] = [[] for _ in range(waves)]
    for g in np.lexsort((np.arange(work.size), -work)):
        ok = np.flatnonzero(room >= dmin[g])
        if ok.size == 0:
            return None
        w = ok[np.argmin(load[ok])]
        out[w].append(int(g))
        load[w] += work[g]
        room[w] -= dmin[g]
    return [w for w in out if w]


def paper_schedule(prob: Problem, units: np.ndarray | None = None, tries: int = 3) -> Schedule | None:
    groups, gd = atomic_groups(prob, units)
    att = np.array([prob.att[g].sum() for g in groups])
    lin = np.array([prob.lin[g].sum() for g in groups])
    comm = np.array([prob.comm[g].sum() for g in groups])
    work = att + lin
    first = max(1, -(-int(gd.sum()) // prob.n))
    best: Schedule | None = None
    for waves in range(first, first + tries):
        split = _split_waves(work, gd, prob.n, waves)
        if split is None:
            continue
        free = np.zeros(prob.n)
        starts, degs, members = [], [], []
        ok = True
        for wave in split:
            idx = np.asarray(wave, np.int64)
            deg, span = dp_degrees(att[idx], lin[idx], comm[idx], gd[idx], prob.n, prob.rpn,
                                   prob.allowed, prob.p)
            if not np.isfinite(span) or span >= 1e299:
                ok = False
                break
            st = place_degrees(deg, prob.n, prob.rpn)
            times = prob.window_times(att[idx], lin[idx], comm[idx], st, deg)
            # Pair the longest groups with the windows of equal degree that free up first.
            for d in np.unique(deg):
                sel = np.flatnonzero(deg == d)
                ready = np.array([free[s : s + d].max() for s in st[sel]])
                wins = st[sel][np.argsort(ready, kind="stable")]
                st[sel[np.argsort(-times[sel], kind="stable")]] = wins
            times = prob.window_times(att[idx], lin[idx], comm[idx], st, deg)
            for g, s, d, t in zip(idx, st, deg, times):
                free[s : s + d] = free[s : s + d].max() + t
                starts.append(int(s))
                degs.append(int(d))
                members.append(groups[g])
        if not ok:
            continue
        sch = Schedule(
            name=f"paper(waves={len(split)})",
            starts=np.asarray(starts, np.int64),
            degs=np.asarray(degs, np.int64),
            members=members,
        ).score(prob)
        if best is None or sch.makespan < best.makespan:
            best = sch
    return best
