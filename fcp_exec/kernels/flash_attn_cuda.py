"""CUDA kernel on flash-attn 2 (>= 2.6, the window_size_left/right signature).

Untested in this repository's CI (no GPU there); `select_kernel` falls back to
`TorchMathKernel` when flash-attn is missing or older. flash-attn's forward returns the fp32
LSE [B, H, S] and its backward accepts an arbitrary (global) out/LSE pair, which is all ring
attention needs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

__all__ = ["FlashAttnKernel", "load_flash_attn"]


def load_flash_attn() -> ModuleType | None:
    """flash_attn.flash_attn_interface when installed with the >= 2.6 signature, else None."""
    try:
        mod = importlib.import_module("flash_attn.flash_attn_interface")
    except ImportError:
        return None
    if not hasattr(mod, "_flash_attn_forward") or not hasattr(mod, "_flash_attn_backward"):
        return None
    return mod


class FlashAttnKernel:
    """flash-attn 2 dense kernel on one block ([S, H, D] -> batch of one)."""

    name = "flash-attn"

    def __init__(self, module: ModuleType) -> None:
        self._fa = module

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse, _, _ = self._fa._flash_attn_forward(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, scale, causal,
            window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
            return_softmax=False,
        )  # fmt: skip
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
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_backward(
            dout.contiguous().unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
            out.contiguous().unsqueeze(0), lse.contiguous().unsqueeze(0),
            dq.unsqueeze(0), dk.unsqueeze(0), dv.unsqueeze(0), 0.0, scale, causal,
            window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
            deterministic=False, rng_state=None,
        )  # fmt: skip
        return dq, dk, dv
