"""One shared buffer per micro-batch for the hand-off from DataLoader workers.

torch moves every tensor a worker returns through its own shared-memory segment (a file
descriptor sent over a socket, a mapping on each side): a text micro-batch has 8 tensors
(tokens, labels, loss mask, positions, four cu_seqlens), so a 4-wave batch costs 32 segments.
`one_buffer` copies a micro-batch's top-level tensors into one byte buffer (a few hundred KB of
memcpy) and returns an object that pickles as that buffer plus a layout: the receiving process
rebuilds the micro-batch with views of the one buffer, so one segment crosses per micro-batch.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import torch

__all__ = ["OneBuffer", "one_buffer"]

ALIGN = 64  # bytes: every view starts on a cache line, so any dtype's alignment holds

Layout = list[tuple[str, torch.dtype, tuple[int, ...], int]]  # name, dtype, shape, byte offset


class OneBuffer:
    """A micro-batch in transit: `buf` (uint8), where each tensor lies in it, and the rest."""

    __slots__ = ("buf", "layout", "rest")

    def __init__(self, buf: torch.Tensor, layout: Layout, rest: Any) -> None:
        self.buf, self.layout, self.rest = buf, layout, rest

    def unpack(self) -> Any:
        """The micro-batch, its tensors views of `buf`."""
        changes = {}
        for name, dtype, shape, start in self.layout:
            n = dtype.itemsize * int(torch.Size(shape).numel())
            changes[name] = self.buf[start : start + n].view(dtype).view(shape)
        return replace(self.rest, **changes)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _unpack, (self.buf, self.layout, self.rest)


def _unpack(buf: torch.Tensor, layout: Layout, rest: Any) -> Any:
    return OneBuffer(buf, layout, rest).unpack()


def one_buffer(mb: Any) -> Any:
    """`mb` (a dataclass) ready to cross a process boundary with its top-level CPU tensors in
    one buffer; unpickling yields the same dataclass with equal values, dtypes and shapes."""
    names = [
        f.name
        for f in fields(mb)
        if isinstance(getattr(mb, f.name), torch.Tensor)
        and getattr(mb, f.name).device.type == "cpu"
    ]
    if len(names) < 2:
        return mb
    tensors = [getattr(mb, n).contiguous() for n in names]
    layout: Layout = []
    total = 0
    for n, t in zip(names, tensors):
        layout.append((n, t.dtype, tuple(t.shape), total))
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    buf = torch.empty(total, dtype=torch.uint8)
    for (_, dtype, shape, start), t in zip(layout, tensors):
        nbytes = t.numel() * t.element_size()
        buf[start : start + nbytes].view(dtype).view(shape).copy_(t)
    return OneBuffer(buf, layout, replace(mb, **dict.fromkeys(names)))
