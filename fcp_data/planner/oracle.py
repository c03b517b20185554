"""Exhaustive optimum for tiny batches, under the same cost model and plan space as fcp.

Enumerates every partition of the sequences into micro-batches, every order of them and every
contiguous replica window (start, degree) holding each, with groups starting as soon as their
window is free. Idle (replica, wave) slots and wave barriers are priced as the planner prices
them (`Cluster.idle`, `Cluster.sync_waves`; `kernels.priced_critical_path`). Exponential: for
tests and benchmarks with at most ~5 sequences on ~4 replicas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import ConfigError
from ..layout import shard_tokens
from .cost.cluster import Cluster
from .cost.model import CostModel
from .cost.transports import blocks_span_nodes

__all__ = ["exhaustive_optimum"]


def _set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]
        yield [[first], *part]


def exhaustive_optimum(
    seqlens: Sequence[int] | np.ndarray, cluster: Cluster, cost: CostModel
) -> float:
    lens = np.asarray(seqlens, dtype=np.int64)
    if lens.size > 6 or cluster.num_replicas > 5:
        raise ConfigError(
            f"exhaustive search is for tiny batches (≤ 6 sequences, ≤ 5 replicas); got "
            f"{lens.size} sequences on {cluster.num_replicas} replicas"
        )
    n, rpn, cap = cluster.num_replicas, cluster.replicas_per_node, cost.capacity_tokens(cluster)
    unit = cluster.pad_unit
    speed = cluster.speeds()
    idle_s = cost.placeholder_seconds(cluster)
    priced = cluster.sync_waves or bool(np.any(idle_s > 0))
    best = math.inf
    for part in _set_partitions(list(range(lens.size))):
        options = []
        for block in part:
            opts = []
            for d in range(1, n + 1):
                if sum(shard_tokens(int(s), d, unit) for s in lens[block]) > cap:
                    continue
                for s0 in range(n - d + 1):
                    t = cost.group_time(
                        lens[block],
                        d,
                        inter_node=s0 // rpn != (s0 + d - 1) // rpn,
                        speed=float(speed[s0 : s0 + d].min()),
                        blocks_inter_node=lambda u, a=s0, k=d: blocks_span_nodes(
                            range(a, a + k), u, rpn
                        ),
                    )
                    opts.append((s0, d, t))
            if not opts:
                break
            options.append(opts)
        else:
            for perm in itertools.permutations(range(len(part))):
                for choice in itertools.product(*(options[i] for i in perm)):
                    if priced:
                        best = min(best, _priced(choice, n, idle_s, cluster.sync_waves))
                        continue
                    free = [0.0] * n
                    for s0, d, t in choice:
                        end = max(free[s0 : s0 + d]) + t
                        free[s0 : s0 + d] = [end] * d
                        if end >= best:
                            break
                    best = min(best, max(free))
    return best


def _priced(
    choice: tuple[tuple[int, int, float], ...], n: int, idle_s: np.ndarray, sync: bool
) -> float:
    """Makespan of (start, degree, time) groups run in order, idle slots priced: the same
    execution model as `kernels.priced_critical_path`, written out plainly as a check on it."""
    last = [-1] * n
    waves = []
    for s0, d, _ in choice:
        w = max(last[s0 : s0 + d]) + 1
        last[s0 : s0 + d] = [w] * d
        waves.append(w)
    num_waves = max(waves) + 1
    free = [0.0] * n
    for w in range(num_waves):
        busy = [False] * n
        for (s0, d, t), gw in zip(choice, waves):
            if gw == w:
                end = max(free[s0 : s0 + d]) + t
                free[s0 : s0 + d] = [end] * d
                busy[s0 : s0 + d] = [True] * d
        for r in range(n):
            if not busy[r]:
                free[r] += float(idle_s[r])
        if sync:
            free = [max(free)] * n
    return max(free)
