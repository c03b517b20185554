"""Naming a DataLoader worker failure: which worker, how it ended, which batches and samples.

When a worker dies (a segfaulting decoder, the OOM killer's SIGKILL) torch reports it in one of
several ways depending on timing: "DataLoader worker (pid(s) ...) exited unexpectedly", or, when
the worker died right after queueing a batch whose tensors travel as file descriptors, a bare
`ConnectionResetError` / `ConnectionRefusedError` / `EOFError` from unpickling. A worker that
hangs shows up as torch's timeout. `worker_failure` turns any of these into one `DataError`
that names the worker, its pid and exit status, the global batches it had in flight and this
replica's samples in them (the suspects), so the bad sample can be found and quarantined.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..errors import DataError

__all__ = ["WORKER_FAULTS", "WorkerEnd", "is_worker_fault", "stop_workers", "worker_failure"]

WORKER_FAULTS = (RuntimeError, OSError, EOFError)
"""What torch raises in the main process when a worker dies or times out."""


class WorkerEnd(NamedTuple):
    """A worker process as it ended: `died` when it was gone before the loader stopped it."""

    pid: int | None
    exitcode: int | None
    died: bool


def is_worker_fault(err: BaseException) -> bool:
    """True for a dead or silent worker; False for an exception the worker itself raised
    (torch re-raises those with "Caught ... in DataLoader worker process N" in the text)."""
    return isinstance(err, WORKER_FAULTS) and "in DataLoader worker process" not in str(err)


def stop_workers(it: Any) -> None:
    """Shut torch's worker processes down now (it deregisters them first, so a worker dying
    later cannot fire torch's SIGCHLD handler into unrelated code), instead of at garbage
    collection, which the traceback of the error being raised would delay."""
    stop = getattr(it, "_shutdown_workers", None)
    if stop is None:
        return
    try:
        stop()
    except RuntimeError:  # the SIGCHLD handler fired inside; its cleanup ran in a finally
        stop()


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running (it stopped answering)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        oom = " (often the kernel's OOM killer)" if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{oom}"
    return f"exited with status {exitcode}"


def worker_failure(
    err: BaseException,
    *,
    processes: Sequence[WorkerEnd],
    epoch: int,
    start: int,
    waiting_for: int,
    stop: int,
    received: Iterable[int],
    prefetch_factor: int,
    replica: int,
    own_keys: Callable[[int], list[str]],
    timeout_s: float | None = None,
) -> DataError:
    """One DataError for a dead or silent worker (see the module docstring).

    Worker w builds batches start+w, start+w+W, ...; the ones it has in flight are its next
    `prefetch_factor` batches from `waiting_for` on that the main process has not received.
    """
    n = max(1, len(processes))
    dead = [w for w, p in enumerate(processes) if p.died]
    if not dead and timeout_s is None:  # died as torch noticed: SIGKILL/crash, not our SIGTERM
        ours = (0, -signal.SIGTERM, None)
        dead = [w for w, p in enumerate(processes) if p.exitcode not in ours]
    suspects = dead or [(waiting_for - start) % n]
    got = set(received)
    parts = []
    keys: list[str] = []
    for w in suspects:
        mine = [b for b in range(waiting_for, stop) if (b - start) % n == w and b not in got]
        mine = mine[:prefetch_factor]
        p = processes[w] if w < len(processes) else WorkerEnd(None, None, False)
        how = _how(p.exitcode) if w in dead else "is stuck (no answer)"
        parts.append(
            f"DataLoader worker {w} (pid {p.pid}) {how} with global batches {mine} of epoch "
            f"{epoch} in flight"
        )
        for b in mine:
            keys += own_keys(b)
    head = "; ".join(parts)
    if timeout_s is not None and not dead:
        head = f"no global batch for {timeout_s:g} s (LoaderOptions.timeout_s): {head}"
    return DataError(
        f"{head}. This replica ({replica}) reads these samples there, one of which is the likely "
        f"cause (a decoder crash or a memory blow-up): {keys[:32]}"
        f"{' ...' if len(keys) > 32 else ''}. torch reported: {type(err).__name__}: {err}"
    )
