"""The hypothesis strategy of small planning problems that the planner property tests share."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from fcp_data.planner import CostModel

__all__ = ["problems"]


@st.composite
def problems(draw: st.DrawFn, devices: tuple[str, ...] = ("h200", "ascend-910c")) -> tuple:
    """(lengths, causal, (replicas, replicas_per_node, capacity, speed), cost model): up to 12
    replicas, 40 sequences, mixed causal flags and optional per-replica speeds."""
    n = draw(st.integers(1, 12))
    rpn = draw(st.integers(1, max(1, n)))
    cap = draw(st.sampled_from([512, 2048, 8192]))
    k = draw(st.integers(1, 40))
    lens = draw(st.lists(st.integers(1, cap * n // 2), min_size=k, max_size=k))
    causal = draw(st.one_of(st.booleans(), st.lists(st.booleans(), min_size=k, max_size=k)))
    speed = None
    if draw(st.booleans()):
        speed = draw(st.lists(st.sampled_from([0.5, 0.8, 1.0, 1.3]), min_size=n, max_size=n))
    model = draw(st.sampled_from(["qwen3-8b", "llama3.2-1b"]))
    device = draw(st.sampled_from(devices))
    return np.array(lens), causal, (n, rpn, cap, speed), CostModel.from_model(model, device)
