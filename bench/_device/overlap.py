"""P2P ping-pong and compute/communication overlap of a d = 2 ring (ranks 0 and 1 of the job).

* P2P: rank 0 sends n bytes, rank 1 sends them back; one-way time is half the median round
  trip. Fitted t(n) = latency + n / bandwidth with the profiler's own `fit_p2p`.
* Overlap: one causal sequence sharded over ranks 0 and 1, ring attention fwd + bwd timed three
  ways: the real ring ("ring"), the same kernels with no transfer (`LocalComm`, "compute") and
  the same transfers with no kernels ("comm": d-1 KV hops forward, d-1 KV + d-1 fp32 dK/dV
  hops backward). hidden = (compute + comm - ring) / comm is the share of transfer time the
  ring hid behind compute (1 = all of it, 0 = none); "wait" is the time blocked in
  `RingComm.wait` per fwd+bwd, the transfer time the ring did not hide. On NCCL `wait` only
  orders the compute stream after the transfer and returns at once, so "wait" is ~0 there
  and the hidden share is the figure to read. On CUDA / NPU the ring posts its transfers from
  a communication stream and times each with events (posted, done, needed by the compute
  stream): "event_hidden_share" is the share of transfer time the compute stream never waited
  for, measured on the device rather than by subtraction.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from fcp.profiling.p2p import pingpong as measure_pingpong
from fcp_exec import ring_attention
from fcp_exec.ring import RingComm
from fcp_exec.runtime import stream_api

from .comm import LocalComm

__all__ = ["measure_overlap", "pingpong"]


def pingpong(rank: int, sizes: list[int], repeats: int, device: torch.device) -> list[list[float]]:
    """[[nbytes, one-way seconds], ...] between ranks 0 and 1 (call on both): `fcp profile`'s."""
    return [[float(n), t] for n, t in measure_pingpong(rank, sizes, repeats, device)]


def _timed(fn: Callable[[], Any], repeats: int, device: torch.device, group: Any) -> float:
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_overlap(
    rank: int, cfg: dict[str, Any], device: torch.device, group: Any
) -> dict[str, Any]:
    """Ring / compute-only / comm-only seconds of one d = 2 fwd+bwd (call on ranks 0 and 1;
    `group` is their process group, for the barriers and the final MAX)."""
    seqlen, heads, kv_heads, dim = cfg["seqlen"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dt = getattr(torch, cfg["dtype"])
    local = seqlen // 2
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(local, heads, dim, generator=g).to(device, dt).requires_grad_()
    k = torch.randn(local, kv_heads, dim, generator=g).to(device, dt).requires_grad_()
    v = torch.randn(local, kv_heads, dim, generator=g).to(device, dt).requires_grad_()
    do = torch.randn(local, heads, dim, generator=g).to(device, dt)
    cu = [0, seqlen]
    waits: list[float] = []
    api = stream_api(device)  # CUDA / NPU: transfers on a comm stream, timed with events
    stream = api.Stream(device=device) if api is not None else None
    comms: list[RingComm] = []

    def ring() -> None:
        comm = RingComm([0, 1], group=group, stream=stream, stream_api=api,
                        timing=api is not None)  # fmt: skip
        ring_attention(q, k, v, cu, cu, ring=comm).backward(do)
        waits.append(comm.wait_seconds)
        comms.append(comm)

    def compute() -> None:
        ring_attention(q, k, v, cu, cu, ring=LocalComm([0, 1])).backward(do)

    kv = torch.stack((k.detach(), v.detach()))
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=device)

    def comm_only() -> None:
        comm = RingComm([0, 1])
        comm.exchange(kv, tag=17)
        comm.wait(17)
        comm.exchange(kv, tag=17)
        comm.exchange(dkv, tag=18)
        comm.wait(17)
        comm.wait(18)

    reps = cfg["repeats"]
    t_ring = _timed(ring, reps, device, group)
    t_compute = _timed(compute, reps, device, group)
    t_comm = _timed(comm_only, reps, device, group)
    both = torch.tensor([t_ring, t_compute, t_comm, statistics.median(waits)], device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    t_ring, t_compute, t_comm, t_wait = (float(x) for x in both.tolist())
    hidden = (t_compute + t_comm - t_ring) / t_comm if t_comm > 0 else 0.0
    events: dict[str, Any] = {}
    if api is not None:  # the last timed ring's transfers, read after the device synchronised
        api.synchronize(device)
        ov = comms[-1].overlap()
        events = {
            "event_transfers": ov.transfers,
            "event_transfer_s": ov.transfer_s,
            "event_exposed_s": ov.exposed_s,
            "event_hidden_share": ov.hidden_share,
        }
    return {
        **events,
        "seqlen": seqlen, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
        "dtype": cfg["dtype"], "ring_s": t_ring, "compute_s": t_compute, "comm_s": t_comm,
        "wait_s": t_wait, "hidden_share": max(0.0, min(1.0, hidden)),
        "hidden_share_raw": hidden,
    }  # fmt: skip
