"""The local attention kernel contract shared by every device.

Ring attention needs two things a stock attention call does not give: the log-sum-exp of every
row (to merge block results exactly) and a backward that takes the *global* output and LSE (so
that block gradients sum to the exact gradient). Every kernel here works on one sequence block
in [S, H, D] layout with K/V already expanded to H heads.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["AttentionKernel"]


class AttentionKernel(Protocol):
    """forward -> (out [Sq, H, D] in q's dtype, lse [H, Sq] fp32); backward -> (dq, dk, dv)."""

    name: str

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
