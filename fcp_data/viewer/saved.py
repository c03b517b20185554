"""A saved plan file: the Plan and the cost model and cluster it was made with, in one JSON.

A plan's predicted times, its lower bound and every baseline drawn beside it are numbers under
one cost model on one cluster. `fcp plan -o FILE` and `fcp demo` write the Plan's own fields
with two more keys beside them, "cost_model" and "cluster", so that `fcp view --plan FILE`
prices and compares THAT plan under what it was made with instead of under the flags' defaults
(Qwen3-8B on 64 H200). The keys sit next to the Plan's fields rather than around them, so
`Plan.from_json` reads a new file as before (unknown keys are ignored) and a file written by
`Plan.to_json` (no context) still opens: `read_saved_plan` then returns None for both and the
caller says so. A wrapped `{"plan": {...}, "cost_model": ..., "cluster": ...}` is read too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import ConfigError
from ..planner import Cluster, CostModel, Plan

__all__ = ["SavedPlan", "cluster_from_dict", "cost_from_dict", "plan_document", "read_saved_plan"]

FORMAT_KEY = "fcp_saved_plan"  # version of the two context keys (the Plan has its own fields)
# replicas of one planned cluster, the bound of `--replicas` too: `fcp simulate --replicas
# 4096` takes ~50 s and 1 GB on 2 cores (per-replica timelines for every strategy); past that
# a plan is minutes of CPU
MAX_REPLICAS = 4096


@dataclass(kw_only=True, slots=True, frozen=True)
class SavedPlan:
    """A plan read from a file, with the cost model and cluster it was made with (None for a
    file that records neither: a bare `Plan.to_json`)."""

    plan: Plan
    cost: CostModel | None
    cluster: Cluster | None


def plan_document(plan: Plan, cost: CostModel, cluster: Cluster) -> bytes:
    """The JSON `fcp plan -o` writes: the Plan's fields plus "cost_model" and "cluster"."""
    doc: dict[str, Any] = json.loads(plan.to_json())
    doc[FORMAT_KEY] = 1
    doc["cost_model"] = asdict(cost)
    doc["cluster"] = {f.name: getattr(cluster, f.name) for f in fields(cluster)}
    return (json.dumps(doc) + "\n").encode()


def cost_from_dict(raw: dict[str, Any], where: str) -> CostModel:
    """A CostModel from its saved fields (what `CostModel.load` does for a file)."""
    from ..planner.cost.vision import VisionCost

    raw = dict(raw)
    raw.pop("fcp_cost_model", None)
    known = {f.name for f in fields(CostModel)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown cost-model fields {unknown}; known: {sorted(known)}")
    try:  # a field missing or of another shape was a raw TypeError (found by the fuzzer)
        if isinstance(raw.get("vision"), dict):
            raw["vision"] = VisionCost(**raw["vision"])
        return CostModel(**raw)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a string where a number goes: float("x")
        raise ConfigError(
            f"{where}: the saved cost model does not build ({exc}); save the plan again with "
            "`fcp plan -o`"
        ) from None


def cluster_from_dict(raw: dict[str, Any], where: str) -> Cluster:
    """A Cluster from its saved fields."""
    raw = dict(raw)
    known = {f.name for f in fields(Cluster)}
    unknown = sorted(set(raw) - known)
    if unknown or "num_replicas" not in raw:
        raise ConfigError(
            f"{where}: the saved cluster needs num_replicas and only {sorted(known)}; got "
            f"{sorted(raw)}"
        )
    try:
        return Cluster(raw.pop("num_replicas"), **raw)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: the saved cluster does not build ({exc}); save the plan again with "
            "`fcp plan -o`"
        ) from None


def read_saved_plan(data: bytes | str, where: str = "plan") -> SavedPlan:
    """The plan in `data` and, when recorded, its cost model and cluster."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"{where}: not a plan JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a plan file holds a JSON object, got {type(doc).__name__}")
    body = doc["plan"] if isinstance(doc.get("plan"), dict) and "waves" not in doc else doc
    try:
        plan = Plan.from_json(json.dumps(body))
    except ValueError as exc:  # msgspec.ValidationError is a ValueError
        raise ConfigError(f"{where}: not a Plan ({exc})") from None
    if not 1 <= plan.num_replicas <= MAX_REPLICAS:  # found by the fuzzer: 2,100,594 replicas
        raise ConfigError(  # kept every replica's timeline: minutes and GBs (unbounded)
            f"{where}: num_replicas={plan.num_replicas} is outside [1, {MAX_REPLICAS}], what "
            "fcp plans (`--replicas`); the file is damaged or not fcp's"
        )
    cost = doc.get("cost_model")
    cluster = doc.get("cluster")
    return SavedPlan(
        plan=plan,
        cost=cost_from_dict(cost, where) if isinstance(cost, dict) else None,
        cluster=cluster_from_dict(cluster, where) if isinstance(cluster, dict) else None,
    )
