"""Run megatron-core's CUDA-only code paths on a machine without a GPU (CPU/gloo runs and tests).

megatron-core 0.16's pipeline schedules, P2P layer and sequence-parallel mappings allocate with
`device="cuda"` or `torch.cuda.current_device()` and call `torch.cuda.synchronize()` even when
every tensor they move is on the CPU. Inside `cuda_on_cpu()` (a no-op when CUDA is available)
a torch function mode rewrites a CUDA `device=` of tensor factories to "cpu", and
`current_device` / `synchronize` / `current_stream` answer as a one-device CPU machine would
(megatron-core 0.19's DDP asks the current stream to wait for CUDA-graph events before every
gradient reduction; on the CPU there is one stream and nothing to wait for), and megatron's
model-parallel RNG tracker (CUDA generator states, forked around dropout) forks nothing, so
use it with every dropout at 0 (fcp's ring attention has none). With
`cuda_type_names=True` (megatron's DDP and distributed optimizer), `Tensor.type()` without
arguments on a CPU tensor also answers the CUDA type name ("torch.cuda.FloatTensor"): the
distributed optimizer files each parameter by that name and refuses any other ("Wrapped
parameters must be one of torch.cuda.FloatTensor, ..."); `Tensor.type(dtype)` conversions are
untouched. Enter that variant around megatron's DDP / optimizer constructors and
`optimizer.step()` only. Nothing else is changed:
every computation and collective is the real one, on gloo. Like `keep_rotary_on_cpu`, this is
for CPU runs only; GPU runs never enter it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["cuda_on_cpu"]


def _is_cuda(device: object) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare ordinal means a CUDA device
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaFactoriesOnCpu(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


class _CpuStream:
    """The one stream of a CPU: work is done when issued, so waits return at once."""

    def wait_event(self, event: object) -> None:
        return None

    def wait_stream(self, stream: object) -> None:
        return None

    def synchronize(self) -> None:
        return None


class _CudaTypeNames(TorchFunctionMode):
    """`Tensor.type()` of a CPU tensor reports the CUDA type name; everything else passes."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name: str = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda."):
                return "torch.cuda." + name.removeprefix("torch.")
            return name
        return func(*args, **kwargs)


@contextmanager
def cuda_on_cpu(*, cuda_type_names: bool = False) -> Iterator[None]:
    """Run megatron's CUDA-only allocations on the CPU (a no-op where CUDA exists).

    Process-wide while it is entered (it patches `torch.cuda` functions): enter it once around
    the training loop, not from several threads.
    """
    if torch.cuda.is_available():
        yield
        return
    from megatron.core.tensor_parallel import random as mp_random

    tracker = mp_random.get_cuda_rng_tracker()  # the one instance every module asks for
    if "fork" in vars(tracker):  # nested in an outer cuda_on_cpu: only add the type names
        with _CudaTypeNames() if cuda_type_names else nullcontext():
            yield
        return
    saved = torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.current_stream
    cpu_stream = _CpuStream()
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # also in backward
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *a, **k: cpu_stream  # type: ignore[assignment]
    tracker.fork = lambda *a, **k: nullcontext()  # the instance's, not the class's
    try:
        with _CudaFactoriesOnCpu(), _CudaTypeNames() if cuda_type_names else nullcontext():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.current_stream = saved
        del tracker.fork
