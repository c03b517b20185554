"""The time budget, the part result shape, device facts and a synchronising timer.

The suite promises to finish inside `--time-budget-s`: each part asks the budget for its slice
before it starts and records a skip (with how much time was left) rather than overrun.
"""

from __future__ import annotations

import importlib
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Budget", "device_info", "failed", "median_time", "skipped", "sync_for"]


@dataclass(kw_only=True, slots=True)
class Budget:
    """Wall-clock budget of the whole suite (monotonic clock, seconds)."""

    total_s: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return max(0.0, self.total_s - (time.monotonic() - self.start))

    def slice(self, fraction: float) -> float:
        """Seconds a part may use: `fraction` of what is left (later parts get the rest)."""
        return self.left() * fraction

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason, **extra}


def failed(exc: BaseException, **extra: Any) -> dict[str, Any]:
    return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", **extra}


def sync_for(device: torch.device) -> Callable[[], None]:
    """A function that waits for `device`'s queued work (a no-op on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "npu":
        mod = getattr(torch, "npu", None)
        if mod is not None:
            return mod.synchronize
    return lambda: None


def median_time(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Median seconds of `fn` over `repeats` runs after one warm-up run."""
    fn()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return str(getattr(mod, "__version__", "unknown"))


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def device_info(kind: str) -> dict[str, Any]:
    """What the figures were measured on: device name, count, memory, library versions."""
    info: dict[str, Any] = {
        "kind": kind,
        "host": platform.node(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "flash_attn": _version("flash_attn"),
        "torch_npu": None,
        "count": 0,
        "name": platform.processor() or platform.machine(),
        # TF32 matmuls would make fp32 exactness ~1e-3, not ~1e-7: say which was in force
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    if kind == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            count=torch.cuda.device_count(),
            name=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            cudnn=torch.backends.cudnn.version(),
            nccl=_nccl_version(),
        )
    elif kind == "npu":
        info["torch_npu"] = _version("torch_npu")
        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            info.update(count=npu.device_count(), name=npu.get_device_name(0))
    else:
        info["count"] = 1
        info["threads"] = torch.get_num_threads()
    return info
