"""Ring transports for the suite: host-staged gloo for ranks sharing a GPU, and no-op rings.

NCCL refuses a communicator with two ranks on one device ("Duplicate GPU detected"), and gloo
sends host memory only. So when more ranks than GPUs run the exactness check, every transfer is
staged: the block is copied to the host, sent with gloo, and copied back onto the device when
`wait` completes it. Ring attention sees a `RingComm` and runs unchanged on device tensors; only
the wire differs, which does not change a single value (the same bytes arrive).

`LocalComm` times the compute half of a ring apart from its transfers (the overlap figure): it
hands back the rank's own block without sending (the same kernels on the same shapes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from fcp_exec.ring import RingComm

__all__ = ["LocalComm", "StagedRingComm"]


class StagedRingComm(RingComm):
    """A RingComm whose transfers go through host memory over gloo."""

    def __init__(self, ring: Sequence[int]) -> None:
        super().__init__(ring)
        self._staged: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def exchange(
        self, send: torch.Tensor, *, tag: int, recv: torch.Tensor | None = None
    ) -> torch.Tensor:
        host = send.detach().to("cpu").contiguous()
        host_recv = torch.empty_like(host)
        works = [
            dist.isend(host, self.next, tag=tag),
            dist.irecv(host_recv, self.prev, tag=tag),
        ]
        out = torch.empty_like(send) if recv is None else recv
        self.sent_bytes += host.numel() * host.element_size()
        self._pending.setdefault(tag, []).extend(works)
        self._keep.setdefault(tag, []).append(host)
        self._staged.setdefault(tag, []).append((host_recv, out))
        return out

    def wait(self, tag: int) -> None:
        super().wait(tag)
        for host_recv, out in self._staged.pop(tag, []):
            out.copy_(host_recv)


class LocalComm(RingComm):
    """A ring of `size` members in which nothing is sent: `exchange` returns the own block.

    Values are wrong beyond step 0 (every step sees this rank's KV) but the kernels, shapes and
    merges are exactly those of the real ring, so its time is the ring's compute alone.
    """

    def __init__(self, ring: Sequence[int]) -> None:
        super().__init__([dist.get_rank()])  # validates and sets rank; then pretend to be d
        self.ring = tuple(ring)
        self.index = self.ring.index(self.rank)
        self.size = len(self.ring)

    def exchange(
        self, send: torch.Tensor, *, tag: int, recv: torch.Tensor | None = None
    ) -> torch.Tensor:
        return send

    def wait(self, tag: int) -> None:
        return None
