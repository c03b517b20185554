"""Run a function on several real gloo processes: free port, exit codes checked, hard timeout.

Each spawn of N processes importing torch costs seconds on a small CI box, so tests run many
cases inside one job rather than one job per case; and the processes start from a forkserver
that imported torch once (`_PRELOAD`): each is a fresh fork of that server (which ran no torch
op and joined no group) and imports its function by name as a spawned one would, without paying
torch's import again (~3 s of CPU each, ~5 s more for the torch parts megatron-core imports).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any

import torch.distributed as dist

from fcp.profiling.spawn import free_port

__all__ = ["free_port", "run_distributed"]

# Imported once by the forkserver the job processes fork from: torch, fcp_exec and the torch
# parts megatron-core imports (~5 s of its ~6 s import). Not megatron-core itself: cp_context
# binds megatron's parallel state only when the job imported it (sys.modules), and jobs without
# megatron must stay without it. None of these runs a torch op or starts a thread.
_PRELOAD = (
    "torch", "torch.distributed", "fcp_exec", "fcp_data.collate", "fcp_data.planner",
    "torch._dynamo", "torch._inductor.compile_fx", "torch._functorch.aot_autograd",
    "torch.fx.experimental.symbolic_shapes", "torch.distributed.tensor", "torch.distributed.fsdp",
    "torch.distributed.checkpoint", "torch.distributed._composable", "torch.distributed.nn",
    "torch.distributed.elastic", "torch.nn.attention.flex_attention", "torch.utils.cpp_extension",
    "torch.onnx",
)  # fmt: skip


def _context() -> Any:
    """The forkserver context, its server started (once per process) with _PRELOAD imported
    and OMP_NUM_THREADS=1 unless set (as `_child` sets it: before torch sizes its pool)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))  # an ImportError there only loses the head start
    omp = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the server's environment, not this one's
    try:
        forkserver.ensure_running()
    finally:
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return ctx


def _child(
    fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple[Any, ...], errq: Any
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=240),
        )
        fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise SystemExit(1) from None


def _launch(fn: Callable[..., Any], world: int, args: tuple[Any, ...], timeout: float) -> str:
    """One attempt; returns "" on success, else a report of exit codes, hangs and tracebacks."""
    ctx = _context()
    errq = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(fn, r, world, port, args, errq)) for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in hung:
        procs[i].kill()
        procs[i].join()
    errors = []
    while not errq.empty():
        errors.append(errq.get())
    codes = [p.exitcode for p in procs]
    if not errors and not hung and all(c == 0 for c in codes):
        return ""
    msg = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors))
    return f"exit codes {codes}, hung ranks {hung} (timeout {timeout}s)\n{msg}"


def run_distributed(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0) -> None:
    """Run fn(rank, world, *args) on `world` fresh processes; raise if any fails or hangs.

    fn must be importable (module level): processes start from the forkserver, not as copies
    of this one, and import it by name, as spawned ones would; their environment is this
    process's when the first job started the server (set variables in fn, not here). The free
    port can be taken by another process between the probe and the bind (a shared CI box);
    only that failure is retried, twice.
    """
    for _ in range(3):
        report = _launch(fn, world, args, timeout)
        if "Address already in use" not in report and "EADDRINUSE" not in report:
            break
    if report:
        raise AssertionError(report)
