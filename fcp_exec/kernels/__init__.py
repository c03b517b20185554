"""Varlen attention kernels returning (out, lse), and the choice among them.

Per device type, the kernels that can run there (`kernel_candidates`): cpu -> PyTorch's flash
attention for CPU; cuda -> torch's own varlen flash kernels (no extra package), flash-attn 2
(2.6-2.8) and FlashAttention-3 (Hopper) when installed; npu -> torch_npu's fused attention in
the TND varlen layout; meta -> the CUDA path's own torch kernel (shape-only runs that prove the
hot path never reads the device). `TorchMathKernel` (explicit scores) is never chosen: pass it
as `kernel=` for small fp32 blocks.

Where two or more can run a block, `KernelChoice` times each once on a varlen buffer of the
model's own heads, head dim and dtype and keeps the fastest ("pick by measurement, never by
name alone"); the line it logs (logger `fcp_exec.kernels`, also kept in `KernelChoice.report`)
states which kernel runs and why. A block no kernel can run (fp32 on CUDA, a head dim or GQA
ratio out of range, a missing package) raises `KernelUnsupportedError` before the first step,
naming each kernel's reason and the alternative; nothing falls back silently to explicit
scores. Nothing is imported or probed at import time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from fcp_exec.kernels.base import AttentionKernel, KernelUnsupportedError, Segments
from fcp_exec.kernels.cpu import CpuFlashKernel
from fcp_exec.kernels.flash_attn_cuda import (
    FlashAttn3Kernel,
    FlashAttnKernel,
    load_flash_attn,
    load_flash_attn3,
)
from fcp_exec.kernels.npu import NpuFusionKernel, load_torch_npu
from fcp_exec.kernels.torch_flash import TorchFlashKernel, torch_flash_available
from fcp_exec.kernels.torch_math import TorchMathKernel

__all__ = [
    "AttentionKernel",
    "CpuFlashKernel",
    "FlashAttn3Kernel",
    "FlashAttnKernel",
    "KernelChoice",
    "KernelUnsupportedError",
    "NpuFusionKernel",
    "Segments",
    "Timer",
    "TorchFlashKernel",
    "TorchMathKernel",
    "kernel_candidates",
    "measure_kernel",
    "select_kernel",
]

_log = logging.getLogger(__name__)

# (kernel, device, dtype, head_dim, heads, kv_heads) -> seconds of one fwd + bwd
Timer = Callable[[AttentionKernel, torch.device, torch.dtype, int, int, int], float]


def _device_kind(device: torch.device | str) -> str:
    # a string, not torch.device: "npu" is only a known device type once torch_npu is loaded
    return device.split(":")[0] if isinstance(device, str) else device.type


def kernel_candidates(device: torch.device | str) -> tuple[list[AttentionKernel], list[str]]:
    """(kernels that can run on this device, fastest-first guess; why the others cannot)."""
    kind = _device_kind(device)
    if kind == "cpu":
        return [CpuFlashKernel()], []
    if kind == "meta":
        return [TorchFlashKernel()], []
    if kind == "npu":
        npu = load_torch_npu()
        if npu is None:
            return [], [
                "npu-fusion: torch_npu cannot be imported; install torch_npu matching "
                "your CANN toolkit (pip install torch_npu)"
            ]
        return [NpuFusionKernel(npu)], []
    if kind != "cuda":
        raise KernelUnsupportedError(
            f"no attention kernel for device type {kind!r}; supported: 'cpu', 'cuda', 'npu' "
            "(and 'meta' for shape-only runs)"
        )
    found: list[AttentionKernel] = []
    why: list[str] = []
    cuda = torch.cuda.is_available()
    if not cuda:
        why.append("torch-flash: torch.cuda.is_available() is False on this machine")
    else:
        dev = torch.device(device)
        reason = torch_flash_available(dev if dev.index is not None else torch.device("cuda", 0))
        if reason is None:
            found.append(TorchFlashKernel())
        else:
            why.append(f"torch-flash: {reason}")
    fa3, fa2 = load_flash_attn3(), load_flash_attn()
    if fa3 is None:
        why.append("flash-attn-3: flash_attn_interface (FlashAttention-3) is not installed")
    elif cuda:
        found.append(FlashAttn3Kernel(fa3))
    if fa2 is None:
        why.append("flash-attn: flash-attn >= 2.6 is not installed (2.5's varlen LSE is padded)")
    elif cuda:
        found.append(FlashAttnKernel(fa2))
    return found, why


def _synthetic(
    device: torch.device, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    t = 4096
    q, dout = (torch.randn(t, heads, head_dim, generator=g).to(device, dtype) for _ in range(2))
    k, v = (torch.randn(t, kv_heads, head_dim, generator=g).to(device, dtype) for _ in range(2))
    return q, k, v, dout


def measure_kernel(
    kernel: AttentionKernel,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    heads: int,
    kv_heads: int,
) -> float:
    """Median seconds of one causal fwd + bwd over 4 sequences of 1024 tokens (3 runs after
    a warm-up, the device synchronised around each): the kind of block a ring step runs."""
    q, k, v, dout = _synthetic(device, dtype, head_dim, heads, kv_heads)
    seg = Segments.of([0, 1024, 2048, 3072, 4096], [0, 1024, 2048, 3072, 4096], device)
    scale = head_dim**-0.5
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    runs = []
    for i in range(4):
        sync()
        start = time.perf_counter()
        out, lse = kernel.forward(q, k, v, seg, causal=True, scale=scale)
        kernel.backward(dout, q, k, v, out, lse, seg, causal=True, scale=scale)
        sync()
        if i:
            runs.append(time.perf_counter() - start)
    return sorted(runs)[len(runs) // 2]


def select_kernel(
    device: torch.device | str,
    *,
    dtype: torch.dtype | None = None,
    head_dim: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    timer: Timer | None = None,
) -> AttentionKernel:
    """The kernel for these blocks on `device` (module doc): KernelUnsupportedError when none
    can run them; the fastest by measurement when several can. Without the block's shape the
    device's first candidate is returned unchecked."""
    return _choose(device, dtype, head_dim, heads, kv_heads, timer)[0]


def _choose(
    device: torch.device | str,
    dtype: torch.dtype | None,
    head_dim: int | None,
    heads: int | None,
    kv_heads: int | None,
    timer: Timer | None,
) -> tuple[AttentionKernel, str]:
    found, why = kernel_candidates(device)
    shape = (dtype, head_dim, heads, kv_heads)
    ok: list[AttentionKernel] = []
    for kern in found:
        if None in shape:
            ok.append(kern)
            continue
        try:
            kern.check(dtype=dtype, head_dim=head_dim, heads=heads, kv_heads=kv_heads)  # type: ignore[arg-type]
        except KernelUnsupportedError as e:
            why.append(str(e))
        else:
            ok.append(kern)
    what = f"{dtype} H={heads} H_kv={kv_heads} D={head_dim} on {device}"
    if not ok:
        raise KernelUnsupportedError(
            f"no attention kernel can run {what}: "
            + "; ".join(why)
            + ". Pass kernel=fcp_exec.kernels.TorchMathKernel() only for small blocks "
            "(explicit scores, O(S^2) memory)"
        )
    if len(ok) == 1 or None in shape:
        return ok[0], f"attention kernel {ok[0].name} for {what} (the only one that runs here)"
    measure = timer or measure_kernel
    dev = torch.device(device)
    times = {k.name: measure(k, dev, dtype, head_dim, heads, kv_heads) for k in ok}  # type: ignore[arg-type]
    best = min(ok, key=lambda k: times[k.name])
    ms = ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in sorted(times.items(), key=lambda x: x[1]))
    return best, f"attention kernel {best.name} for {what}, measured fastest ({ms}; fwd+bwd)"


class KernelChoice:
    """The kernel of each block kind (device, dtype, head dim, heads), chosen once and kept.

    A `CPGroupCache` holds one for the whole job (the binding hands it to every attention call),
    so the measurement of `select_kernel` runs once per block kind, not per micro-batch.
    `report` keeps the line stated for each choice."""

    def __init__(self, *, timer: Timer | None = None) -> None:
        self._timer = timer
        self._chosen: dict[tuple[object, ...], AttentionKernel] = {}
        self.report: list[str] = []

    def get(
        self, device: torch.device, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int
    ) -> AttentionKernel:
        key = (device, dtype, head_dim, heads, kv_heads)
        if key not in self._chosen:
            kern, line = _choose(device, dtype, head_dim, heads, kv_heads, self._timer)
            _log.info(line)
            self.report.append(line)
            self._chosen[key] = kern
        return self._chosen[key]
