"""CUDA default: torch's own varlen flash kernels (no extra package), GQA native.

`aten::_flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
is_causal, return_debug_mask, *, scale) -> (out, logsumexp [H, T_q] fp32, rng_state, unused,
debug)` and `_flash_attention_backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k,
max_q, max_k, dropout_p, is_causal, rng_state, unused, *, scale) -> (dq, dk, dv)` are the ops
beneath `torch.nn.attention.varlen.varlen_attn` (torch 2.10+); they exist with these positions
since torch 2.4, take H_kv-headed K/V, and accept a backward from any (out, lse) pair, which is
what ring attention needs and what `varlen_attn`'s own autograd does not offer. With dropout 0
the rng tensors are unused; torch's own backward passes zeros(2) and an empty tensor, as here.

Both ops also have `meta` kernels, so the whole CUDA call path (shapes, dtypes, the absence of
any host read) is exercised on this CPU machine with `meta` tensors; `select_kernel("meta")`
returns this kernel for that purpose.

Limits of the flash kernel (checked before the first step by `check`): fp16/bf16 only, head
dim a multiple of 8 up to 256, an NVIDIA GPU of compute capability 8.0 or newer (sm80+).
"""

from __future__ import annotations

import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments, check_gqa

__all__ = ["TorchFlashKernel", "torch_flash_available"]

_HALF = (torch.float16, torch.bfloat16)


def torch_flash_available(device: torch.device) -> str | None:
    """None when torch's flash kernels can run on `device`, else why not (one line)."""
    if device.type == "meta":
        return None
    if device.type != "cuda":
        return f"torch's flash kernels run on CUDA, not {device.type!r}"
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return f"torch {torch.__version__} has no aten::_flash_attention_forward"
    if not torch.backends.cuda.is_flash_attention_available():
        return f"torch {torch.__version__} was built without flash attention"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"flash attention needs compute capability 8.0+, this GPU has {major}.{minor}"
    return None


class TorchFlashKernel:
    """torch's aten flash attention on one varlen buffer per call."""

    name = "torch-flash"

    def __init__(self) -> None:
        self._rng: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        check_gqa(self.name, heads, kv_heads)
        if dtype not in _HALF:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} runs fp16/bf16, got {dtype}: train in bf16 (autocast or "
                "params_dtype=torch.bfloat16), or pass kernel=TorchMathKernel() for small fp32 "
                "blocks (explicit scores, O(S^2) memory)"
            )
        if head_dim % 8 or head_dim > 256:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} runs head_dim a multiple of 8 up to 256, got {head_dim}: "
                "pad the head dim or pass kernel=TorchMathKernel() for small blocks"
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
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, seg.cu_q, seg.cu_k, seg.max_q, seg.max_k, 0.0, causal, False, scale=scale
        )
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
        if q.device not in self._rng:  # unused with dropout 0; made once, not per call
            self._rng[q.device] = (
                torch.zeros(2, dtype=torch.uint64, device=q.device),
                torch.empty(0, device=q.device),
            )
        rng, unused = self._rng[q.device]
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(),
            q,
            k,
            v,
            out.contiguous(),
            lse.contiguous(),
            seg.cu_q,
            seg.cu_k,
            seg.max_q,
            seg.max_k,
            0.0,
            causal,
            rng,
            unused,
            scale=scale,
        )
        return dq, dk, dv
