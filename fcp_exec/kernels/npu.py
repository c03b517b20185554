"""Ascend NPU kernel on torch_npu's fused attention, imported only when an NPU block runs.

`npu_fusion_attention` returns the row max and row sum (each repeated 8 times on the last
axis) instead of an LSE: lse = max + log(sum). For the backward with the *global* LSE we hand
it softmax_max = lse and softmax_sum = 1, so its exp(s - max) / sum is exp(s - lse) exactly.
Causal blocks are square (diagonal step), for which sparse_mode=3 with the 2048x2048 upper
triangle mask is the top-left causal mask. Not exercised on hardware here; the CPU test suite
checks the guard and the call contract with a mocked torch_npu.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

__all__ = ["NpuFusionKernel", "load_torch_npu"]


def load_torch_npu() -> ModuleType | None:
    """torch_npu if installed, else None (import of fcp_exec never needs it)."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


class NpuFusionKernel:
    """torch_npu.npu_fusion_attention on one block, layout BSND with B = 1."""

    name = "npu-fusion"

    def __init__(self, module: ModuleType) -> None:
        self._npu = module

    def _mask(self, causal: bool, device: torch.device) -> tuple[torch.Tensor | None, int]:
        if not causal:
            return None, 0
        return torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1), 3

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask, mode = self._mask(causal, q.device)
        res = self._npu.npu_fusion_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), q.shape[1], "BSND",
            atten_mask=mask, scale=scale, keep_prob=1.0, sparse_mode=mode,
        )  # fmt: skip
        out, smax, ssum = res[0], res[1], res[2]
        lse = (smax[..., 0] + torch.log(ssum[..., 0])).float()  # [1, H, S]
        return out.squeeze(0), lse.squeeze(0)

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
        mask, mode = self._mask(causal, q.device)
        smax = lse.unsqueeze(0).unsqueeze(-1).expand(1, *lse.shape, 8).contiguous()
        ssum = torch.ones_like(smax)
        res = self._npu.npu_fusion_attention_grad(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), dout.unsqueeze(0), q.shape[1],
            "BSND", atten_mask=mask, softmax_max=smax, softmax_sum=ssum,
            attention_in=out.unsqueeze(0), scale_value=scale, keep_prob=1.0, sparse_mode=mode,
        )  # fmt: skip
        return res[0].squeeze(0), res[1].squeeze(0), res[2].squeeze(0)
