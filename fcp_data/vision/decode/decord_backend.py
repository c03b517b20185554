"""decord backend: its own frame-accurate `get_batch` (seeks to keyframes as it needs).

decord is available by name only; `backend="auto"` never picks it (fcp_data.vision.decode.
backends says why, with numbers). Its work is not reported, so `DecodeStats` gets the frames
and seeks of the same run plan as PyAV's, from decord's keyframe list (`estimated` = True):
get_batch seeks to the keyframe before an index unless the index is in the GOP it is decoding.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from ...optional import require
from .base import DecodeStats
from .errors import frame_failed, not_opening, too_few_frames
from .gop import plan_runs

__all__ = ["DecordBackend"]

NAME = "decord"


class DecordBackend:
    """decord.VideoReader over the bytes (CPU); see the module docstring."""

    name = NAME

    def decode(self, data: bytes, wanted: Sequence[int], stats: DecodeStats) -> list[np.ndarray]:
        decord = require("decord", "decoding video frames with decord")
        errors = (decord.DECORDError, RuntimeError, OSError)
        try:
            reader = decord.VideoReader(io.BytesIO(data), ctx=decord.cpu(0))
            count = len(reader)
            keys = list(reader.get_key_indices())
        except errors as exc:
            raise not_opening(NAME, exc) from exc
        if wanted[-1] >= count:
            raise too_few_frames(count, wanted)
        runs = plan_runs(wanted, keys)
        stats.frames_decoded += sum(r.decoded for r in runs)
        stats.seeks += sum(r.seek for r in runs)
        stats.estimated = True
        try:
            batch = reader.get_batch(list(wanted))
        except errors as exc:
            raise frame_failed(NAME, exc, frame=None, decoded_before=None, wanted=wanted) from exc
        # decord.bridge may be set to torch by the caller's code: both have .numpy()/.asnumpy()
        frames = batch.asnumpy() if hasattr(batch, "asnumpy") else batch.numpy()
        return list(np.asarray(frames, dtype=np.uint8))
