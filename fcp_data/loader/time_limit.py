"""A per-sample time limit that works in the training process too (num_workers=0).

A read stuck on a dead network mount or a decoder spinning on a crafted file never returns;
without a limit, training hangs with no word. `SampleTimeLimit` runs each call in one helper
thread and waits at most `seconds`: past it the caller gets `SampleTimeout` (the loader turns
it into a skipped or raised bad sample, by key) and the stuck thread is abandoned: Python cannot
kill a thread, so it is a daemon that dies with the process, and the next call starts a fresh
one. Signals (SIGALRM) were not used: they cannot interrupt C code (FFmpeg) that never returns
to the interpreter, and they only work in the main thread. What an abandoned thread waits on
is ended, though (`fcp_data.readers.abandon`): a `pipe:` command is killed with its children and
an HTTP range request is cancelled, so neither outlives the sample that gave up on it.

The hand-off costs a few tens of microseconds per sample, small next to reading one.

Inside a DataLoader worker a call that never returns (one holding the GIL, or one under a
limit longer than `LoaderOptions.timeout_s`) is caught by the loader's watchdog instead; so
that its error can name the sample, each call is also written to the loader's `WorkerBoard`
(which call, since when, under which limit) before it starts and marked done after.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import DataError
from ..readers.abandon import AbandonableThread
from .workers import WorkerBoard

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
        self.thread = AbandonableThread(self._serve, "fcp-sample-reader")
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

    def __init__(self, seconds: float, board: WorkerBoard | None = None) -> None:
        self.seconds = float(seconds)
        self.board = board  # where a DataLoader worker says which call it is in
        self._worker: _Worker | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "board": self.board}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.seconds, self._worker = state["seconds"], None
        self.board = state.get("board")

    def __call__(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()`, or SampleTimeout naming `what` when it takes longer than the limit."""
        board = self.board
        if board is None:
            return self._call(what, fn)
        board.begin(what, self.seconds)
        try:
            return self._call(what, fn)
        finally:
            board.end(what)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
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
            why = f"{what} did not finish within sample_timeout_s={self.seconds:g} s"
            w.thread.abandon(why)  # ends what it waits on: a pipe: command, a range request
            raise SampleTimeout(
                f"{why} (a hung read or decoder; what it waited on, a pipe: command or a "
                "range request, was ended); raise LoaderOptions.sample_timeout_s if such "
                "samples are legitimately slow"
            )
        ok, value = box[0]
        if not ok:
            raise value
        return value
