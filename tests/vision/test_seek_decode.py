"""Seeking to the keyframe before a replica's first frame gives exactly the sequential frames."""

from __future__ import annotations

import io

import numpy as np
import pytest

from fcp_data.vision.decode import DecodeStats
from fcp_data.vision.media import decode_video_frames


def _video(n: int, fps: int, codec: str, gop: int) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        s.codec_context.gop_size = gop
        if codec == "libx264":
            s.options = {"preset": "ultrafast", "bf": "2", "crf": "30"}
        yy, xx = np.mgrid[0:48, 0:64]
        for i in range(n):
            img = np.stack([(xx * (c_ + 1) + yy + 9 * i) % 256 for c_ in range(3)], -1)
            for p in s.encode(av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def _sequential(data: bytes) -> list[np.ndarray]:
    """Every frame of a whole decode from the start: the reference numbering."""
    import av

    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


@pytest.mark.parametrize(("codec", "fps"), [("libx264", 30), ("mpeg4", 25)])
def test_seek_decode_equals_sequential(codec, fps) -> None:
    data = _video(240, fps, codec, gop=12)
    ref = _sequential(data)
    assert len(ref) == 240
    rng = np.random.default_rng(0)
    for first in (48, 61, 120, 200, 239):
        wanted = sorted({first, *rng.integers(first, 240, size=5).tolist()})
        stats = DecodeStats()
        out = decode_video_frames(data, wanted, backend="pyav", stats=stats)
        np.testing.assert_array_equal(out, np.stack([ref[i] for i in wanted]))
        assert stats.seeks >= 1 and stats.frames_decoded < 240 - first + 12
    # repeats come back in order, and frames the file lacks are refused
    out = decode_video_frames(data, [200, 200, 201], backend="pyav")
    np.testing.assert_array_equal(out, np.stack([ref[200], ref[200], ref[201]]))
    with pytest.raises(ValueError, match="decodes 240 frames but the index samples frame 250"):
        decode_video_frames(data, [100, 250], backend="pyav")


def test_seek_lands_on_the_keyframe_before_the_first_frame() -> None:
    """The seek really skips decoding: with a 12-frame GOP, frame 200 starts decoding at 192."""
    data = _video(240, 30, "libx264", gop=12)
    stats = DecodeStats()
    decode_video_frames(data, [200], backend="pyav", stats=stats)
    assert (stats.seeks, stats.frames_decoded) == (1, 200 - 192 + 1)
