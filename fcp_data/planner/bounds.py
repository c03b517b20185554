"""A lower bound on any plan's makespan: what every candidate's ratio is measured against."""

from __future__ import annotations

import numpy as np

from ..layout import shard_tokens
from .kernels import BETA1, BETA2, INTER_NODE_BANDWIDTH, INTRA_NODE_BANDWIDTH
from .problem import Problem

__all__ = ["lower_bound"]


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
    d = np.arange(1, prob.num_replicas + 1)  # every degree: the bound holds for all strategies
    local = shard_tokens(s, d)
    d = d[local <= prob.cap]
    if d.size == 0:
        return work / total_speed
    bw = np.where(
        d > prob.replicas_per_node,
        prob.cost_params[INTER_NODE_BANDWIDTH],
        prob.cost_params[INTRA_NODE_BANDWIDTH],
    )
    comm = np.where(
        d > 1, (d - 1) / d * prob.comm[top] / bw + prob.cost_params[BETA2] * (d - 1), 0.0
    )
    t = prob.lin[top] / d / fastest + np.maximum(prob.att[top] / d / fastest, comm)
    t = t + prob.cost_params[BETA1] / fastest
    best = float(np.min(np.maximum(t, (rest + d * slowest * t) / total_speed)))
    return max(work / total_speed, best)
