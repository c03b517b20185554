"""Planning a batch once when it is planned early for read-ahead.

With remote shards a DataLoader worker starts fetching its next batch's byte ranges before it
packs the current one (`BatchBuilder.read_ahead`), which needs the next batch's plan. The
planner is pure, so its result for the same inputs can be reused: `PlanMemo` keeps the last
few plans keyed by a digest of every input, and `build` gets the early plan back for free.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PlanMemo"]

KEEP = 4  # plans held: the batch being packed and the one being read ahead, with room


class PlanMemo:
    """Wraps a pure planner; picklable (the memo starts empty in each worker)."""

    def __init__(self, planner: Callable[..., Any]) -> None:
        self.planner = planner
        self._memo: OrderedDict[bytes, Any] = OrderedDict()

    def __call__(self, seqlens: np.ndarray, cluster: Any, cost: Any, **kw: Any) -> Any:
        h = hashlib.blake2b(np.ascontiguousarray(seqlens, dtype=np.int64).tobytes())
        h.update(
            repr(
                (cluster, cost, sorted((k, repr(v)) for k, v in kw.items() if k != "causal"))
            ).encode()
        )
        causal = kw.get("causal")
        if causal is not None:
            h.update(np.ascontiguousarray(causal, dtype=bool).tobytes())
        key = h.digest()
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        plan = self.planner(seqlens, cluster, cost, **kw)
        self._memo[key] = plan
        while len(self._memo) > KEEP:
            self._memo.popitem(last=False)
        return plan

    def __getstate__(self) -> dict[str, Any]:
        return {"planner": self.planner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.planner, self._memo = state["planner"], OrderedDict()
