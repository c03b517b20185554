"""Fixtures: real text shards, a trained BPE tokenizer file, a cost model."""

from __future__ import annotations

from pathlib import Path

import pytest
from datapath_helpers import train_bpe, write_text_shards

from fcp_data.planner import CostModel


@pytest.fixture(scope="session")
def text_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root: Path = tmp_path_factory.mktemp("dp-shards")
    return write_text_shards(root, 60, per_shard=16, seed=5, max_bytes=6000)


@pytest.fixture(scope="session")
def bpe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dp-tok") / "bpe.json"
    train_bpe().save(str(path))
    return path


@pytest.fixture(scope="session")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")
