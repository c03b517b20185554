"""A schedule's critical path with idle (replica, wave) slots priced and optional wave barriers.

Groups run in order on contiguous windows; group g lands in wave 1 + the latest wave of any
earlier group on one of its replicas (the rule `assemble.to_plan` numbers waves by). A replica
with no group in wave w still runs a micro-batch there when the framework needs every rank
(`Cluster.idle`): `idle_s[r]` seconds, placed between its groups of waves < w and > w, so a
placeholder in the middle of a replica's waves can delay its next group. With `sync`, every wave
ends with a barrier (FSDP / ZeRO-3: each layer's all-gather spans every rank) and the makespan is
the sum over waves of the wave's longest group or placeholder.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["group_waves", "priced_critical_path"]


@nb.njit(cache=True)
def group_waves(starts: np.ndarray, degs: np.ndarray, num_replicas: int) -> np.ndarray:
    """The wave of each group: 1 + the latest wave of an earlier group on one of its replicas."""
    last = np.full(num_replicas, -1, np.int64)
    wave = np.empty(starts.shape[0], np.int64)
    for g in range(starts.shape[0]):
        s = starts[g]
        e = s + degs[g]
        w = 0
        for r in range(s, e):
            if last[r] + 1 > w:
                w = last[r] + 1
        for r in range(s, e):
            last[r] = w
        wave[g] = w
    return wave


@nb.njit(cache=True)
def priced_critical_path(
    starts: np.ndarray,
    degs: np.ndarray,
    times: np.ndarray,
    num_replicas: int,
    idle_s: np.ndarray,
    sync: bool,
) -> float:
    """Makespan of groups run in order on contiguous windows, idle slots priced at `idle_s`.

    Placeholders are added one at a time in each replica's wave order, exactly as
    `simulate.score_plan` adds them wave by wave, so both give the same float.
    """
    n_groups = starts.shape[0]
    if n_groups == 0:
        return 0.0
    wave = group_waves(starts, degs, num_replicas)
    num_waves = wave.max() + 1
    last = np.full(num_replicas, -1, np.int64)
    if not sync:
        free = np.zeros(num_replicas)
        for g in range(n_groups):
            s = starts[g]
            e = s + degs[g]
            w = wave[g]
            t0 = 0.0
            for r in range(s, e):
                for _ in range(last[r] + 1, w):
                    free[r] += idle_s[r]
                last[r] = w
                if free[r] > t0:
                    t0 = free[r]
            for r in range(s, e):
                free[r] = t0 + times[g]
        for r in range(num_replicas):
            for _ in range(last[r] + 1, num_waves):
                free[r] += idle_s[r]
        return free.max()
    longest = np.zeros(num_waves)
    for g in range(n_groups):
        s = starts[g]
        e = s + degs[g]
        w = wave[g]
        if times[g] > longest[w]:
            longest[w] = times[g]
        for r in range(s, e):
            for v in range(last[r] + 1, w):
                if idle_s[r] > longest[v]:
                    longest[v] = idle_s[r]
            last[r] = w
    for r in range(num_replicas):
        for v in range(last[r] + 1, num_waves):
            if idle_s[r] > longest[v]:
                longest[v] = idle_s[r]
    total = 0.0
    for w in range(num_waves):
        total += longest[w]
    return total
