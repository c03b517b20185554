"""Plan one batch with every strategy to draw (a saved plan first), then draw them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..planner import Cluster, CostModel, score_plan
from ..planner.compare import StrategyResult, compare_strategies
from .batch import Batch
from .figure import draw

__all__ = ["VIEW_STRATEGIES", "view"]

VIEW_STRATEGIES = ("fcp", "static", "megatron-hybrid")


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
    results = compare_strategies(batch.seqlens, cluster, cost, strategies, causal=batch.causal)
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
