"""`ExecRuntime`: what a training job keeps across micro-batches for attention's hot path.

Two things must outlive a micro-batch and must not live in module globals: the kernel choice
(measured once per block kind, `fcp_exec.kernels.KernelChoice`) and one communication stream
per device (creating a CUDA stream per micro-batch would cost a driver call and defeat the
allocator's per-stream caching). `CPGroupCache` holds one runtime; `cp_context` hands it to the
binding, and `cp_attention` takes the kernel and the ring's stream from it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from fcp_exec.kernels import KernelChoice, Timer

__all__ = ["ExecRuntime", "stream_api"]


def stream_api(device: torch.device) -> ModuleType | None:
    """torch.cuda / torch.npu for devices with streams, None for CPU and meta."""
    if device.type not in ("cuda", "npu"):
        return None
    return getattr(torch, device.type, None)


class ExecRuntime:
    """Per-job state of the attention hot path (one per `CPGroupCache`).

    streams: False keeps ring transfers on the compute stream (NCCL's own stream only);
    timing: record device events around every ring transfer (`RingComm.overlap`), for
    benchmarks; it costs three events per transfer."""

    def __init__(
        self, *, streams: bool = True, timing: bool = False, timer: Timer | None = None
    ) -> None:
        self.kernels = KernelChoice(timer=timer)
        self.streams = streams
        self.timing = timing
        self._streams: dict[torch.device, Any] = {}
        # (members, transport, block shape) whose members agreed on the shape (verify.py)
        self.agreed_shapes: set[tuple[Any, ...]] = set()

    def comm_stream(self, device: torch.device) -> tuple[Any, ModuleType | None]:
        """(the device's communication stream, its stream API), (None, None) without streams."""
        api = stream_api(device) if self.streams else None
        if api is None:
            return None, None
        if device not in self._streams:
            self._streams[device] = api.Stream(device=device)
        return self._streams[device], api
