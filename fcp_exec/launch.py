"""Local process groups for gloo jobs: a free port and a spawned group with a hard deadline.

Benchmarks, the profiler and examples start several processes on one host the same way: pick
a port the OS says is free, spawn one process per rank, wait for rank 0's result with a
deadline (a hung peer must not hang the caller), kill stragglers and check every exit code.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from typing import Any

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
    Returns that result. Raises RuntimeError naming `what` and every exit code when a process
    fails, nothing arrives, or the deadline passes (stragglers are killed, never waited for).
    """
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, out, *args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    result, got = None, False
    # read while the processes run: a large result must not block its sender on a full pipe
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
        raise RuntimeError(
            f"{what}: process exit codes {codes} (negative: killed, e.g. at the {timeout_s:.0f} s "
            f"deadline), result {'received' if got else 'missing'}"
        )
    return result
