"""Plan one batch with every strategy to draw (a saved plan first), then draw them.

Planning times are warm: `warm_up` plans a tiny batch with each strategy first, untimed. The
first plan of a process pays what a training run pays once, not per batch: numba compiling or
loading the planner's kernels (~15 s on a cold cache, ~0.6 s from it) and, for
megatron-hybrid, importing megatron-core (~6 s). Timed cold, that would be reported as if
every batch cost it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..planner import Cluster, CostModel, plan_global_batch, score_plan
from ..planner.compare import StrategyResult, compare_strategies
from .batch import Batch
from .figure import draw

__all__ = ["VIEW_STRATEGIES", "WARM_SEQUENCES", "compare_warm", "view", "warm_up"]

VIEW_STRATEGIES = ("fcp", "static", "megatron-hybrid")
WARM_SEQUENCES = 8  # the tiny batch: the batch's longest and shortest sequences


def warm_up(
    strategies: Sequence[str],
    seqlens: Sequence[int] | np.ndarray,
    cluster: Cluster,
    cost: CostModel,
    *,
    causal: bool | Sequence[bool] | np.ndarray = True,
) -> None:
    """Plan a tiny batch with every strategy once, untimed (see the module docstring).

    The tiny batch holds the batch's longest and shortest sequences, so that the code paths the
    real batch takes (CP groups for the long ones, d = 1 for the short ones) compile here. A
    strategy that cannot plan it is left to fail, and be reported, on the real batch."""
    lens = np.asarray(seqlens, np.int64).reshape(-1)
    flags = np.broadcast_to(np.asarray(causal, bool), lens.shape)
    order = np.argsort(-lens, kind="stable")
    half = WARM_SEQUENCES // 2
    pick = np.unique(np.concatenate([order[:half], order[-half:]])) if lens.size else order
    for strategy in strategies:
        try:
            plan_global_batch(
                lens[pick],
                cluster,
                cost,
                causal=flags[pick],
                strategy=strategy,
                on_too_long="drop",
            )
        except (ValueError, AssertionError):  # as compare_strategies: reported when timed
            continue


def compare_warm(
    seqlens: Sequence[int] | np.ndarray,
    cluster: Cluster,
    cost: CostModel,
    strategies: Sequence[str],
    *,
    causal: bool | Sequence[bool] | np.ndarray = True,
) -> list[StrategyResult]:
    """`compare_strategies` after `warm_up`: every planning time is a warm one."""
    warm_up(strategies, seqlens, cluster, cost, causal=causal)
    return compare_strategies(seqlens, cluster, cost, strategies, causal=causal)


def view(
    batch: Batch,
    cluster: Cluster,
    cost: CostModel,
    path: str | Path,
    strategies: Sequence[str] = VIEW_STRATEGIES,
    *,
    force: bool = False,
) -> tuple[Path, list[StrategyResult]]:
    """Plan `batch` with every strategy (the saved plan first, if any), draw, return the path
    written (never an existing file unless `force`) and the results."""
    saved = batch.saved
    if saved is not None and saved.num_replicas != cluster.num_replicas:
        raise ConfigError(
            f"the saved plan is for {saved.num_replicas} replicas but --replicas is "
            f"{cluster.num_replicas}; pass --replicas {saved.num_replicas}"
        )
    results = compare_warm(batch.seqlens, cluster, cost, strategies, causal=batch.causal)
    if saved is not None:
        sc = score_plan(saved, batch.seqlens, cluster, cost, causal=batch.causal)
        first = StrategyResult(
            strategy=f"saved ({saved.strategy})",
            plan=saved,
            makespan=sc.makespan,
            lower_bound=sc.lower_bound,
            utilization=sc.utilization,
            planning_ms=math.nan,
        )
        results = [first, *results]
    return draw(results, batch, cluster, cost, path, force=force), results
