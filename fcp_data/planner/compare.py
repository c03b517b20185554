"""Strategies side by side on one global batch, scored by the same simulator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .api import plan_global_batch
from .cost.cluster import Cluster
from .cost.model import CostModel
from .plan import Plan
from .simulate import score_plan

__all__ = ["DEFAULT_STRATEGIES", "StrategyResult", "compare_strategies"]

DEFAULT_STRATEGIES = (
    "fcp",
    "static-balanced",
    "pow2",
    "static",
    "megatron-hybrid",
    "megatron-dynamic",
    "megatron-dynamic-tuned",
)


@dataclass(kw_only=True, slots=True, frozen=True)
class StrategyResult:
    """One strategy's plan and its score; `error` is set (and plan None) when it found none."""

    strategy: str
    plan: Plan | None
    makespan: float
    lower_bound: float
    utilization: float
    planning_ms: float
    error: str = ""

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound if self.plan is not None else float("nan")


def compare_strategies(
    seqlens: Sequence[int] | np.ndarray,
    cluster: Cluster,
    cost: CostModel,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    *,
    causal: bool | Sequence[bool] | np.ndarray = True,
) -> list[StrategyResult]:
    out: list[StrategyResult] = []
    for strategy in strategies:
        t0 = time.perf_counter()
        try:
            plan = plan_global_batch(
                seqlens, cluster, cost, causal=causal, strategy=strategy, on_too_long="drop"
            )
        except (ValueError, AssertionError) as exc:
            # megatron-core's scheduler asserts on inputs it cannot place; report, don't crash.
            out.append(
                StrategyResult(
                    strategy=strategy,
                    plan=None,
                    makespan=float("nan"),
                    lower_bound=float("nan"),
                    utilization=float("nan"),
                    planning_ms=float("nan"),
                    error=str(exc).split("\n")[0],
                )
            )
            continue
        ms = (time.perf_counter() - t0) * 1e3
        sc = score_plan(plan, seqlens, cluster, cost, causal=causal)
        out.append(
            StrategyResult(
                strategy=strategy,
                plan=plan,
                makespan=sc.makespan,
                lower_bound=sc.lower_bound,
                utilization=sc.utilization,
                planning_ms=ms,
            )
        )
    return out
