"""Per-sample vision work of a global batch: how many encoder units, and where their tokens sit.

Two layouts are described exactly:
- regular: unit k starts at `first + k * stride` (the legacy loader puts every template token
  first and the units back to back; Qwen2/2.5-VL's template `<|vision_start|>` + pads +
  `<|vision_end|>` is regular too, first = 1);
- explicit: sorted `unit_starts` per sample (Qwen3-VL's per-group `<t seconds>` text and
  InternVL's `Frame-i: ` labels vary in length, so the gaps differ by a token or two).
The planner is handed these arrays only; `fcp_data.vision.vision_work_from_index` /
`vision_work_from_media` build them from the length index and its vision rule (walking the
rule's template parts with its text counter, the one description the index counts and the
loader emits), since the planner imports nothing of readers or vision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError

__all__ = ["VisionWork"]


def _i64(x: object, n: int, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim == 0:
        a = np.full(n, a)
    if a.shape != (n,):
        raise ConfigError(f"VisionWork.{name} has shape {a.shape}; give one value per sample ({n})")
    return a


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionWork:
    """Arrays of one entry per sample (0 units for text): `units`, `unit_tokens` (LLM tokens per
    unit), `first` / `stride` (regular layout), `patches` (encoder patches per unit),
    `decode_mpix` (megapixels decoded per unit), and optionally `ptr` / `starts`: sample i's
    unit starts are `starts[ptr[i]:ptr[i + 1]]` (explicit layout, used when present)."""

    units: np.ndarray
    unit_tokens: np.ndarray
    first: np.ndarray
    stride: np.ndarray
    patches: np.ndarray
    decode_mpix: np.ndarray
    ptr: np.ndarray | None = None
    starts: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        *,
        units: object | None = None,
        unit_tokens: object,
        first: object = 0,
        patches: object,
        decode_mpix: object = 0.0,
        stride: object | None = None,
        unit_starts: Sequence[Sequence[int]] | None = None,
    ) -> VisionWork:
        """Regular layout from `units`/`first`/`stride`, or explicit from `unit_starts`."""
        ptr = starts = None
        if unit_starts is not None:
            counts = np.array([len(x) for x in unit_starts], np.int64)
            ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            flat = [np.asarray(x, np.int64) for x in unit_starts]
            starts = np.concatenate(flat) if flat else np.zeros(0, np.int64)
            units = counts
            first = np.array([x[0] if len(x) else 0 for x in flat], np.int64)
        n = np.asarray(units).size
        u = _i64(units, n, "units").astype(np.int64)
        m = np.where(u > 0, _i64(unit_tokens, n, "unit_tokens").astype(np.int64), 0)
        st = m.copy() if stride is None else _i64(stride, n, "stride").astype(np.int64)
        work = cls(
            units=u,
            unit_tokens=m,
            first=_i64(first, n, "first").astype(np.int64),
            stride=st,
            patches=_i64(patches, n, "patches").astype(np.float64),
            decode_mpix=_i64(decode_mpix, n, "decode_mpix").astype(np.float64),
            ptr=ptr,
            starts=starts,
        )
        work._check()
        return work

    def _check(self) -> None:
        u, m, st, f = self.units, self.unit_tokens, self.stride, self.first
        bad = (u < 0) | ((u > 0) & ((m < 1) | (st < m) | (f < 0)))
        if self.ptr is not None and self.starts is not None and self.starts.size > 1:
            owner = np.repeat(np.arange(u.size), np.diff(self.ptr))
            inner = owner[1:] == owner[:-1]  # consecutive starts of one sample
            close = inner & (np.diff(self.starts) < m[owner[1:]])
            bad = bad.copy()
            bad[owner[1:][close]] = True
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(
                f"sample {i}: vision work units={u[i]}, unit_tokens={m[i]}, stride={st[i]}, "
                f"first={f[i]} is not a layout (need units >= 0, unit_tokens >= 1, "
                "stride >= unit_tokens, first >= 0, unit starts sorted at least unit_tokens "
                "apart)"
            )

    @property
    def size(self) -> int:
        return int(self.units.size)

    def unit_starts(self, i: int) -> np.ndarray:
        """Token offsets where sample i's units start."""
        if self.ptr is not None and self.starts is not None:
            return self.starts[self.ptr[i] : self.ptr[i + 1]]
        return self.first[i] + self.stride[i] * np.arange(self.units[i], dtype=np.int64)

    def last_token(self) -> np.ndarray:
        """One past the last vision token of each sample (0 for text)."""
        if self.ptr is not None and self.starts is not None:
            last = self.starts[np.maximum(self.ptr[1:] - 1, 0)] if self.starts.size else 0
        else:
            last = self.first + (self.units - 1) * self.stride
        return np.where(self.units > 0, last + self.unit_tokens, 0)
