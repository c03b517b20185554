"""CPU kernel: PyTorch's flash attention for CPU, which returns the LSE we need.

`aten::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, is_causal, *, attn_mask,
scale) -> (out, lse [B, H, S] fp32)` and its `_backward(grad_out, q, k, v, out, lse, dropout,
is_causal, *, attn_mask, scale)`. Its one trap: a fully masked row comes back with lse 0, not
-inf, and a backward given lse = -inf yields NaN. Ring attention never hands this kernel a row
without a visible key (blocks are real-prefix x real-prefix, see `fcp_exec.layout`), so neither
case can arise here; `lse` of untouched rows stays -inf in the merge buffer only.
"""

from __future__ import annotations

import torch

__all__ = ["CpuFlashKernel"]


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)


def _shd(x: torch.Tensor) -> torch.Tensor:
    return x.squeeze(0).transpose(0, 1)


class CpuFlashKernel:
    """Flash attention for CPU (fp32, bf16, fp16, fp64)."""

    name = "cpu-flash"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, scale=scale
        )
        return _shd(out), lse.squeeze(0)

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
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _bhsd(dout.contiguous()),
            _bhsd(q),
            _bhsd(k),
            _bhsd(v),
            _bhsd(out.contiguous()),
            lse.contiguous().unsqueeze(0),
            0.0,
            causal,
            scale=scale,
        )
        return _shd(dq), _shd(dk), _shd(dv)
