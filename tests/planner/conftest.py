"""Shared helpers for planner tests: small clusters and a real analytic cost model."""

from __future__ import annotations

import pytest

from fcp_data.planner import Cluster, CostModel


@pytest.fixture(scope="session")
def qwen8b() -> CostModel:
    return CostModel.from_model("qwen3-8b", "h200")


@pytest.fixture
def cluster16() -> Cluster:
    return Cluster(16, replicas_per_node=8, tokens_per_replica=8192)
