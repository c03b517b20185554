"""Timed fwd+bwd of the two compute terms of the cost model, on this machine's CPU or GPU.

* attention: torch's `scaled_dot_product_attention` on one sequence of s tokens, GQA heads
  expanded as in training. On CPU it dispatches to PyTorch's flash attention for CPU, the
  kernel fcp_exec's ring runs at d = 1; on CUDA to SDPA's flash backend, fcp_exec's path when
  flash-attn is not installed. (fcp_data never imports fcp_exec, so the kernel is called here
  directly rather than through the ring.)
* per-token layers: one transformer layer's QKV and output projections, RMSNorms and SwiGLU MLP
  on s tokens, plus the LM head with its cross-entropy (once, not per layer).

Layers are identical, so one layer is timed and multiplied by `shape.layers`. Each point is the
median of `repeats` runs after one warm-up run (the first call of a kernel allocates and, on
CPU, pays ~2x for cold caches). Inputs are fp32 on CPU (what the gloo examples train in).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fcp_data.errors import ConfigError

from .shapes import ModelShape

__all__ = ["ComputePoint", "median_seconds", "time_attention", "time_linear"]


@dataclass(kw_only=True, slots=True, frozen=True)
class ComputePoint:
    """Measured seconds for one micro-batch of one sequence of `seqlen` tokens, all layers."""

    seqlen: int
    attention_s: float
    linear_s: float
    attention_full_s: float | None = None

    @property
    def total_s(self) -> float:
        return self.attention_s + self.linear_s


def median_seconds(fn: Callable[[], object], repeats: int, *, sync: Callable[[], None]) -> float:
    """Median wall time of `fn` over `repeats` runs after one warm-up."""
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync_for(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def time_attention(
    shape: ModelShape,
    seqlen: int,
    *,
    causal: bool = True,
    repeats: int = 3,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> float:
    """Seconds of attention fwd+bwd for one sequence, all layers (one layer timed)."""
    if seqlen < 2 or seqlen % 2:
        raise ConfigError(f"seqlen={seqlen} must be even and >= 2 (one zigzag pair at d = 1)")
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seqlen)
    q = torch.randn(1, shape.heads, seqlen, shape.head_dim, generator=gen).to(dev, dtype)
    k = torch.randn(1, shape.kv_heads, seqlen, shape.head_dim, generator=gen).to(dev, dtype)
    v = torch.randn_like(k)
    grad = torch.randn_like(q)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    groups = shape.heads // shape.kv_heads

    def run() -> None:
        kk = k.repeat_interleave(groups, dim=1) if groups > 1 else k
        vv = v.repeat_interleave(groups, dim=1) if groups > 1 else v
        out = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    return shape.layers * median_seconds(run, repeats, sync=_sync_for(dev))


class _Layer(torch.nn.Module):
    """The per-token work of one decoder layer (attention itself excluded)."""

    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.norm1, self.norm2 = torch.nn.RMSNorm(s.hidden), torch.nn.RMSNorm(s.hidden)
        self.qkv = torch.nn.Linear(s.hidden, q + 2 * kv, bias=False)
        self.out = torch.nn.Linear(q, s.hidden, bias=False)
        self.gate_up = torch.nn.Linear(s.hidden, 2 * s.ffn, bias=False)
        self.down = torch.nn.Linear(s.ffn, s.hidden, bias=False)
        self.q = q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.qkv(self.norm1(x))[:, : self.q]  # stands in for the attention output
        x = x + self.out(h)
        g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(g) * u)


def time_linear(
    shape: ModelShape,
    seqlen: int,
    *,
    repeats: int = 3,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> float:
    """Seconds of the per-token layers fwd+bwd for `seqlen` tokens, all layers + LM head."""
    dev = torch.device(device)
    torch.manual_seed(0)
    layer = _Layer(shape).to(dev, dtype)
    head = torch.nn.Linear(shape.hidden, shape.vocab, bias=False).to(dev, dtype)
    x = torch.randn(seqlen, shape.hidden, device=dev, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, shape.vocab, (seqlen,), device=dev)
    sync = _sync_for(dev)

    def run_layer() -> None:
        layer(x).sum().backward()

    def run_head() -> None:
        torch.nn.functional.cross_entropy(head(x).float(), labels).backward()

    per_layer = median_seconds(run_layer, repeats, sync=sync)
    return shape.layers * per_layer + median_seconds(run_head, repeats, sync=sync)
