"""`decode_video_frames`: source frames by index, from any backend, checked the same way.

The one frame decoder of both loader paths (the pixel payload, fcp_data.vision.payload, and
the placeholder path, `decode_frames`). It asks the backend only for the sorted unique frames,
then restores the caller's order and repeats (an odd frame count is padded by repeating the
last index), and checks every frame's size: all frames one size, and that size the index's
`expect` (height, width), or VideoDecodeError.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import ConfigError
from .backends import make_backend, resolve_backend
from .base import DecodeStats
from .errors import size_changes, size_mismatch

__all__ = ["decode_video_frames"]


def decode_video_frames(
    data: bytes,
    indices: Sequence[int],
    expect: tuple[int, int] | None = None,
    *,
    backend: str = "auto",
    device: str = "cpu",
    stats: DecodeStats | None = None,
) -> np.ndarray:
    """uint8 (len(indices), H, W, 3) RGB source frames `indices` (repeats allowed) of `data`.

    Frame i is the i-th frame of a whole sequential decode; only the GOPs that hold wanted
    frames are decoded (`plan_runs`), so a CP member's decode work follows the frames it
    holds. `expect` (height, width; None or a 0 side: unknown) is the index's size.

    Raises VideoDecodeError (a ValueError: a per-sample fault) when the video does not open, a
    frame fails to decode, it has fewer frames than the highest index, or frames are of another
    size; ConfigError / MissingDependencyError for a bad or missing `backend` / `device`.
    `stats`, if given, adds up the work (`DecodeStats`).
    """
    name = resolve_backend(backend, device)
    wanted = sorted({int(i) for i in indices})
    if not wanted or wanted[0] < 0:
        raise ConfigError(f"frame indices {list(indices)[:4]} must be non-empty and >= 0")
    stats = DecodeStats() if stats is None else stats
    stats.backend = name
    frames = make_backend(name, device).decode(data, wanted, stats)
    first = frames[0].shape[:2]
    for i, frame in zip(wanted, frames, strict=True):
        if frame.shape[:2] != first:
            raise size_changes(first, i, frame.shape[:2])
    if expect is not None and all(expect) and tuple(first) != (int(expect[0]), int(expect[1])):
        raise size_mismatch(int(first[0]), int(first[1]), expect)
    at = {w: k for k, w in enumerate(wanted)}
    return np.stack([frames[at[int(i)]] for i in indices])
