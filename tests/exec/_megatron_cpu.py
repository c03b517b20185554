"""Run megatron-core's DDP and DistributedOptimizer on CPU tensors: a test-only device shim.

megatron-core 0.16.1 allocates its DDP grad/param buffers and a few optimizer scalars on the
GPU unconditionally (`torch.cuda.current_device()`, `device="cuda"`), and the distributed
optimizer sorts parameters by the CUDA type name (`param.type() == "torch.cuda.FloatTensor"`,
anything else raises TypeError). Nothing else in those code paths needs a GPU: the reductions
are ordinary `torch.distributed` collectives, which gloo runs on CPU tensors. So this shim
mocks only what this machine lacks, a GPU, and only inside `megatron_cuda_on_cpu()`:

1. `torch.cuda.current_device()` returns 0 (it raises without a CUDA device);
2. a tensor factory (`torch.zeros`, `torch.empty`, `torch.tensor`, ...) asked for a CUDA
   device (`"cuda"`, `"cuda:N"`, an int, `torch.device("cuda", N)`) allocates on CPU instead;
3. `Tensor.type()` without arguments on a CPU tensor answers the CUDA type name
   (`torch.FloatTensor` -> `torch.cuda.FloatTensor`), so the distributed optimizer files an
   fp32 CPU parameter where it files an fp32 GPU one.

Points 2 and 3 are one `torch.overrides.TorchFunctionMode`, active only inside the context
(nothing is patched at import, nothing global outlives the `with`). Enter it around megatron's
constructors and `optimizer.step()`; the forward and backward passes, DDP's backward hooks
and its grad collectives need no shim and run outside it. Where CUDA is available the
context does nothing, so the same test code runs unchanged on a GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["megatron_cuda_on_cpu"]


def _is_cuda(device: Any) -> bool:
    if device is None or isinstance(device, str) and device == "cpu":
        return False
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class _CudaOnCpu(TorchFunctionMode):
    """Factories asked for CUDA allocate on CPU; `Tensor.type()` reports CUDA type names."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda."):
                return "torch.cuda." + name[len("torch.") :]
            return name
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


@contextmanager
def megatron_cuda_on_cpu() -> Iterator[None]:
    """Inside: megatron-core's CUDA allocations land on CPU (no-op when CUDA is available)."""
    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(torch.cuda, "current_device", return_value=0), _CudaOnCpu():
        yield
