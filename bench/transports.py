"""Ring vs all-to-all (Ulysses) vs hybrid u x r attention, forward + backward, on gloo CPU.

Run: .venv/bin/python bench/transports.py [-o out.json] [--quick]
(one 4-process job; ~1-2 minutes on 2 loaded CPU cores). Prints a table and writes JSON.

For d = 2, 3, 4 and each transport u that divides d (u = 1: ring, u = d: all-to-all, else the
hybrid) one causal pack of one sequence of `--seqlens` tokens runs `fcp_exec.cp_attention`
forward + backward on d gloo processes; configurations are interleaved (every one once per
repeat, `--repeats` 3) so load drift on a shared box hits all alike; the figure is the median
over repeats of the slowest member. Bytes are what each member sends per pass
(`fcp_exec.transport_bytes`).

HONEST LABEL: gloo on CPU moves bytes through loopback TCP with the same cores that compute
the kernels, and all-to-all cannot overlap compute at all while the ring hides part of its
transfers; neither the ratio nor the sign of the difference says anything about NVLink or
InfiniBand, where all-to-all bandwidth and latency differ by orders of magnitude. Use this to
see that every transport runs and scales, not to choose one; the device suite and the
planner's cost model are for that.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from _common import make_parser, out_path, print_table, write_json

from fcp.profiling.spawn import run_group
from fcp_exec import (
    CPBinding,
    CPGroupCache,
    ReplicaRanks,
    a2a_bytes_per_token,
    cp_attention,
    local_token_index,
)
from fcp_exec.transport_bytes import hybrid_ring_bytes_per_token

__all__ = ["main"]

DEGREES = (2, 3, 4)


@dataclass(frozen=True)
class _Spec:
    replicas: tuple[int, ...]
    ulysses: int


def _configs(seqlens: list[int], degrees: tuple[int, ...]) -> list[tuple[int, int, int]]:
    return [(n, d, u) for n in seqlens for d in degrees for u in range(1, d + 1) if d % u == 0]


def _label(d: int, u: int) -> str:
    return "ring" if u == 1 else ("all-to-all" if u == d else f"hybrid {u}x{d // u}")


def _worker(rank: int, world: int, port: int, out: Any, cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))  # fmt: skip
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    configs = [tuple(c) for c in cfg["configs"]]
    cache.prepare([_Spec(tuple(range(d)), u) for _, d, u in configs])  # collective, same order
    h, hkv, dim = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    times: dict[str, list[float]] = {}
    for rep in range(cfg["repeats"] + 1):  # repeat 0 warms up
        for n, d, u in configs:
            key = f"{n},{d},{u}"
            dt = torch.zeros(1, dtype=torch.float64)
            if rank < d:
                padded = -(-n // (2 * d)) * 2 * d
                idx = local_token_index([0, padded], d, rank)
                g = torch.Generator().manual_seed(n)
                q, k, v = (torch.randn(len(idx), hh, dim, generator=g).requires_grad_()
                           for hh in (h, hkv, hkv))  # fmt: skip
                members = tuple(range(d))
                j = rank // u
                a2a = cache.get(members[j * u : (j + 1) * u]) if u > 1 else None
                cp = CPBinding.of(members, rank, ulysses=u, group=cache.get(members),
                                  a2a_group=a2a)  # fmt: skip
                dist.barrier(cache.get(members))
                start = time.perf_counter()
                cp_attention(q, k, v, [0, n], [0, padded], binding=cp).sum().backward()
                dt[0] = time.perf_counter() - start
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if rep:
                times.setdefault(key, []).append(float(dt[0]))
    if rank == 0:
        out.put(times)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--seqlens", default="1024,4096,8192", help="tokens of the one sequence")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    degrees = DEGREES
    if args.quick:
        args.seqlens, args.heads, args.kv_heads, args.head_dim = "64", 2, 2, 8
        args.repeats, degrees = 1, (2,)
    seqlens = [int(x) for x in args.seqlens.split(",")]
    configs = _configs(seqlens, degrees)
    cfg = {"configs": configs, "heads": args.heads, "kv_heads": args.kv_heads,
           "head_dim": args.head_dim, "repeats": args.repeats}  # fmt: skip
    t0 = time.monotonic()
    times = run_group(_worker, max(degrees), cfg, timeout_s=1800, what="transports bench")
    rows = []
    shape = {"kv_heads": args.kv_heads, "head_dim": args.head_dim, "activation_bytes": 4}
    for n, d, u in configs:
        ts = times[f"{n},{d},{u}"]
        t_local = -(-n // (2 * d)) * 2
        rows.append({
            "seqlen": n, "degree": d, "ulysses": u, "ring_degree": d // u,
            "transport": _label(d, u), "fwd_bwd_ms": 1e3 * statistics.median(ts),
            "all_ms": [1e3 * t for t in ts],
            "a2a_bytes": a2a_bytes_per_token(heads=args.heads, ulysses=u, **shape) * t_local,
            "ring_bytes": hybrid_ring_bytes_per_token(ulysses=u, ring_degree=d // u, **shape)
            * t_local,
        })  # fmt: skip
    print("NOT indicative of NVLink / InfiniBand: CPU cores both compute and copy the bytes.")
    cells = [
        (r["seqlen"], r["degree"], r["transport"], f"{r['fwd_bwd_ms']:.1f}",
         f"{r['a2a_bytes'] / 1024:.0f}", f"{r['ring_bytes'] / 1024:.0f}")
        for r in rows
    ]  # fmt: skip
    print_table(
        f"gloo on CPU, fp32, causal, one sequence; median of {args.repeats} interleaved runs",
        ("tokens", "d", "transport", "fwd+bwd ms", "a2a KiB", "ring KiB"),
        cells,
    )
    report = {
        "what": "ring vs all-to-all vs hybrid u x r attention, fwd+bwd, gloo on CPU",
        "caveat": "CPU/gloo: cores compute and copy; says little about NVLink or InfiniBand",
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                  "dtype": "float32", "causal": True},
        "repeats": args.repeats, "rows": rows, "elapsed_s": time.monotonic() - t0,
    }  # fmt: skip
    write_json(out_path(args, "transports"), report, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
