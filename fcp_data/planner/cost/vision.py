"""Per-replica vision time: the encoder units a replica holds, edge duplicates included.

A video's vision tokens are `units` equal runs of `unit_tokens` tokens (a Qwen tubelet of 2
frames, an InternVL frame or tile); no encoder term crosses a unit, so a replica of a degree-d
CP group decodes and encodes exactly the units that overlap its two zigzag chunks, chunk i and
chunk 2d-1-i of the sequence padded to a multiple of 2d. Unit k starts at token
`first + k * stride` (stride = unit_tokens when the units are contiguous, as the loader lays
them out; larger when a template puts text between units). A unit cut by a chunk edge is done
by both owners, so a member of a degree-d group holding a video of U units does about U/d + 2
of them (up to 4 partial units at its 4 chunk edges), not U/d. Worked example: 60 tubelets of
720 tokens after 2 template tokens, L = 43,202 at d = 4: the members hold 16, 16, 17, 16
tubelets (65 encoded in all, 5 duplicates); the slowest does 17, not 15.

Time of one unit on one replica (seconds, fwd+bwd unless the encoder is frozen):

    encode(P) = a_unit + a_patch · P + a_window · P · min(P, W) + a_full · P²  (W: window)
    decode    = decode_seconds_per_mpix · megapixels decoded / decode_workers

and a CP group's vision time is the largest member's Σ_units, divided by the group's slowest
speed factor. It adds to the language-model time of model.py (the encoder runs before the first
layer; no ring traffic overlaps it). Counting is closed form (`held_units`), exact for this
layout; tests check it against enumerating the zigzag positions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ...errors import ConfigError
from ..kernels.vision import group_vision
from .vision_work import VisionWork

__all__ = [
    "VisionCost",
    "VisionLoad",
    "group_vision_seconds",
    "held_units",
    "member_units",
]


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionCost:
    """Coefficients of the vision side of one replica (see the module docstring).

    seconds_per_patch: linear layers per patch (patch embedding, QKVO, MLP, mergers).
    seconds_per_unit: fixed time per unit (kernel launches of one unit's varlen segment).
    seconds_per_window_pair / seconds_per_full_pair: attention per (query patch, key patch) pair,
    summed over the window-attention / full-attention blocks.
    window_patches: patches per attention window (Qwen2.5-VL: 8×8 = 64; 0 = no window blocks).
    extra_patches: tokens the encoder adds per unit (InternViT's CLS: 1).
    decode_seconds_per_mpix: one loader worker's decode (+ resize) time per decoded megapixel.
    decode_workers: loader workers decoding in parallel for one replica.
    """

    seconds_per_patch: float
    seconds_per_unit: float = 0.0
    seconds_per_window_pair: float = 0.0
    seconds_per_full_pair: float = 0.0
    window_patches: int = 0
    extra_patches: int = 0
    decode_seconds_per_mpix: float = 0.0
    decode_workers: int = 1
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "name":
                continue
            if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ConfigError(
                    f"VisionCost.{f.name}={v!r} must be a finite number >= 0 "
                    "(fix the encoder preset or refit with `fcp profile --vision`)"
                )
        if self.decode_workers < 1:
            raise ConfigError(f"VisionCost.decode_workers={self.decode_workers} must be >= 1")

    def encode_seconds(self, patches: np.ndarray | float) -> np.ndarray:
        """Encoder time of one unit of `patches` patches (vectorised)."""
        p = np.asarray(patches, dtype=np.float64) + self.extra_patches
        win = np.minimum(p, self.window_patches) if self.window_patches else 0.0
        return (
            self.seconds_per_unit
            + self.seconds_per_patch * p
            + self.seconds_per_window_pair * p * win
            + self.seconds_per_full_pair * p * p
        )

    def unit_seconds(self, patches: np.ndarray, decode_mpix: np.ndarray) -> np.ndarray:
        """Encode + decode time of one unit on one replica."""
        dec = self.decode_seconds_per_mpix * np.asarray(decode_mpix, np.float64)
        return self.encode_seconds(patches) + dec / self.decode_workers


def held_units(
    first: np.ndarray,
    stride: np.ndarray,
    unit_tokens: np.ndarray,
    units: np.ndarray,
    seqlen: np.ndarray,
    degree: np.ndarray,
    index: np.ndarray,
) -> np.ndarray:
    """Units that member `index` of a degree-`degree` group decodes and encodes (vectorised).

    The sequence is padded to a multiple of 2d and cut into 2d chunks of C tokens; the member
    holds [iC, (i+1)C) and [(2d-1-i)C, (2d-i)C). With units sorted by start and by end, the
    units meeting [a, b) are #(start < b) − #(end <= a), and a unit meeting both chunks (only
    possible when they touch, i = d-1) is counted once.
    """
    f, st, m, u = (np.asarray(x, np.int64) for x in (first, stride, unit_tokens, units))
    d, i = np.asarray(degree, np.int64), np.asarray(index, np.int64)
    c = -(-np.asarray(seqlen, np.int64) // (2 * d))  # chunk length of the padded sequence
    st1 = np.maximum(st, 1)

    def starts_before(b: np.ndarray) -> np.ndarray:
        return np.clip(-(-(b - f) // st1), 0, u)

    def ends_by(a: np.ndarray) -> np.ndarray:
        return np.clip((a - f - m) // st1 + 1, 0, u)

    a0, b0 = i * c, (i + 1) * c
    a1, b1 = (2 * d - 1 - i) * c, (2 * d - i) * c
    first_chunk = np.maximum(starts_before(b0) - ends_by(a0), 0)
    second_chunk = np.maximum(starts_before(b1) - ends_by(a1), 0)
    both = np.maximum(starts_before(b0) - ends_by(a1), 0)
    return np.where(u > 0, first_chunk + second_chunk - both, 0)


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionLoad:
    """A batch's vision work priced by a VisionCost: what the planner carries.

    `unit_s[s]`: seconds per unit of sample s; `total[s]` = unit_s · units, its replica-seconds
    when encoded once (the part that divides by d; what every plan pays at least).
    """

    work: VisionWork
    unit_s: np.ndarray
    total: np.ndarray

    @classmethod
    def build(cls, work: VisionWork, cost: VisionCost, seqlens: np.ndarray) -> VisionLoad:
        lens = np.asarray(seqlens, np.int64)
        if work.size != lens.size:
            raise ConfigError(
                f"vision work describes {work.size} samples but the batch has {lens.size}; "
                "build VisionWork for exactly the planned samples, in the same order"
            )
        over = work.last_token() > lens
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise ConfigError(
                f"sample {i}: its vision tokens end at {int(work.last_token()[i])} but the "
                f"sequence has {int(lens[i])} tokens; the index and the vision work disagree "
                "(rebuild the index or the VisionWork with the same rule)"
            )
        unit_s = np.where(work.units > 0, cost.unit_seconds(work.patches, work.decode_mpix), 0.0)
        return cls(work=work, unit_s=unit_s, total=unit_s * work.units)

    @property
    def active(self) -> bool:
        return bool(np.any(self.total > 0))

    def group_seconds(
        self,
        lens: np.ndarray,
        speed: np.ndarray | None,
        starts: np.ndarray,
        degs: np.ndarray,
        units: np.ndarray,
        unit_group: np.ndarray,
    ) -> np.ndarray:
        """Vision time of each contiguous window group, at its slowest member's speed.

        `lens`, `speed`: the batch's lengths and the replicas' speed factors (None: all equal),
        passed as arrays so that the cost room's vision terms need no Problem."""
        t = group_vision_seconds(self, lens, units, unit_group, degs)
        if speed is not None:
            t = t / np.array([speed[s : s + k].min() for s, k in zip(starts, degs)])
        return t

    def set_seconds(
        self, lens: np.ndarray, speed: np.ndarray, members: np.ndarray, replicas: np.ndarray
    ) -> float:
        """Vision time of one group on an arbitrary replica set."""
        members = np.asarray(members, np.int64)
        degs = np.array([len(replicas)], np.int64)
        t = group_vision_seconds(self, lens, members, np.zeros(members.size, np.int64), degs)
        return float(t[0]) / float(speed[np.asarray(replicas)].min())


def group_vision_seconds(
    load: VisionLoad,
    lens: np.ndarray,
    units: np.ndarray,
    unit_group: np.ndarray,
    degs: np.ndarray,
) -> np.ndarray:
    """Each group's vision time: its busiest member's Σ unit_s · held units (speed 1).

    `units[j]` (a sample id) runs in group `unit_group[j]` of degree `degs[g]`. Compiled: one
    closed-form count per (vision sample, member), O(Σ degrees); a degree-1 group holds all.
    """
    w = load.work
    ptr = np.zeros(0, np.int64) if w.ptr is None else w.ptr
    starts = np.zeros(0, np.int64) if w.starts is None else w.starts
    return group_vision(
        w.first,
        w.stride,
        w.unit_tokens,
        w.units,
        ptr,
        starts,
        np.asarray(lens, np.int64),
        load.unit_s,
        load.total,
        np.asarray(units, np.int64),
        np.asarray(unit_group, np.int64),
        np.asarray(degs, np.int64),
    )


def member_units(work: VisionWork, i: int, seqlen: int, degree: int) -> np.ndarray:
    """Units each member of a degree-`degree` group holds of sample i, for either layout."""
    d = int(degree)
    if work.ptr is None:
        return held_units(
            work.first[i],
            work.stride[i],
            work.unit_tokens[i],
            work.units[i],
            seqlen,
            np.full(d, d),
            np.arange(d),
        )
    starts, m = work.unit_starts(i), int(work.unit_tokens[i])
    c = -(-int(seqlen) // (2 * d))
    r = np.arange(d)
    a0, b0, a1, b1 = r * c, (r + 1) * c, (2 * d - 1 - r) * c, (2 * d - r) * c

    def meet(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # units with start < b, end > a
        below = np.searchsorted(starts, b, side="left")
        return np.maximum(below - np.searchsorted(starts, a - m, side="right"), 0)

    return meet(a0, b0) + meet(a1, b1) - meet(a1, b0)
