"""The paper's candidate: waves, Stage 1 BFD atomic groups, Stage 2 2D-DP per wave.

Stage 1 packs sequences, longest first, into bins: a sequence that fits no open bin opens one at
its minimum degree (memory d_min × E), shorter ones best-fit into the headroom. The bins are
the atomic groups. When their minimum degrees do not fit N replicas at once the batch is split
into waves, atomic groups dealt longest first to the wave with the least work that still has
room; several wave counts are tried. Stage 2 gives each wave's groups their degrees with the
exact DP of Eq. 11 (`kernels.dp_degrees`), placement puts them on concrete replicas, and the
biggest groups of a wave go to the windows that free up first. The wave loop is compiled.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..cost.problem import Problem
from ..kernels import INF, bfd_pack, dp_degrees, group_time
from .placement import _place
from .schedule import Schedule

__all__ = ["atomic_groups", "paper_schedule"]


def atomic_groups(prob: Problem, units: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1: (atomic group of each sequence, minimum degree of each group)."""
    order = prob.order if units is None else units
    bin_of, bin_d, _ = bfd_pack(prob.lens, order, prob.cap, prob.dmin, 0, prob.unit)
    return bin_of, bin_d


@nb.njit(cache=True)
def _window_time(
    att: float,
    lin: float,
    comm: float,
    s: int,
    d: int,
    replicas_per_node: int,
    speed: np.ndarray,
    cost_params: np.ndarray,
) -> float:
    sp = INF
    for r in range(s, s + d):
        sp = min(sp, speed[r])
    return group_time(
        att,
        lin,
        comm,
        d,
        (s // replicas_per_node) != ((s + d - 1) // replicas_per_node),
        sp,
        cost_params,
    )


@nb.njit(cache=True)
def _paper_waves(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    group_dmin: np.ndarray,
    num_replicas: int,
    replicas_per_node: int,
    allowed: np.ndarray,
    speed: np.ndarray,
    cost_params: np.ndarray,
    nwaves: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Deal atomic groups to `nwaves` waves, DP each wave, place, chain. Returns (group order,
    starts, degrees, makespan); makespan INF when infeasible."""
    k = att.shape[0]
    work = att + lin
    order = np.argsort(-work, kind="mergesort")
    load = np.zeros(nwaves)
    room = np.full(nwaves, num_replicas, np.int64)
    wave_of = np.empty(k, np.int64)
    for t in range(k):
        g = order[t]
        best = -1
        for w in range(nwaves):
            if room[w] >= group_dmin[g] and (best < 0 or load[w] < load[best]):
                best = w
        if best < 0:
            return order, np.zeros(0, np.int64), np.zeros(0, np.int64), INF
        wave_of[g] = best
        load[best] += work[g]
        room[best] -= group_dmin[g]
    free = np.zeros(num_replicas)
    seg_lo = np.arange(0, num_replicas, replicas_per_node)
    seg_hi = np.minimum(seg_lo + replicas_per_node, num_replicas)
    out_g = np.empty(k, np.int64)
    out_s = np.empty(k, np.int64)
    out_d = np.empty(k, np.int64)
    cnt = 0
    for w in range(nwaves):
        idx = np.flatnonzero(wave_of == w)
        if idx.size == 0:
            continue
        deg, span = dp_degrees(
            att[idx],
            lin[idx],
            comm[idx],
            group_dmin[idx],
            num_replicas,
            replicas_per_node,
            allowed,
            cost_params,
        )
        if span >= INF:
            return order, np.zeros(0, np.int64), np.zeros(0, np.int64), INF
        window_starts = _place(
            deg, np.argsort(-deg, kind="mergesort"), num_replicas, replicas_per_node, seg_lo, seg_hi
        )
        times = np.empty(idx.size)
        for j in range(idx.size):
            g = idx[j]
            times[j] = _window_time(
                att[g],
                lin[g],
                comm[g],
                window_starts[j],
                deg[j],
                replicas_per_node,
                speed,
                cost_params,
            )
        # Pair the longest groups with the windows of equal degree that free up first.
        for d in np.unique(deg):
            sel = np.flatnonzero(deg == d)
            ready = np.empty(sel.size)
            for j in range(sel.size):
                ready[j] = free[window_starts[sel[j]] : window_starts[sel[j]] + d].max()
            wins = window_starts[sel][np.argsort(ready, kind="mergesort")]
            by_time = sel[np.argsort(-times[sel], kind="mergesort")]
            for j in range(sel.size):
                window_starts[by_time[j]] = wins[j]
        for j in range(idx.size):
            g = idx[j]
            t = _window_time(
                att[g],
                lin[g],
                comm[g],
                window_starts[j],
                deg[j],
                replicas_per_node,
                speed,
                cost_params,
            )
            s0 = window_starts[j]
            t0 = free[s0 : s0 + deg[j]].max()
            free[s0 : s0 + deg[j]] = t0 + t
            out_g[cnt] = g
            out_s[cnt] = s0
            out_d[cnt] = deg[j]
            cnt += 1
    return out_g[:cnt].copy(), out_s[:cnt].copy(), out_d[:cnt].copy(), free.max()


def paper_schedule(
    prob: Problem, units: np.ndarray | None = None, tries: int = 3
) -> Schedule | None:
    ids = prob.order if units is None else units
    bin_of, group_dmin = atomic_groups(prob, ids)
    b = bin_of[ids]
    att = np.bincount(b, weights=prob.att[ids], minlength=group_dmin.size)
    lin = np.bincount(b, weights=prob.lin[ids], minlength=group_dmin.size)
    comm = np.bincount(b, weights=prob.comm[ids], minlength=group_dmin.size)
    first = max(1, -(-int(group_dmin.sum()) // prob.num_replicas))
    best: tuple[np.ndarray, np.ndarray, np.ndarray, float, int] | None = None
    counts = list(range(first, first + tries))
    # Σ dmin / N waves is a bound, not a packing: 9 groups of degree 2 on 3 replicas fit one per
    # wave, not 6 waves. One wave per group always deals (every dmin <= N), so it is the last
    # resort when the tries found no dealing.
    counts.append(max(group_dmin.size, first + tries))
    for waves in counts:
        if best is not None and waves >= first + tries:
            break
        group_order, starts, degs, makespan = _paper_waves(
            att,
            lin,
            comm,
            group_dmin,
            prob.num_replicas,
            prob.replicas_per_node,
            prob.allowed,
            prob.speed,
            prob.cost_params,
            waves,
        )
        if makespan < INF and (best is None or makespan < best[3]):
            best = (group_order, starts, degs, makespan, waves)
    if best is None:
        return None
    order, starts, degs, _, waves = best
    pos = np.empty(group_dmin.size, np.int64)
    pos[order] = np.arange(order.size)
    return Schedule(
        name=f"paper(waves={waves})", starts=starts, degs=degs, units=ids, unit_group=pos[b]
    ).score(prob)
