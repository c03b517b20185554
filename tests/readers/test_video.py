"""Video metadata probes (decord, PyAV) under a time limit, and frame decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcp_data.readers.synth import encode_video
from fcp_data.vision.decode import decode_frames, decode_sample_video, groups_for_token_range
from fcp_data.vision.families import get_rule
from fcp_data.vision.media_meta import parse_sidecar, video_meta_from_fields
from fcp_data.vision.probe import Prober, ProbeTimeout


@pytest.fixture(scope="module")
def clip() -> bytes:
    return encode_video(24, 96, 64, 12, seed=3)


@pytest.fixture(scope="module")
def prober_pyav():
    with Prober("pyav", timeout_s=30) as p:
        yield p


def test_pyav_and_decord_probes_agree_with_truth(clip: bytes, prober_pyav: Prober) -> None:
    pytest.importorskip("decord")
    a = prober_pyav.probe(clip)
    with Prober("decord", timeout_s=30) as p:
        b = p.probe(clip)
    assert (a.num_frames, a.width, a.height) == (b.num_frames, b.width, b.height) == (24, 96, 64)
    assert a.fps == pytest.approx(12) and b.fps == pytest.approx(12)
    assert a.source == "pyav" and b.source == "decord"


def test_probe_timeout_never_hangs_and_recovers(clip: bytes) -> None:
    p = Prober("pyav", timeout_s=0.001)  # a fresh child cannot even start in 1 ms
    with pytest.raises(ProbeTimeout, match="raise the probe timeout"):  # waited: no error
        p.probe(clip)
    p.timeout_s = 30
    assert p.probe(clip).num_frames == 24  # a new child serves the next request
    p.close()


def test_probe_reports_undecodable_bytes(prober_pyav: Prober) -> None:
    with pytest.raises(ValueError, match="does not decode"):
        prober_pyav.probe(b"\x00\x01garbage" * 100)


def test_sidecar_validation_messages() -> None:
    meta, caption = parse_sidecar(
        b'{"num_frames": 30, "fps": 10, "width": 64, "height": 48,'
        b' "duration": 3.0, "caption": "hi"}'
    )
    assert meta.num_frames == 30 and caption == "hi"
    derived = video_meta_from_fields({"fps": 25, "width": 8, "height": 8, "duration": 2.0})
    assert derived.num_frames == 50
    for fields, fragment in [
        ({"fps": 0, "width": 8, "height": 8, "num_frames": 3}, "fps=0"),
        ({"fps": 10, "width": 8, "height": 8, "num_frames": -1}, "num_frames=-1"),
        ({"fps": 10, "width": 0, "height": 8, "num_frames": 3}, "size 0x8"),
        ({"fps": 10, "width": 8, "height": 8, "num_frames": 100, "duration": 1.0}, "inconsistent"),
        ({"fps": "ten", "width": 8, "height": 8, "num_frames": 3}, "fps='ten'"),
        ({"width": 8}, "lacks fps, height, num_frames"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            video_meta_from_fields(fields)
    with pytest.raises(ValueError, match="JSON object"):
        parse_sidecar(b"[1, 2]")


@pytest.mark.parametrize("backend", ["pyav", "decord"])
def test_decode_frames_shape_and_content(clip: bytes, backend: str) -> None:
    if backend == "decord":
        pytest.importorskip("decord")
    frames = decode_frames(clip, [0, 5, 23], (64, 96), backend=backend)  # type: ignore[arg-type]
    assert frames.dtype == torch.uint8 and frames.shape == (3, 64, 96, 3)
    # frames move (the pattern shifts 7 levels per frame): decoded frames must differ
    assert not torch.equal(frames[0], frames[1])
    assert frames.float().std() > 10


def test_decoders_agree(clip: bytes) -> None:
    pytest.importorskip("decord")
    a = decode_frames(clip, [0, 11, 23], (64, 96), backend="pyav").int()
    b = decode_frames(clip, [0, 11, 23], (64, 96), backend="decord").int()
    assert (a - b).abs().float().mean() < 3.0  # same frames, colour conversion may differ


def test_decode_as_the_rule_samples_and_token_range(clip: bytes) -> None:
    rule = get_rule("qwen2.5-vl")
    vt = rule.video(num_frames=24, fps=12, height=64, width=96)
    full = decode_sample_video(clip, rule, num_frames=24, fps=12, height=64, width=96)
    assert full.shape == (len(vt.frame_indices), *vt.resized, 3)
    assert full.shape[1] % 28 == 0 and full.shape[2] % 28 == 0
    per = vt.vision // vt.grid[0]
    part = decode_sample_video(
        clip, rule, num_frames=24, fps=12, height=64, width=96, token_range=(per, per + 1)
    )
    assert part.shape[0] == 2  # one temporal group = 2 frames
    assert torch.equal(part, full[2:4])
    assert groups_for_token_range(vt, 0, vt.vision) == range(vt.grid[0])
    assert len(groups_for_token_range(vt, 5, 5)) == 0


def test_resize_is_a_real_resize(clip: bytes) -> None:
    small = decode_frames(clip, [0], (32, 48)).numpy()[0].astype(np.float64)
    big = decode_frames(clip, [0], (64, 96)).numpy()[0].astype(np.float64)
    assert abs(small.mean() - big.mean()) < 5  # same picture, different size


def test_auto_probe_falls_back_to_pyav_and_reports_both() -> None:
    pytest.importorskip("decord")
    with Prober("auto", timeout_s=30) as p, pytest.raises(ValueError, match="PyAV fallback"):
        p.probe(b"\x00garbage" * 200)


def test_index_read_is_thread_safe(built_index) -> None:
    from concurrent.futures import ThreadPoolExecutor

    idx = built_index
    want = [idx.read(i) for i in range(len(idx))]
    order = list(range(len(idx))) * 4
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(idx.read, order))
    assert all(g == want[i] for g, i in zip(got, order))


def test_mkv_without_header_frame_count_is_counted(prober_pyav: Prober) -> None:
    """Matroska stores no frame count: the PyAV probe counts demuxed packets instead."""
    import io

    import av

    mkv = encode_video(15, 64, 48, 10, codec="mpeg4", fmt="matroska")
    with av.open(io.BytesIO(mkv)) as c:
        assert c.streams.video[0].frames == 0  # the header really lacks it
    meta = prober_pyav.probe(mkv)
    assert (meta.num_frames, meta.fps, meta.width, meta.height) == (15, 10.0, 64, 48)
    assert meta.duration == pytest.approx(1.5)
