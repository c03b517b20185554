"""Compiled per-member vision time of CP groups (see `cost.vision` for the model).

For each group, every member's Σ over the group's vision samples of (seconds per unit × units
it holds), then the busiest member's total. A member's units are counted in closed form from
its two zigzag chunks (`cost.vision.held_units` is the vectorised twin, checked against
enumerating positions); a degree-1 group holds every unit. O(Σ degrees) per schedule.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["group_vision"]


@nb.njit(cache=True)
def _starts_before(b: int, f: int, st: int, u: int) -> int:
    return min(max(-((f - b) // st), 0), u)


@nb.njit(cache=True)
def _ends_by(a: int, f: int, st: int, m: int, u: int) -> int:
    return min(max((a - f - m) // st + 1, 0), u)


@nb.njit(cache=True)
def _held(f: int, st: int, m: int, u: int, seqlen: int, d: int, i: int) -> int:
    """Scalar `held_units` (same closed form), for the compiled group loop."""
    c = (seqlen + 2 * d - 1) // (2 * d)
    st = max(st, 1)
    a0, b0, a1, b1 = i * c, (i + 1) * c, (2 * d - 1 - i) * c, (2 * d - i) * c
    before0 = _starts_before(b0, f, st, u)
    first_chunk = max(before0 - _ends_by(a0, f, st, m, u), 0)
    second_chunk = max(_starts_before(b1, f, st, u) - _ends_by(a1, f, st, m, u), 0)
    both = max(before0 - _ends_by(a1, f, st, m, u), 0)
    return first_chunk + second_chunk - both


@nb.njit(cache=True)
def _count_below(x: np.ndarray, lo: int, hi: int, v: int) -> int:
    """#{k in [lo, hi): x[k] < v} for sorted x (binary search)."""
    a, b = lo, hi
    while a < b:
        mid = (a + b) // 2
        if x[mid] < v:
            a = mid + 1
        else:
            b = mid
    return a - lo


@nb.njit(cache=True)
def _held_explicit(
    starts: np.ndarray, lo: int, hi: int, m: int, seqlen: int, d: int, i: int
) -> int:
    """Units with sorted starts `starts[lo:hi]` meeting member i's chunks: #(start < b) −
    #(start + m <= a) per chunk, a unit meeting both counted once."""
    c = (seqlen + 2 * d - 1) // (2 * d)
    a0, b0, a1, b1 = i * c, (i + 1) * c, (2 * d - 1 - i) * c, (2 * d - i) * c
    before0 = _count_below(starts, lo, hi, b0)
    first_chunk = max(before0 - _count_below(starts, lo, hi, a0 - m + 1), 0)
    ends_by_a1 = _count_below(starts, lo, hi, a1 - m + 1)
    second_chunk = max(_count_below(starts, lo, hi, b1) - ends_by_a1, 0)
    return first_chunk + second_chunk - max(before0 - ends_by_a1, 0)


@nb.njit(cache=True)
def group_vision(
    first: np.ndarray,
    stride: np.ndarray,
    unit_tokens: np.ndarray,
    units_of: np.ndarray,
    ptr: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    unit_s: np.ndarray,
    total: np.ndarray,
    units: np.ndarray,
    unit_group: np.ndarray,
    degs: np.ndarray,
) -> np.ndarray:
    """Busiest member's vision seconds per group; `ptr` empty means the regular layout."""
    off = np.zeros(degs.size + 1, np.int64)
    for g in range(degs.size):
        off[g + 1] = off[g] + degs[g]
    per_member = np.zeros(off[-1])
    for j in range(units.size):
        s = units[j]
        if unit_s[s] <= 0.0:
            continue
        g = unit_group[j]
        d = degs[g]
        if d == 1:  # the one member holds every unit
            per_member[off[g]] += total[s]
            continue
        for i in range(d):
            if ptr.size > 0:  # explicit unit starts
                n = _held_explicit(starts, ptr[s], ptr[s + 1], unit_tokens[s], lens[s], d, i)
            else:
                n = _held(first[s], stride[s], unit_tokens[s], units_of[s], lens[s], d, i)
            per_member[off[g] + i] += unit_s[s] * n
    out = np.zeros(degs.size)
    for g in range(degs.size):
        for r in range(off[g], off[g + 1]):
            out[g] = max(out[g], per_member[r])
    return out
