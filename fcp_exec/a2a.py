"""All-to-all among the u members of one head-parallel block, in block-member order.

`torch.distributed.all_to_all_single` splits dim 0 of its input in the *process group's* rank
order, which torch sorts by global rank; a block's member order is the ring order of the plan
(positions j*u .. j*u+u-1), which need not be sorted (ring (4, 2, 0, 3, 1)). `A2AComm` maps
between the two, so callers index slices by block position m. One call per exchange: gloo
(CPU tensors), NCCL and HCCL all implement `all_to_all_single`; on gloo a device tensor is
staged through host memory (ranks sharing one accelerator), which changes no value.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from fcp_data.errors import ConfigError

__all__ = ["A2AComm"]


class A2AComm:
    """Exchange slices [u, ...] with the block: slice m goes to member m, slice m of the
    result came from member m. `sent_bytes` counts what leaves this member (u-1 slices)."""

    def __init__(self, members: Sequence[int], group: dist.ProcessGroup | None) -> None:
        self.members = tuple(int(r) for r in members)
        self.size = len(self.members)
        self.rank = dist.get_rank() if dist.is_initialized() else self.members[0]
        if self.rank not in self.members:
            raise ConfigError(
                f"all-to-all block {self.members} does not contain global rank {self.rank}"
            )
        self.index = self.members.index(self.rank)
        self.group = group
        self.sent_bytes = 0
        self.seconds = 0.0  # time inside all_to_all_single (nothing overlaps it)
        self._to_group: torch.Tensor | None = None
        self._on_device: dict[torch.device, torch.Tensor] = {}
        if self.size > 1:
            if group is None or not dist.is_initialized():
                raise ConfigError(
                    f"an all-to-all block of {self.size} members needs its process group "
                    "(CPGroupCache.get(block ranks)) and torch.distributed"
                )
            ranks = tuple(dist.get_process_group_ranks(group))
            if sorted(ranks) != sorted(self.members):
                raise ConfigError(
                    f"the process group holds global ranks {ranks} but the block is "
                    f"{self.members}; pass the block's own group"
                )
            order = [self.members.index(r) for r in ranks]  # group rank -> block position
            if order != list(range(self.size)):
                self._to_group = torch.tensor(order, dtype=torch.long)

    def exchange(self, send: torch.Tensor) -> torch.Tensor:
        """send [u, ...] (slice m for member m) -> recv [u, ...] (slice m from member m)."""
        if send.shape[0] != self.size:
            raise ConfigError(f"send has {send.shape[0]} slices for a block of {self.size}")
        if self.size == 1:
            return send
        perm = self._device_perm(send.device)
        if perm is not None:
            send = send.index_select(0, perm)
        send = send.contiguous()
        staged = dist.get_backend(self.group) == "gloo" and send.device.type != "cpu"
        wire = send.cpu() if staged else send
        recv = torch.empty_like(wire)
        start = time.perf_counter()
        dist.all_to_all_single(recv, wire, group=self.group)
        self.seconds += time.perf_counter() - start
        self.sent_bytes += wire.numel() * wire.element_size() * (self.size - 1) // self.size
        if staged:
            recv = recv.to(send.device)
        if perm is not None:  # group-rank order back to block positions
            recv = torch.empty_like(recv).index_copy_(0, perm, recv)
        return recv

    def _device_perm(self, device: torch.device) -> torch.Tensor | None:
        """The block-to-group order on `device`, copied once (not per exchange: a pageable
        host-to-device copy per all-to-all would stall the host)."""
        if self._to_group is None:
            return None
        if device not in self._on_device:
            self._on_device[device] = self._to_group.to(device)
        return self._on_device[device]
