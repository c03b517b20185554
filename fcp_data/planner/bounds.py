"""A lower bound on any plan's makespan: what every candidate's ratio is measured against."""

from __future__ import annotations

import numpy as np

from ..layout import shard_tokens
from .cost.problem import Problem
from .kernels import BETA1, BETA2, BETA3, INTER_NODE_BANDWIDTH, INTRA_NODE_BANDWIDTH, TRANSPORTS

__all__ = ["lower_bound"]


def lower_bound(prob: Problem, keep: np.ndarray | None = None) -> float:
    """A lower bound on any plan's makespan for the sequences `keep` (default: all).

    Two classic terms and their combination:
    - work: a group of degree d on replicas of speed >= sp occupies d·sp·T = L + max(A, d·sp·C)
      + d·β1 >= L + A unit-speed seconds, so no plan does less than W = Σ (A + L): M ≥ W / Σ speed;
    - the most expensive sequence alone: M ≥ min_d T(s_max, d) on the fastest replicas;
    - combined: if s_max runs at degree d, its group holds d replicas for T_d, and M·Σ speed is
      at least the rest of the work plus what that group occupies. In a latency- or
      bandwidth-bound group (d·C > A) the attention of sequences packed with s_max hides behind
      the ring, so the group occupies less than "its own work + T_d": only
      f_d = L + d·β1 + max(A, d·sp·C − H_d), where H_d = Σ_{o ≠ max} max(0, A_o − d·sp·C_o)
      is all the attention the others could hide (each pays its own ring bytes C_o). With
      sp = the slowest speed (f_d grows with sp): M ≥ min_d max(T_d, (W − w_max + f_d) / Σ speed).
    Every step is an inequality on the simulator's own T(G, d), so the bound holds for every plan
    it scores (tests/planner/test_bruteforce.py enumerates all plans of tiny instances). Without
    H_d, two packed sequences beat it by up to 0.74% (lengths 828 and 936 on 2 H200 replicas).
    With head-parallel transports (`CostModel.head_parallel`) s_max may also run each hybrid
    u x r: T_d and f_d take the least over the transports (f_d adds d·sp·C_a2a, which hides
    behind nothing), and H_d lets the others hide all their attention (their own ring bytes
    may shrink to nothing under a pure all-to-all), so the bound stays below every plan.
    """
    ids = np.arange(prob.lens.size) if keep is None else keep
    if ids.size == 0:
        return 0.0
    total_speed = float(prob.speed.sum())
    work = float(prob.work[ids].sum())
    top = ids[np.argmax(prob.work[ids])]
    others = ids[ids != top]
    rest = work - float(prob.work[top])
    fastest, slowest = float(prob.speed.max()), float(prob.speed.min())
    s = int(prob.lens[top])
    d = np.arange(1, prob.num_replicas + 1)  # every degree: the bound holds for all strategies
    local = shard_tokens(s, d, prob.unit)
    d = d[local <= prob.cap]
    if d.size == 0:
        return work / total_speed
    p = prob.cost_params
    bw = np.where(d > prob.replicas_per_node, p[INTER_NODE_BANDWIDTH], p[INTRA_NODE_BANDWIDTH])
    comm = np.where(d > 1, (d - 1) / d * prob.comm[top] / bw + p[BETA2] * (d - 1), 0.0)
    t = prob.lin[top] / d / fastest + np.maximum(prob.att[top] / d / fastest, comm)
    t = t + p[BETA1] / fastest
    # H_d: attention of the others that can hide under the ring, net of their own bytes
    own_ring = slowest * np.outer((d - 1) / bw, prob.comm[others])
    if p.size > TRANSPORTS:  # a hybrid may carry the others' K/V at no ring cost at all
        own_ring = np.zeros_like(own_ring)
    hidden = np.maximum(0.0, prob.att[others][None, :] - own_ring).sum(axis=1)
    ring = d * slowest * comm
    occupied = prob.lin[top] + d * p[BETA1] + np.maximum(prob.att[top], ring - hidden)
    best = float(np.min(np.maximum(t, (rest + occupied) / total_speed)))
    for k in range(TRANSPORTS, p.size, 3):
        u, ratio, share = int(p[k]), p[k + 1], p[k + 2]
        ok = d % u == 0
        if not ok.any():
            continue
        du, bwu = d[ok], bw[ok]
        r = du // u
        ring_u = np.where(
            r > 1, (r - 1) / r * share * prob.comm[top] / bwu + p[BETA2] * (r - 1), 0.0
        )
        # the fastest the all-to-all can be: intra-node bandwidth
        a2a = (u - 1) / u * ratio * prob.comm[top] / du / p[INTRA_NODE_BANDWIDTH] + p[BETA3]
        t_u = prob.lin[top] / du / fastest + np.maximum(prob.att[top] / du / fastest, ring_u)
        t_u = t_u + a2a + p[BETA1] / fastest
        occ = prob.lin[top] + du * p[BETA1] + du * slowest * a2a
        occ = occ + np.maximum(prob.att[top], du * slowest * ring_u - hidden[ok])
        best = min(best, float(np.min(np.maximum(t_u, (rest + occ) / total_speed))))
    # rounded down by 1e-12: a plan that meets the bound exactly must not score below it by
    # float rounding (the scorer sums the same terms in another order)
    return max(work / total_speed, best) * (1.0 - 1e-12)
