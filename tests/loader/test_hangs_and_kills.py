"""Nothing hangs, every death is named: stuck reads (a real FIFO), stuck workers, real SIGKILLs."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from crash_helpers import FifoIndex, HangingPlanner, HangOn, KillOn
from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner

from fcp_data.errors import DataError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.loader.global_batch import SampleReadError


def make(index, cost, replica: int, workers: int, **opts) -> FCPDataLoader:
    return FCPDataLoader(
        index,
        cluster=cluster(4),
        cost=cost,
        replica=replica,
        global_batch_size=16,
        num_workers=workers,
        tokenizer=ByteTokenizer(),
        options=LoaderOptions(planner=opts.pop("planner", simple_planner), **opts),
    )


def owner_of(index, cost, key: str) -> int:
    """The replica whose micro-batches hold `key` (planning only: nothing is read)."""
    ld = make(index, cost, 0, 0)
    pos = list(index.keys).index(key)
    for b in range(ld.num_batches):
        ids = ld.sampler.batch(0, b)
        if pos in ids:
            plan = ld._builder.plan(ids)
            s = list(ids).index(pos)
            return next(r for g in plan.groups if s in g.sequence_ids for r in g.replicas)
    raise AssertionError(key)


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_read_stuck_on_a_fifo_is_bounded_inline(shards, cost, tmp_path, on_error) -> None:
    fifo = str(tmp_path / "stuck")
    os.mkfifo(fifo)
    victim = 7
    index = FifoIndex(shards[0], ByteTokenizer(), victim=victim, fifo=fifo)
    key = str(index.keys[victim])
    ld = make(index, cost, owner_of(index, cost, key), 0, on_error=on_error, sample_timeout_s=0.5)
    try:  # the FIFO never gets a writer: only the 0.5 s limit ends the read (else: a hang)
        if on_error == "raise":
            with pytest.raises(SampleReadError, match=rf"{key}.*sample_timeout_s=0.5 s"):
                list(ld)
        else:
            list(ld)
            skipped = [(k, why) for m in ld.metrics_history for k, why in m.skipped]
            assert [k for k, _ in skipped] == [key] and "SampleTimeout" in skipped[0][1]
    finally:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # release the abandoned reader thread
        os.close(fd)


def test_a_hung_worker_raises_after_timeout_s(shards, cost) -> None:
    index = TarIndex(shards[0], ByteTokenizer())
    probe = make(index, cost, 0, 0)
    total = int(index.seqlens[probe.sampler.batch(0, 1)].sum())  # global batch 1 hangs
    ld = make(index, cost, 0, 2, planner=HangingPlanner(total), timeout_s=1.0)
    got = []
    with pytest.raises(DataError) as info:
        for mb in ld:
            got.append(mb.batch_index)
    msg = str(info.value)
    assert "no global batch for 1 s (LoaderOptions.timeout_s)" in msg, msg
    assert "DataLoader worker 1 (pid" in msg and "global batches [1" in msg, msg
    assert set(got) == {0}  # the message names the 1 s limit: what ended the wait


def test_a_slow_batch_within_timeout_s_is_awaited(shards, cost, monkeypatch) -> None:
    """torch is asked in short slices (here 0.2 s) so that dead workers are noticed soon; a
    batch slower than a slice but within timeout_s must still arrive, in order."""
    from fcp_data.loader import prefetch

    monkeypatch.setattr(prefetch, "POLL_S", 0.2)
    index = TarIndex(shards[0], ByteTokenizer())
    probe = make(index, cost, 0, 0)
    total = int(index.seqlens[probe.sampler.batch(0, 1)].sum())
    ref = [mb.digest for mb in probe]
    ld = make(index, cost, 0, 2, planner=HangingPlanner(total, hang_s=1.0), timeout_s=30)
    assert [mb.digest for mb in ld] == ref


def _kill_when_written(pid_file: Path, stop: threading.Event) -> None:
    while not stop.is_set():
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            return
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["self", "outside"])
def test_a_sigkilled_worker_is_one_named_error(shards, cost, tmp_path, how: str) -> None:
    """A worker killed by SIGKILL (itself, or from outside as the OOM killer does) while it
    holds the victim: one DataError naming the worker, its batches in flight and the victim."""
    index = TarIndex(shards[0], ByteTokenizer())
    victim = "s00021"
    marker = shards[1][victim][:24]
    pid_file = tmp_path / "pid"
    enc = KillOn(marker) if how == "self" else HangOn(marker, str(pid_file))
    ld = make(index, cost, owner_of(index, cost, victim), 2, encode=enc, timeout_s=60)
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_written, args=(pid_file, stop), daemon=True)
    killer.start()
    try:
        with pytest.raises(DataError) as info:
            list(ld)
    finally:
        stop.set()
    msg = str(info.value)
    assert "was killed by SIGKILL (often the kernel's OOM killer)" in msg, msg
    assert "DataLoader worker " in msg and "global batches [" in msg, msg
    assert victim in msg, msg  # the suspect is named


def test_a_worker_killed_after_queueing_a_batch(shards, cost) -> None:
    """Killed right after handing over a batch (its tensors still in flight as file descriptors):
    torch may report a bare ConnectionResetError / EOFError; fcp reports one DataError."""
    index = TarIndex(shards[0], ByteTokenizer())
    ld = make(index, cost, 0, 1)
    victims = [str(index.keys[int(i)]) for i in ld.sampler.batch(0, 1)]  # worker 0's 2nd batch
    for victim in victims[:3]:
        marker = shards[1][victim][:24]
        ld = make(index, cost, owner_of(index, cost, victim), 1, encode=KillOn(marker))
        with pytest.raises(DataError) as info:
            list(ld)
        msg = str(info.value)
        assert "DataLoader worker 0" in msg and "SIGKILL" in msg, msg
