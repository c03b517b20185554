"""Video and image metadata from a sidecar, checked before it is trusted.

A video sample may carry a `.json` sidecar {num_frames, fps, width, height, duration} written
when the shard was made; then no video byte is read to size it. Nonsense values (0 fps,
negative frames, a duration that disagrees with frames/fps by more than 10%) are rejected with a
message naming the field, because a wrong frame count silently changes every token estimate.
Moved here from fcp_data.readers (media I/O sits with the decoder; readers re-exports it).
"""

from __future__ import annotations

import io
import math
from typing import Any

import msgspec

from ..errors import MemberError, MissingDependencyError
from ..optional import require

__all__ = [
    "VideoMeta",
    "decode_json_object",
    "image_size",
    "parse_sidecar",
    "video_meta_from_fields",
]

DURATION_TOLERANCE = 0.10  # |duration - num_frames/fps| / duration allowed in a sidecar
INT32_MAX = 2**31 - 1  # the index stores num_frames, width and height as int32


class VideoMeta(msgspec.Struct, frozen=True, kw_only=True):
    num_frames: int
    fps: float
    width: int
    height: int
    duration: float
    source: str = "sidecar"  # "sidecar", "decord" or "pyav"


def _number(fields: dict[str, Any], name: str) -> float | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MemberError(f"sidecar field {name}={value!r} is not a finite number")
    return float(value)


def video_meta_from_fields(fields: dict[str, Any], source: str = "sidecar") -> VideoMeta:
    """Validate metadata fields; num_frames or duration may be derived from the other and fps."""
    fps, nf = _number(fields, "fps"), _number(fields, "num_frames")
    width, height, duration = (_number(fields, k) for k in ("width", "height", "duration"))
    missing = [k for k, v in (("fps", fps), ("width", width), ("height", height)) if v is None]
    if nf is None and duration is None:
        missing.append("num_frames (or duration)")
    if missing:
        raise MemberError(
            f"{source} lacks {', '.join(missing)}; write all of num_frames, fps, "
            "width, height, duration or drop the sidecar so the video is probed"
        )
    assert fps is not None and width is not None and height is not None
    if fps <= 0:
        raise MemberError(f"{source} fps={fps:g} must be > 0")
    if width < 1 or height < 1 or width != int(width) or height != int(height):
        raise MemberError(f"{source} size {width:g}x{height:g} must be positive integers")
    if nf is None:
        assert duration is not None
        nf = float(round(duration * fps))
    if nf < 1 or nf != int(nf):
        raise MemberError(f"{source} num_frames={nf:g} must be a positive integer")
    for name, value in (("num_frames", nf), ("width", width), ("height", height)):
        if value > INT32_MAX:
            raise MemberError(
                f"{source} {name}={value:.0f} does not fit the index column (int32, at most "
                f"{INT32_MAX}); fix the sidecar or drop it so the video is probed"
            )
    if duration is None:
        duration = nf / fps
    if duration <= 0:
        raise MemberError(f"{source} duration={duration:g} must be > 0")
    if abs(duration - nf / fps) > DURATION_TOLERANCE * duration + 1.0 / fps:
        raise MemberError(
            f"{source} is inconsistent: num_frames/fps = {nf / fps:.3f} s but duration = "
            f"{duration:.3f} s; fix the sidecar or drop it so the video is probed"
        )
    return VideoMeta(
        num_frames=int(nf),
        fps=fps,
        width=int(width),
        height=int(height),
        duration=duration,
        source=source,
    )


def decode_json_object(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object from `data`; ValueError naming `what` when it is not valid JSON or not an
    object (a list or a number where a sample's fields belong)."""
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise MemberError(f"{what} is not valid JSON ({exc})") from exc
    except RecursionError as exc:  # arrays nested thousands deep: one bad sample, not the build
        raise MemberError(
            f"{what} is nested too deeply to decode ({exc}); flatten the sample's JSON"
        ) from exc
    if not isinstance(obj, dict):
        raise MemberError(f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def parse_sidecar(data: bytes) -> tuple[VideoMeta, str | None]:
    """(metadata, caption or None) from sidecar JSON bytes."""
    fields = decode_json_object(data, "sidecar")
    caption = fields.get("caption")
    return video_meta_from_fields(fields), caption if isinstance(caption, str) else None


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) of an encoded image from its header (PIL), else by decoding (PyAV)."""
    try:
        image = require("PIL.Image", "reading an image's size from its header (Pillow)")
    except MissingDependencyError:
        image = None  # PyAV reads the size too, by decoding the image
    if image is not None:
        try:
            with image.open(io.BytesIO(data)) as im:
                return im.height, im.width
        except (image.UnidentifiedImageError, OSError) as exc:
            raise MemberError(f"image does not decode ({exc})") from exc
    av = require("av", "reading an image's size without Pillow (PyAV)")
    try:
        with av.open(io.BytesIO(data)) as container:
            frame = next(container.decode(video=0))
            return frame.height, frame.width
    except (av.FFmpegError, StopIteration) as exc:
        raise MemberError(f"image does not decode ({exc})") from exc
