"""Core kernels shared by every candidate: a group's time, the padded shard, Stage 1 BFD,
Stage 2 DP and the critical path of a schedule."""

from __future__ import annotations

import numba as nb
import numpy as np

from ... import layout

__all__ = [
    "BETA1",
    "BETA2",
    "BETA3",
    "INF",
    "INTER_NODE_BANDWIDTH",
    "INTRA_NODE_BANDWIDTH",
    "REPLICAS_PER_NODE",
    "TRANSPORTS",
    "bfd_pack",
    "critical_path",
    "dp_degrees",
    "group_time",
    "shard_tokens",
    "window_transports",
]

INF = 1e300
# Positions in `cost_params`, the cost model's constants packed into one float array (numba
# kernels take arrays, not dataclasses): seconds per micro-batch, seconds per ring step, and
# the bytes/s of an intra-node and an inter-node link; the replicas of a node and the
# all-to-all latency of a micro-batch; then, from TRANSPORTS on, one triple per head-parallel
# degree u: (u, all-to-all bytes per local token / alpha3, share of the ring's bytes).
BETA1 = 0
BETA2 = 1
INTRA_NODE_BANDWIDTH = 2
INTER_NODE_BANDWIDTH = 3
REPLICAS_PER_NODE = 4
BETA3 = 5
TRANSPORTS = 6


@nb.njit(cache=True)
def group_time(
    att: float,
    lin: float,
    comm: float,
    d: int,
    inter: bool,
    speed: float,
    cost_params: np.ndarray,
) -> float:
    """T(G, d) of cost/model.py: L + max(A, C) + β1, compute scaled by the slowest member's speed;
    with head-parallel transports, the fastest of the ring and each hybrid u x r.

    The kernels see a window's node span (`inter`), not where it starts: an all-to-all block
    is taken to span nodes when the window does and u does not divide the node (blocks
    aligned to nodes). The scorer (`Problem.window_times`) uses the exact blocks.
    """
    attention = att / d / speed
    ring = 0.0
    bandwidth = cost_params[INTER_NODE_BANDWIDTH] if inter else cost_params[INTRA_NODE_BANDWIDTH]
    if d > 1:
        ring = (d - 1) / d * comm / bandwidth + cost_params[BETA2] * (d - 1)
    best = lin / d / speed + max(attention, ring) + cost_params[BETA1] / speed
    # a hybrid's all-to-all hides behind nothing: it can only win where the ring is exposed
    if d == 1 or cost_params.size <= TRANSPORTS or ring <= attention:
        return best
    per_node = cost_params[REPLICAS_PER_NODE]
    for k in range(TRANSPORTS, cost_params.size, 3):
        u = int(cost_params[k])
        if d % u:
            continue
        r = d // u
        ring_u = 0.0
        if r > 1:
            ring_u = (r - 1) / r * cost_params[k + 2] * comm / bandwidth + cost_params[BETA2] * (
                r - 1
            )
        block_bw = cost_params[INTRA_NODE_BANDWIDTH]
        if inter and (u > per_node or int(per_node) % u):
            block_bw = cost_params[INTER_NODE_BANDWIDTH]
        a2a = (u - 1) / u * cost_params[k + 1] * comm / d / block_bw + cost_params[BETA3]
        t = lin / d / speed + max(attention, ring_u) + a2a + cost_params[BETA1] / speed
        if t < best:
            best = t
    return best


@nb.njit(cache=True)
def window_transports(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    starts: np.ndarray,
    degs: np.ndarray,
    speed: np.ndarray,
    times: np.ndarray,
    cost_params: np.ndarray,
) -> np.ndarray:
    """In place: each window's time lowered to its fastest hybrid u x r where one beats the
    ring's `times`; returns the u of each (1: the ring). Exact all-to-all blocks: a block
    spans nodes when its own replicas [start + j u, start + (j + 1) u) do."""
    n = starts.shape[0]
    ulysses = np.ones(n, np.int64)
    per_node = int(cost_params[REPLICAS_PER_NODE])
    for g in range(n):
        d = degs[g]
        if d == 1:
            continue
        s0 = starts[g]
        sp = speed[g]
        inter = s0 // per_node != (s0 + d - 1) // per_node
        bandwidth = (
            cost_params[INTER_NODE_BANDWIDTH] if inter else cost_params[INTRA_NODE_BANDWIDTH]
        )
        attention = att[g] / d / sp
        ring = (d - 1) / d * comm[g] / bandwidth + cost_params[BETA2] * (d - 1)
        if ring <= attention:  # the ring hides behind attention: no all-to-all beats it
            continue
        for k in range(TRANSPORTS, cost_params.shape[0], 3):
            u = int(cost_params[k])
            if d % u:
                continue
            r = d // u
            ring_u = 0.0
            if r > 1:
                ring_u = (r - 1) / r * cost_params[k + 2] * comm[g] / bandwidth
                ring_u += cost_params[BETA2] * (r - 1)
            block_inter = False
            if inter:
                for j in range(r):
                    a = s0 + j * u
                    if a // per_node != (a + u - 1) // per_node:
                        block_inter = True
                        break
            block_bw = (
                cost_params[INTER_NODE_BANDWIDTH]
                if block_inter
                else cost_params[INTRA_NODE_BANDWIDTH]
            )
            a2a = (u - 1) / u * cost_params[k + 1] * comm[g] / d / block_bw + cost_params[BETA3]
            t = lin[g] / d / sp + max(attention, ring_u) + a2a + cost_params[BETA1] / sp
            if t < times[g]:
                times[g] = t
                ulysses[g] = u
    return ulysses


# Tokens of a length-s sequence held by one member of a degree-d group (the layout contract):
# 2u * ceil(s / 2du) for a pad unit u (TP under sequence parallel, else 1).
shard_tokens = nb.njit(cache=True)(layout.shard_tokens)


@nb.njit(cache=True)
def bfd_pack(
    lens: np.ndarray,
    order: np.ndarray,
    cap: int,
    dmin_single: np.ndarray,
    fixed_degree: int,
    unit: int = 1,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-Fit-Decreasing of Stage 1: sequences (visited in `order`, longest first) into bins.

    A sequence that fits no open bin opens one at its own minimum degree (or `fixed_degree`
    when > 0), whose memory is d × cap; later (shorter) sequences best-fit into the headroom,
    measured in padded per-replica tokens at the bin's degree (`shard_tokens` with pad unit
    `unit`, exactly what the collator allocates). Returns (bin of each sequence, degree of each
    bin, number of bins).
    """
    k = order.shape[0]
    bin_of = np.empty(lens.shape[0], np.int64)
    bin_d = np.empty(k, np.int64)
    bin_used = np.empty(k, np.int64)
    nbins = 0
    for t in range(k):
        i = order[t]
        s = lens[i]
        best = -1
        best_rem = cap + 1
        for b in range(nbins):
            rem = cap - bin_used[b] - shard_tokens(s, bin_d[b], unit)
            if rem >= 0 and rem < best_rem:
                best = b
                best_rem = rem
        if best >= 0:
            bin_used[best] += shard_tokens(s, bin_d[best], unit)
            bin_of[i] = best
        else:
            d = fixed_degree if fixed_degree > 0 else dmin_single[i]
            bin_d[nbins] = d
            bin_used[nbins] = shard_tokens(s, d, unit)
            bin_of[i] = nbins
            nbins += 1
    return bin_of, bin_d[:nbins].copy(), nbins


@nb.njit(cache=True)
def dp_degrees(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    dmin: np.ndarray,
    num_replicas: int,
    replicas_per_node: int,
    allowed: np.ndarray,
    cost_params: np.ndarray,
) -> tuple[np.ndarray, float]:
    """Stage 2 (Eq. 11 / Algorithm 1): degrees for K concurrent groups on at most n replicas.

    DP[i][j] = min_d max(DP[i-1][j-d], T̂_i(d)) where T̂_i(d) = min_{d' ≤ d} T_i(d') is the
    prefix minimum (using fewer replicas than allotted is allowed). DP[i-1][j-d] is
    non-decreasing in d and T̂_i non-increasing, so the minimum sits where they cross: each cell
    is a binary search, O(K·n·log n) instead of O(K·n²), and exact. Returns (degree per group,
    makespan), makespan INF when the groups cannot all fit.
    """
    k = att.shape[0]
    tpm = np.full((k, num_replicas + 1), INF)
    targ = np.zeros((k, num_replicas + 1), np.int64)
    for i in range(k):
        best = INF
        bd = 0
        for d in range(1, num_replicas + 1):
            if d >= dmin[i] and allowed[d]:
                t = group_time(att[i], lin[i], comm[i], d, d > replicas_per_node, 1.0, cost_params)
                if t < best:
                    best = t
                    bd = d
            tpm[i, d] = best
            targ[i, d] = bd
    dpv = np.full((k + 1, num_replicas + 1), INF)
    choice = np.zeros((k + 1, num_replicas + 1), np.int64)
    dpv[0, :] = 0.0
    need = 0
    for i in range(1, k + 1):
        need_prev = need
        need += dmin[i - 1]
        if need > num_replicas:
            return np.zeros(k, np.int64), INF
        g = i - 1
        for j in range(need, num_replicas + 1):
            lo = dmin[g]
            hi = j - need_prev
            # smallest d in [lo, hi] with f(d) = dpv[i-1, j-d] >= tpm[g, d]
            a, b = lo, hi + 1
            while a < b:
                m = (a + b) // 2
                if dpv[i - 1, j - m] >= tpm[g, m]:
                    b = m
                else:
                    a = m + 1
            best = INF
            bd = 0
            for d in (a - 1, a):
                if lo <= d <= hi:
                    v = max(dpv[i - 1, j - d], tpm[g, d])
                    if v < best:
                        best = v
                        bd = d
            dpv[i, j] = best
            choice[i, j] = bd
    degs = np.zeros(k, np.int64)
    j = num_replicas
    for i in range(k, 0, -1):
        da = choice[i, j]
        degs[i - 1] = targ[i - 1, da]
        j -= da
    return degs, dpv[k, num_replicas]


@nb.njit(cache=True)
def critical_path(
    starts: np.ndarray, degs: np.ndarray, times: np.ndarray, num_replicas: int
) -> float:
    """Makespan of groups run in order on contiguous windows, each starting when free."""
    free = np.zeros(num_replicas)
    for g in range(starts.shape[0]):
        s = starts[g]
        e = s + degs[g]
        t0 = 0.0
        for r in range(s, e):
            if free[r] > t0:
                t0 = free[r]
        for r in range(s, e):
            free[r] = t0 + times[g]
    return free.max()
