"""The ring's exposed communication, fitted from real d = 1 and d = 2 groups on this machine.

The cost model lets ring traffic hide behind attention: a member of a degree-d group spends
T = L/d + max(A/d, C) + beta1 with C = (d-1)/d · alpha3·s / bandwidth + beta2·(d-1). A ping-pong
between idle processes (p2p.py) prices C as if the link were free to overlap; on CPU with gloo
the transfers run on the cores that compute, and measured d = 2 groups took 1.5-1.8x their
prediction. Here C is fitted to what real groups leave after the per-token layers:

    C(s) = k(s) · t2(s) − alpha2·s/2 − beta1,    k(s) = t1_profile(s) / t1(s)

where t1, t2 are fwd+bwd seconds at d = 1 and d = 2 timed concurrently on two processes
(`ring_timing`, so both see the same contention) and k rescales them to the profile's own
compute time (a busy machine slows both alike). C ≈ (alpha3·s/2)·x + beta2 is
then fitted by non-negative least squares on relative error: bandwidth = 1/x, beta2 the per-step
constant. Rows where the ring was no slower than the halved compute carry no signal and are
left out (noted by the warnings when too few remain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fcp_data.errors import ConfigError
from fcp_data.planner import CostModel

from .fit import Fit, FitRow, nonneg_relative_lstsq
from .shapes import ModelShape

__all__ = ["RING_LENGTHS", "fit_ring", "measure_ring", "ring_fit_problems", "with_ring"]

# fwd+bwd 0.02-0.4 s each for cpu-small on one core. The short ones pin the per-step latency
# beta2: from 512 tokens up the exposed time grows in proportion to the bytes (15.8, 31.7, 63.0
# ms at 512, 1024, 2048 on a loaded 2-core machine), so beta2 fitted as 0 there; at 128 and 256
# tokens the ring still exposed 12-14 ms, which the fit reads as beta2 = 6.4 ms.
RING_LENGTHS = (128, 256, 512, 1024, 2048, 3072)


def measure_ring(
    shape: ModelShape,
    seqlens: Sequence[int] = RING_LENGTHS,
    *,
    repeats: int = 2,
    timeout_s: float = 600.0,
) -> list[dict[str, float]]:
    """Rows {seqlen, d1_s, d2_s} timed on 2 gloo processes by `ring_timing` (fcp_exec's ring
    attention); a process that fails or outlives `timeout_s` raises DataError."""
    from .ring_timing import time_ring_groups  # torch and the training side: only when timing

    return time_ring_groups(shape, [int(s) for s in seqlens], repeats=repeats, timeout_s=timeout_s)


def fit_ring(rows: Sequence[dict[str, float]], cost: CostModel) -> Fit:
    """Fit {seconds_per_byte, beta2} of the exposed ring cost at d = 2 (module docstring)."""
    if not rows:
        raise ConfigError("no ring measurements to fit; measure at least 2 lengths")
    s = np.array([r["seqlen"] for r in rows], np.float64)
    t1 = np.array([r["d1_s"] for r in rows], np.float64)
    t2 = np.array([r["d2_s"] for r in rows], np.float64)
    if np.any(t1 <= 0) or np.any(t2 <= 0):
        raise ConfigError(f"ring times must be positive, got d1 {t1.tolist()}, d2 {t2.tolist()}")
    profile_t1 = cost.alpha1 * s * s + cost.alpha2 * s + cost.beta1
    exposed = t2 * (profile_t1 / t1) - cost.alpha2 * s / 2 - cost.beta1
    keep = exposed > 0
    if keep.sum() < 1:
        raise ConfigError(
            "every ring measurement ran at or under the halved compute time: nothing to fit "
            "(communication fully hidden); keep the ping-pong profile"
        )
    s_k, c_k = s[keep], exposed[keep]
    a = np.stack([cost.alpha3 * s_k / 2, np.ones_like(s_k)], 1)
    coef = nonneg_relative_lstsq(a, c_k) if keep.sum() >= 2 else np.array([0.0, float(c_k[0])])
    pred = a @ coef
    fit_rows = tuple(
        FitRow(x=float(x), measured=float(m), predicted=float(p)) for x, m, p in zip(s_k, c_k, pred)
    )
    return Fit(coef={"seconds_per_byte": float(coef[0]), "beta2": float(coef[1])}, rows=fit_rows)


def ring_fit_problems(fit: Fit, base: CostModel) -> list[str]:
    """Why a ring fit cannot be a price of the ring here, one clause each ([] when it can).

    The fit is C(s) = (alpha3 s / 2) x + beta2 over the communication real d = 2 groups
    exposed. x = 0 says the exposed time did not grow with the bytes sent: the non-negative
    fit dropped the term, and `with_ring` would price ring traffic at 10^12 B/s (printed as
    1000000 MB/s), i.e. free. A bandwidth above the idle ping-pong's is as absurd: traffic that
    shares the cores with compute cannot move faster than over an idle link. Either way the
    planner would see rings as free and put every sequence on one degree, like static CP.
    beta2 = 0 leaves the per-step latency unpriced: every ring step of a short sequence looks
    free, so the planner widens rings that a few ms per step (what CPU gloo measures) would
    make slower; `fcp demo` measures again and then falls back to a shipped profile."""
    spb, beta2 = fit.coef["seconds_per_byte"], fit.coef["beta2"]
    out: list[str] = []
    if spb <= 0:
        out.append(
            "its bandwidth term was fitted as 0 (the exposed time did not grow with the bytes "
            "sent), which prices ring traffic as free"
        )
    elif 1.0 / spb > base.intra_node_bandwidth:
        out.append(
            f"it prices the ring at {1e-6 / spb:,.0f} MB/s, faster than the idle ping-pong "
            f"({base.intra_node_bandwidth / 1e6:,.0f} MB/s): transfers that share the cores "
            "with compute cannot beat an idle link"
        )
    if beta2 <= 0:
        out.append("its per-step latency (β2) was fitted as 0")
    return out


def with_ring(cost: CostModel, fit: Fit, *, label: str = "ring measured here") -> CostModel:
    """`cost` with the ring's fitted bandwidth (both link kinds: one host) and beta2; `label`
    is appended to the name (`fcp profile --ring` writes "ring measured (fcp profile --ring)",
    since its file is read on other machines, where "here" would be wrong)."""
    spb = fit.coef["seconds_per_byte"]
    bandwidth = 1.0 / spb if spb > 0 else 1e12
    base = cost.name.split(" + ring measured")[0]  # a ring price replaces, never stacks
    return dataclasses.replace(
        cost,
        intra_node_bandwidth=bandwidth,
        inter_node_bandwidth=bandwidth,
        beta2=fit.coef["beta2"],
        name=f"{base} + {label}",
    )
