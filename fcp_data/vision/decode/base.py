"""The backend contract: what a frame decoder takes, returns and reports (`DecodeStats`).

A backend gets the encoded bytes and the wanted frame indices, sorted and unique, and returns
one uint8 (H, W, 3) RGB array per wanted index, in that order. It raises VideoDecodeError
(fcp_data.vision.decode.errors) for a video that does not open, a frame that fails, or fewer
frames than the highest index; the caller (`decode_video_frames`) does ordering, repeats and
the size checks, so those are the same for every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["DecodeStats", "FrameBackend"]


@dataclass(slots=True)
class DecodeStats:
    """Work a decode did, added up over every call it is passed to.

    A benchmark reports "frames decoded by the slowest CP member as a share of a whole-video
    decode": member 0 of a degree-d zigzag group holds the first and the last chunk, so a
    decoder that seeks once decodes 100% of the video for it; decoding only the GOPs it holds
    brings that to about 2/(2d) of the frames plus up to one GOP per held chunk.

    frames_decoded: frames the decoder produced, wanted or not (PyAV: counted exactly; decord
        and torchcodec do not report their work, so it is derived from their keyframe lists
        with the same run plan as PyAV's and `estimated` is True).
    seeks: seeks to a keyframe (exact for PyAV, planned for the others).
    backend: the backend that decoded last ("pyav", "decord", "torchcodec").
    """

    frames_decoded: int = 0
    seeks: int = 0
    backend: str = ""
    estimated: bool = False


class FrameBackend(Protocol):
    """One decoding library behind the common contract (see the module docstring)."""

    name: str

    def decode(self, data: bytes, wanted: Sequence[int], stats: DecodeStats) -> list[np.ndarray]:
        """uint8 (H, W, 3) frames `wanted` (sorted, unique, >= 0) of `data`, in that order."""
        ...
