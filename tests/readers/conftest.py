"""Shared, session-scoped sample data: real shards written by webdataset, real mp4s by PyAV."""

from __future__ import annotations

from pathlib import Path

import pytest

from fcp_data.readers.build import build_index
from fcp_data.readers.length_index import LengthIndex
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.synth import make_shards

N_TEXT, N_VIDEO, PER_SHARD = 40, 12, 16


@pytest.fixture(scope="session")
def counts() -> dict[str, int]:
    """How many samples the session shards hold (text, video, per shard)."""
    return {"text": N_TEXT, "video": N_VIDEO, "per_shard": PER_SHARD}


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    make_shards(out, text=N_TEXT, video=N_VIDEO, seed=7, samples_per_shard=PER_SHARD)
    return out


@pytest.fixture(scope="session")
def shard_paths(shard_dir: Path) -> list[Path]:
    paths = sorted(shard_dir.glob("*.tar"))
    assert len(paths) == 3 + 1  # 40 text in shards of 16, 12 videos in one
    return paths


@pytest.fixture(scope="session")
def built_index(shard_paths: list[Path], tmp_path_factory: pytest.TempPathFactory) -> LengthIndex:
    out = tmp_path_factory.mktemp("index") / "idx"
    return build_index([str(p) for p in shard_paths], out, config=ScanConfig())
