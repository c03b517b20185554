"""Every stream scan ends: non-tar streams are refused at their first header, endless ones at a
byte limit, and a JSON member nested thousands deep is one bad sample, not a crashed build."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from fcp_data.errors import SampleError
from fcp_data.readers.build import build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.stream import stream_records


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_an_endless_non_tar_stream_is_refused_at_its_first_header(tmp_path: Path) -> None:
    index = build_index("pipe:yes", tmp_path / "idx", allow_empty=True)  # was: forever
    assert len(index) == 0
    [skip] = index.skipped
    assert skip.shard == "pipe:yes" and skip.key == "(bytes 0..end)"
    assert "not a tar stream: its first 512 bytes are no tar header (they start b'y\\ny" in (
        skip.reason
    )
    with pytest.raises(
        SampleError, match=r"pipe:yes: sample '\(bytes 0\.\.end\)': not a tar stream"
    ):
        list(stream_records("pipe:yes", config=ScanConfig(on_error="raise")))


def test_an_endless_tar_stream_stops_at_the_byte_limit(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "s.tar", {f"k{i}.txt": b"word " * 200 for i in range(4)})
    spec = f"pipe:while true; do cat {shard}; done"  # concatenated archives, never ending
    skipped: list = []
    records = list(
        stream_records(spec, config=ScanConfig(stream_max_bytes=1 << 20), skipped=skipped)
    )
    assert records and all(r.text_tokens == 250 for r in records)  # whole samples kept
    assert len(records) <= 4 * ((1 << 20) // shard.stat().st_size + 1)  # no more than 1 MiB
    assert skipped[-1].key.endswith("..end)")
    assert "still producing after 1048576 bytes" in skipped[-1].reason
    assert "--stream-max-bytes" in skipped[-1].reason


def test_stream_max_bytes_is_checked() -> None:
    from fcp_data.errors import ConfigError

    with pytest.raises(ConfigError, match=r"stream_max_bytes=10 must be an integer in \[1048576"):
        list(stream_records("pipe:true", config=ScanConfig(stream_max_bytes=10)))


def test_json_nested_ten_thousand_deep_is_one_bad_sample(tmp_path: Path) -> None:
    deep = b'{"text": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    shard = _tar(
        tmp_path / "d.tar",
        {"a.json": b'{"text": "fine"}', "b.json": deep, "c.json": b'{"text": "also fine"}'},
    )
    index = build_index(str(shard), tmp_path / "idx")
    assert index.keys.tolist() == ["a", "c"]
    [skip] = index.skipped
    assert skip.key == "b" and ".json is nested too deeply to decode" in skip.reason
    with pytest.raises(SampleError, match=r"sample 'b': \.json is nested too deeply"):
        build_index(str(shard), tmp_path / "idx2", config=ScanConfig(on_error="raise"))
    assert not (tmp_path / "idx2").exists()
