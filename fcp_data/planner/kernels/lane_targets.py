"""Compiled kernels of the mixed-degree lane sets: the dual approximation and its bisection.

For a target makespan M, `lanes_for_target` counts the lanes each sequence needs to finish
within M; `smallest_lane_target` bisects the smallest M whose lanes fit the replicas. See
`planner/strategies/lanes.py`; the arrays follow the conventions of `kernels/__init__.py`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .core import BETA1, INF
from .lanes import unit_lane_time

__all__ = ["lanes_for_target", "smallest_lane_target"]


@nb.njit(cache=True)
def lanes_for_target(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    dmin: np.ndarray,
    overhead: np.ndarray,
    order: np.ndarray,
    target: float,
    num_replicas: int,
    replicas_per_node: int,
    allowed: np.ndarray,
    cost_params: np.ndarray,
    credit: float,
) -> tuple[np.ndarray, int]:
    """Dual approximation: the lanes needed so that every unit finishes within `target`.

    A unit needs the smallest allowed degree d >= dmin with T(u, d) <= target. Units that need
    d > 1 are first-fit (smallest fitting degree, fullest lane) into wide lanes of at most
    `target` load; the rest need ceil((Σ T(u, 1) − credit × spare wide-lane replica-time) /
    target) lanes of degree 1. Returns (wide lane degrees, number of degree-1 lanes); -1 lanes
    when the target is infeasible.
    """
    lane_params = cost_params.copy()
    lane_params[BETA1] = 0.0  # β1 is charged per unit through `overhead`
    k = order.shape[0]
    lane_deg = np.zeros(num_replicas, np.int64)
    lane_load = np.zeros(num_replicas)
    num_lanes = 0
    used = 0
    narrow = 0.0
    for t in range(k):
        u = order[t]
        d = dmin[u]
        need = 0
        while d <= num_replicas:
            if allowed[d]:
                tt = unit_lane_time(
                    att, lin, comm, overhead, u, d, d > replicas_per_node, 1.0, lane_params
                )
                if tt <= target:
                    need = d
                    break
            d += 1
        if need == 0:
            return lane_deg[:0].copy(), -1
        if need == 1:
            narrow += unit_lane_time(att, lin, comm, overhead, u, 1, False, 1.0, lane_params)
            continue
        best = -1
        # the 64 most recently opened lanes: older ones are all but full (first-fit
        # decreasing); exact whenever fewer than 65 wide lanes exist (N <= 128)
        for ln in range(max(0, num_lanes - 64), num_lanes):
            if lane_deg[ln] < need:
                continue
            tt = unit_lane_time(
                att,
                lin,
                comm,
                overhead,
                u,
                lane_deg[ln],
                lane_deg[ln] > replicas_per_node,
                1.0,
                lane_params,
            )
            if lane_load[ln] + tt > target:
                continue
            if (
                best < 0
                or lane_deg[ln] < lane_deg[best]
                or (lane_deg[ln] == lane_deg[best] and lane_load[ln] > lane_load[best])
            ):
                best = ln
        if best >= 0:
            lane_load[best] += unit_lane_time(
                att,
                lin,
                comm,
                overhead,
                u,
                lane_deg[best],
                lane_deg[best] > replicas_per_node,
                1.0,
                lane_params,
            )
        else:
            if used + need > num_replicas:
                return lane_deg[:0].copy(), -1
            lane_deg[num_lanes] = need
            lane_load[num_lanes] = unit_lane_time(
                att, lin, comm, overhead, u, need, need > replicas_per_node, 1.0, lane_params
            )
            num_lanes += 1
            used += need
    spare = 0.0
    for ln in range(num_lanes):
        spare += (target - lane_load[ln]) * lane_deg[ln]
    rest = narrow - credit * spare
    k1 = 0
    if rest > 0:
        k1 = int(np.ceil(rest / target - 1e-9))
    if used + k1 > num_replicas:
        return lane_deg[:0].copy(), -1
    return lane_deg[:num_lanes].copy(), k1


@nb.njit(cache=True)
def smallest_lane_target(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    dmin: np.ndarray,
    overhead: np.ndarray,
    order: np.ndarray,
    lower: float,
    num_replicas: int,
    replicas_per_node: int,
    allowed: np.ndarray,
    cost_params: np.ndarray,
    credit: float,
) -> tuple[np.ndarray, float]:
    """Bisect the smallest target makespan whose lanes (`lanes_for_target`) fit N replicas.

    The target grows from the lower bound by 5%, 15%, then ×1.5 until feasible, then is
    bisected to 0.4%. Returns (wide lane degrees, target); target INF when nothing fits.
    """
    lo = max(lower, 1e-12)
    hi = lo
    wide, k1 = lanes_for_target(
        att,
        lin,
        comm,
        dmin,
        overhead,
        order,
        hi,
        num_replicas,
        replicas_per_node,
        allowed,
        cost_params,
        credit,
    )
    steps = 0
    while k1 < 0 and steps < 60:
        lo = hi
        hi = hi * (1.05 if steps == 0 else 1.1 if steps == 1 else 1.5)
        steps += 1
        wide, k1 = lanes_for_target(
            att,
            lin,
            comm,
            dmin,
            overhead,
            order,
            hi,
            num_replicas,
            replicas_per_node,
            allowed,
            cost_params,
            credit,
        )
    if k1 < 0:
        return wide, INF
    for _ in range(12):
        if hi - lo <= 4e-3 * hi:
            break
        mid = 0.5 * (lo + hi)
        w2, k2 = lanes_for_target(
            att,
            lin,
            comm,
            dmin,
            overhead,
            order,
            mid,
            num_replicas,
            replicas_per_node,
            allowed,
            cost_params,
            credit,
        )
        if k2 < 0:
            lo = mid
        else:
            hi = mid
            wide = w2
    return wide, hi
