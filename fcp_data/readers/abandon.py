"""Ending work that a caller gave up on, instead of leaving it running.

The loader's `SampleTimeLimit` runs a sample's read in a helper thread and stops waiting after
`sample_timeout_s`; Python cannot kill that thread. What the thread waits on can be ended,
though: a `pipe:` command (killed with its process group, so `sh -c` children go too) or an
HTTP range request (its future cancelled on the event loop, which closes the connection).
Code that starts such work registers how to end it with `on_abandon`; whoever gives up on the
thread calls `AbandonableThread.abandon(reason)`, which runs those hooks once. Before this a
stalled `pipe:` command kept running after its sample timed out and every later sample of the
shard waited out its own whole limit behind it.

Nothing is kept at module level: the hooks live on the thread object itself, and code running
on any other thread (the main thread at index time, a DataLoader worker's own) registers
nothing and is ended by its own limits (`stream_timeout_s`, `stall_timeout_s`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["AbandonableThread", "abandoned", "on_abandon"]

Hook = Callable[[str], None]


class AbandonableThread(threading.Thread):
    """A daemon thread whose caller may give up on it: `abandon` ends what it waits on."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        super().__init__(target=target, name=name, daemon=True)
        self.fcp_lock = threading.Lock()
        self.fcp_hooks: list[Hook] = []
        self.fcp_abandoned: str | None = None

    def abandon(self, reason: str) -> None:
        """Mark the thread abandoned (`reason`: why) and end what it waits on, once."""
        with self.fcp_lock:
            if self.fcp_abandoned is not None:
                return
            self.fcp_abandoned = reason
            hooks, self.fcp_hooks = self.fcp_hooks, []
        for hook in hooks:  # each hook ends its own work; they suppress their own faults
            hook(reason)


def on_abandon(end: Hook) -> Callable[[], None]:
    """Run `end(reason)` if the calling thread is abandoned while the work lasts; returns the
    function that unregisters it (call it when the work is done). On an abandoned thread
    `end` runs at once; on any other kind of thread nothing is registered."""
    thread = threading.current_thread()
    if not isinstance(thread, AbandonableThread):
        return _nothing
    with thread.fcp_lock:
        reason = thread.fcp_abandoned
        if reason is None:
            thread.fcp_hooks.append(end)
    if reason is not None:
        end(reason)
        return _nothing

    def remove() -> None:
        with thread.fcp_lock:
            if end in thread.fcp_hooks:
                thread.fcp_hooks.remove(end)

    return remove


def abandoned() -> str | None:
    """Why the calling thread was abandoned, or None (also on any other kind of thread)."""
    thread = threading.current_thread()
    return thread.fcp_abandoned if isinstance(thread, AbandonableThread) else None


def _nothing() -> None:
    return None
