"""Naming a DataLoader worker failure: which worker, how it ended, which batches and samples.

When a worker dies (a segfaulting decoder, the OOM killer's SIGKILL) torch reports it in one of
several ways depending on timing: "DataLoader worker (pid(s) ...) exited unexpectedly", or, when
the worker died right after queueing a batch whose tensors travel as file descriptors, a bare
`ConnectionResetError` / `ConnectionRefusedError` / `EOFError` from unpickling. A worker that
hangs shows up as torch's timeout. `worker_failure` turns any of these into one `DataError`
that names the worker, its pid and exit status, the global batches it had in flight and this
replica's samples in them (the suspects), so the bad sample can be found and quarantined.

What a worker was doing when it hung or died is read from a `WorkerBoard`: each worker writes
the call it is in (`SampleTimeLimit` names it: "reading sample 'k'") to a small file of its
own before the call and marks it done after, so the main process can name the exact sample
(and its shard) instead of only the batches in flight. A worker that ended with status 0
before the loader stopped it has finished its share (torch stops each worker when its batches
run out) and is never the one blamed for a hang.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..errors import DataError

__all__ = [
    "WORKER_FAULTS",
    "ReceiveWatchdog",
    "WorkerBoard",
    "WorkerEnd",
    "is_worker_fault",
    "stop_workers",
    "worker_failure",
]

WORKER_FAULTS = (RuntimeError, OSError, EOFError)
"""What torch raises in the main process when a worker dies or times out."""


class WorkerEnd(NamedTuple):
    """A worker process as it ended: `died` when it was gone before the loader stopped it."""

    pid: int | None
    exitcode: int | None
    died: bool


_SAMPLE = re.compile(r"sample ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_BOARDS: weakref.WeakSet[WorkerBoard] = weakref.WeakSet()  # live boards of this process


def _remove_board(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker collecting its copy must not remove it
        shutil.rmtree(path, ignore_errors=True)


class WorkerBoard:
    """Where each DataLoader worker of a loader says which call it is in (see the module doc).

    One file per worker process, named by its pid, rewritten in place (one `pwrite`, a few
    microseconds) when a call starts and when it ends; only processes other than the one that
    made the board write. Picklable: spawned workers get the folder, not the registry entry.
    `locate(epoch, batches, key)` is set by the loader (main process only) and names the
    sample's shard; `reset()` forgets the records of earlier workers before new ones start, so
    a reused pid cannot inherit a dead worker's record.
    """

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="fcp-workers-")
        self.owner = os.getpid()
        self.locate: Callable[[int, Sequence[int], str], str | None] | None = None
        self._fd, self._fd_pid, self._written = -1, -1, 0
        weakref.finalize(self, _remove_board, self.path, self.owner)
        _BOARDS.add(self)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "owner": self.owner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.owner, self.locate = state["path"], state["owner"], None
        self._fd, self._fd_pid, self._written = -1, -1, 0

    def _write(self, record: dict[str, Any]) -> None:
        pid = os.getpid()
        if pid == self.owner:
            return  # inline (num_workers=0): the time limit names the sample itself
        if self._fd_pid != pid:  # first write of this process (a fork copies the object)
            try:
                self._fd = os.open(os.path.join(self.path, str(pid)), os.O_WRONLY | os.O_CREAT)
            except OSError:  # the board is gone (the loader was collected): nothing to tell
                self._fd = -1
            self._fd_pid, self._written = pid, 0
        if self._fd < 0:
            return
        data = json.dumps(record).encode()
        pad = b" " * max(0, self._written - len(data))  # JSON allows trailing blanks
        try:
            os.pwrite(self._fd, data + pad, 0)
        except OSError:
            return
        self._written = len(data)

    def begin(self, what: str, limit_s: float) -> None:
        """This worker now runs `what` (a sample read, a decode) under a `limit_s` limit."""
        self._write({"what": what, "since": time.time(), "busy": True, "limit_s": limit_s})

    def end(self, what: str) -> None:
        """`what` returned (or raised, or timed out): the worker is past it."""
        self._write({"what": what, "since": time.time(), "busy": False})

    def reset(self) -> None:
        """Forget every record (called before a new set of workers starts)."""
        for name in os.listdir(self.path) if os.path.isdir(self.path) else ():
            with contextlib.suppress(OSError):  # removed already
                os.unlink(os.path.join(self.path, name))

    def record(self, pid: int) -> dict[str, Any] | None:
        """The last record the worker with this pid wrote, or None."""
        try:
            with open(os.path.join(self.path, str(pid)), "rb") as f:
                rec = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None


def _sample_in(what: str) -> str | None:
    """The key in "reading sample 'k'" (the time limit's description of a call), or None."""
    match = _SAMPLE.search(what)
    if match is None:
        return None
    try:
        key = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return None
    return key if isinstance(key, str) else None


def _doing(
    pid: int | None, epoch: int, batches: Sequence[int], now: float
) -> tuple[str, str | None]:
    """What the worker with `pid` was doing, from the newest record any live board holds:
    (a phrase for the message, the key of the sample it was in or None)."""
    if pid is None:
        return "", None
    boards = list(_BOARDS)
    found = [(rec, b) for b in boards if (rec := b.record(pid)) is not None]
    if not found:  # every sample read writes a record first: this worker started none
        return (
            "; it had not started reading a sample yet, so it was stuck planning or starting"
            if boards
            else "",
            None,
        )
    rec, board = max(found, key=lambda rb: float(rb[0].get("since", 0.0)))
    what = str(rec.get("what", "?"))
    ago = max(0.0, now - float(rec.get("since", now)))
    if not rec.get("busy"):
        return (
            f"; it was not reading a sample: its last call ({what}) had returned {ago:.1f} s "
            "before, so it was stuck planning or collating",
            None,
        )
    key = _sample_in(what)
    where = ""
    if key is not None and board.locate is not None:
        try:
            shard = board.locate(epoch, batches, key)
        except Exception:  # naming the shard is a courtesy; never mask the failure itself
            shard = None
        where = f" (shard {shard})" if shard else ""
    limit = float(rec.get("limit_s", 0.0))
    bound = (
        f", past its sample_timeout_s={limit:g} s (a call that holds the GIL cannot be interrupted)"
        if 0 < limit < ago
        else f", within sample_timeout_s={limit:g} s"
        if limit > 0
        else " (sample_timeout_s=0: no per-sample limit)"
    )
    return f"; it had been {what}{where} for {ago:.1f} s{bound}", key


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s descendants, deepest last (Linux /proc; elsewhere none)."""
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants; a descendant that leads its own process group
    (a `pipe:` command started in its own session) takes its whole group with it."""
    for child in [*_children(pid), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if child != pid and os.getpgid(child) == child:
                os.killpg(child, signal.SIGKILL)
            else:
                os.kill(child, signal.SIGKILL)


class ReceiveWatchdog:
    """Bounds one wait of the main process for a batch from its DataLoader workers.

    torch waits on its result queue with a timeout (`LoaderOptions.timeout_s`, in slices), but
    once a message starts to arrive its receive has none: a worker frozen mid-send (a C call
    holding the GIL, a stopped process) leaves a half-read message or an unanswered request for
    a tensor's file descriptor, and the main process waits forever. The watchdog, a daemon
    thread, is armed around each `next()` on torch's iterator; a wait longer than `limit_s`
    (timeout_s plus one polling slice, 605 s by default) kills the worker processes and their
    children with SIGKILL, which ends the blocked receive with an error the loader names
    (`fired`: pid -> seconds it had waited). A normal wait never comes near the limit: torch
    returns or times out within one slice.
    """

    def __init__(self, limit_s: float, processes: Callable[[], Sequence[Any]]) -> None:
        self.limit_s, self._processes = limit_s, processes
        self.fired: dict[int, float] = {}
        self._cond = threading.Condition()
        self._since: float | None = None
        self._stop = False
        self._thread = threading.Thread(
            target=self._watch, name="fcp-receive-watchdog", daemon=True
        )
        self._thread.start()

    def arm(self) -> None:
        with self._cond:
            self._since = time.monotonic()
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._since = None

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        with self._cond:
            while not self._stop:
                if self._since is None:
                    self._cond.wait()
                    continue
                waited = time.monotonic() - self._since
                if waited < self.limit_s:
                    self._cond.wait(self.limit_s - waited)
                    continue
                for proc in self._processes():
                    pid = getattr(proc, "pid", None)
                    if pid is not None and proc.exitcode is None:
                        self.fired[int(pid)] = waited
                        kill_tree(int(pid))
                self._since = None


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


def _stopped(exitcode: int | None) -> str:
    """How a worker the loader had to stop ended, as observed after torch's shutdown."""
    if exitcode is None:
        return "it had not exited yet when last checked"
    if exitcode == 0:  # torch's SIGTERM handler in a worker exits with 0
        return "it exited with status 0 on the SIGTERM of torch's shutdown"
    return f"it {_how(exitcode)}"


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
    frozen: dict[int, float] | None = None,
) -> DataError:
    """One DataError for a dead or silent worker (see the module docstring).

    Worker w builds batches start+w, start+w+W, ...; the ones it has in flight are its next
    `prefetch_factor` batches from `waiting_for` on that the main process has not received.
    On a timeout (`timeout_s` set) the worker owing batch `waiting_for` is the hung one: it
    was alive and silent; one that exited with status 0 had simply run out of batches.
    """
    now = time.time()
    n = max(1, len(processes))
    owing = (waiting_for - start) % n
    died = [w for w, p in enumerate(processes) if p.died]
    failed = [w for w in died if processes[w].exitcode != 0]  # 0: finished its share
    if timeout_s is not None:  # silent: the worker owing the awaited batch, and any crash
        dead = [w for w in died if w in failed or w == owing]
        suspects = sorted({owing, *failed})
    elif frozen:  # the watchdog killed them: they are the suspects, not an OOM killer
        dead = [w for w, p in enumerate(processes) if p.pid in frozen]
        suspects = dead
    else:
        dead = failed or died
        if not dead:  # died as torch noticed: SIGKILL/crash, not our SIGTERM
            ours = (0, -signal.SIGTERM, None)
            dead = [w for w, p in enumerate(processes) if p.exitcode not in ours]
        suspects = dead or [owing]
    got = set(received)
    parts = []
    keys: list[str] = []
    named: list[str] = []
    for w in suspects:
        mine = [b for b in range(waiting_for, stop) if (b - start) % n == w and b not in got]
        mine = mine[:prefetch_factor]
        p = processes[w] if w < len(processes) else WorkerEnd(None, None, False)
        after = ""
        if frozen and p.pid in frozen:
            how = (
                f"froze: the main process had been receiving one of its batches for "
                f"{frozen[p.pid]:.1f} s without getting it (a worker holding the GIL or stopped "
                "cannot answer torch's receive, which has no timeout), so the loader's watchdog "
                "killed it and its children with SIGKILL"
            )
        elif w in dead:
            how = _how(p.exitcode)
        elif timeout_s is not None:
            how = "hung"
            after = f"; alive but silent, it was stopped by the loader: {_stopped(p.exitcode)}"
        else:
            how = "is stuck (no answer)"
        doing, key = _doing(p.pid, epoch, mine, now)
        parts.append(
            f"DataLoader worker {w} (pid {p.pid}) {how} with global batches {mine} of epoch "
            f"{epoch} in flight{doing}{after}"
        )
        if key is not None:
            named.append(key)
        for b in mine:
            keys += own_keys(b)
    head = "; ".join(parts)
    if timeout_s is not None:
        head = f"no global batch for {timeout_s:g} s (LoaderOptions.timeout_s): {head}"
    if named:
        tail = (
            f"The sample{'s' if len(named) > 1 else ''} it was in: {named} (this replica, "
            f"{replica}); quarantine it or find why it hangs or crashes the reader"
        )
    else:
        tail = (
            f"This replica ({replica}) reads these samples there, one of which is the likely "
            f"cause (a decoder crash or a memory blow-up): {keys[:32]}"
            f"{' ...' if len(keys) > 32 else ''}"
        )
    return DataError(f"{head}. {tail}. torch reported: {type(err).__name__}: {err}")
