"""Least-squares fits of the cost model's coefficients, with the per-point error table.

Compute: t(s) = alpha1·s² + alpha2·s + beta1 over the measured grid of sequence lengths (fwd +
bwd, all layers), the paper's Eq. 8 + Eq. 10 at d = 1. Communication: t(n) = latency + n / bw
over ping-pong message sizes. Both minimise the *relative* error (each row divided by its
measurement), because the grid spans two or three orders of magnitude: an unweighted fit lets
the longest sequence decide everything and misses short ones by 50% or more, which are most of
a long-tailed batch. Coefficients must be >= 0 (CostModel refuses negatives): with k <= 3 columns
every subset is tried (at most 7 small solves) and the best non-negative one kept, which is the
exact non-negative least-squares solution. Noiseless data from known coefficients is recovered
to rounding (tests/e2e/test_e2e_profile.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fcp_data.errors import ConfigError

__all__ = [
    "OFF_LIMIT",
    "Fit",
    "FitRow",
    "fit_compute",
    "fit_p2p",
    "fit_warnings",
    "nonneg_relative_lstsq",
]

OFF_LIMIT = 0.25  # a point the fit misses by more than this is worth a warning


@dataclass(kw_only=True, slots=True, frozen=True)
class FitRow:
    """One measured point and what the fitted model predicts for it."""

    x: float
    measured: float
    predicted: float

    @property
    def rel_error(self) -> float:
        return (self.predicted - self.measured) / self.measured


@dataclass(kw_only=True, slots=True, frozen=True)
class Fit:
    """Fitted coefficients (by name) and the per-point error table (the paper's Table 3)."""

    coef: dict[str, float]
    rows: tuple[FitRow, ...]

    @property
    def max_abs_error(self) -> float:
        return max(abs(r.rel_error) for r in self.rows)

    @property
    def mean_abs_error(self) -> float:
        return float(np.mean([abs(r.rel_error) for r in self.rows]))


def nonneg_relative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin_{c >= 0} Σ_i ((A c − y)_i / y_i)² by trying every column subset (k <= 3)."""
    a, y = np.asarray(a, np.float64), np.asarray(y, np.float64)
    if a.ndim != 2 or a.shape[0] != y.size or a.shape[1] > 3:
        raise ConfigError(f"design matrix {a.shape} and {y.size} measurements do not match")
    if a.shape[0] < a.shape[1]:
        raise ConfigError(
            f"{a.shape[0]} measurements cannot fit {a.shape[1]} coefficients; measure at least "
            f"{a.shape[1]} grid points"
        )
    if np.any(y <= 0) or not np.all(np.isfinite(y)):
        raise ConfigError(f"measurements must be positive and finite, got {y.tolist()}")
    w = a / y[:, None]
    best, best_err = np.zeros(a.shape[1]), np.inf
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sol, *_ = np.linalg.lstsq(w[:, cols], np.ones(y.size), rcond=None)
            if np.any(sol < 0):
                continue
            c = np.zeros(a.shape[1])
            c[list(cols)] = sol
            err = float(np.sum((w @ c - 1.0) ** 2))
            if best_err == np.inf or err < best_err * (1 - 1e-12):  # ties: fewer columns
                best, best_err = c, err
    return best


def _fit(names: Sequence[str], a: np.ndarray, x: np.ndarray, y: np.ndarray) -> Fit:
    c = nonneg_relative_lstsq(a, y)
    pred = a @ c
    rows = tuple(
        FitRow(x=float(xi), measured=float(yi), predicted=float(pi))
        for xi, yi, pi in zip(x, y, pred)
    )
    return Fit(coef={n: float(v) for n, v in zip(names, c)}, rows=rows)


def fit_compute(seqlens: Sequence[int], seconds: Sequence[float]) -> Fit:
    """alpha1 (s/token²), alpha2 (s/token), beta1 (s) from fwd+bwd times of one sequence."""
    s = np.asarray(seqlens, np.float64)
    return _fit(
        ("alpha1", "alpha2", "beta1"),
        np.stack([s * s, s, np.ones_like(s)], 1),
        s,
        np.asarray(seconds, np.float64),
    )


def fit_p2p(nbytes: Sequence[int], seconds: Sequence[float]) -> Fit:
    """latency (s) and inverse bandwidth (s/byte) from one-way message times."""
    n = np.asarray(nbytes, np.float64)
    return _fit(
        ("latency", "seconds_per_byte"),
        np.stack([np.ones_like(n), n], 1),
        n,
        np.asarray(seconds, np.float64),
    )


def fit_warnings(fit: Fit, what: str) -> list[str]:
    """Why a fit should not be trusted as is, one sentence each ([] when nothing is wrong).

    Degenerate when a coefficient is 0 (the non-negative fit dropped that term: the planner
    will treat it as free), when there are no more points than coefficients (the curve passes
    through every point, so its error says nothing), or when any point is off by more than
    25% (noise, a busy machine, or a shape the model does not describe).
    """
    out: list[str] = []
    zeros = [name for name, v in fit.coef.items() if v == 0.0]
    if zeros:
        out.append(
            f"{what}: {', '.join(zeros)} fitted as 0 (the non-negative fit dropped the term, "
            "so the planner treats it as free); measure more or longer points"
        )
    if len(fit.rows) <= len(fit.coef):
        out.append(
            f"{what}: {len(fit.rows)} point(s) for {len(fit.coef)} coefficients: the fit passes "
            "through every point and its error says nothing; measure more points"
        )
    bad = [r for r in fit.rows if abs(r.rel_error) > OFF_LIMIT]
    if bad:
        worst = ", ".join(f"{r.x:g} ({r.rel_error:+.0%})" for r in bad[:5])
        out.append(
            f"{what}: {len(bad)} point(s) off by more than {OFF_LIMIT:.0%}: {worst}; rerun on "
            "an idle machine or with more --repeats"
        )
    return out
