"""P2P latency and bandwidth between two real processes (torch.distributed, gloo by default).

Rank 0 sends a message of n bytes, rank 1 sends it back (ping-pong); one-way time is half the
median round trip over `repeats` round trips after one warm-up. This is the link a 2-member
ring uses on this machine (loopback TCP for gloo on one host; NVLink / IB for NCCL on a
cluster when launched there). The fit t(n) = latency + n / bandwidth gives beta2's latency and
the cost model's bandwidth. Processes are spawned (not forked) on a free port, and their exit
codes are checked: a dead peer raises instead of hanging past `timeout_s`.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fcp_data.errors import ConfigError, DataError

from .spawn import run_group

__all__ = ["P2PPoint", "measure_p2p", "pingpong"]


@dataclass(kw_only=True, slots=True, frozen=True)
class P2PPoint:
    """One-way seconds for one message of `nbytes` bytes."""

    nbytes: int
    seconds: float


def pingpong(rank: int, sizes: Sequence[int], repeats: int, device: Any) -> list[tuple[int, float]]:
    """(nbytes, one-way seconds) per size between ranks 0 and 1 of an initialised process group.

    Call on both ranks; one warm-up round trip per size is not timed. Shared by `fcp profile`
    and the device suite, so both measure the link the same way.
    """
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    results = []
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
        rtts = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                rtts.append(time.perf_counter() - t0)
        results.append((buf.numel() * 4, statistics.median(rtts) / 2))
    return results


def _pingpong(
    rank: int, world: int, port: int, out: Any, sizes: list[int], repeats: int, backend: str
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    device = torch.device("cpu")
    if backend == "nccl":  # one GPU per process (needs 2 GPUs); written, not run on hardware
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    results = pingpong(rank, sizes, repeats, device)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put(results)


def measure_p2p(
    sizes: Sequence[int] = (4096, 65536, 1 << 20, 4 << 20, 16 << 20),
    *,
    repeats: int = 5,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> list[P2PPoint]:
    """Ping-pong between two spawned processes; one P2PPoint per message size."""
    if len(sizes) < 2:
        raise ConfigError(f"sizes={list(sizes)}: a latency + bandwidth fit needs >= 2 sizes")
    try:
        result = run_group(
            _pingpong,
            2,
            [int(s) for s in sizes],
            int(repeats),
            backend,
            timeout_s=timeout_s,
            what="P2P measurement",
        )
    except DataError as exc:
        raise DataError(
            f"{exc}; check that 127.0.0.1 TCP ports are usable or pass --no-p2p"
        ) from exc
    return [P2PPoint(nbytes=n, seconds=t) for n, t in result]
