"""Shared fixtures: real text shards on disk, a tar-offset index, a 4-replica cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from loader_helpers import NUM_SAMPLES, ByteTokenizer, TarIndex, write_text_shards

from fcp_data.planner import CostModel

__all__: list[str] = []


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
