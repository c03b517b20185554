"""Moldable list scheduling: each sequence picks its degree and the window that frees up first.

Sequences are visited longest first; each tries degrees d_min .. d_min + `extra` on node-aligned
windows and takes the (degree, window) with the earliest finish, starting when the whole window
is free (`kernels.list_schedule`). Consecutive sequences that landed on the same window become
one micro-batch when memory allows (`kernels.compact_windows`), which only lowers the time.
"""

from __future__ import annotations

import numpy as np

from ..cost.problem import Problem
from ..kernels import compact_windows, list_schedule
from .schedule import Schedule

__all__ = ["moldable_schedule"]


def moldable_schedule(
    prob: Problem, units: np.ndarray | None = None, extra: int = 4
) -> Schedule | None:
    order = prob.order if units is None else units
    if order.size * prob.num_replicas * (extra + 1) > 1e7:  # bounded work at 1024 replicas
        extra = max(1, int(1e7 // max(1, order.size * prob.num_replicas)) - 1)
    w_start, w_deg, _, span = list_schedule(
        prob.att,
        prob.lin,
        prob.comm,
        prob.dmin,
        order,
        prob.num_replicas,
        prob.replicas_per_node,
        prob.allowed,
        prob.speed,
        extra,
        prob.cost_params,
    )
    if span >= 1e299:
        return None
    g_of, g_start, g_deg = compact_windows(
        prob.lens, order, w_start, w_deg, prob.num_replicas, prob.cap, prob.unit
    )
    return Schedule(
        name=f"moldable(extra={extra})",
        starts=g_start,
        degs=g_deg,
        units=order,
        unit_group=g_of[order],
    ).score(prob)
