"""Placement: concrete replica windows for a multiset of degrees.

The slowest link sets a ring's speed (DESIGN.md, from the blog seed), so a group that fits in
one node must stay in one node: degrees are placed largest first, groups wider than a node on
whole free nodes, the others best-fit into the node with the least room that still holds them
(keeping big holes for big groups). When fragmentation leaves no such room, the whole multiset
falls back to a dense left-to-right layout, which is always contiguous because Σ d ≤ N.
Compiled with numba: placement runs for every candidate lane set (hundreds per plan).
"""

from __future__ import annotations

import numba as nb
import numpy as np

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
    degs: np.ndarray, order: np.ndarray, n: int, rpn: int, node_order: np.ndarray
) -> np.ndarray:
    free = np.ones(n, dtype=np.bool_)
    starts = np.full(degs.size, -1, np.int64)
    nodes = (n + rpn - 1) // rpn
    rooms = np.empty(nodes, np.int64)
    for nd in range(nodes):
        rooms[nd] = min(n, (nd + 1) * rpn) - nd * rpn
    for t in range(order.size):
        i = order[t]
        d = degs[i]
        s = -1
        if d > rpn:
            s = _run_in(free, 0, n, d, rpn)
        else:
            best_room = rpn + 1
            for t2 in range(nodes):
                nd = node_order[t2]
                lo = nd * rpn
                hi = min(n, lo + rpn)
                room = rooms[nd]
                if d <= room < best_room:
                    cand = _run_in(free, lo, hi, d, 1)
                    if cand >= 0:
                        s = cand
                        best_room = room
        if s < 0:
            s = _run_in(free, 0, n, d, 1)
        if s < 0:
            off = 0
            for j in range(order.size):
                starts[order[j]] = off
                off += degs[order[j]]
            return starts
        for r in range(s, s + d):
            free[r] = False
            rooms[r // rpn] -= 1
        starts[i] = s
    return starts


def place_degrees(
    degrees: list[int] | np.ndarray, n: int, rpn: int, free: np.ndarray | None = None
) -> np.ndarray:
    """Start replica of each degree's window (same order as `degrees`); windows are disjoint.

    `free` (when each replica becomes available, e.g. after a prologue) makes nodes that free
    up first win ties, so the widest groups, placed first, start earliest.
    """
    degs = np.asarray(degrees, dtype=np.int64)
    if degs.sum() > n:
        raise ValueError(f"degrees sum to {int(degs.sum())} > {n} replicas")
    order = np.lexsort((np.arange(degs.size), -degs)).astype(np.int64)
    nodes = -(-n // rpn)
    if free is None or not np.any(free):
        node_order = np.arange(nodes, dtype=np.int64)
    else:
        ready = np.array([free[k * rpn : (k + 1) * rpn].mean() for k in range(nodes)])
        node_order = np.lexsort((np.arange(nodes), ready)).astype(np.int64)
    return _place(degs, order, int(n), int(rpn), node_order)
