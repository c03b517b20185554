"""`ScannedSource` and `LengthIndex` are one `SampleSource`: same arrays, header, bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from fcp_data.errors import ConfigError, DataError
from fcp_data.loader.source import open_source, source_skipped
from fcp_data.readers import LengthIndex, SampleSource, ScannedSource
from fcp_data.readers.scan import ScanConfig

ARRAYS = (
    "keys",
    "seqlens",
    "causal",
    "modality",
    "text_tokens",
    "vision_tokens",
    "special_tokens",
    "num_frames",
    "fps",
    "width",
    "height",
)


@pytest.fixture(scope="module")
def scanned(shard_paths: list[Path]) -> ScannedSource:
    return ScannedSource.scan([str(p) for p in shard_paths], config=ScanConfig())


def test_scanned_source_equals_the_built_index(
    scanned: ScannedSource, built_index: LengthIndex, shard_paths: list[Path]
) -> None:
    assert isinstance(scanned, SampleSource) and isinstance(built_index, SampleSource)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(scanned, name), getattr(built_index, name), name)
    assert int(np.count_nonzero(scanned.modality)) > 0  # the videos are in it
    assert scanned.header.tokenizer == built_index.header.tokenizer
    assert dict(scanned.header.rule) == dict(built_index.header.rule)
    assert scanned.header.scan == built_index.header.scan
    assert list(scanned.skipped) == list(built_index.skipped) == []
    # bytes as webdataset reads them
    ref = list(wds.WebDataset([str(p) for p in shard_paths], shardshuffle=False))
    for i in (0, 17, len(ref) - 1):
        want = {k: v for k, v in ref[i].items() if not k.startswith("__")}
        assert scanned.read(i) == built_index.read(i) == want


def test_open_source_routes_directories_specs_and_objects(
    built_index: LengthIndex, shard_paths: list[Path], scanned: ScannedSource
) -> None:
    assert isinstance(open_source(str(built_index.path)), LengthIndex)
    assert isinstance(open_source([str(p) for p in shard_paths]), ScannedSource)
    assert open_source(scanned) is scanned
    assert source_skipped(scanned) == []


def test_an_object_without_the_contract_is_refused() -> None:
    class LengthsOnly:
        seqlens = np.array([3, 4])
        causal = np.array([True, True])

        def read(self, i: int) -> dict[str, bytes]:
            return {"txt": b"abc"}

    with pytest.raises(ConfigError, match=r"missing \['keys', 'modality', .*'header', 'skipped'\]"):
        open_source(LengthsOnly())


def test_scanning_nothing_usable_is_a_data_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    with wds.TarWriter(str(empty)) as sink:
        sink.write({"__key__": "a", "txt": b""})
    with pytest.raises(DataError, match="no usable sample"):
        ScannedSource.scan(str(empty))
