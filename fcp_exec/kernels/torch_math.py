"""Device-agnostic kernel in plain torch ops (the CUDA fallback when flash-attn is missing).

It materialises the [H, Sq, Sk] score matrix, so it is for correctness and small blocks, not
for speed: a 16k x 16k block with 32 heads is 32 GiB in fp32. Scores are computed in fp32 (or
fp64 for fp64 inputs) whatever the input dtype, which keeps bf16 results within 2.5e-2.
"""

from __future__ import annotations

import torch

__all__ = ["TorchMathKernel"]


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.einsum("qhd,khd->hqk", q.to(acc), k.to(acc)) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s


class TorchMathKernel:
    """Attention with explicit scores; returns fp32 LSE like the flash kernels."""

    name = "torch-math"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s = _scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1))
        out = torch.einsum("hqk,khd->qhd", p, v.to(p.dtype))
        return out.to(q.dtype), lse.float()

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = _scores(q, k, causal, scale)
        acc = s.dtype
        p = torch.exp(s - lse.to(acc).unsqueeze(-1))
        do, o = dout.to(acc), out.to(acc)
        dv = torch.einsum("hqk,qhd->khd", p, do)
        dp = torch.einsum("qhd,khd->hqk", do, v.to(acc))
        delta = (do * o).sum(-1).transpose(0, 1).unsqueeze(-1)  # [H, Sq, 1]
        ds = p * (dp - delta) * scale
        dq = torch.einsum("hqk,khd->qhd", ds, k.to(acc))
        dk = torch.einsum("hqk,qhd->khd", ds, q.to(acc))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
