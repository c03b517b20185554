"""A device-agnostic kernel in plain torch ops: explicit scores, one segment at a time.

It materialises each segment's [H, S_q, S_k] score matrix in fp32 (fp64 for fp64 inputs), so it
is a reference for tests and a last resort for small blocks, never a default: a 16K x 16K
segment with 32 heads is 32 GiB of scores. `check` refuses a micro-batch whose largest segment
would need more than `max_score_bytes` (default 2 GiB) before the first step, naming the size,
so a run cannot silently fall back to it at a size it cannot hold.
"""

from __future__ import annotations

import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments, check_gqa

__all__ = ["TorchMathKernel"]


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.einsum("qhd,khd->hqk", q.to(acc), k.to(acc)) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class TorchMathKernel:
    """Attention with explicit scores over varlen segments; fp32 LSE like the flash kernels."""

    name = "torch-math"

    def __init__(self, *, max_score_bytes: int = 2 << 30) -> None:
        self.max_score_bytes = max_score_bytes

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        check_gqa(self.name, heads, kv_heads)

    def check_size(self, heads: int, max_q: int, max_k: int) -> None:
        """KernelUnsupportedError when one segment's fp32 scores exceed `max_score_bytes`."""
        need = 4 * heads * max_q * max_k
        if need > self.max_score_bytes:
            raise KernelUnsupportedError(
                f"kernel 'torch-math' would hold {need / 2**30:.1f} GiB of scores for a "
                f"{max_q} x {max_k} segment with {heads} heads (limit "
                f"{self.max_score_bytes / 2**30:.1f} GiB): run a flash kernel (CUDA bf16/fp16: "
                "torch's own flash kernels or flash-attn; CPU: 'cpu-flash')"
            )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_size(q.shape[1], seg.max_q, seg.max_k)
        groups = q.shape[1] // k.shape[1]
        out = torch.zeros_like(q)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
        for (a, b), (c, e) in zip(
            zip(seg.host_q, seg.host_q[1:]), zip(seg.host_k, seg.host_k[1:]), strict=True
        ):
            if b == a or e == c:
                continue
            s = _scores(q[a:b], _expand(k[c:e], groups), causal, scale)
            m = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - m.unsqueeze(-1))
            out[a:b] = torch.einsum("hqk,khd->qhd", p, _expand(v[c:e], groups).to(p.dtype)).to(
                q.dtype
            )
            lse[:, a:b] = m.float()
        return out, lse

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.check_size(q.shape[1], seg.max_q, seg.max_k)
        groups = q.shape[1] // k.shape[1]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for (a, b), (c, e) in zip(
            zip(seg.host_q, seg.host_q[1:]), zip(seg.host_k, seg.host_k[1:]), strict=True
        ):
            if b == a or e == c:
                continue
            s = _scores(q[a:b], _expand(k[c:e], groups), causal, scale)
            acc = s.dtype
            p = torch.exp(s - lse[:, a:b].to(acc).unsqueeze(-1))
            do, o = dout[a:b].to(acc), out[a:b].to(acc)
            ks, vs = _expand(k[c:e], groups).to(acc), _expand(v[c:e], groups).to(acc)
            g_v = torch.einsum("hqk,qhd->khd", p, do)
            dp = torch.einsum("qhd,khd->hqk", do, vs)
            delta = (do * o).sum(-1).transpose(0, 1).unsqueeze(-1)  # [H, Sq, 1]
            ds = p * (dp - delta) * scale
            dq[a:b] = torch.einsum("hqk,khd->qhd", ds, ks).to(q.dtype)
            g_k = torch.einsum("hqk,qhd->khd", ds, q[a:b].to(acc))
            n = e - c
            dk[c:e] = g_k.view(n, -1, groups, q.shape[2]).sum(2).to(k.dtype)
            dv[c:e] = g_v.view(n, -1, groups, q.shape[2]).sum(2).to(v.dtype)
        return dq, dk, dv
