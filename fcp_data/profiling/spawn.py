"""Two or more spawned processes with a hard deadline (the P2P measurement's launcher).

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

from ..errors import DataError

__all__ = ["free_port", "spawn_group"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def spawn_group(
    target: Callable[..., None], world: int, *args: Any, timeout_s: float, what: str
) -> Any:
    """Run `target(rank, world, port, out, *args)` on `world` spawned processes; one of them
    must `out.put(result)`, which is returned."""
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
