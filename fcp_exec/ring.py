"""Point-to-point ring exchange between the members of one CP group, on global ranks.

Rings change every micro-batch, so creating a process group per ring just for P2P would cost a
collective `new_group` per switch; instead sends and receives address global ranks on the
default group (works on gloo for arbitrary, changing rings; NCCL/HCCL get
`batch_isend_irecv`, which posts both directions at once so a 2-member ring cannot deadlock).
Transfers are asynchronous: `exchange` posts them and returns at once, `wait` completes them, so
the caller computes the current block while the next one is on the wire (double buffering).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["RingComm", "validate_ring"]


def validate_ring(ring: Sequence[int], rank: int) -> tuple[int, ...]:
    """The ring as a tuple, or a ValueError naming what is wrong and how to fix it."""
    members = tuple(int(r) for r in ring)
    if not members:
        raise ValueError("ring is empty: pass the global ranks of the CP group in ring order")
    if len(set(members)) != len(members):
        dup = sorted({r for r in members if members.count(r) > 1})
        raise ValueError(f"ring {members} lists ranks {dup} more than once; each member once")
    if rank not in members:
        raise ValueError(
            f"ring {members} does not contain this process (global rank {rank}); pass the ring "
            "of this rank's CP group (RankPlan.group_replicas mapped to global ranks)"
        )
    return members


class RingComm:
    """Send to the next member and receive from the previous one, asynchronously.

    `tag` separates the KV ring from the dK/dV ring of the backward (both flow the same way
    between the same pair); gloo matches messages by (peer, tag) in order.
    """

    def __init__(self, ring: Sequence[int], *, group: dist.ProcessGroup | None = None) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.ring = validate_ring(ring, rank)
        self.rank = rank
        self.index = self.ring.index(rank)
        self.size = len(self.ring)
        self.next = self.ring[(self.index + 1) % self.size]
        self.prev = self.ring[(self.index - 1) % self.size]
        self._group = group
        self._pending: dict[int, list[dist.Work]] = {}
        self._keep: dict[int, list[torch.Tensor]] = {}
        self.wait_seconds = 0.0  # time blocked in `wait`: communication NOT hidden by compute
        self.sent_bytes = 0  # bytes posted to `next` (what the cost model's comm term charges)
        if self.size > 1 and not dist.is_initialized():
            raise RuntimeError(
                f"a ring of {self.size} members needs torch.distributed; call "
                "torch.distributed.init_process_group first"
            )

    def exchange(
        self, send: torch.Tensor, *, tag: int, recv: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Post send(next) and recv(prev); returns the receive buffer (valid after `wait`)."""
        send = send.contiguous()
        buf = torch.empty_like(send) if recv is None else recv
        backend = dist.get_backend(self._group)
        if backend == "gloo":
            works = [
                dist.isend(send, self.next, group=self._group, tag=tag),
                dist.irecv(buf, self.prev, group=self._group, tag=tag),
            ]
        else:
            ops = [
                dist.P2POp(dist.isend, send, self.next, group=self._group, tag=tag),
                dist.P2POp(dist.irecv, buf, self.prev, group=self._group, tag=tag),
            ]
            works = dist.batch_isend_irecv(ops)
        self.sent_bytes += send.numel() * send.element_size()
        self._pending.setdefault(tag, []).extend(works)
        self._keep.setdefault(tag, []).append(send)  # the send buffer must outlive the transfer
        return buf

    def wait(self, tag: int) -> None:
        """Complete every transfer posted with `tag`."""
        start = time.perf_counter()
        for work in self._pending.pop(tag, []):
            work.wait()
        self._keep.pop(tag, None)
        self.wait_seconds += time.perf_counter() - start
