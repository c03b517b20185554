"""Global batches built ahead in torch DataLoader workers, delivered in order, faults named.

Worker w of W plans and collates global batches start+w, start+w+W, ... and torch hands their
results back round-robin, so batch b+1 is planned (the paper's asynchronous CPU scheduling)
while the training loop runs batch b. With remote shards a worker also reads ahead its own next
batch, b+W, while it builds b (`read_ahead`); its threads end with the worker's iteration. With
num_workers=0 the same code runs inline (reading ahead b+1) and yields identical batches. A
dead or silent worker becomes one DataError (see `workers`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import DataError
from .global_batch import BatchBuilder
from .handoff import one_buffer
from .options import LoaderOptions
from .types import PlannedBatch
from .workers import (
    WORKER_FAULTS,
    ReceiveWatchdog,
    WorkerEnd,
    is_worker_fault,
    stop_workers,
    worker_failure,
)

__all__ = ["POLL_S", "planned_batches"]

POLL_S = 5.0
"""Seconds torch waits on its queue before checking that every worker is alive."""


class _PlannedBatches(IterableDataset):
    """Global batches [start, stop) of one epoch, dealt round-robin to DataLoader workers."""

    def __init__(self, builder: BatchBuilder, epoch: int, start: int, stop: int) -> None:
        self.builder, self.epoch, self.start, self.stop = builder, epoch, start, stop

    def __iter__(self) -> Iterator[PlannedBatch]:
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        order = self.builder.sampler.order(self.epoch)
        try:
            for b in range(self.start + w, self.stop, n):
                after = b + n if b + n < self.stop else None  # this process's next batch
                pb = self.builder.build(self.epoch, b, order, next_batch=after)
                if info is not None:  # crossing a process boundary: one buffer per micro-batch
                    pb.micro_batches = [one_buffer(mb) for mb in pb.micro_batches]
                yield pb
        finally:  # the epoch's end, a stop or an error: no read-ahead outlives its iteration
            self.builder.close()


def _identity(x: PlannedBatch) -> PlannedBatch:
    return x


def planned_batches(
    builder: BatchBuilder,
    epoch: int,
    start: int,
    stop: int,
    *,
    num_workers: int,
    prefetch_factor: int,
    options: LoaderOptions,
) -> Iterator[PlannedBatch]:
    """Batches [start, stop) of `epoch` in order, built inline or by `num_workers` workers."""
    ds = _PlannedBatches(builder, epoch, start, stop)
    if start >= stop:
        return
    if num_workers == 0:
        yield from ds
        return
    opts = options
    dl = DataLoader(
        ds,
        batch_size=None,
        num_workers=min(num_workers, max(stop - start, 1)),
        prefetch_factor=prefetch_factor,
        collate_fn=_identity,
        pin_memory=opts.pin_memory,
        # torch waits in slices of at most POLL_S and checks its workers after each, so a dead
        # worker is noticed within seconds even where its SIGCHLD handler is not installed (a
        # loader iterated off the main thread); the total wait, timeout_s, is counted here
        timeout=min(opts.timeout_s, POLL_S) if opts.timeout_s > 0 else POLL_S,
        multiprocessing_context=opts.multiprocessing_context,
    )
    it = iter(dl)
    dog = None
    if opts.timeout_s > 0:  # torch's receive itself has no timeout: a frozen sender ends here
        dog = ReceiveWatchdog(
            opts.timeout_s + min(opts.timeout_s, POLL_S),
            lambda: list(getattr(it, "_workers", [])),
        )
    try:
        yield from _receive(it, dog, builder, epoch, start, stop, prefetch_factor, opts)
    finally:
        if dog is not None:
            dog.close()


def _receive(
    it: Iterator[PlannedBatch],
    dog: ReceiveWatchdog | None,
    builder: BatchBuilder,
    epoch: int,
    start: int,
    stop: int,
    prefetch_factor: int,
    opts: LoaderOptions,
) -> Iterator[PlannedBatch]:
    """torch's batches in order, every fault of a worker turned into one named DataError."""
    pending: dict[int, PlannedBatch] = {}
    nxt = start
    waited_since = time.monotonic()
    while True:
        if dog is not None:
            dog.arm()
        try:
            try:
                pb = next(it)
            finally:  # at once: the shutdown below must not be taken for a frozen receive
                if dog is not None:
                    dog.disarm()
        except StopIteration:
            break
        except Exception as e:
            frozen = dict(dog.fired) if dog is not None else {}  # killed: any error it caused
            if not frozen and not (isinstance(e, WORKER_FAULTS) and is_worker_fault(e)):
                raise  # the worker's own exception (a bad sample's SampleReadError, ...)
            silent = "DataLoader timed out after" in str(e) and not frozen
            waited = time.monotonic() - waited_since
            if silent and (opts.timeout_s == 0 or waited < opts.timeout_s):
                continue  # a slice of the wait passed and every worker is alive
            procs = list(getattr(it, "_workers", []))  # torch's worker processes, in order
            before = [p.exitcode for p in procs]  # who had died before the shutdown
            stop_workers(it)
            ends = [
                WorkerEnd(p.pid, b if b is not None else p.exitcode, b is not None)
                for p, b in zip(procs, before)
            ]
            raise worker_failure(
                e,
                processes=ends,
                epoch=epoch,
                start=start,
                waiting_for=nxt,
                stop=stop,
                received=pending,
                prefetch_factor=prefetch_factor,
                replica=builder.replica,
                own_keys=lambda b: builder.own_keys(epoch, b),
                timeout_s=opts.timeout_s if silent else None,
                frozen=frozen,
            ) from e
        waited_since = time.monotonic()
        pending[pb.batch_index] = pb  # torch returns workers' items round-robin
        while nxt in pending:
            yield pending.pop(nxt)
            nxt += 1
    if pending or nxt != stop:
        raise DataError(f"DataLoader workers delivered batches up to {nxt}, need {stop}")
