"""Placement: concrete replica windows for a multiset of degrees.

The slowest link sets a ring's speed (docs/design.md, "The cost model"), so a group that fits in
one node must stay in one node: degrees are placed largest first, groups wider than a node on
whole free nodes, the others best-fit into the node with the least room that still holds them
(keeping big holes for big groups). When fragmentation leaves no such room, the whole multiset
falls back to a dense left-to-right layout, which is always contiguous because Σ d ≤ N.
Compiled with numba: placement runs for every candidate lane set (hundreds per plan).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...errors import PlanningError

__all__ = ["place_degrees"]


@nb.njit(cache=True)
def _run_in(free: np.ndarray, lo: int, hi: int, d: int, step: int) -> int:
    """First start s in [lo, hi - d] (stepping by `step`) whose window [s, s + d) is all free."""
    s = lo
    while s + d <= hi:
        ok = True
        for r in range(s, s + d):
            if not free[r]:
                ok = False
                break
        if ok:
            return s
        s += step
    return -1


@nb.njit(cache=True)
def _place(
    degs: np.ndarray,
    order: np.ndarray,
    num_replicas: int,
    replicas_per_node: int,
    seg_lo: np.ndarray,
    seg_hi: np.ndarray,
) -> np.ndarray:
    """Place degrees (visited in `order`) best-fit into segments [seg_lo, seg_hi), which are
    nodes or parts of nodes, in order of preference; groups wider than a node go on whole
    free nodes; a dense left-to-right layout when fragmentation leaves no room."""
    free = np.ones(num_replicas, dtype=np.bool_)
    starts = np.full(degs.size, -1, np.int64)
    nseg = seg_lo.size
    seg_of = np.empty(num_replicas, np.int64)
    rooms = seg_hi - seg_lo
    for g in range(nseg):
        for r in range(seg_lo[g], seg_hi[g]):
            seg_of[r] = g
    for t in range(order.size):
        i = order[t]
        d = degs[i]
        s = -1
        if d > replicas_per_node:
            s = _run_in(free, 0, num_replicas, d, replicas_per_node)
        else:
            best_room = num_replicas + 1
            for g in range(nseg):
                room = rooms[g]
                if d <= room < best_room:
                    cand = _run_in(free, seg_lo[g], seg_hi[g], d, 1)
                    if cand >= 0:
                        s = cand
                        best_room = room
        if s < 0:
            s = _run_in(free, 0, num_replicas, d, 1)
        if s < 0:
            off = 0
            for j in range(order.size):
                starts[order[j]] = off
                off += degs[order[j]]
            return starts
        for r in range(s, s + d):
            free[r] = False
            rooms[seg_of[r]] -= 1
        starts[i] = s
    return starts


def node_segments(num_replicas: int, replicas_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """Every node as one segment, in replica order."""
    lo = np.arange(0, num_replicas, replicas_per_node, dtype=np.int64)
    return lo, np.minimum(lo + replicas_per_node, num_replicas)


def _ready_segments(
    num_replicas: int, replicas_per_node: int, free: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes split where the time replicas become free jumps (by > 2% of the latest), earliest
    first: a lane inside one segment starts when all its replicas are free, so it must not
    straddle a replica still busy in the prologue."""
    lo_l: list[int] = []
    hi_l: list[int] = []
    ready: list[float] = []
    tol = 0.02 * float(free.max())
    for base in range(0, num_replicas, replicas_per_node):
        top = min(num_replicas, base + replicas_per_node)
        start = base
        for r in range(base + 1, top + 1):
            if r == top or abs(free[r] - free[r - 1]) > tol:
                lo_l.append(start)
                hi_l.append(r)
                ready.append(float(free[start:r].max()))
                start = r
    order = np.lexsort((np.asarray(lo_l), np.asarray(ready)))
    return np.asarray(lo_l, np.int64)[order], np.asarray(hi_l, np.int64)[order]


def place_degrees(
    degrees: list[int] | np.ndarray,
    num_replicas: int,
    replicas_per_node: int,
    free: np.ndarray | None = None,
) -> np.ndarray:
    """Start replica of each degree's window (same order as `degrees`); windows are disjoint.

    `free` (when each replica becomes available, e.g. after a prologue) splits nodes where
    that time jumps and prefers the parts that free up first, so the widest groups, placed
    first, start earliest and no group waits for one busy member.
    """
    degs = np.asarray(degrees, dtype=np.int64)
    if degs.sum() > num_replicas:
        raise PlanningError(f"degrees sum to {int(degs.sum())} > {num_replicas} replicas")
    order = np.lexsort((np.arange(degs.size), -degs)).astype(np.int64)
    if free is None or not np.any(free):
        seg_lo, seg_hi = node_segments(num_replicas, replicas_per_node)
    else:
        seg_lo, seg_hi = _ready_segments(num_replicas, replicas_per_node, free)
    return _place(degs, order, int(num_replicas), int(replicas_per_node), seg_lo, seg_hi)
