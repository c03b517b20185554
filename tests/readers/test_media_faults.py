"""Lying metadata and broken videos: real mp4/mkv bytes from PyAV, damaged at known places."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from webdataset import TarWriter

from fcp_data.errors import SampleError
from fcp_data.readers.build import build_index
from fcp_data.readers.synth import encode_video
from fcp_data.vision.decode import decode_frames, decode_index_video

BACKENDS = ["pyav", "decord"]


def _backend(name: str) -> str:
    if name == "decord":
        pytest.importorskip("decord")
    return name


@pytest.fixture(scope="module")
def clip() -> bytes:
    return encode_video(24, 96, 64, 12, seed=3)  # libx264 mp4, moov at the end


def _meta(num_frames: float, fps: float, width: float, height: float) -> bytes:
    fields = {"num_frames": num_frames, "fps": fps, "width": width, "height": height}
    return msgspec.json.encode({**fields, "duration": num_frames / fps})


def test_sidecar_values_that_overflow_a_column_are_skips(tmp_path: Path) -> None:
    mp4 = encode_video(6, 64, 48, 10)
    path = tmp_path / "big.tar"
    with TarWriter(str(path)) as w:
        w.write({"__key__": "frames", "mp4": mp4, "json": _meta(2**31, 1, 64, 48)})
        w.write({"__key__": "ok", "mp4": mp4, "json": _meta(6, 10, 64, 48)})
        w.write({"__key__": "wide", "mp4": mp4, "json": _meta(6, 10, 2**31, 48)})
        w.write({"__key__": "tall", "mp4": mp4, "json": _meta(6, 10, 64, 1e30)})
        w.write({"__key__": "edge", "mp4": mp4, "json": _meta(2**31 - 1, 1, 64, 48)})
    idx = build_index(str(path), tmp_path / "idx")  # before: OverflowError ended the build
    assert list(idx.keys) == ["ok", "edge"]
    assert int(idx.num_frames[1]) == 2**31 - 1  # the largest value that fits is kept
    reasons = {s.key: s.reason for s in idx.skipped}
    assert "num_frames=2147483648 does not fit the index column (int32" in reasons["frames"]
    assert "width=2147483648 does not fit" in reasons["wide"]
    assert "height=1000000000000000019884624838656 does not fit" in reasons["tall"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_frames_asked_than_decodable_is_an_error(clip: bytes, backend: str) -> None:
    backend = _backend(backend)
    assert decode_frames(clip, [0, 23], (64, 96), backend=backend).shape[0] == 2  # type: ignore[arg-type]
    with pytest.raises(SampleError, match=r"24 decodable frames but frame 24 was asked") as info:
        decode_frames(clip, [0, 12, 24, 30], (64, 96), backend=backend, key="v7", shard="s.tar")  # type: ignore[arg-type]
    assert (info.value.key, info.value.shard) == ("v7", "s.tar")
    assert "2 of 4 requested frames missing" in info.value.reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_garbage_is_a_sample_error_naming_the_key(backend: str) -> None:
    backend = _backend(backend)
    with pytest.raises(SampleError, match=r"'junk'.*does not open"):
        decode_frames(b"\x00garbage" * 100, [0], (8, 8), backend=backend, key="junk")  # type: ignore[arg-type]


def test_a_frame_that_fails_to_decode_is_named(clip: bytes) -> None:
    data = bytearray(clip)
    data[2000:3000] = bytes(1000)  # inside mdat (the moov index at the end stays intact)
    with pytest.raises(SampleError, match=r"frame 6 does not decode.*6 frames decoded") as info:
        decode_frames(bytes(data), [0, 20], (64, 96), key="v", shard="s.tar")
    assert info.value.key == "v"
    assert decode_frames(bytes(data), [0, 5], (64, 96)).shape[0] == 2  # frames before it are fine


def test_a_cut_stream_decodes_fewer_frames_and_says_so() -> None:
    mkv = encode_video(24, 96, 64, 12, seed=3, fmt="matroska")
    cut = mkv[: len(mkv) // 2]  # matroska decodes up to the cut
    with pytest.raises(SampleError, match="5 decodable frames but frame 11 was asked"):
        decode_frames(cut, [0, 11, 23], (64, 96), key="m")


def test_sidecar_that_over_reports_frames_is_caught_at_decode(tmp_path: Path) -> None:
    mp4 = encode_video(6, 64, 48, 10)  # 6 real frames; the sidecar claims 40
    path = tmp_path / "liar.tar"
    with TarWriter(str(path)) as w:
        w.write({"__key__": "liar", "mp4": mp4, "json": _meta(40, 10, 64, 48)})
    idx = build_index(str(path), tmp_path / "idx")
    with pytest.raises(SampleError, match="6 decodable frames") as info:
        decode_index_video(idx, 0)
    assert info.value.key == "liar" and info.value.shard.endswith("liar.tar")


def test_every_record_field_is_checked_against_its_column() -> None:
    """The scanner's last check, for values that reach a record by any route."""
    from fcp_data.readers.scan import SampleRecord, _check_columns, _column_limits

    limits = _column_limits()
    assert limits["num_frames"] == (-(2**31), 2**31 - 1) and limits["text_tokens"][1] == 2**63 - 1
    fields = dict(key="k", url="u", modality=2, text_tokens=1, vision_tokens=4, members={})
    _check_columns(SampleRecord(**fields, special_tokens=1, causal=True, width=2**31 - 1), limits)
    with pytest.raises(ValueError, match=r"width=2147483648 does not fit"):
        _check_columns(SampleRecord(**fields, special_tokens=1, causal=True, width=2**31), limits)
    with pytest.raises(ValueError, match=r"special_tokens=9223372036854775808"):
        _check_columns(SampleRecord(**fields, special_tokens=2**63, causal=True), limits)
