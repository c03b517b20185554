"""A fitted cost profile on this device: the profiler's compute fit and its vision encoder fit.

Compute: `fcp.profiling.run_profile` (what `fcp profile --device ...` runs) on a small
model shape over a grid of lengths, causal and full attention, P2P off (the suite measures the
link itself, between GPUs, in the ring job). Reported: the fitted CostModel, the coefficients
and the per-point relative errors (the paper's Table 3) and the profiler's own warnings.

Vision: the profiler's ViT-like encoder timed fwd+bwd on this device for several patch counts,
fitted t(P) = a_unit + a_patch P + a_full P^2 by the same non-negative relative least squares;
PyAV decode is fitted too when PyAV is installed (`run_vision_profile`), else recorded as
skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from fcp.profiling import ProfileConfig, fit_warnings, run_profile, shape_from_name
from fcp.profiling.fit import Fit, FitRow, nonneg_relative_lstsq
from fcp.profiling.vision import VisionProfileConfig, run_vision_profile, time_encoder

__all__ = ["bench_compute_profile", "bench_vision_profile"]


def _table(fit: Fit) -> dict[str, Any]:
    return {
        "coef": fit.coef,
        "rows": [{"x": r.x, "measured_s": r.measured, "predicted_s": r.predicted,
                  "rel_error": r.rel_error} for r in fit.rows],
        "max_abs_error": fit.max_abs_error,
        "mean_abs_error": fit.mean_abs_error,
    }  # fmt: skip


def bench_compute_profile(
    device: str, shape_name: str, seqlens: list[int], repeats: int
) -> dict[str, Any]:
    """run_profile on `device` for `shape_name`; the fit, its errors and the CostModel."""
    start = time.monotonic()
    shape = shape_from_name(shape_name)
    cfg = ProfileConfig(shape=shape, seqlens=tuple(seqlens), repeats=repeats, device=device,
                        full_attention=True, p2p=False)  # fmt: skip
    prof = run_profile(cfg)
    return {
        "status": "ok", "shape": asdict(shape), "seqlens": list(seqlens), "repeats": repeats,
        "dtype": "float32", "compute_fit": _table(prof.compute),
        "eta_full": prof.cost.eta_full, "cost_model": asdict(prof.cost),
        "warnings": fit_warnings(prof.compute, "compute"),
        "seconds": time.monotonic() - start,
    }  # fmt: skip


def _encoder_only(c: VisionProfileConfig) -> Fit:
    p = np.array(c.patches, np.float64)
    t = np.array([time_encoder(c, int(n)) for n in c.patches])
    a = np.stack([np.ones_like(p), p, p * p], 1)
    coef = nonneg_relative_lstsq(a, t)
    names = ("seconds_per_unit", "seconds_per_patch", "seconds_per_full_pair")
    rows = tuple(FitRow(x=float(x), measured=float(y), predicted=float(v))
                 for x, y, v in zip(p, t, a @ coef))  # fmt: skip
    return Fit(coef={n: float(v) for n, v in zip(names, coef)}, rows=rows)


def bench_vision_profile(c: VisionProfileConfig) -> dict[str, Any]:
    """The encoder fit on c.device (and the decode fit when PyAV is installed)."""
    start = time.monotonic()
    encoder = {k: getattr(c, k) for k in ("layers", "hidden", "heads", "ffn", "patches")}
    out: dict[str, Any] = {"status": "ok", "encoder": encoder, "device": c.device}
    if importlib.util.find_spec("av") is None:
        fit = _encoder_only(c)
        out["encoder_fit"] = _table(fit)
        out["decode_fit"] = {"status": "skipped", "reason": "PyAV (av) is not installed"}
    else:
        prof = run_vision_profile(c)
        out["encoder_fit"] = _table(prof.encoder)
        out["decode_fit"] = {"status": "ok", **_table(prof.decode), "sizes": list(c.sizes),
                             "frames": c.frames}  # fmt: skip
        fit = prof.encoder
    out["warnings"] = fit_warnings(fit, "vision encoder")
    out["seconds"] = time.monotonic() - start
    return out
