"""megatron-core's DDP and DistributedOptimizer on CPU: `cuda_on_cpu` plus CUDA type names.

megatron-core 0.16.1 allocates the DDP grad/param buffers and a few optimizer scalars on the
GPU unconditionally (`torch.cuda.current_device()` in `_ParamAndGradBuffer`, `device="cuda"`
in `MixedPrecisionOptimizer.__init__` and `get_grad_norm_fp32`, which `ChainedOptimizer.step`
calls every step), and the distributed optimizer files each parameter by its CUDA type name
(`model_param.type() == "torch.cuda.FloatTensor"`; anything else raises "Wrapped parameters
must be one of torch.cuda.FloatTensor, ..."). Nothing else on that path needs a GPU: the
reduce-scatters and all-gathers are ordinary `torch.distributed` collectives that gloo runs on
CPU tensors. So this mocks only what this machine lacks, a GPU, inside
`megatron_cuda_on_cpu()`:

1. `fcp_exec.megatron_cpu.cuda_on_cpu()`: `torch.cuda.current_device()` answers "cpu" and a
   tensor factory asked for a CUDA device allocates on CPU (a torch function mode);
2. `Tensor.type()` without arguments on a CPU tensor answers the CUDA type name
   (`torch.FloatTensor` -> `torch.cuda.FloatTensor`), so the distributed optimizer files an
   fp32 CPU parameter where it files an fp32 GPU one. `Tensor.type(dtype)` (a conversion) is
   untouched.

Each part alone is not enough (measured on one process): with none, DDP's constructor raises
"Found no NVIDIA driver"; with 1 only, `get_megatron_optimizer` raises the TypeError above.
Enter the context around megatron's constructors and `optimizer.step()` only; the forward and
backward passes, DDP's backward hooks and its overlapped collectives run outside it. Where CUDA
is available it does nothing, so the same test runs unchanged on a GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fcp_exec.megatron_cpu import cuda_on_cpu

__all__ = ["megatron_cuda_on_cpu"]


class _CudaTypeNames(TorchFunctionMode):
    """`Tensor.type()` of a CPU tensor reports the CUDA type name; everything else passes."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name: str = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda."):
                return "torch.cuda." + name.removeprefix("torch.")
            return name
        return func(*args, **kwargs)


@contextmanager
def megatron_cuda_on_cpu() -> Iterator[None]:
    """Inside: megatron-core's DDP / optimizer CUDA allocations land on CPU (no-op with CUDA)."""
    if torch.cuda.is_available():
        yield
        return
    with cuda_on_cpu(), _CudaTypeNames():
        yield
