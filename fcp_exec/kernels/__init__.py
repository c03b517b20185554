"""Local attention kernels returning (out, lse), chosen by device type.

cpu -> PyTorch's flash attention for CPU; cuda -> flash-attn 2 when installed, else the plain
torch path; npu -> torch_npu fused attention (imported lazily). Nothing is imported or probed
at import time: `select_kernel` does the probing when a device is first seen.
"""

from __future__ import annotations

import torch

from fcp_exec.kernels.base import AttentionKernel
from fcp_exec.kernels.cpu import CpuFlashKernel
from fcp_exec.kernels.flash_attn_cuda import FlashAttnKernel, load_flash_attn
from fcp_exec.kernels.npu import NpuFusionKernel, load_torch_npu
from fcp_exec.kernels.torch_math import TorchMathKernel

__all__ = [
    "AttentionKernel",
    "CpuFlashKernel",
    "FlashAttnKernel",
    "NpuFusionKernel",
    "TorchMathKernel",
    "select_kernel",
]


def select_kernel(device: torch.device | str) -> AttentionKernel:
    """The best available kernel for `device` (see module doc); raises for unknown devices."""
    # a string, not torch.device: "npu" is only a known device type once torch_npu is loaded
    kind = device.split(":")[0] if isinstance(device, str) else device.type
    if kind == "cpu":
        return CpuFlashKernel()
    if kind == "cuda":
        fa = load_flash_attn()
        return FlashAttnKernel(fa) if fa is not None else TorchMathKernel()
    if kind == "npu":
        npu = load_torch_npu()
        if npu is None:
            raise RuntimeError(
                "tensors are on an 'npu' device but torch_npu cannot be imported; install "
                "torch_npu matching your CANN toolkit (pip install torch_npu)"
            )
        return NpuFusionKernel(npu)
    raise ValueError(
        f"no attention kernel for device type {kind!r}; supported: 'cpu', 'cuda', 'npu'"
    )
