"""All-to-all latency and bandwidth among real processes (torch.distributed, gloo by default).

A head-parallel transport (`fcp_exec.ulysses`) runs 4 all-to-alls per layer and micro-batch
over the u members of a block, each member sending (u - 1)/u of a buffer. Here `world`
spawned processes run `all_to_all_single` on buffers of n bytes per member (the size one member
of a block holds for one layer of the grid's lengths); the time is the median over `repeats`
calls after one warm-up, the slowest member's (a barrier-free collective ends with its slowest
member). The fit t(n) = latency + (world - 1)/world * n / bandwidth gives beta3's latency and
the all-to-all's bandwidth, which the profile states relative to the P2P link's
(`CostModel.a2a_efficiency`). Spawned on a free port, exit codes checked, bounded by
`timeout_s` (`spawn.run_group`).
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

__all__ = ["A2APoint", "measure_a2a", "time_all_to_all"]


@dataclass(kw_only=True, slots=True, frozen=True)
class A2APoint:
    """Seconds of one all-to-all in which every member holds `nbytes` bytes."""

    nbytes: int
    seconds: float
    world: int


def time_all_to_all(sizes: Sequence[int], repeats: int, device: Any) -> list[tuple[int, float]]:
    """(nbytes per member, seconds) per size, on an initialised process group; call on every
    rank. Shared by `fcp profile` and the device suite."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    results = []
    for n in sizes:
        per = max(1, n // 4 // world) * world  # a multiple of the world: equal splits
        src = torch.zeros(per, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(dst, src)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - t0)
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(slowest.to(device), op=dist.ReduceOp.MAX)
        results.append((per * 4, float(slowest.item())))
    return results


def _a2a(
    rank: int, world: int, port: int, out: Any, sizes: list[int], repeats: int, backend: str
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    device = torch.device("cpu")
    if backend == "nccl":  # one GPU per process; written, not run on hardware here
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    results = time_all_to_all(sizes, repeats, device)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put(results)


def measure_a2a(
    sizes: Sequence[int] = (65536, 1 << 20, 4 << 20),
    *,
    world: int = 2,
    repeats: int = 5,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> list[A2APoint]:
    """All-to-all among `world` spawned processes; one A2APoint per buffer size."""
    if len(sizes) < 2:
        raise ConfigError(f"sizes={list(sizes)}: a latency + bandwidth fit needs >= 2 sizes")
    if world < 2:
        raise ConfigError(f"world={world}: an all-to-all needs >= 2 members")
    try:
        result = run_group(
            _a2a,
            int(world),
            [int(s) for s in sizes],
            int(repeats),
            backend,
            timeout_s=timeout_s,
            what="all-to-all measurement",
        )
    except DataError as exc:
        raise DataError(
            f"{exc}; check that 127.0.0.1 TCP ports are usable or leave out --head-parallel"
        ) from exc
    return [A2APoint(nbytes=n, seconds=t, world=int(world)) for n, t in result]
