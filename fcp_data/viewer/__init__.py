"""fcp_data.viewer: draw plans (fcp beside static CP and megatron-core's hybrid CP) as a PNG.

    from fcp_data.viewer import batch_from_index, view, summarize
    batch = batch_from_index("out/demo/index", batch_size=32)
    path, results = view(batch, cluster, cost, "out/plan.png")  # never overwrites: plan-1.png
    summarize(results, batch, path)

`fcp view` is the command line over it. Modules: `batch` (one global batch from a saved
plan, an index, shards or lengths), `bars` (the timeline: bars and wave spans under the
simulator's execution model), `colors` (one fixed colour per degree), `gantt` (one strategy's
panel and the degree table), `figure` (the whole picture and where it is written), `summary`
(the terminal table), `compare` (plan every strategy and draw). Names load lazily (PEP 562):
importing the package imports neither matplotlib nor the planner.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "VIEW_STRATEGIES",
    "Bar",
    "Batch",
    "WaveSpan",
    "batch_from_index",
    "batch_from_lengths",
    "batch_from_plan",
    "batch_from_shards",
    "degree_color",
    "draw",
    "free_path",
    "print_comparison",
    "summarize",
    "timeline",
    "view",
    "wave_spans",
]

_WHERE = {
    "Batch": "batch",
    "batch_from_index": "batch",
    "batch_from_lengths": "batch",
    "batch_from_plan": "batch",
    "batch_from_shards": "batch",
    "Bar": "bars",
    "WaveSpan": "bars",
    "timeline": "bars",
    "wave_spans": "bars",
    "degree_color": "colors",
    "draw": "figure",
    "free_path": "figure",
    "print_comparison": "summary",
    "summarize": "summary",
    "VIEW_STRATEGIES": "compare",
    "view": "compare",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
