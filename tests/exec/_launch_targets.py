"""Process targets for test_launch (importable by spawned children)."""

from __future__ import annotations

import time
from typing import Any


def answer(rank: int, world: int, port: int, out: Any, value: int) -> None:
    if rank == 0:
        out.put({"world": world, "port": port, "value": value})


def fail_on_rank_1(rank: int, world: int, port: int, out: Any) -> None:
    if rank == 1:
        raise SystemExit(3)
    out.put("rank 0 done")


def hang(rank: int, world: int, port: int, out: Any) -> None:
    time.sleep(60)
