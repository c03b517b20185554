"""Which spans of a video to decode for a set of wanted frames: pure index arithmetic.

A decoder can start only at a keyframe, and then produces every frame up to the one asked for.
For sorted wanted frames it either continues the decode it is in or seeks to the keyframe at or
before the next wanted frame, whichever decodes fewer frames: it seeks only when that keyframe
lies past the frame after the last one decoded (so it never seeks backwards, and never into
the GOP it is already decoding). Each `Run` is one contiguous decode span.

With zigzag CP, member 0 of a degree-d group holds the first and the last chunk of a video:
one seek to the first frame decodes 100% of the frames for it, while runs decode the first
chunk, seek, and decode the last one, about 2/(2d) of the frames plus at most one GOP before
each chunk (bench/media_decode.py measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FrameTable", "Run", "keyframe_at_or_before", "plan_runs"]


@dataclass(frozen=True, slots=True)
class Run:
    """Decode from frame `start` through the last of `frames` (all wanted, sorted).

    `seek`: the run starts by seeking to keyframe `start`; False: it starts the decode at the
    stream's beginning (the first run, when its keyframe is the first frame) or continues the
    previous run's decode where that stopped.
    """

    start: int
    seek: bool
    frames: tuple[int, ...]

    @property
    def stop(self) -> int:
        """The last frame this run decodes (its last wanted frame)."""
        return self.frames[-1]

    @property
    def decoded(self) -> int:
        """Frames this run decodes, wanted or not."""
        return self.stop - self.start + 1


def keyframe_at_or_before(keyframes: np.ndarray, frame: int) -> int:
    """The last keyframe index <= `frame` (`keyframes` sorted); 0 when there is none."""
    k = int(np.searchsorted(keyframes, frame, side="right")) - 1
    return int(keyframes[k]) if k >= 0 else 0


def plan_runs(wanted: Sequence[int], keyframes: Sequence[int] | np.ndarray) -> list[Run]:
    """Decode spans for `wanted` (sorted, unique) given the keyframe indices of the stream."""
    keys = np.unique(np.asarray(keyframes, dtype=np.int64))
    runs: list[Run] = []
    frames: list[int] = []
    start, seek = 0, False
    for w in wanted:
        k = keyframe_at_or_before(keys, int(w))
        if frames and k <= frames[-1] + 1:  # continuing reaches w no later than a seek
            frames.append(int(w))
            continue
        if frames:
            runs.append(Run(start, seek, tuple(frames)))
        # the first run starts at the stream's beginning without a seek when it can
        start, seek, frames = k, bool(runs) or k > 0, [int(w)]
    if frames:
        runs.append(Run(start, seek, tuple(frames)))
    return runs


@dataclass(frozen=True, slots=True)
class FrameTable:
    """Every frame's pts in presentation order and which frames are keyframes.

    Frame index i is the i-th smallest pts: the same numbering as a whole sequential decode
    (the decoder outputs frames in pts order), exact for variable frame rate too, where an
    index derived from the average rate drifts (a 30 fps average with 20-90 ms gaps is off by
    several frames after a few seconds).
    """

    pts: np.ndarray  # int64 [N], sorted
    keyframes: np.ndarray  # int64 [K], sorted frame indices

    @classmethod
    def from_packets(cls, packets: Sequence[tuple[int | None, bool]]) -> FrameTable | None:
        """The table of (pts, is_keyframe) per frame packet; None when pts cannot number
        frames (a packet without pts, two packets with one pts): decode from the start then."""
        if any(p is None for p, _ in packets):
            return None
        pts = np.array([p for p, _ in packets], dtype=np.int64)
        order = np.argsort(pts, kind="stable")
        pts = pts[order]
        if pts.size and (np.diff(pts) <= 0).any():
            return None
        key = np.array([k for _, k in packets], dtype=bool)[order]
        return cls(pts=pts, keyframes=np.flatnonzero(key).astype(np.int64))

    def __len__(self) -> int:
        return int(self.pts.size)

    def index_of(self) -> dict[int, int]:
        """pts -> frame index."""
        return {int(p): i for i, p in enumerate(self.pts.tolist())}
