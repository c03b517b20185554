"""A per-sample time limit that works in the training process too (num_workers=0).

A read stuck on a dead network mount or a decoder spinning on a crafted file never returns;
without a limit, training hangs with no word. `SampleTimeLimit` runs each call in one helper
thread and waits at most `seconds`: past it the caller gets `SampleTimeout` (the loader turns
it into a skipped or raised bad sample, by key) and the stuck thread is abandoned: Python cannot
kill a thread, so it is a daemon that dies with the process, and the next call starts a fresh
one. Signals (SIGALRM) were not used: they cannot interrupt C code (FFmpeg) that never returns
to the interpreter, and they only work in the main thread.

The hand-off costs a few tens of microseconds per sample, small next to reading one.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import DataError

__all__ = ["SampleTimeLimit", "SampleTimeout"]

T = TypeVar("T")


class SampleTimeout(DataError):
    """One sample's read or decode did not finish within the limit."""


class _Worker:
    """One daemon thread serving calls from a queue; abandoned when a call overruns."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue.SimpleQueue()
        )
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._serve, name="fcp-sample-reader", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box.append((True, fn()))
            except BaseException as e:  # handed to the caller, who re-raises it
                box.append((False, e))
            done.set()


class SampleTimeLimit:
    """Call functions with a time limit of `seconds` (0: call directly, no limit).

    Picklable: the thread is not sent to DataLoader workers, and a forked child (where the
    parent's thread does not exist) starts its own.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self._worker: _Worker | None = None

    def __getstate__(self) -> dict[str, float]:
        return {"seconds": self.seconds}

    def __setstate__(self, state: dict[str, float]) -> None:
        self.seconds, self._worker = state["seconds"], None

    def __call__(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()`, or SampleTimeout naming `what` when it takes longer than the limit."""
        if self.seconds <= 0:
            return fn()
        w = self._worker
        if w is None or w.pid != os.getpid() or not w.thread.is_alive():
            w = self._worker = _Worker()
        box: list[Any] = []
        done = threading.Event()
        w.jobs.put((fn, box, done))
        if not done.wait(self.seconds):
            self._worker = None  # abandon the stuck thread; the next call gets a fresh one
            raise SampleTimeout(
                f"{what} did not finish within sample_timeout_s={self.seconds:g} s (a hung "
                "read or decoder); raise LoaderOptions.sample_timeout_s if such samples are "
                "legitimately slow"
            )
        ok, value = box[0]
        if not ok:
            raise value
        return value
