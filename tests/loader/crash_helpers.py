"""Encoders, sources and planners that fail on purpose (module-level: workers unpickle them)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from loader_helpers import TarIndex, simple_planner
from torch.utils.data import get_worker_info

__all__ = ["ExitOn", "FifoIndex", "FreezeMidSend", "HangOn", "HangingPlanner", "KillOn", "RaiseOn"]


class RaiseOn:
    """Byte-encodes samples, raising on the one whose payload starts with `marker`."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        raw = sample["txt"]
        if raw.startswith(self.marker):
            raise OSError("simulated decoder failure")
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64) + 1


class ExitOn(RaiseOn):
    """Kills the worker process outright (a segfaulting decoder) on the marked sample."""

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        if sample["txt"].startswith(self.marker):
            os._exit(3)
        return super().__call__(sample)


class KillOn(RaiseOn):
    """The worker SIGKILLs itself on the marked sample (what the OOM killer does to it)."""

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        if sample["txt"].startswith(self.marker) and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(sample)


class HangOn(RaiseOn):
    """On the marked sample: write this process's pid to `pid_file`, then hang (a stuck decoder)."""

    def __init__(self, marker: bytes, pid_file: str, hang_s: float = 60.0) -> None:
        super().__init__(marker)
        self.pid_file, self.hang_s = pid_file, hang_s

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        if sample["txt"].startswith(self.marker):
            tmp = self.pid_file + ".tmp"
            Path(tmp).write_text(str(os.getpid()))
            os.replace(tmp, self.pid_file)
            time.sleep(self.hang_s)
        return super().__call__(sample)


class FifoIndex(TarIndex):
    """A TarIndex whose sample `victim` lives behind a named pipe nobody writes: reading it
    blocks in open(2), as a read from a dead network mount does."""

    def __init__(self, urls: list[str], tokenizer: Any, *, victim: int, fifo: str) -> None:
        super().__init__(urls, tokenizer)
        self.victim, self.fifo = victim, fifo

    def read(self, i: int) -> dict[str, bytes]:
        if i == self.victim:
            with open(self.fifo, "rb") as f:  # blocks until a writer appears
                return {"txt": f.read()}
        return super().read(i)


class HangingPlanner:
    """simple_planner, but inside a DataLoader worker it stalls `hang_s` on the batch of `total`
    tokens (a stuck or very slow planner)."""

    def __init__(self, total: int, hang_s: float = 60.0) -> None:
        self.total, self.hang_s = total, hang_s

    def __call__(self, seqlens: np.ndarray, cluster: Any, cost: Any, **kw: Any) -> Any:
        if get_worker_info() is not None and int(np.asarray(seqlens).sum()) == self.total:
            time.sleep(self.hang_s)
        return simple_planner(seqlens, cluster, cost, **kw)


class FreezeMidSend(RaiseOn):
    """Byte-encodes samples; on the marked one, arms a freeze of this worker's *send*.

    torch hands a batch's tensors to the main process as file descriptors: the main process
    unpickles the batch, then asks the worker's `multiprocessing.resource_sharer` thread for
    each descriptor, a receive with no timeout. Armed, the next descriptor that thread sends
    first writes this process's pid to `pid_file` and then holds the GIL in a C call
    (`sleep` through `ctypes.PyDLL`, which keeps the GIL) for `freeze_s`: the whole worker is
    frozen mid-send, and the main process waits inside torch's receive.

    The queue thread may still be sending the batch before when the marked sample is read; so
    that the freeze catches the marked sample's own batch, arming waits (sleeping, so that
    thread runs) until the main process has written `received_file`: it got that batch whole.
    """

    def __init__(
        self, marker: bytes, pid_file: str, received_file: str, freeze_s: int = 60
    ) -> None:
        super().__init__(marker)
        self.pid_file, self.received_file, self.freeze_s = pid_file, received_file, freeze_s

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        if sample["txt"].startswith(self.marker) and get_worker_info() is not None:
            for _ in range(3000):  # at most 30 s; the main process writes it within a second
                if os.path.exists(self.received_file):
                    break
                time.sleep(0.01)
            self._arm()
        return np.frombuffer(sample["txt"], dtype=np.uint8).astype(np.int64) + 1

    def _arm(self) -> None:
        import ctypes
        from multiprocessing import resource_sharer

        sharer = resource_sharer._resource_sharer
        register = sharer.register
        pid_file, freeze_s = self.pid_file, self.freeze_s

        def frozen_register(send: Any, close: Any) -> Any:
            def frozen_send(conn: Any, pid: int) -> None:
                tmp = pid_file + ".tmp"
                Path(tmp).write_text(str(os.getpid()))
                os.replace(tmp, pid_file)
                ctypes.PyDLL(None).sleep(freeze_s)  # holds the GIL: nothing else runs
                send(conn, pid)

            sharer.register = register  # only the first descriptor after arming
            return register(frozen_send, close)

        sharer.register = frozen_register
