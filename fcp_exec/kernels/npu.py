"""Ascend NPU kernel on torch_npu's fused attention in the TND (varlen) layout.

`torch_npu.npu_fusion_attention(query, key, value, head_num, input_layout, pse=None,
padding_mask=None, atten_mask=None, scale=1., keep_prob=1., pre_tockens, next_tockens,
inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
gen_mask_parallel=True, sync=False, ...) -> (attention_out, softmax_max, softmax_sum,
softmax_out, seed, offset, numels)` and `npu_fusion_attention_grad(query, key, value, dy,
head_num, input_layout, *, pse, padding_mask, atten_mask, softmax_max, softmax_sum, softmax_in,
attention_in, scale_value, keep_prob, ..., actual_seq_qlen, actual_seq_kvlen, sparse_mode, ...)
-> (dq, dk, dv, dpse[, dsink])` (schemas of Ascend/op-plugin's op_plugin_functions.yaml; later
releases append `softmax_layout`, `sink`, ... with defaults; everything optional goes by
keyword here). With input_layout "TND", q is [T_q, N, D], k/v [T_k, N_kv, D] (GQA native:
head_num is the number of query heads, N a multiple of N_kv) and `actual_seq_qlen/kvlen` are
host lists of cumulative END offsets (`Segments.host_q[1:]`), so one call covers the buffer.

The LSE trap: the forward returns the row max and row sum (each repeated 8 times on the last
axis) instead of an LSE, and in TND they are tensors of shape [T, N, 8] whose memory is laid
out [N, T, 8] ("NTD": CANN's aclnnFlashAttentionVarLenScoreV4 page says the softmax outputs of
aclnnFlashAttentionVarLenScore are labelled TND but laid out NTD; torch_npu's `softmax_layout`
argument, 7.2.0 with CANN 8.3.RC1 on, switches to a real TND layout, unused here so that every
release behaves alike). So lse = max + log(sum) reads the buffer as [N, T, 8]: [H, T_q]
directly. For the backward with the *global* LSE, softmax_max = lse in that same layout and
softmax_sum = 1, so the kernel's exp(s - max) / sum is exp(s - lse) exactly.

Causal: sparse_mode=3 (rightDownCausal) with the compressed 2048x2048 upper-triangular bool
mask, which the docs require for that mode; it applies per segment in TND and, on the square
segments callers use for causal (`fcp_exec.kernels.base`), equals the top-left mask. No
segment ever has a fully masked row, which the varlen mode forbids. Limits (docs): fp16, bf16
and fp32; head dim 1 to 768; at most 256 query heads. Not run on hardware here: a fake torch_npu
with the documented signatures and layouts checks the calls on CPU.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments, check_gqa

__all__ = ["NpuFusionKernel", "load_torch_npu"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_HEAD_DIM = 768
_MAX_HEADS = 256
_MASK_SIDE = 2048  # the compressed causal mask sparse_mode 3 takes
_SOFTMAX_REPEAT = 8  # softmax_max/sum repeat each value 8 times on their last axis


def load_torch_npu() -> ModuleType | None:
    """torch_npu if installed, else None (import of fcp_exec never needs it)."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


class NpuFusionKernel:
    """torch_npu.npu_fusion_attention on one varlen buffer per call (layout TND)."""

    name = "npu-fusion"

    def __init__(self, module: ModuleType) -> None:
        self._npu = module
        self._masks: dict[torch.device, torch.Tensor] = {}

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        check_gqa(self.name, heads, kv_heads)
        if dtype not in _DTYPES:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} runs {[str(d) for d in _DTYPES]}, got {dtype}: cast "
                "q/k/v, or pass kernel=TorchMathKernel() for small blocks"
            )
        if not 0 < head_dim <= _MAX_HEAD_DIM:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} runs head_dim 1 to {_MAX_HEAD_DIM}, got {head_dim}: "
                "pass kernel=TorchMathKernel() for small blocks"
            )
        if heads > _MAX_HEADS:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} runs at most {_MAX_HEADS} query heads per call, got "
                f"{heads}: shard the heads (tensor or Ulysses parallelism) or pass "
                "kernel=TorchMathKernel() for small blocks"
            )

    def _mask(self, causal: bool, device: torch.device) -> tuple[torch.Tensor | None, int]:
        """(atten_mask, sparse_mode): the cached compressed causal mask and mode 3, or none."""
        if not causal:
            return None, 0
        mask = self._masks.get(device)
        if mask is None:
            ones = torch.ones(_MASK_SIDE, _MASK_SIDE, dtype=torch.bool, device=device)
            mask = self._masks[device] = ones.triu(1)
        return mask, 3

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
        mask, mode = self._mask(causal, q.device)
        res = self._npu.npu_fusion_attention(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            q.shape[1],
            "TND",
            atten_mask=mask,
            scale=scale,
            keep_prob=1.0,
            actual_seq_qlen=list(seg.host_q[1:]),
            actual_seq_kvlen=list(seg.host_k[1:]),
            sparse_mode=mode,
        )
        t, h = q.shape[0], q.shape[1]
        # shape [T, N, 8], memory [N, T, 8] (module doc): `view`, never a transpose
        smax = res[1].view(h, t, _SOFTMAX_REPEAT)[..., 0]
        ssum = res[2].view(h, t, _SOFTMAX_REPEAT)[..., 0]
        return res[0], (smax + torch.log(ssum)).float()

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
        mask, mode = self._mask(causal, q.device)
        t, h = q.shape[0], q.shape[1]
        # the forward's layout: memory [N, T, 8] under the shape [T, N, 8]
        smax = lse.float().unsqueeze(-1).expand(h, t, _SOFTMAX_REPEAT).contiguous()
        smax = smax.view(t, h, _SOFTMAX_REPEAT)
        res = self._npu.npu_fusion_attention_grad(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            dout.contiguous(),
            h,
            "TND",
            atten_mask=mask,
            softmax_max=smax,
            softmax_sum=torch.ones_like(smax),
            attention_in=out.contiguous(),
            scale_value=scale,
            keep_prob=1.0,
            actual_seq_qlen=list(seg.host_q[1:]),
            actual_seq_kvlen=list(seg.host_k[1:]),
            sparse_mode=mode,
        )
        return res[0], res[1], res[2]
