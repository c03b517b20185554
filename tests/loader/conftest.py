"""Shared fixtures: real text shards on disk, a tar-offset index, a 4-replica cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from loader_helpers import ByteTokenizer, TarIndex, write_text_shards

from fcp_data.planner import Cluster, CostModel

NUM_SAMPLES = 90


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, bytes]]:
    root: Path = tmp_path_factory.mktemp("text-shards")
    return write_text_shards(root, NUM_SAMPLES, per_shard=25, seed=1, max_bytes=3000)


@pytest.fixture()
def index(shards) -> TarIndex:
    return TarIndex(shards[0], ByteTokenizer())


@pytest.fixture(scope="session")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")


def cluster(n: int, tokens: int = 1100) -> Cluster:
    # 1100 tokens a replica: 3000-token samples need degree 3, short ones share a replica
    return Cluster(n, replicas_per_node=4, tokens_per_replica=tokens)
