"""`run_profile`: measure this machine, fit the cost model, keep the evidence with it.

The saved JSON is what `CostModel.load` reads ({"cost_model": {...}}) plus a "profile" section
with the raw measurements, the per-point fit errors (the paper's Table 3) and how they were
taken (shape, threads, torch version), so a profile can be audited or refitted later.

What is measured and what is derived:
- alpha1, alpha2, beta1: fitted to attention + per-token layer fwd+bwd times (timing.py, fit.py);
- eta_full: measured full-attention over causal-attention quadratic coefficients, minus 1;
- intra/inter-node bandwidth and beta2: fitted to 2-process ping-pong (p2p.py); beta2 is the
  per-message latency x 3 messages per layer per ring step (forward KV, backward KV + dKV) x
  layers. One host has one kind of link, so inter = intra here;
- with head_parallel: beta3 and a2a_efficiency fitted to all-to-alls among 2 processes
  (a2a.py) at the buffer one member of a u = 2 block holds for one layer of each grid length;
  beta3 = latency x 4 all-to-alls per layer x layers; the head-parallel degrees and bytes come
  from the shape's heads (planner.cost.transports);
- alpha3 (ring bytes per token), bytes_per_token, static_bytes: from the shape, not measured:
  K and V of every layer, 3 passes; 34 activation bytes per hidden unit per layer per token in
  bf16 (Korthikanti et al. 2022), scaled to the element size; 16 bytes per parameter (fp32
  weights, grads and two Adam moments).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fcp_data.errors import ConfigError
from fcp_data.planner import CostModel
from fcp_data.planner.cost.transports import (
    A2A_EXCHANGES_PER_LAYER,
    a2a_bytes_per_token,
    head_parallel_degrees,
    ring_share,
)

from .a2a import A2APoint, measure_a2a
from .fit import Fit, fit_compute, fit_p2p
from .p2p import P2PPoint, measure_p2p
from .shapes import ModelShape
from .timing import ComputePoint, time_attention, time_linear

__all__ = ["Profile", "ProfileConfig", "run_profile"]

DEFAULT_SEQLENS = (256, 512, 1024, 1536, 2048, 3072, 4096)
QUICK_SEQLENS = (256, 512, 1024, 2048)
MESSAGES_PER_LAYER_STEP = 3


@dataclass(kw_only=True, slots=True)
class ProfileConfig:
    """What to measure. `quick()` keeps a run under ~30 s on 2 CPU cores."""

    shape: ModelShape
    seqlens: tuple[int, ...] = DEFAULT_SEQLENS
    repeats: int = 3
    threads: int = 1
    device: str = "cpu"
    full_attention: bool = True
    p2p: bool = True
    p2p_sizes: tuple[int, ...] | None = None
    p2p_repeats: int = 7
    head_parallel: bool = False

    def __post_init__(self) -> None:
        if len(self.seqlens) < 3:
            raise ConfigError(f"seqlens={self.seqlens}: fitting 3 coefficients needs >= 3 lengths")
        bad = [s for s in self.seqlens if s < 2 or s % 2]
        if bad:
            raise ConfigError(f"seqlens {bad} must be even and >= 2 (e.g. 256 512 1024 2048)")
        if self.threads < 1:
            raise ConfigError(f"threads={self.threads} must be >= 1")

    @classmethod
    def quick(cls, shape: ModelShape, **kw: Any) -> ProfileConfig:
        base: dict[str, Any] = dict(
            seqlens=QUICK_SEQLENS, repeats=2, full_attention=False, p2p_repeats=3
        )
        return cls(shape=shape, **{**base, **kw})

    def ring_message_sizes(self) -> tuple[int, ...]:
        """P2P sizes to time: `p2p_sizes`, or the K+V block one ring step of one layer sends
        for each grid length at degree 2 (s/2 tokens x 2 x kv_heads x head_dim x 4 bytes:
        64 KB-1 MB for cpu-small). Loopback gloo is not linear in size (a ~2 ms plateau from
        64 KB to 4 MB was measured here), so the fit is made where the ring actually runs."""
        if self.p2p_sizes is not None:
            return self.p2p_sizes
        per_token = 2 * self.shape.kv_heads * self.shape.head_dim * 4
        return tuple(sorted({s // 2 * per_token for s in self.seqlens}))

    def a2a_message_sizes(self) -> tuple[int, ...]:
        """All-to-all buffers to time: what one member of a u = 2 block holds for one layer of
        each grid length at degree 2 (s/2 tokens x (2H + 2 H_kv) x head_dim x 4 bytes)."""
        per_token = (2 * self.shape.heads + 2 * self.shape.kv_heads) * self.shape.head_dim * 4
        return tuple(sorted({s // 2 * per_token for s in self.seqlens}))

    @property
    def num_steps(self) -> int:
        steps = len(self.seqlens) * (3 if self.full_attention else 2) + int(self.p2p)
        return steps + int(self.head_parallel)


@dataclass(kw_only=True, slots=True)
class Profile:
    """A fitted CostModel and the measurements behind it."""

    cost: CostModel
    compute: Fit
    points: tuple[ComputePoint, ...]
    p2p: Fit | None = None
    p2p_points: tuple[P2PPoint, ...] = ()
    a2a: Fit | None = None
    a2a_points: tuple[A2APoint, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def table(fit: Fit | None) -> list[dict[str, float]] | None:
            if fit is None:
                return None
            return [
                {
                    "x": r.x,
                    "measured_s": r.measured,
                    "predicted_s": r.predicted,
                    "rel_error": r.rel_error,
                }
                for r in fit.rows
            ]

        return {
            "fcp_cost_model": 1,
            "cost_model": asdict(self.cost),
            "profile": {
                **self.meta,
                "compute_fit": {
                    "coef": self.compute.coef,
                    "rows": table(self.compute),
                    "max_abs_error": self.compute.max_abs_error,
                    "mean_abs_error": self.compute.mean_abs_error,
                },
                "p2p_fit": None
                if self.p2p is None
                else {
                    "coef": self.p2p.coef,
                    "rows": table(self.p2p),
                    "max_abs_error": self.p2p.max_abs_error,
                },
                "a2a_fit": None
                if self.a2a is None
                else {
                    "coef": self.a2a.coef,
                    "rows": table(self.a2a),
                    "max_abs_error": self.a2a.max_abs_error,
                },
                "points": [asdict(p) for p in self.points],
            },
        }

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return out


def run_profile(config: ProfileConfig, *, on_step: Callable[[str], None] | None = None) -> Profile:
    """Measure, fit and return a Profile (`Profile.save` writes what CostModel.load reads)."""
    step = on_step or (lambda _msg: None)
    load_before = os.getloadavg()[0]
    shape = config.shape
    old_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    points: list[ComputePoint] = []
    try:
        for s in config.seqlens:
            att = time_attention(shape, s, repeats=config.repeats, device=config.device)
            step(f"attention s={s}")
            full = None
            if config.full_attention:
                full = time_attention(
                    shape, s, causal=False, repeats=config.repeats, device=config.device
                )
                step(f"full attention s={s}")
            lin = time_linear(shape, s, repeats=config.repeats, device=config.device)
            step(f"linear s={s}")
            points.append(
                ComputePoint(seqlen=s, attention_s=att, linear_s=lin, attention_full_s=full)
            )
    finally:
        torch.set_num_threads(old_threads)
    lens = [p.seqlen for p in points]
    compute = fit_compute(lens, [p.total_s for p in points])
    eta = 1.0
    if config.full_attention:
        a_causal = fit_compute(lens, [p.attention_s for p in points]).coef["alpha1"]
        a_full = fit_compute(lens, [p.attention_full_s or 0.0 for p in points]).coef["alpha1"]
        eta = max(0.0, a_full / a_causal - 1.0) if a_causal > 0 else 1.0
    p2p_fit, p2p_points = None, ()
    bandwidth, latency = 5e9, 0.0  # the `cpu` device preset's guess when P2P is not measured
    if config.p2p:
        gpus = config.device.startswith("cuda") and torch.cuda.device_count() >= 2
        p2p_points = tuple(
            measure_p2p(
                config.ring_message_sizes(),
                repeats=config.p2p_repeats,
                backend="nccl" if gpus else "gloo",
            )
        )
        step("p2p")
        p2p_fit = fit_p2p([p.nbytes for p in p2p_points], [p.seconds for p in p2p_points])
        latency = p2p_fit.coef["latency"]
        spb = p2p_fit.coef["seconds_per_byte"]
        bandwidth = 1.0 / spb if spb > 0 else 1e12
    a2a_fit, a2a_points, a2a_terms = None, (), {}
    if config.head_parallel:
        gpus = config.device.startswith("cuda") and torch.cuda.device_count() >= 2
        a2a_points = tuple(
            measure_a2a(
                config.a2a_message_sizes(),
                repeats=config.p2p_repeats,
                backend="nccl" if gpus else "gloo",
            )
        )
        step("all-to-all")
        # a member sends (world - 1)/world of its buffer: fit on the bytes that travel
        sent = [p.nbytes * (p.world - 1) / p.world for p in a2a_points]
        a2a_fit = fit_p2p(sent, [p.seconds for p in a2a_points])
        a2a_spb = a2a_fit.coef["seconds_per_byte"]
        p2p_spb = 1.0 / bandwidth if p2p_fit is None else p2p_fit.coef["seconds_per_byte"]
        # a ratio of two fitted slopes; either fitted as 0 (a degenerate fit, which
        # fit_warnings reports) leaves the all-to-all at the link's bandwidth
        efficiency = p2p_spb / a2a_spb if a2a_spb > 0 and p2p_spb > 0 else 1.0
        a2a_terms = {
            **shape_head_parallel_terms(shape, bytes_per_element=4),
            "beta3": A2A_EXCHANGES_PER_LAYER * shape.layers * a2a_fit.coef["latency"],
            "a2a_efficiency": efficiency,
        }
    elem = torch.finfo(torch.float32).bits // 8
    cost = CostModel(
        alpha1=compute.coef["alpha1"],
        alpha2=compute.coef["alpha2"],
        alpha3=shape.ring_bytes_per_token(elem),
        beta1=compute.coef["beta1"],
        beta2=MESSAGES_PER_LAYER_STEP * shape.layers * latency,
        intra_node_bandwidth=bandwidth,
        inter_node_bandwidth=bandwidth,
        bytes_per_token=34.0 * shape.hidden * shape.layers * elem / 2,
        static_bytes=16.0 * shape.params,
        eta_full=eta,
        name=f"{shape.name}@{config.device} (measured, {config.threads} thread"
        f"{'s' if config.threads > 1 else ''})",
        **a2a_terms,
    )
    meta = {
        "shape": asdict(shape),
        "device": config.device,
        "threads": config.threads,
        "repeats": config.repeats,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "eta_measured": config.full_attention,
        "p2p_measured": config.p2p,
        "cpu_count": os.cpu_count(),
        "p2p_backend": "nccl"
        if config.device.startswith("cuda") and torch.cuda.device_count() >= 2
        else "gloo",
        "loadavg_1min": [load_before, os.getloadavg()[0]],  # busy machine: noisy points
    }
    return Profile(
        cost=cost,
        compute=compute,
        points=tuple(points),
        p2p=p2p_fit,
        p2p_points=p2p_points,
        a2a=a2a_fit,
        a2a_points=a2a_points,
        meta=meta,
    )


def shape_head_parallel_terms(shape: ModelShape, *, bytes_per_element: int) -> dict[str, Any]:
    """The head-parallel fields of a profiled shape (its heads, in the profile's dtype)."""
    us = head_parallel_degrees(shape.heads, shape.kv_heads)
    return {
        "head_parallel": us,
        "a2a_bytes": tuple(
            a2a_bytes_per_token(
                heads=shape.heads,
                kv_heads=shape.kv_heads,
                head_dim=shape.head_dim,
                ulysses=u,
                activation_bytes=bytes_per_element,
                layers=shape.layers,
            )
            for u in us
        ),
        "ring_shares": tuple(ring_share(shape.kv_heads, u) for u in us),
    }
