"""Real sample shards for tests and demos: stdlib source text and tiny PyAV-encoded videos.

Text: the Python standard library's `.py` files (`sysconfig.get_paths()["stdlib"]`) are a
long-tailed code corpus present on every machine: on CPython 3.11 about 700 files from a few
hundred bytes to ~230 KB. Files are drawn with a seeded RNG from the sorted file list, so shards
are identical for a given seed and Python version. One text sample in four is `.json`
{"text": ...} instead of `.txt`.

Video: durations follow InternVid's profile (85% log-normal(ln 4.5 s, 0.5) in [1, 10] s, 15%
10 s + log-normal(3.23, 1.0)) scaled by `time_scale` (default 0.2) and frame rates 8-12 fps,
so a clip has 4-120 frames at 64x48..160x120: a 100-video set encodes in a few seconds on one
core. Half of the videos carry a `.json` sidecar {num_frames, fps, width, height, duration,
caption}; the others a `.txt` caption and must be probed.
"""

from __future__ import annotations

import io
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import ConfigError, MissingFileError
from ..optional import require

__all__ = ["RESOLUTIONS", "encode_video", "make_shards", "stdlib_sources"]

RESOLUTIONS = ((64, 48), (96, 64), (128, 96), (160, 120), (120, 160), (96, 96))  # (w, h)
VIDEO_FPS = (8, 10, 12)
MAX_FRAMES = 120
MTIME = 1_700_000_000.0  # tar member mtime, fixed so that a seed gives byte-identical shards


def stdlib_sources() -> list[Path]:
    """Sorted `.py` files of the standard library (site-packages and tests excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts
        and "test" not in p.parts
        and "tests" not in p.parts
        and p.is_file()
    ]
    if not files:
        raise MissingFileError(f"no .py files under the stdlib directory {root}")
    return sorted(files)


def encode_video(
    num_frames: int,
    width: int,
    height: int,
    fps: int,
    *,
    seed: int = 0,
    codec: str = "libx264",
    fmt: str = "mp4",
) -> bytes:
    """A `fmt` file ("mp4", "matroska", "webm") of `num_frames` moving-gradient frames
    (yuv420p, so sides must be even)."""
    av = require("av", "writing synthetic video shards (PyAV)")

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "35"}
        yy, xx = np.mgrid[0:height, 0:width]
        base = rng.integers(0, 255, size=3)
        for i in range(num_frames):
            img = np.empty((height, width, 3), dtype=np.uint8)
            for c in range(3):
                img[..., c] = (xx * (c + 1) + yy + 7 * i + base[c]) % 256
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _duration(rng: np.random.Generator) -> float:
    if rng.random() < 0.85:
        return float(np.clip(rng.lognormal(np.log(4.5), 0.5), 1.0, 10.0))
    return 10.0 + float(rng.lognormal(3.23, 1.0))


def make_shards(
    out_dir: str | os.PathLike[str],
    *,
    text: int = 0,
    video: int = 0,
    seed: int = 0,
    samples_per_shard: int = 64,
    time_scale: float = 0.2,
    sidecar_fraction: float = 0.5,
    progress: Any = None,
) -> list[Path]:
    """Write `text-NNNNNN.tar` and `video-NNNNNN.tar` shards; returns their paths in order.
    `progress`: an object with `advance(n)` (`fcp_data.progress.Progress`), told per sample."""
    from webdataset import TarWriter

    if text < 0 or video < 0 or samples_per_shard < 1:
        raise ConfigError(
            f"text={text}, video={video} must be >= 0 and samples_per_shard="
            f"{samples_per_shard} >= 1"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths: list[Path] = []

    def shards(prefix: str, count: int) -> Iterator[tuple[Any, int]]:  # (writer, index) per sample
        for start in range(0, count, samples_per_shard):
            path = out / f"{prefix}-{start // samples_per_shard:06d}.tar"
            paths.append(path)
            with TarWriter(str(path), mtime=MTIME) as writer:  # fixed mtime: same bytes
                for i in range(start, min(count, start + samples_per_shard)):
                    yield writer, i
                    if progress is not None:
                        progress.advance(1)

    if text:
        sources = stdlib_sources()
        picks = rng.integers(0, len(sources), size=text)
        for writer, i in shards("text", text):
            body = sources[picks[i]].read_text(encoding="utf-8", errors="replace")
            if not body.strip():
                body = f"# empty module {sources[picks[i]].name}\n"
            sample: dict[str, object] = {"__key__": f"t{i:08d}"}
            if i % 4 == 3:
                sample["json"] = msgspec.json.encode({"text": body, "source": picks[i].item()})
            else:
                sample["txt"] = body.encode("utf-8")
            writer.write(sample)
    for writer, i in shards("video", video):
        w, h = RESOLUTIONS[int(rng.integers(len(RESOLUTIONS)))]
        fps = int(rng.choice(VIDEO_FPS))
        frames = int(np.clip(round(_duration(rng) * time_scale * fps), 4, MAX_FRAMES))
        caption = f"a {w}x{h} clip of {frames} frames of moving gradients, number {i}"
        sample = {"__key__": f"v{i:08d}", "mp4": encode_video(frames, w, h, fps, seed=seed + i)}
        if rng.random() < sidecar_fraction:
            sample["json"] = msgspec.json.encode(
                {
                    "num_frames": frames,
                    "fps": fps,
                    "width": w,
                    "height": h,
                    "duration": frames / fps,
                    "caption": caption,
                }
            )
        else:
            sample["txt"] = caption.encode("utf-8")
        writer.write(sample)
    return paths
