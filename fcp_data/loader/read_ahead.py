"""Background read-ahead of a process's next global batch from remote shards, in a byte budget.

Why: without it a global batch of remote samples waits at least one round trip before its
first sample decodes (the batch's own concurrent prefetch, `BatchBuilder._prefetch`), and one
more for each text chat its loss count reads, one at a time: with 50 ms a request and 8 chats
in a batch of 32 that is ~0.45 s a batch, against ~0.05 s to build it from local shards
(bench/remote_media.py, 2 workers). A process builds its batches one after another
(DataLoader worker w of W builds b, b+W, b+2W, ...; with num_workers=0 the training process
builds b, b+1, ...), so while batch b is decoded, tokenised and collated, the requests of its
next batch can be in flight.

`ReadAhead` (one per process; picklable: each process starts with no state and no thread):

* `submit(source, batch, items)`: the whole reads the next batch's build will make, as
  (position, bytes, reads) in reading order, from that batch's exact plan: the samples this
  replica holds, and the text chats of the global batch that every replica reads to count their
  loss tokens (a held chat is read twice: `reads` = 2). A pool of `THREADS` daemon
  threads takes them from the head of the queue while their bytes fit in what is free of the
  budget (reserved before a request is issued, freed when the sample is taken or dropped),
  fetches each chunk with one `source.prefetch` round (concurrent range requests, neighbours
  joined, as the batch's own prefetch does) and reads every sample with `source.read`, so what
  it holds passed every check a read makes (range answers, lengths, crc32). A sample larger
  than the budget is never queued: it is read on demand.
* `settle(batch, timeout)`: called when that batch is built. Samples still queued are
  dropped (the batch's own prefetch fetches them now), ones in flight are awaited at most
  `timeout`, outside every sample's time limit, so a slow read-ahead costs time but never
  turns into a sample timeout; one still in flight after it is abandoned, dropped on arrival.
  Whatever is held for another batch (one that was never built here) is dropped.
* `take(pos)`: the sample's members, `reads` times, then forgotten; None when the read-ahead
  does not hold it (never queued, failed, abandoned): the caller then reads it exactly as
  without a read-ahead, with the same checks, time limits and errors. A read-ahead's own error
  is never raised. `AheadSource` is the source a build reads through: it takes from the
  read-ahead only when a whole read really happens.
* `close()`: drops what is held or queued and joins the threads (the iteration's end).

What it does not do: read past the batches it is told about (an epoch's last batch has no
next one), fetch a sample its batch does not read, or reserve more than `budget` bytes at
once (`stats.max_held` records the most it did). A sample's bytes are its span in the shard
(its members and the tar headers between them): what one range request of it returns. Bytes
on their way through the shard reader (a joined request's body while it is cut into samples)
are not counted, and at a stop mid-epoch up to one fetched-but-unread chunk per thread stays in
the reader's own range buffer (`RemoteOptions.prefetch_ranges` bounds it), as unread ranges of
the synchronous prefetch do.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError
from ..readers.abandon import AbandonableThread
from ..readers.remote import RemoteReader, is_remote

__all__ = [
    "JOIN_S",
    "THREADS",
    "AheadSource",
    "ReadAhead",
    "ReadAheadStats",
    "ReadProbe",
    "remote_bytes",
]

THREADS = 2
"""Read-ahead threads per process: the range requests of a chunk already run concurrently on
fsspec's event loop (32 at a time), so a second thread only lets one chunk's reads (crc32 and
slicing, ~1 GB/s) overlap the next chunk's requests; more would add GIL contention."""

JOIN_S = 10.0
"""Seconds `close()` waits for each thread. An idle thread leaves at once; one inside a request
has it cancelled first (`readers.abandon`: the connection is closed), so a thread stuck on a
stalled server ends within milliseconds too (it used to cost JOIN_S per thread: 20 s at the
end of an inline epoch behind a stalled server); the limit is only a last resort."""

_QUEUED, _RUNNING, _READY = 0, 1, 2


@dataclass(kw_only=True, slots=True)
class ReadAheadStats:
    """What one process's read-ahead did, for tests and benchmarks (nothing acts on it)."""

    max_held: int = 0
    """Most bytes reserved at once (queued bytes are not reserved); never above the budget."""
    served: int = 0
    """Samples handed to a read instead of being fetched then."""
    unstarted: int = 0
    """Samples still queued when their batch was built: its own prefetch fetched them (no byte
    was fetched twice)."""
    wasted: int = 0
    """Samples the read-ahead fetched (or began to) and nobody used: in flight past the wait of
    their batch (read again on demand), held for a batch that did not read them, or in flight
    at close. 0 in a run without faults, stops or timeouts."""
    failed: int = 0
    """Read-ahead reads that raised; the normal read of the sample reports its error."""


@dataclass(kw_only=True, slots=True)
class _Entry:
    size: int
    batch: tuple[int, int]
    reads: int = 1
    state: int = _QUEUED
    data: Mapping[str, bytes] | None = None
    abandoned: bool = False


class _Pool:
    """One process's queue, held samples, budget and threads (see the module docstring).

    Threads refer to the pool, never to its `ReadAhead`, so a collected `ReadAhead` closes it.
    """

    def __init__(self, budget: int, threads: int, stats: ReadAheadStats) -> None:
        self.budget, self.nthreads, self.stats = budget, threads, stats
        self.cond = threading.Condition()
        self.entries: dict[int, _Entry] = {}
        self.queue: deque[int] = deque()
        self.held = 0
        self.share = 1  # samples per chunk: a 1/threads share of the last submission
        self.source: Any = None
        self.closed = False
        self.threads: list[threading.Thread] = []

    # ---- the caller's side ------------------------------------------------------------------
    def submit(
        self, source: Any, batch: tuple[int, int], items: Iterable[tuple[int, int, int]]
    ) -> None:
        with self.cond:
            if self.closed:
                return
            self.source = source
            for pos, size, reads in items:
                if 0 < size <= self.budget and reads > 0 and pos not in self.entries:
                    self.entries[pos] = _Entry(size=size, batch=batch, reads=reads)
                    self.queue.append(pos)
            self.share = max(1, -(-len(self.queue) // self.nthreads))
            if self.queue and not self.threads:
                self.threads = [
                    AbandonableThread(self._serve, f"fcp-read-ahead-{i}")
                    for i in range(self.nthreads)
                ]
                for t in self.threads:
                    t.start()
            self.cond.notify_all()

    def settle(self, batch: tuple[int, int], timeout: float | None) -> frozenset[int]:
        with self.cond:
            for pos in self.queue:  # never started: the batch's own prefetch fetches them
                del self.entries[pos]
            self.stats.unstarted += len(self.queue)
            self.queue.clear()
            for pos, e in list(self.entries.items()):
                if e.batch == batch:
                    continue
                if e.state == _READY:  # held for a batch that was not built here, or done
                    self._drop(pos, e)
                else:
                    e.abandoned = True
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                busy = [e for e in self.entries.values() if e.state == _RUNNING and not e.abandoned]
                if not busy:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    for e in busy:  # read on demand; dropped when it arrives
                        e.abandoned = True
                    break
                self.cond.wait(left)
            self.cond.notify_all()
            return frozenset(pos for pos, e in self.entries.items() if e.state == _READY)

    def take(self, pos: int) -> Mapping[str, bytes] | None:
        with self.cond:
            e = self.entries.get(pos)
            if e is None or e.state != _READY or e.data is None:
                return None
            self.stats.served += 1
            e.reads -= 1
            if e.reads > 0:  # read again by this build: each read gets its own mapping
                return dict(e.data)
            del self.entries[pos]
            self.held -= e.size
            self.cond.notify_all()
            return e.data

    def close(self, join_s: float) -> None:
        with self.cond:
            self.closed = True
            self.queue.clear()
            for pos, e in list(self.entries.items()):
                if e.state != _RUNNING:  # a running one is dropped when its thread lands it
                    self._drop(pos, e)
            self.cond.notify_all()
            threads = list(self.threads)
        for t in threads:  # a request in flight is cancelled, not waited out (was JOIN_S each)
            t.abandon("the read-ahead was closed")
        for t in threads:
            if t is not threading.current_thread():
                t.join(join_s)

    # ---- the threads' side ------------------------------------------------------------------
    def _drop(self, pos: int, e: _Entry, *, wasted: bool = True) -> None:
        """Forget `pos` (under the lock), freeing its reservation if it had one."""
        del self.entries[pos]
        if e.state == _QUEUED:
            self.stats.unstarted += 1
        else:
            self.held -= e.size
            self.stats.wasted += wasted

    def _next_chunk(self) -> list[tuple[int, _Entry]] | None:
        """(Under the lock.) Reserve the head of the queue that fits the free budget, at most
        `share` samples (so the threads split a batch); None once closed."""
        while not self.closed:
            if self.queue and self.held + self.entries[self.queue[0]].size <= self.budget:
                break
            self.cond.wait()
        if self.closed:
            return None
        chunk: list[tuple[int, _Entry]] = []
        while self.queue and len(chunk) < self.share:
            e = self.entries[self.queue[0]]
            if self.held + e.size > self.budget:
                break
            chunk.append((self.queue.popleft(), e))
            e.state = _RUNNING
            self.held += e.size
        self.stats.max_held = max(self.stats.max_held, self.held)
        return chunk

    def _serve(self) -> None:
        while True:
            with self.cond:
                chunk = self._next_chunk()
                source = self.source
            if chunk is None:
                return
            self._fetch(source, chunk)

    def _fetch(self, source: Any, chunk: list[tuple[int, _Entry]]) -> None:
        # one round of concurrent range requests for the whole chunk; best effort: each read
        # below fetches what this round did not
        with contextlib.suppress(Exception):
            source.prefetch([pos for pos, _ in chunk])
        for pos, e in chunk:
            data: Mapping[str, bytes] | None = None
            failed = False
            with self.cond:
                skip = self.closed or e.abandoned  # the batch reads it itself (or none will)
            if not skip:
                try:
                    data = source.read(pos)
                except Exception:  # the sample's own read, later, reports it by key
                    failed = True
            with self.cond:
                self.stats.failed += failed
                if self.entries.get(pos) is not e:  # cannot happen: only this thread lands it
                    continue
                if data is None or e.abandoned or self.closed:
                    self._drop(pos, e, wasted=not failed)
                else:
                    e.state, e.data = _READY, data
                self.cond.notify_all()


class ReadAhead:
    """One process's read-ahead of its next global batch; see the module docstring.

    `budget`: bytes it may reserve at once (0 turns it off). Picklable: DataLoader workers get
    the budget and start their own threads; a forked child never uses its parent's.
    """

    def __init__(self, budget: int, *, threads: int = THREADS, join_s: float = JOIN_S) -> None:
        self.budget, self.threads, self.join_s = int(budget), int(threads), float(join_s)
        self._fresh()

    def _fresh(self) -> None:
        """This process's state: no pool, no thread, no kept plan, zero counters."""
        self.stats = ReadAheadStats()
        self._pool: _Pool | None = None
        self._finalize: weakref.finalize | None = None
        self._pid = os.getpid()
        self._plan: tuple[int, int, np.ndarray, Any, float] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"budget": self.budget, "threads": self.threads, "join_s": self.join_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.budget, self.threads, self.join_s = state["budget"], state["threads"], state["join_s"]
        self._fresh()

    def _live(self, start: bool) -> _Pool | None:
        """This process's pool (made when `start`); a pool copied by fork is never touched."""
        if self._pid != os.getpid():  # its threads are the parent's; its lock may be held
            self._fresh()
        if self._pool is None and start and self.budget > 0:
            self._pool = _Pool(self.budget, self.threads, self.stats)
            # collected without close() (a loader dropped mid-epoch): its threads still end
            self._finalize = weakref.finalize(self, self._pool.close, 0.0)
        return self._pool

    def submit(
        self, source: Any, batch: tuple[int, int], items: Iterable[tuple[int, int, int]]
    ) -> None:
        """Queue (position, bytes, reads) of batch (epoch, index), in reading order."""
        items = list(items)
        pool = self._live(start=bool(items))
        if pool is not None and items:
            pool.submit(source, batch, items)

    def settle(self, batch: tuple[int, int], *, timeout: float | None) -> frozenset[int]:
        """Batch (epoch, index) is being built: the positions the read-ahead holds for it, after
        waiting at most `timeout` seconds (None: until done) for those in flight."""
        pool = self._live(start=False)
        return frozenset() if pool is None else pool.settle(batch, timeout)

    def take(self, pos: int) -> Mapping[str, bytes] | None:
        """Sample `pos`'s members if held (as many times as it was queued for), else None."""
        pool = self._live(start=False)
        return None if pool is None else pool.take(int(pos))

    def close(self) -> None:
        """Drop everything held or queued and join the threads; a later submit starts anew."""
        pool, fin = self._live(start=False), self._finalize
        self._pool, self._finalize, self._plan = None, None, None
        if fin is not None:
            fin.detach()
        if pool is not None:
            pool.close(self.join_s)

    @property
    def held(self) -> int:
        """Bytes reserved now (in flight or held)."""
        pool = self._live(start=False)
        return 0 if pool is None else pool.held

    # ---- the next batch's plan, planned early to know its samples ---------------------------
    def keep_plan(self, epoch: int, batch: int, ids: np.ndarray, plan: Any, seconds: float) -> None:
        """Keep the plan made for the read-ahead of (epoch, batch) for that batch's build: the
        planner is pure, so planning it again (a few ms a batch) would give the same plan."""
        self._live(start=False)
        self._plan = (epoch, batch, np.array(ids, copy=True), plan, seconds)

    def early_plan(self, epoch: int, batch: int, ids: np.ndarray) -> tuple[Any, float] | None:
        """(plan, planning seconds) kept for (epoch, batch) when it was made for these very
        `ids` (a resumed or elastic sampler may draw others), else None."""
        self._live(start=False)
        kept, self._plan = self._plan, None
        if kept is None or kept[:2] != (epoch, batch) or not np.array_equal(kept[2], ids):
            return None
        return kept[3], kept[4]


class AheadSource:
    """`source` as a build reads it: a whole read (`read(pos)`) of a sample the read-ahead
    holds returns its members from there; every other read and attribute is the source's own.
    The read-ahead is asked only when a read happens, so nothing is taken that is not read."""

    __slots__ = ("_ahead", "_source")

    def __init__(self, source: Any, ahead: ReadAhead) -> None:
        self._source, self._ahead = source, ahead

    def read(self, i: int, exts: Sequence[str] | None = None) -> Mapping[str, bytes]:
        if exts is None:
            data = self._ahead.take(int(i))
            return self._source.read(i) if data is None else data
        return self._source.read(i, exts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


class _Probed(DataError, ValueError):
    """Raised by `ReadProbe.read` instead of reading: every read path catches one of these."""


class ReadProbe:
    """`source` whose reads are recorded and raise instead of happening: running a count on it
    finds which samples that count would read, with no duplicate of its rules."""

    __slots__ = ("_source", "whole")

    def __init__(self, source: Any) -> None:
        self._source, self.whole = source, []

    def read(self, i: int, exts: Sequence[str] | None = None) -> Mapping[str, bytes]:
        if exts is None:  # a subset read (`exts`) is not read ahead: only whole ones are
            self.whole.append(int(i))
        raise _Probed(f"sample {i}: a probe does not read")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    @staticmethod
    def call(what: str, fn: Any) -> Any:
        """A time limit's signature, called at once (a probe makes no read to bound)."""
        return fn()


def remote_bytes(source: Any, pos: int) -> int:
    """Bytes one range request of sample `pos` fetches when it lives in a remote shard; 0 when
    it is local or its source keeps no member table (nothing to read ahead)."""
    sources, source_of = getattr(source, "sources", None), getattr(source, "source_of", None)
    if sources is not None and callable(source_of):  # a Blend: its own source's position
        k = int(source_of(np.asarray([pos]))[0])
        return remote_bytes(sources[k], int(pos) - int(source.offsets[k]))
    url, members = getattr(source, "shard_url", None), getattr(source, "members", None)
    if not callable(url) or not callable(members) or not is_remote(str(url(pos))):
        return 0
    table = members(pos)
    if not table:
        return 0
    start, end = RemoteReader.span(table, None)
    return end - start
