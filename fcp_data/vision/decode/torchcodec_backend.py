"""torchcodec backend (0.17 API): `VideoDecoder(bytes, seek_mode="exact", device=...)`.

`seek_mode="exact"` scans the file once and builds its own frame table, so `get_frames_at`
returns frame i for index i (variable frame rate included), decoding each needed GOP once and
never seeking backwards. `device="cuda"` decodes on the GPU (NVDEC); frames are copied back to
host memory because the pipeline resizes and normalises on the CPU, and torchcodec documents
that its CUDA colour conversion is not bit-identical to the CPU one. torchcodec does not report
its work: `DecodeStats` gets the run plan of its keyframe list (`estimated` = True).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...optional import require
from .base import DecodeStats
from .errors import frame_failed, not_opening, too_few_frames
from .gop import plan_runs

__all__ = ["TorchCodecBackend"]

NAME = "torchcodec"
_ERRORS = (RuntimeError, ValueError, IndexError, OSError)  # what torchcodec raises on bad media


class TorchCodecBackend:
    """torchcodec.decoders.VideoDecoder over the bytes, on `device`; see the module docstring."""

    name = NAME

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def decode(self, data: bytes, wanted: Sequence[int], stats: DecodeStats) -> list[np.ndarray]:
        decoders = require("torchcodec.decoders", "decoding video frames with torchcodec")
        try:
            decoder = decoders.VideoDecoder(data, seek_mode="exact", device=self.device)
            count = decoder.metadata.num_frames
            count = len(decoder) if count is None else int(count)
        except _ERRORS as exc:
            raise not_opening(NAME, exc) from exc
        if wanted[-1] >= count:
            raise too_few_frames(count, wanted)
        _plan_stats(decoder, wanted, stats)
        try:
            batch = decoder.get_frames_at(indices=list(wanted))
        except _ERRORS as exc:
            raise frame_failed(NAME, exc, frame=None, decoded_before=None, wanted=wanted) from exc
        nchw = batch.data  # uint8 [N, 3, H, W]
        return list(nchw.permute(0, 2, 3, 1).contiguous().cpu().numpy())


def _plan_stats(decoder: Any, wanted: Sequence[int], stats: DecodeStats) -> None:
    """Planned frames and seeks from the decoder's keyframes (a private torchcodec call;
    without it, only the frames returned are counted)."""
    keys = getattr(decoder, "_get_key_frame_indices", None)
    try:
        runs = plan_runs(wanted, list(keys())) if callable(keys) else None
    except _ERRORS:
        runs = None
    stats.estimated = True
    if runs is None:
        stats.frames_decoded += len(wanted)
        return
    stats.frames_decoded += sum(r.decoded for r in runs)
    stats.seeks += sum(r.seek for r in runs)
