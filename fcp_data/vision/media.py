"""Decode exactly the frames, images and tiles a replica's encoder units need, or say why not.

Frames come from PyAV by index and must all exist: a file that decodes fewer frames than its
index entry promised (a header that over-reports, a cut file) is an error naming both counts,
never a silently repeated last frame, because the index's token count and every replica's
positions were computed from the promised count. Video frames are resized like qwen-vl-utils
(bicubic with antialias on float, rounded to uint8); images and InternVL tiles with Pillow's
bicubic resize, as the Hugging Face Pillow processors and InternVL's dynamic_preprocess do.

Images in modes other than RGB are composited over white through RGBA (transformers'
convert_to_rgb; qwen-vl-utils does the same for RGBA): CMYK, P, L, LA, RGBA all work. Modes with
more than 8 bits per channel (I;16, I, F) have no agreed 8-bit meaning and are refused.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "check_media_size",
    "decode_video_frames",
    "internvl_tiles",
    "load_image",
    "resize_frames",
]

REFUSED_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


SEEK_MIN_FRAME = 48  # below this, decoding from the start costs about what a seek saves


def _pts_index(stream: Any) -> Callable[[int | None], int | None] | None:
    """pts -> frame index for a constant-rate stream (exact rationals), or None if unknown."""
    rate, base = stream.average_rate or stream.guessed_rate, stream.time_base
    if not rate or not base:
        return None
    start = stream.start_time or 0
    scale = Fraction(base) * Fraction(rate)

    def index(pts: int | None) -> int | None:
        if pts is None:
            return None
        x = (pts - start) * scale
        i = round(x)
        return int(i) if abs(x - i) < Fraction(1, 100) else None

    return index


def _decode(data: bytes, wanted: list[int], seek: bool) -> tuple[dict[int, np.ndarray], int]:
    """Wanted frames by index and the last index decoded; None-safe seek when `seek`.

    With `seek`, the container seeks to the keyframe before the first wanted frame and every
    decoded frame's index is derived from its pts; any frame whose pts does not give the next
    whole index (variable rate, missing pts, a seek that lands past the frame) raises
    _SeekUnreliable and the caller decodes from the start instead.
    """
    import av

    want = set(wanted)
    got: dict[int, np.ndarray] = {}
    last = -1
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        index_of = _pts_index(stream) if seek else None
        if seek and index_of is None:
            raise _SeekUnreliable
        i = 0
        if seek:
            assert index_of is not None
            target = stream.start_time or 0
            target += int(
                wanted[0]
                / (
                    Fraction(stream.time_base)
                    * Fraction(stream.average_rate or stream.guessed_rate)
                )
            )
            container.seek(target, stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if seek:
                j = index_of(frame.pts)  # type: ignore[misc]
                if j is None or (last >= 0 and j != last + 1) or (last < 0 and j > wanted[0]):
                    raise _SeekUnreliable
                i = j
            last = i
            if i in want:
                got[i] = frame.to_ndarray(format="rgb24")
            if i >= wanted[-1]:
                break
            i += 1
    return got, last


def check_media_size(height: int, width: int, expect: tuple[int, int] | None, what: str) -> None:
    """ValueError when decoded media is not the (height, width) the index counted it at.

    The rule's resize target, grid and token count come from the index's width/height (a
    sidecar or the probe): a 640x360 clip indexed as 320x320 would be squeezed to the wrong
    aspect and its tokens would describe another grid, with no error. (0, 0) or None: unknown.
    """
    if expect is None or not all(expect):
        return
    if (int(height), int(width)) != (int(expect[0]), int(expect[1])):
        raise ValueError(
            f"the {what} decodes at {width}x{height} (width x height) but the index says "
            f"{expect[1]}x{expect[0]}: its tokens and resize were computed for the wrong size "
            "and it would load stretched; fix the sidecar's width/height or re-index"
        )


class _SeekUnreliable(Exception):
    """Frame indices cannot be trusted after a seek: decode from the start."""


def decode_video_frames(
    data: bytes, indices: Sequence[int], expect: tuple[int, int] | None = None
) -> np.ndarray:
    """uint8 (len(indices), H, W, 3) source frames `indices` (repeats allowed) of `data`.

    `expect` (height, width) is the index's size: a frame of another size raises
    (`check_media_size`).

    A replica that holds only late tubelets of a long video seeks to the keyframe before its
    first frame (constant-rate streams; frame indices checked from pts) instead of decoding
    from frame 0, so its decode work follows the frames it holds.
    """
    import av

    wanted = sorted(set(int(i) for i in indices))
    if not wanted or wanted[0] < 0:
        raise ValueError(f"frame indices {wanted[:4]} must be non-empty and >= 0")
    try:
        try:
            got, last = _decode(data, wanted, seek=wanted[0] >= SEEK_MIN_FRAME)
        except _SeekUnreliable:
            got, last = _decode(data, wanted, seek=False)
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise ValueError(
            f"frame decoding failed ({type(e).__name__}: {e}); the file is corrupt: re-encode "
            "it or drop the sample (on_error='skip' counts it)"
        ) from e
    missing = [i for i in wanted if i not in got]
    if missing:
        raise ValueError(
            f"the video decodes {last + 1} frames but the index samples frame {missing[0]} "
            f"(of {len(wanted)} wanted): its frame count differs from the index's; re-probe "
            "it (rebuild the index without a sidecar num_frames, or fix the sidecar)"
        )
    first = got[wanted[0]]
    check_media_size(first.shape[0], first.shape[1], expect, "video")
    return np.stack([got[int(i)] for i in indices])


def resize_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 (T, H, W, 3) -> (T, h, w, 3): bicubic with antialias on float, rounded, clamped."""
    import torch

    h, w = size
    if frames.shape[1:3] == (h, w):
        return frames
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(
        x, size=(h, w), mode="bicubic", antialias=True, align_corners=False
    )
    return x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def load_image(data: bytes, expect: tuple[int, int] | None = None) -> object:
    """A Pillow RGB image; other 8-bit modes composited over white, 16/32-bit modes refused.

    The one image rule of both loader paths (the vision payload and `vision_input`): a 16-bit
    PNG is refused on both, never clipped (Pillow's convert("RGB") of an I;16 image saturates:
    98.8% of a uniform 16-bit image's values become 255). `expect` (height, width): the
    index's size, checked (`check_media_size`).
    """
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data))
        im.load()
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"image does not decode ({type(e).__name__}: {e}); re-encode it") from e
    check_media_size(im.size[1], im.size[0], expect, "image")
    if im.mode == "RGB":
        return im
    if im.mode in REFUSED_MODES:
        raise ValueError(
            f"image mode {im.mode!r} (more than 8 bits per channel) is not supported: the "
            "processors expect 8-bit RGB; convert it (e.g. to 8-bit RGB PNG) when writing shards"
        )
    rgba = im.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def resize_image(im: object, size: tuple[int, int]) -> np.ndarray:
    """uint8 (h, w, 3) of a Pillow image resized bicubically to size = (h, w)."""
    from PIL import Image

    h, w = size
    if im.size != (w, h):  # type: ignore[attr-defined]
        im = im.resize((w, h), Image.Resampling.BICUBIC)  # type: ignore[attr-defined]
    return np.asarray(im)


def internvl_tiles(
    im: object, *, rows: int, cols: int, thumbnail: bool, tiles: Sequence[int], side: int = 448
) -> np.ndarray:
    """uint8 (len(tiles), side, side, 3): tiles of InternVL's dynamic_preprocess, by index.

    The image is resized to (cols*side, rows*side) and cut row-major; index rows*cols is the
    thumbnail (the whole image resized to side x side), present when `thumbnail` and >1 tile.
    """
    grid = (
        resize_image(im, (rows * side, cols * side))
        if any(t < rows * cols for t in tiles)
        else None
    )
    out = []
    for t in tiles:
        if t < rows * cols:
            r, c = divmod(int(t), cols)
            assert grid is not None
            out.append(grid[r * side : (r + 1) * side, c * side : (c + 1) * side])
        elif thumbnail and t == rows * cols and rows * cols > 1:
            out.append(resize_image(im, (side, side)))
        else:
            raise ValueError(f"tile {t} outside the {rows}x{cols} grid (+thumbnail={thumbnail})")
    return np.stack(out)
