"""Decode exactly the frames, images and tiles a replica's encoder units need, or say why not.

Video frames come from the one decoder, fcp_data.vision.decode (re-exported here as
`decode_video_frames`): by index, only the GOPs that hold them, and all must exist: a file
that decodes fewer frames than its index entry promised (a header that over-reports, a cut
file) is an error naming both counts, never a silently repeated last frame, because the
index's token count and every replica's positions were computed from the promised count.
Video frames are resized like qwen-vl-utils (bicubic with antialias on float, rounded to
uint8); images and InternVL tiles with Pillow's bicubic resize, as the Hugging Face Pillow
processors and InternVL's dynamic_preprocess do.

Images in modes other than RGB are composited over white through RGBA (transformers'
convert_to_rgb; qwen-vl-utils does the same for RGBA): CMYK, P, L, LA, RGBA all work. Modes with
more than 8 bits per channel (I;16, I, F) have no agreed 8-bit meaning and are refused.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError, MemberError
from ..optional import require
from .decode import decode_video_frames
from .decode.errors import size_mismatch_message
from .families.internvl import IMAGE_SIZE

__all__ = [
    "check_media_size",
    "decode_video_frames",
    "internvl_tiles",
    "load_image",
    "resize_frames",
]

REFUSED_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def check_media_size(height: int, width: int, expect: tuple[int, int] | None, what: str) -> None:
    """ValueError when decoded media is not the (height, width) the index counted it at.

    The rule's resize target, grid and token count come from the index's width/height (a
    sidecar or the probe): a 640x360 clip indexed as 320x320 would be squeezed to the wrong
    aspect and its tokens would describe another grid, with no error. (0, 0) or None: unknown.
    Video frames get the same text from the decoder (VideoDecodeError, a ValueError).
    """
    message = size_mismatch_message(height, width, expect, what)
    if message is not None:
        raise MemberError(message)


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
    Image = require("PIL.Image", "decoding an image (Pillow)")

    try:
        im = Image.open(io.BytesIO(data))
        im.load()
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise MemberError(f"image does not decode ({type(e).__name__}: {e}); re-encode it") from e
    check_media_size(im.size[1], im.size[0], expect, "image")
    if im.mode == "RGB":
        return im
    if im.mode in REFUSED_MODES:
        raise MemberError(
            f"image mode {im.mode!r} (more than 8 bits per channel) is not supported: the "
            "processors expect 8-bit RGB; convert it (e.g. to 8-bit RGB PNG) when writing shards"
        )
    rgba = im.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def resize_image(im: object, size: tuple[int, int]) -> np.ndarray:
    """uint8 (h, w, 3) of a Pillow image resized bicubically to size = (h, w)."""
    Image = require("PIL.Image", "resizing an image (Pillow)")

    h, w = size
    if im.size != (w, h):  # type: ignore[attr-defined]
        im = im.resize((w, h), Image.Resampling.BICUBIC)  # type: ignore[attr-defined]
    return np.asarray(im)


def internvl_tiles(
    im: object,
    *,
    rows: int,
    cols: int,
    thumbnail: bool,
    tiles: Sequence[int],
    side: int = IMAGE_SIZE,
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
            raise ConfigError(f"tile {t} outside the {rows}x{cols} grid (+thumbnail={thumbnail})")
    return np.stack(out)
