"""Time real CP groups on this machine: d = 1 and d = 2 fwd+bwd of the profiled model shape.

`fcp profile --ring` and `fcp demo` call this (through `ring.measure_ring`) and fit the ring's
*exposed* communication from it. Why: the cost model lets ring P2P hide behind attention,
T = L + max(A, C), and a ping-pong between idle processes says the link is fast. On CPU with
gloo the transfers run on the very cores that compute, so little hides: measured d = 2 groups
took 1.5-1.8x their prediction. Timing the real ring (fcp_exec's ring attention in a
transformer of the profiled shape, two gloo processes) and fitting C to what is left after the
per-token layers gives the planner the ring's true price, so it stops spending rings where one
replica would do.

Both ranks run the d = 1 points too (each its own copy, concurrently), so d = 1 and d = 2
are timed under the same contention: the fit subtracts the d = 1 fit, not a quiet-machine one.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from typing import Any

import torch

from fcp_data.errors import ConfigError
from fcp_exec.attention import ring_attention

from .shapes import ModelShape
from .spawn import run_group

__all__ = ["time_ring_groups"]


class _Stack(torch.nn.Module):
    """The profiled shape's decoder layers (attention through the ring) and LM head."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.s = s = shape
        self.q, self.kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.qkv = torch.nn.ModuleList(
            [torch.nn.Linear(s.hidden, self.q + 2 * self.kv, bias=False) for _ in range(s.layers)]
        )
        self.out = torch.nn.ModuleList(
            [torch.nn.Linear(self.q, s.hidden, bias=False) for _ in range(s.layers)]
        )
        self.up = torch.nn.ModuleList(
            [torch.nn.Linear(s.hidden, 2 * s.ffn, bias=False) for _ in range(s.layers)]
        )
        self.down = torch.nn.ModuleList(
            [torch.nn.Linear(s.ffn, s.hidden, bias=False) for _ in range(s.layers)]
        )
        self.head = torch.nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor, cu: torch.Tensor, ring: tuple[int, ...]
    ) -> torch.Tensor:
        s, t = self.s, x.shape[0]
        for i in range(s.layers):
            q, k, v = self.qkv[i](x).split([self.q, self.kv, self.kv], dim=-1)
            a = ring_attention(
                q.reshape(t, s.heads, s.head_dim),
                k.reshape(t, s.kv_heads, s.head_dim),
                v.reshape(t, s.kv_heads, s.head_dim),
                cu,
                cu,
                ring=ring,
            )
            x = x + self.out[i](a.reshape(t, -1))
            g, u = self.up[i](x).chunk(2, dim=-1)
            x = x + self.down[i](torch.nn.functional.silu(g) * u)
        return torch.nn.functional.cross_entropy(self.head(x), labels)


def _time(model: _Stack, seqlen: int, ring: tuple[int, ...], repeats: int) -> float:
    local = seqlen // len(ring)
    cu = torch.tensor([0, seqlen], dtype=torch.int32)
    g = torch.Generator().manual_seed(seqlen)
    x = torch.randn(local, model.s.hidden, generator=g, requires_grad=True)
    labels = torch.randint(0, model.s.vocab, (local,), generator=g)
    times = []
    for i in range(repeats + 1):  # the first run warms kernels and allocations
        if len(ring) > 1:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        model(x, labels, cu, ring).backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(
    rank: int,
    world: int,
    port: int,
    out: Any,
    shape: ModelShape,
    seqlens: list[int],
    repeats: int,
) -> None:
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    torch.manual_seed(0)
    model = _Stack(shape)
    rows = []
    for s in seqlens:
        dist.barrier()
        d1 = _time(model, s, (rank,), repeats)  # both ranks at once: the same contention
        d2 = _time(model, s, (0, 1), repeats)
        both = torch.tensor([d1, d2])
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        rows.append({"seqlen": s, "d1_s": float(both[0]), "d2_s": float(both[1])})
    dist.barrier()
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def time_ring_groups(
    shape: ModelShape, seqlens: list[int], *, repeats: int = 3, timeout_s: float = 600.0
) -> list[dict[str, float]]:
    """Seconds of fwd+bwd at d = 1 and d = 2 per length (slowest rank, median of repeats),
    timed on 2 spawned gloo processes; a failed or late process raises DataError."""
    bad = [s for s in seqlens if s < 4 or s % 4]
    if bad:
        raise ConfigError(f"lengths {bad} must be multiples of 4 (zigzag chunks at d = 2)")
    return run_group(
        _worker, 2, shape, list(seqlens), repeats, timeout_s=timeout_s, what="ring measurement"
    )
