"""CPU kernel: PyTorch's flash attention for CPU over varlen segments (GQA native).

`aten::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, is_causal, *, attn_mask,
scale) -> (out, lse [B, H, S] fp32)` and its `_backward(grad_out, q, k, v, out, lse, dropout,
is_causal, *, attn_mask, scale)` take H_kv-headed K/V as they are (checked against expanded
heads: identical to the last bit). The op is dense, so this kernel loops over the segments on
the host offsets `Segments` carries: on CPU the loop is the kernel's own work, not a host
overhead in front of a device (the CUDA and NPU kernels make one call per varlen buffer). Its
one trap, a fully masked row coming back with lse 0, cannot arise: the schedule never builds a
segment with queries and no keys (`fcp_exec.kernels.base`).
"""

from __future__ import annotations

import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments, check_gqa

__all__ = ["CpuFlashKernel"]

_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)


def _shd(x: torch.Tensor) -> torch.Tensor:
    return x.squeeze(0).transpose(0, 1)


def _pairs(seg: Segments) -> list[tuple[int, int, int, int]]:
    hq, hk = seg.host_q, seg.host_k
    return [(hq[i], hq[i + 1], hk[i], hk[i + 1]) for i in range(seg.count) if hq[i + 1] > hq[i]]


class CpuFlashKernel:
    """Flash attention for CPU (fp32, fp64, bf16, fp16)."""

    name = "cpu-flash"

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        check_gqa(self.name, heads, kv_heads)
        if dtype not in _DTYPES:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} runs {[str(d) for d in _DTYPES]}, got {dtype}: cast q/k/v"
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
        pairs = _pairs(seg)
        if len(pairs) == 1 and pairs[0] == (0, q.shape[0], 0, k.shape[0]):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, scale=scale
            )
            return _shd(out), lse.squeeze(0)
        out = torch.zeros_like(q)
        lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)
        for a, b, c, e in pairs:
            o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _bhsd(q[a:b]), _bhsd(k[c:e]), _bhsd(v[c:e]), 0.0, causal, scale=scale
            )
            out[a:b] = _shd(o)
            lse[:, a:b] = m.squeeze(0)
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
        pairs = _pairs(seg)
        if len(pairs) == 1 and pairs[0] == (0, q.shape[0], 0, k.shape[0]):
            dq, dk, dv = self._one(dout, q, k, v, out, lse, causal, scale)
            return _shd(dq), _shd(dk), _shd(dv)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for a, b, c, e in pairs:
            gq, gk, gv = self._one(
                dout[a:b], q[a:b], k[c:e], v[c:e], out[a:b], lse[:, a:b], causal, scale
            )
            dq[a:b], dk[c:e], dv[c:e] = _shd(gq), _shd(gk), _shd(gv)
        return dq, dk, dv

    @staticmethod
    def _one(
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
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
