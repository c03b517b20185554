"""The one multi-process job of the suite: exactness cases, then P2P and overlap on ranks 0-1.

One spawn serves every degree (rings [0], [0, 1], [0, 1, 2], [0, 1, 2, 3] of a 4-process job;
ranks outside a case's ring idle) because starting processes that import torch and create a
CUDA context costs seconds each. Rank 0 decides before every case whether the budget still
allows it and broadcasts the verdict, so all ranks skip together and nothing hangs. A case
that raises is recorded with its error and ends the exactness cases (the ring's message state
is unknown after a failure); the job itself still reports.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from fcp.profiling.spawn import run_group
from fcp_exec.a2a import A2AComm
from fcp_exec.kernels import select_kernel
from fcp_exec.ring import RingComm

from .comm import StagedRingComm
from .exactness import Case, a2a_blocks, run_case, summarise
from .overlap import measure_overlap, pingpong

__all__ = ["run_ring_job"]


def _device(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        return dev
    if kind == "npu":
        import torch_npu  # noqa: F401  (registers the npu device type)

        dev = torch.device("npu", rank % torch.npu.device_count())  # type: ignore[attr-defined]
        torch.npu.set_device(dev)  # type: ignore[attr-defined]
        return dev
    return torch.device("cpu")


def _go(ok: bool, comm_dev: torch.device) -> bool:
    flag = torch.tensor([1.0 if ok else 0.0], device=comm_dev)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def _kernel_label(device: torch.device, dtype: str) -> str:
    if device.type == "cuda" and dtype == "float32":
        return "torch-math (the flash kernels have no fp32)"
    return select_kernel(device).name


def _cases(rank: int, cfg: dict[str, Any], device: torch.device, comm_dev: torch.device) -> list:
    rows: list[dict[str, Any]] = []
    longest, broken = 0.0, ""
    cases = [Case(**spec) for spec in cfg["cases"]]
    # all-to-all blocks of the u > 1 cases: collective creation, every rank, same order; on
    # a host-staged run the blocks are gloo groups (A2AComm stages device tensors)
    gloo = "gloo" if cfg["staged"] or cfg["stage_bf16"] else None
    blocks = {b: dist.new_group(list(b), backend=gloo) for b in a2a_blocks(cases)}
    for spec, case in zip(cfg["cases"], cases):
        now = time.time()
        if not _go(not broken and now + 2 * longest < cfg["deadline"], comm_dev):
            why = f"an earlier case failed ({broken})" if broken else "time budget spent"
            rows.append({**spec, "status": "skipped", "reason": why})
            continue
        ring = list(range(case.degree))
        vec = torch.zeros(8, dtype=torch.float64, device=comm_dev)
        err = ""
        # the CPU dry run stages its bf16 cases through the host path too, so it runs in CI
        staged = cfg["staged"] or (cfg["stage_bf16"] and case.dtype == "bfloat16")
        if rank in ring:
            try:
                u = case.ulysses
                j, m = divmod(rank, u)
                block = tuple(range(j * u, (j + 1) * u))
                members = ring[m::u]  # the r-ring of block position m
                comm = StagedRingComm(members) if staged else RingComm(members)
                a2a = A2AComm(block, blocks[block]) if u > 1 else None
                vec = run_case(case, comm, device, a2a).to(comm_dev)
            except Exception as exc:  # recorded in the JSON, not swallowed
                traceback.print_exc()
                err = f"rank {rank}: {type(exc).__name__}: {exc}"
                vec = torch.full((8,), float("inf"), dtype=torch.float64, device=comm_dev)
        dist.all_reduce(vec, op=dist.ReduceOp.MAX)
        values = vec.tolist()
        row = summarise(case, values, _kernel_label(device, case.dtype))
        row["transport"] = "host-staged" if staged else "direct"
        if values[0] == float("inf") and values[4] == float("inf"):
            errors: list[str] = [""] * dist.get_world_size()
            dist.all_gather_object(errors, err)
            broken = "; ".join(e for e in errors if e) or "a member failed"
            row.update(status="failed", reason=broken)
        else:
            row["status"] = "ok"
        row["seconds"] = time.time() - now
        rows.append(row)
        longest = max(longest, row["seconds"])
    return rows


def _worker(rank: int, world: int, port: int, out: Any, cfg: dict[str, Any]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    device = _device(cfg["kind"], rank)
    backend = cfg["backend"]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=cfg["timeout_s"]))  # fmt: skip
    comm_dev = torch.device("cpu") if backend == "gloo" else device
    warm = torch.ones(1, device=comm_dev)
    dist.all_reduce(warm)  # creates the communicator on every rank before any P2P
    result: dict[str, Any] = {"started_s": time.time() - cfg["launched"]}
    result["cases"] = _cases(rank, cfg, device, comm_dev)
    pair = dist.new_group([0, 1]) if world >= 2 and (cfg["p2p"] or cfg["overlap"]) else None
    left = cfg["deadline"] - time.time()
    if cfg["p2p"]:
        p2p = cfg["p2p"]
        if _go(left > p2p["min_s"], comm_dev):
            rows = pingpong(rank, p2p["sizes"], p2p["repeats"], device) if rank < 2 else []
            result["p2p"] = {"status": "ok", "rows": rows}
        else:
            result["p2p"] = {"status": "skipped", "reason": f"time budget: {left:.0f} s left"}
    if cfg["overlap"]:
        left = cfg["deadline"] - time.time()
        if _go(left > cfg["overlap"]["min_s"], comm_dev):
            res = measure_overlap(rank, cfg["overlap"], device, pair) if rank < 2 else {}
            result["overlap"] = {"status": "ok", **res}
        else:
            result["overlap"] = {"status": "skipped", "reason": f"time budget: {left:.0f} s left"}
    if rank == 0:
        out.put(result)
    dist.barrier()
    dist.destroy_process_group()


def run_ring_job(
    *,
    kind: str,
    world: int,
    backend: str,
    staged: bool,
    stage_bf16: bool = False,
    cases: list[dict[str, Any]],
    p2p: dict[str, Any] | None,
    overlap: dict[str, Any] | None,
    seconds: float,
) -> dict[str, Any]:
    """Run the job on `world` spawned processes within `seconds` (hard deadline: the job is
    killed and RuntimeError raised if it overruns; cases stop early to avoid that)."""
    margin = 5.0 + 0.1 * seconds  # teardown and the result's trip back
    cfg = {
        "kind": kind, "backend": backend, "staged": staged, "stage_bf16": stage_bf16,
        "cases": cases, "p2p": p2p,
        "overlap": overlap, "deadline": time.time() + seconds - margin, "launched": time.time(),
        "timeout_s": max(30, int(seconds)),
    }  # fmt: skip
    return run_group(_worker, world, cfg, timeout_s=seconds, what="device suite ring job")
