"""Compiled kernels of moldable list scheduling: window choice and micro-batch compaction.

See `planner/strategies/moldable.py`; the arrays follow `kernels/__init__.py`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .core import INF, group_time, shard_tokens

__all__ = ["compact_windows", "list_schedule"]


@nb.njit(cache=True)
def _window_finish(
    free: np.ndarray,
    speed: np.ndarray,
    s0: int,
    d: int,
    att: float,
    lin: float,
    comm: float,
    inter: bool,
    cost_params: np.ndarray,
) -> float:
    """When a unit would finish on replicas [s0, s0 + d): start when all are free, run at the
    slowest member's speed."""
    smax = 0.0
    sp = INF
    for r in range(s0, s0 + d):
        smax = max(smax, free[r])
        sp = min(sp, speed[r])
    return smax + group_time(att, lin, comm, d, inter, sp, cost_params)


@nb.njit(cache=True)
def list_schedule(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    dmin: np.ndarray,
    order: np.ndarray,
    num_replicas: int,
    replicas_per_node: int,
    allowed: np.ndarray,
    speed: np.ndarray,
    extra: int,
    cost_params: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Moldable list scheduling: each unit (longest first) picks the degree and node-aligned
    window of replicas on which it finishes first, starting when the whole window is free.

    Degrees tried: dmin .. dmin + extra (allowed ones only). Windows are packed inside a node
    (starts b, b+d, b+2d, ...) or, for d > replicas per node, start at node boundaries. With
    equal speeds a degree's run time is the same on every window of one kind (intra- or
    inter-node), so only the window that frees up first matters: O(N) per degree.
    Returns (start, degree, finish time) per unit and the makespan.
    """
    k = order.shape[0]
    free = np.zeros(num_replicas)
    w_start = np.zeros(att.shape[0], np.int64)
    w_deg = np.zeros(att.shape[0], np.int64)
    w_end = np.zeros(att.shape[0])
    nodes = (num_replicas + replicas_per_node - 1) // replicas_per_node
    fastest = speed.max()
    uniform = speed.min() == fastest
    for t in range(k):
        u = order[t]
        bf = INF
        bs = 0
        bd = 0
        earliest = free.min()
        for d in range(dmin[u], min(num_replicas, dmin[u] + extra) + 1):
            if not allowed[d]:
                continue
            inter = d > replicas_per_node
            t_run = group_time(att[u], lin[u], comm[u], d, inter, fastest, cost_params)
            # no window of this degree can beat the best so far: skip its scan
            if earliest + t_run >= bf:
                continue
            for nd in range(nodes if not inter else 1):
                top = (
                    min(num_replicas, nd * replicas_per_node + replicas_per_node)
                    if not inter
                    else num_replicas
                )
                s0 = nd * replicas_per_node
                while s0 + d <= top:
                    if uniform:
                        smax = 0.0
                        for r in range(s0, s0 + d):
                            smax = max(smax, free[r])
                        f = smax + t_run
                    else:
                        f = _window_finish(
                            free, speed, s0, d, att[u], lin[u], comm[u], inter, cost_params
                        )
                    if f < bf:
                        bf = f
                        bs = s0
                        bd = d
                    s0 += d if not inter else replicas_per_node
        if bd == 0:
            return w_start, w_deg, w_end, INF
        for r in range(bs, bs + bd):
            free[r] = bf
        w_start[u] = bs
        w_deg[u] = bd
        w_end[u] = bf
    return w_start, w_deg, w_end, free.max()


@nb.njit(cache=True)
def compact_windows(
    lens: np.ndarray,
    order: np.ndarray,
    w_start: np.ndarray,
    w_deg: np.ndarray,
    num_replicas: int,
    cap: int,
    unit: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge consecutive units on the same window into one micro-batch when memory allows
    (padded shards with pad unit `unit`, as the collator allocates them).

    Units are visited in scheduling order; a unit joins the previous group when that group is
    the latest on every replica of the same window and its padded shard still fits. Returns
    (group of each unit, group starts, group degrees) in execution order.
    """
    k = order.shape[0]
    last = np.full(num_replicas, -1, np.int64)
    g_of = np.full(lens.shape[0], -1, np.int64)
    g_start = np.empty(k, np.int64)
    g_deg = np.empty(k, np.int64)
    g_used = np.empty(k, np.int64)
    ng = 0
    for t in range(k):
        u = order[t]
        s = w_start[u]
        d = w_deg[u]
        loc = shard_tokens(lens[u], d, unit)
        g = last[s]
        ok = g >= 0 and g_start[g] == s and g_deg[g] == d and g_used[g] + loc <= cap
        if ok:
            for r in range(s, s + d):
                if last[r] != g:
                    ok = False
                    break
        if ok:
            g_used[g] += loc
            g_of[u] = g
        else:
            g_start[ng] = s
            g_deg[ng] = d
            g_used[ng] = loc
            g_of[u] = ng
            for r in range(s, s + d):
                last[r] = ng
            ng += 1
    return g_of, g_start[:ng].copy(), g_deg[:ng].copy()
