"""Local process groups: a free port and a spawned group with a hard deadline.

The profiler's P2P measurement, the benchmarks, examples, tests and the demo
start several processes on one host the same way; this is the one implementation.

Pick a port the OS says is free, spawn one process per rank, read rank 0's result while they
run (a large result must not block its sender on a full pipe), kill stragglers at the deadline
and check every exit code: a hung or dead peer raises instead of hanging the caller.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from typing import Any

from fcp_data.errors import DataError

__all__ = ["free_port", "run_group"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_group(
    target: Callable[..., None], world: int, *args: Any, timeout_s: float, what: str
) -> Any:
    """Run `target(rank, world, port, out, *args)` on `world` spawned processes.

    `target` must be importable (spawned, not forked) and one rank must `out.put(result)`.
    Returns that result. Raises DataError (a RuntimeError) naming `what` and every exit code
    when a process fails, nothing arrives, or the deadline passes (stragglers are killed).
    """
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, out, *args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    result, got = None, False
    while time.monotonic() < deadline:
        if not out.empty():
            result, got = out.get(), True
            break
        if not any(p.is_alive() for p in procs):
            if not out.empty():
                result, got = out.get(), True
            break
        time.sleep(0.02)
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    if not got or any(c != 0 for c in codes):
        raise DataError(
            f"{what}: process exit codes {codes} (negative: killed, e.g. at the {timeout_s:.0f} s "
            f"deadline), result {'received' if got else 'missing'}"
        )
    return result
