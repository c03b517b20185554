"""Run a function on several real gloo processes: free port, exit codes checked, hard timeout.

Each spawn of N processes importing torch costs seconds on a small CI box, so tests run many
cases inside one job rather than one job per case; and the processes start from a forkserver
that imported torch once (`_preload`): each is a fresh fork of that server (which ran no torch
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
from typing import Any

import torch.distributed as dist

from fcp_exec.launch import free_port

__all__ = ["free_port", "run_distributed"]

_PRELOAD = f"{__package__}._preload" if __package__ else "_preload"


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
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([_PRELOAD])  # read when the server starts: the first job here
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
    """Run fn(rank, world, *args) on `world` spawned processes; raise if any fails or hangs.

    fn must be importable (module level): processes start from the forkserver, not as copies
    of this one, and import it by name, as spawned ones would. The free
    port can be taken by another process between the probe and the bind (a shared CI box);
    only that failure is retried, twice.
    """
    for _ in range(3):
        report = _launch(fn, world, args, timeout)
        if "Address already in use" not in report and "EADDRINUSE" not in report:
            break
    if report:
        raise AssertionError(report)
