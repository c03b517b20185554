"""Point-to-point ring exchange between the members of one CP group, on that group.

Sends and receives run on the CP group's own communicator (`group=`, the group `cp_context`
bound: `CPGroupCache` creates it once and keeps it), never on the world group: with NCCL a P2P
on the world communicator opens a peer connection on first use, inside a training step, every
time a ring pairs two ranks for the first time. Peers are addressed by global rank; torch maps
them into the group. gloo gets isend/irecv; NCCL and HCCL get `batch_isend_irecv` (both
directions posted at once, so a 2-member ring cannot deadlock).

Transfers are asynchronous: `exchange` posts them and returns at once, `wait` completes them,
so the caller computes the current step while the next KV is on the wire (double buffering).
On CUDA and NPU the transfers are posted from a dedicated communication stream (`stream=`, one
per device, kept by `fcp_exec.runtime.ExecRuntime`): the stream first waits for the compute
stream (the send buffer is ready), the transfer completes on it, and `wait` makes the compute
stream wait for an event of it, so the host never blocks and step s+1's transfer overlaps step
s's kernel. With `timing=True` three events per transfer (posted, done, needed) measure how much
of the transfer the compute hid; `overlap()` reads them after the caller synchronised the
device (benchmarks only: reading event times inside a layer would sync the host).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from fcp_data.errors import ConfigError, ExecError

__all__ = ["Overlap", "RingComm", "validate_ring"]


def validate_ring(ring: Sequence[int], rank: int) -> tuple[int, ...]:
    """The ring as a tuple, or a ValueError naming what is wrong and how to fix it."""
    members = tuple(int(r) for r in ring)
    if not members:
        raise ConfigError("ring is empty: pass the global ranks of the CP group in ring order")
    if len(set(members)) != len(members):
        dup = sorted({r for r in members if members.count(r) > 1})
        raise ConfigError(f"ring {members} lists ranks {dup} more than once; each member once")
    if rank not in members:
        raise ConfigError(
            f"ring {members} does not contain this process (global rank {rank}); pass the ring "
            "of this rank's CP group (RankPlan.group_replicas mapped to global ranks)"
        )
    return members


@dataclass(frozen=True, slots=True)
class Overlap:
    """Transfers measured with device events: `transfer_s` on the wire (posted -> done),
    `exposed_s` the part compute did not hide (needed -> done, when done came later)."""

    transfers: int
    transfer_s: float
    exposed_s: float

    @property
    def hidden_share(self) -> float:
        return 1.0 - self.exposed_s / self.transfer_s if self.transfer_s > 0 else 1.0


class RingComm:
    """Send to the next member and receive from the previous one, asynchronously.

    `tag` separates the KV ring from the dK/dV ring of the backward (both flow the same way
    between the same pair); gloo matches messages by (peer, tag) in order.
    """

    def __init__(
        self,
        ring: Sequence[int],
        *,
        group: dist.ProcessGroup | None = None,
        stream: Any = None,
        stream_api: ModuleType | None = None,
        timing: bool = False,
    ) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.ring = validate_ring(ring, rank)
        self.rank = rank
        self.index = self.ring.index(rank)
        self.size = len(self.ring)
        self.next = self.ring[(self.index + 1) % self.size]
        self.prev = self.ring[(self.index - 1) % self.size]
        self.group = group
        self._pending: dict[int, list[dist.Work]] = {}
        self._keep: dict[int, list[torch.Tensor]] = {}
        self._done: dict[int, Any] = {}
        self._stream = stream
        self._api = stream_api
        self._timing = timing
        self._events: list[tuple[Any, Any, Any]] = []
        self.wait_seconds = 0.0  # host time blocked in `wait` (gloo: communication not hidden)
        self.sent_bytes = 0  # bytes posted to `next` (what the cost model's comm term charges)
        self._backend = ""
        self._device: torch.device | None = None
        if self.size > 1:
            if not dist.is_initialized():
                raise ExecError(
                    f"a ring of {self.size} members needs torch.distributed; call "
                    "torch.distributed.init_process_group first"
                )
            if group is not None:
                held = sorted(dist.get_process_group_ranks(group))
                if held != sorted(self.ring):
                    raise ConfigError(
                        f"the process group holds global ranks {held} but the ring is "
                        f"{self.ring}; pass the CP group of this ring (CPGroupCache.get(ring))"
                    )
            self._backend = dist.get_backend(group)
        if stream is not None and stream_api is None:
            raise ConfigError("stream= needs stream_api= (torch.cuda or torch.npu)")

    def _post(self, send: torch.Tensor, buf: torch.Tensor, tag: int) -> list[dist.Work]:
        if self._backend == "gloo":
            return [
                dist.isend(send, self.next, group=self.group, tag=tag),
                dist.irecv(buf, self.prev, group=self.group, tag=tag),
            ]
        ops = [
            dist.P2POp(dist.isend, send, self.next, group=self.group, tag=tag),
            dist.P2POp(dist.irecv, buf, self.prev, group=self.group, tag=tag),
        ]
        return dist.batch_isend_irecv(ops)

    def exchange(
        self, send: torch.Tensor, *, tag: int, recv: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Post send(next) and recv(prev); returns the receive buffer (valid after `wait`)."""
        send = send.contiguous()
        buf = torch.empty_like(send) if recv is None else recv
        if self._stream is None:
            works = self._post(send, buf, tag)
        else:
            api, stream = self._api, self._stream
            assert api is not None
            self._device = send.device
            compute = api.current_stream(send.device)
            stream.wait_stream(compute)  # the send buffer is written on the compute stream
            with api.stream(stream):
                posted = api.Event(enable_timing=True) if self._timing else None
                if posted is not None:
                    posted.record(stream)
                works = self._post(send, buf, tag)
                for work in works:  # the comm stream (not the host) waits for the transfer
                    work.wait()
                done = api.Event(enable_timing=self._timing)
                done.record(stream)
            for t in (send, buf):  # the caching allocator must not reuse them before `done`
                t.record_stream(stream)
            self._done[tag] = (done, posted)
            works = []
        self.sent_bytes += send.numel() * send.element_size()
        self._pending.setdefault(tag, []).extend(works)
        self._keep.setdefault(tag, []).append(send)  # the send buffer must outlive the transfer
        return buf

    def wait(self, tag: int) -> None:
        """Complete every transfer posted with `tag` (on a stream: the compute stream waits for
        it on the device; the host does not block)."""
        start = time.perf_counter()
        for work in self._pending.pop(tag, []):
            work.wait()
        entry = self._done.pop(tag, None)
        if entry is not None:
            api = self._api
            assert api is not None
            done, posted = entry
            compute = api.current_stream(self._device)
            if posted is not None:
                needed = api.Event(enable_timing=True)
                needed.record(compute)
                self._events.append((posted, done, needed))
            compute.wait_event(done)
        self._keep.pop(tag, None)
        self.wait_seconds += time.perf_counter() - start

    def overlap(self) -> Overlap:
        """The timed transfers so far (`timing=True`); call after synchronising the device."""
        transfer = exposed = 0.0
        for posted, done, needed in self._events:
            transfer += posted.elapsed_time(done) / 1e3
            exposed += max(0.0, needed.elapsed_time(done) / 1e3)
        return Overlap(len(self._events), transfer, exposed)
