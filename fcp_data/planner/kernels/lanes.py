"""Compiled kernels of the lane candidates: LPT dealing, refinement and packing.

See `planner/strategies/lanes.py` for what a lane is; the arrays follow `kernels/__init__.py`.
The lane sets themselves (dual approximation) are found by `lane_targets.py`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .core import BETA1, INF, group_time, shard_tokens

__all__ = ["deal_lpt", "pack_lanes", "refine_moves", "unit_lane_time"]


@nb.njit(cache=True)
def _heap_less(load: np.ndarray, a: int, b: int) -> bool:
    return load[a] < load[b] or (load[a] == load[b] and a < b)


@nb.njit(cache=True)
def _sift_down(heap: np.ndarray, lo: int, size: int, i: int, load: np.ndarray) -> None:
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        small = left
        right = left + 1
        if right < size and _heap_less(load, heap[lo + right], heap[lo + left]):
            small = right
        if _heap_less(load, heap[lo + small], heap[lo + i]):
            heap[lo + small], heap[lo + i] = heap[lo + i], heap[lo + small]
            i = small
        else:
            return


@nb.njit(cache=True)
def deal_lpt(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    dmin: np.ndarray,
    order: np.ndarray,
    lane_deg: np.ndarray,
    lane_inter: np.ndarray,
    lane_speed: np.ndarray,
    overhead: np.ndarray,
    load0: np.ndarray,
    cost_params: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Longest-processing-time dealing onto lanes (CP groups held for the whole batch).

    Units are visited in `order` (longest first) and each goes to the lane where it would finish
    first among lanes of degree >= its dmin (ties: the lowest lane). `overhead[u] / d` is the
    unit's share of the per micro-batch constant β1 (units are packed into micro-batches of
    d × cap tokens afterwards). `load0` is when each lane becomes free (after a prologue).
    Lanes of equal (degree, link, speed) are interchangeable, so each such class keeps a heap
    of its lanes by load: a unit looks at one lane per class, O(K · classes · log L) instead of
    O(K · L) (8192 sequences on 1024 replicas: ~50 ms down to ~1 ms).
    Returns (lane of each unit, lane loads); a lane of -1 means no lane could hold the unit.
    """
    num_lanes = lane_deg.shape[0]
    load = load0.copy()
    lane_of = np.full(att.shape[0], -1, np.int64)
    lane_params = cost_params.copy()
    lane_params[BETA1] = 0.0  # β1 is charged per unit through `overhead`
    # classes of interchangeable lanes
    cls = np.full(num_lanes, -1, np.int64)
    c_deg = np.empty(num_lanes, np.int64)
    c_inter = np.empty(num_lanes, np.bool_)
    c_speed = np.empty(num_lanes)
    num_classes = 0
    for ln in range(num_lanes):
        for c in range(num_classes):
            if (
                c_deg[c] == lane_deg[ln]
                and c_inter[c] == lane_inter[ln]
                and c_speed[c] == lane_speed[ln]
            ):
                cls[ln] = c
                break
        if cls[ln] < 0:
            c_deg[num_classes] = lane_deg[ln]
            c_inter[num_classes] = lane_inter[ln]
            c_speed[num_classes] = lane_speed[ln]
            cls[ln] = num_classes
            num_classes += 1
    size = np.zeros(num_classes, np.int64)
    for ln in range(num_lanes):
        size[cls[ln]] += 1
    off = np.zeros(num_classes + 1, np.int64)
    for c in range(num_classes):
        off[c + 1] = off[c] + size[c]
    heap = np.empty(num_lanes, np.int64)
    fill = off[:-1].copy()
    for ln in range(num_lanes):
        heap[fill[cls[ln]]] = ln
        fill[cls[ln]] += 1
    for c in range(num_classes):
        for i in range(size[c] // 2 - 1, -1, -1):
            _sift_down(heap, off[c], size[c], i, load)
    for t in range(order.shape[0]):
        u = order[t]
        best_c = -1
        best_l = -1
        bf = INF
        for c in range(num_classes):
            d = c_deg[c]
            if d < dmin[u]:
                continue
            ln = heap[off[c]]
            f = load[ln] + group_time(
                att[u], lin[u], comm[u], d, c_inter[c], c_speed[c], lane_params
            )
            f += overhead[u] / d / c_speed[c]
            if f < bf or (f == bf and ln < best_l):
                bf = f
                best_c = c
                best_l = ln
        if best_c >= 0:
            load[best_l] = bf
            lane_of[u] = best_l
            _sift_down(heap, off[best_c], size[best_c], 0, load)
    return lane_of, load


@nb.njit(cache=True)
def unit_lane_time(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    overhead: np.ndarray,
    u: int,
    d: int,
    inter: bool,
    speed: float,
    lane_params: np.ndarray,
) -> float:
    """A unit's time in a lane with β1 replaced by its share `overhead[u] / d` (q[0] is 0)."""
    return (
        group_time(att[u], lin[u], comm[u], d, inter, speed, lane_params) + overhead[u] / d / speed
    )


@nb.njit(cache=True)
def refine_moves(
    att: np.ndarray,
    lin: np.ndarray,
    comm: np.ndarray,
    dmin: np.ndarray,
    overhead: np.ndarray,
    lane_of: np.ndarray,
    load: np.ndarray,
    lane_deg: np.ndarray,
    lane_inter: np.ndarray,
    lane_speed: np.ndarray,
    max_iter: int,
    cost_params: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Move units off the most loaded lane while that lowers the maximum load.

    Each iteration takes the lane that finishes last and applies the single move of one of its
    units to another lane that lowers max(load of the two) the most. Stops when no move helps.
    """
    lane_params = cost_params.copy()
    lane_params[BETA1] = 0.0  # β1 is charged per unit through `overhead`
    num_lanes = lane_deg.shape[0]
    k = att.shape[0]
    for _ in range(max_iter):
        m = 0
        for ln in range(1, num_lanes):
            if load[ln] > load[m]:
                m = ln
        best_new = load[m] * (1.0 - 1e-12)
        bu = -1
        bl = -1
        bcm = 0.0
        bcl = 0.0
        for u in range(k):
            if lane_of[u] != m:
                continue
            cm = unit_lane_time(
                att, lin, comm, overhead, u, lane_deg[m], lane_inter[m], lane_speed[m], lane_params
            )
            for ln in range(num_lanes):
                if ln == m or lane_deg[ln] < dmin[u]:
                    continue
                if load[ln] >= best_new:
                    continue
                cl = unit_lane_time(
                    att,
                    lin,
                    comm,
                    overhead,
                    u,
                    lane_deg[ln],
                    lane_inter[ln],
                    lane_speed[ln],
                    lane_params,
                )
                new = max(load[m] - cm, load[ln] + cl)
                if new < best_new:
                    best_new = new
                    bu = u
                    bl = ln
                    bcm = cm
                    bcl = cl
        if bu < 0:
            break
        lane_of[bu] = bl
        load[m] -= bcm
        load[bl] += bcl
    return lane_of, load


@nb.njit(cache=True)
def pack_lanes(
    lens: np.ndarray,
    lane_of: np.ndarray,
    lane_deg: np.ndarray,
    order: np.ndarray,
    cap: int,
    nlanes: int,
    unit: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pack each lane's units into micro-batches (BFD at the lane's degree, shards padded with
    pad unit `unit`).

    Units are bucketed by lane keeping `order` (longest first), then each lane best-fits its
    units into its own micro-batches. Returns (micro-batch of each unit, lane of each
    micro-batch, its rank within the lane). Units with lane -1 get micro-batch -1.
    """
    k = lens.shape[0]
    mb_of = np.full(k, -1, np.int64)
    mb_lane = np.empty(k, np.int64)
    mb_rank = np.empty(k, np.int64)
    mb_used = np.empty(k, np.int64)
    count = np.zeros(nlanes + 1, np.int64)
    for t in range(order.shape[0]):
        ln = lane_of[order[t]]
        if ln >= 0:
            count[ln + 1] += 1
    for ln in range(nlanes):
        count[ln + 1] += count[ln]
    bucket = np.empty(count[nlanes], np.int64)
    fill = count[:-1].copy()
    for t in range(order.shape[0]):
        u = order[t]
        ln = lane_of[u]
        if ln >= 0:
            bucket[fill[ln]] = u
            fill[ln] += 1
    nmb = 0
    for ln in range(nlanes):
        d = lane_deg[ln]
        first = nmb
        for j in range(count[ln], count[ln + 1]):
            u = bucket[j]
            s = shard_tokens(lens[u], d, unit)
            best = -1
            best_rem = cap + 1
            for b in range(first, nmb):
                rem = cap - mb_used[b] - s
                if rem >= 0 and rem < best_rem:
                    best = b
                    best_rem = rem
            if best < 0:
                mb_lane[nmb] = ln
                mb_rank[nmb] = nmb - first
                mb_used[nmb] = s
                mb_of[u] = nmb
                nmb += 1
            else:
                mb_used[best] += s
                mb_of[u] = best
    return mb_of, mb_lane[:nmb].copy(), mb_rank[:nmb].copy()
