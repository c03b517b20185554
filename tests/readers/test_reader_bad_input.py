"""Bad input: each kind is skipped with its key and reason, or raises, per policy."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import msgspec
import pytest
from webdataset import TarWriter

from fcp_data.readers.build import build_index
from fcp_data.readers.errors import SampleError, TooManyFailures
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.stream import stream_records
from fcp_data.readers.synth import encode_video

GOOD_TEXT = b"def f(x):\n    return x + 1\n"


def _write(path: Path, samples: list[dict[str, object]]) -> str:
    with TarWriter(str(path)) as w:
        for s in samples:
            w.write(s)
    return str(path)


def _sidecar(**fields: object) -> bytes:
    return msgspec.json.encode(fields)


@pytest.fixture(scope="module")
def bad_shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    mp4 = encode_video(6, 64, 48, 10)
    good_meta = {"num_frames": 6, "fps": 10, "width": 64, "height": 48, "duration": 0.6}
    samples: list[dict[str, object]] = [
        {"__key__": "ok0", "txt": GOOD_TEXT},
        {"__key__": "empty", "txt": b""},
        {"__key__": "ok1", "txt": GOOD_TEXT},
        {"__key__": "garbage_video", "mp4": b"\x00not a video" * 50, "txt": b"cap"},
        {"__key__": "ok2", "txt": GOOD_TEXT},
        {"__key__": "zero_fps", "mp4": mp4, "json": _sidecar(**{**good_meta, "fps": 0})},
        {"__key__": "ok3", "txt": GOOD_TEXT},
        {"__key__": "neg_frames", "mp4": mp4, "json": _sidecar(**{**good_meta, "num_frames": -5})},
        {"__key__": "ok4", "txt": GOOD_TEXT},
        {"__key__": "missing", "mp4": mp4, "json": _sidecar(fps=10)},
        {"__key__": "ok5", "txt": GOOD_TEXT},
        {"__key__": "nopayload", "cls": b"3"},
        {"__key__": "ok6", "txt": GOOD_TEXT},
        {"__key__": "badjson", "json": b"{not json"},
        {"__key__": "ok7", "mp4": mp4, "json": _sidecar(**good_meta)},
    ]
    return _write(tmp_path_factory.mktemp("bad") / "bad.tar", samples)


REASONS = {
    "empty": "empty text",
    "garbage_video": "does not decode",
    "zero_fps": "fps=0",
    "neg_frames": "num_frames=-5",
    "missing": "lacks width, height, num_frames",
    "nopayload": "no payload",
    "badjson": "not valid JSON",
}


def test_skip_policy_records_each_key_and_reason(bad_shard: str, tmp_path: Path) -> None:
    idx = build_index(bad_shard, tmp_path / "idx", config=ScanConfig(probe_backend="pyav"))
    assert list(idx.keys) == [f"ok{i}" for i in range(8)]
    skipped = {s.key: s.reason for s in idx.skipped}
    assert set(skipped) == set(REASONS)
    for key, fragment in REASONS.items():
        assert fragment in skipped[key], (key, skipped[key])
    assert all(s.shard == bad_shard for s in idx.skipped)


def test_raise_policy_names_the_sample(bad_shard: str) -> None:
    with pytest.raises(SampleError, match=r"'empty'.*empty text") as info:
        list(stream_records(bad_shard, config=ScanConfig(on_error="raise")))
    assert info.value.key == "empty"


def test_raise_policy_survives_the_process_pool(bad_shard: str, tmp_path: Path) -> None:
    other = tmp_path / "other.tar"
    other.write_bytes(Path(bad_shard).read_bytes())
    with pytest.raises(SampleError, match="empty text") as info:
        build_index(
            [bad_shard, str(other)], tmp_path / "i", config=ScanConfig(on_error="raise"), workers=2
        )
    assert info.value.key == "empty"  # the pickled error keeps its fields


def test_consecutive_failures_raise(tmp_path: Path) -> None:
    shard = _write(
        tmp_path / "s.tar",
        [{"__key__": f"e{i}", "txt": b""} for i in range(5)]
        + [{"__key__": "ok", "txt": GOOD_TEXT}],
    )
    with pytest.raises(TooManyFailures, match="5 consecutive"):
        list(stream_records(shard, config=ScanConfig(max_consecutive_failures=5)))
    skipped: list = []
    records = list(
        stream_records(shard, config=ScanConfig(max_consecutive_failures=6), skipped=skipped)
    )
    assert [r.key for r in records] == ["ok"] and len(skipped) == 5


def test_consecutive_failures_span_shards(tmp_path: Path) -> None:
    a = _write(
        tmp_path / "a.tar",
        [{"__key__": "ok", "txt": GOOD_TEXT}]
        + [{"__key__": f"e{i}", "txt": b""} for i in range(2)],
    )
    b = _write(
        tmp_path / "b.tar",
        [{"__key__": f"f{i}", "txt": b""} for i in range(2)]
        + [{"__key__": "ok2", "txt": GOOD_TEXT}],
    )
    cfg = ScanConfig(max_consecutive_failures=4)
    with pytest.raises(TooManyFailures, match="4 consecutive"):
        build_index([a, b], tmp_path / "i", config=cfg)  # one scanner sees both shards
    with pytest.raises(TooManyFailures, match="across shards"):
        build_index([a, b], tmp_path / "i", config=cfg, workers=2)  # joined by the parent
    idx = build_index([a, b], tmp_path / "j", config=ScanConfig(max_consecutive_failures=5))
    assert list(idx.keys) == ["ok", "ok2"] and len(idx.skipped) == 4


def test_corrupt_and_truncated_tars(shard_paths: list[Path], tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar file at all" * 40)
    whole = shard_paths[0].read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: len(whole) // 2])
    idx = build_index([str(junk), str(cut)], tmp_path / "idx")
    reasons = [s.reason for s in idx.skipped]
    assert any("junk" in s.shard for s in idx.skipped)
    assert any("truncated" in r or "corrupt" in r for r in reasons)
    full = build_index(str(shard_paths[0]), tmp_path / "full")
    # every sample that ends before the cut survives, with identical lengths
    assert 0 < len(idx) < len(full)
    assert list(idx.keys) == list(full.keys[: len(idx)])
    assert list(idx.seqlens) == list(full.seqlens[: len(idx)])


def test_member_that_is_not_a_sample(tmp_path: Path) -> None:
    path = tmp_path / "odd.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("README", b"hello"), ("a.txt", GOOD_TEXT)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    skipped: list = []
    recs = list(stream_records(str(path), skipped=skipped))
    assert [r.key for r in recs] == ["a"]
    assert skipped[0].key == "README" and "not a sample" in skipped[0].reason


def test_bad_policy_values_are_refused() -> None:
    from fcp_data.readers.errors import ErrorPolicy

    with pytest.raises(ValueError, match="'ignore'"):
        ErrorPolicy(on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 1"):
        ErrorPolicy(max_consecutive_failures=0)
