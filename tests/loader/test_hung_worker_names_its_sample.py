"""A DataLoader worker that hangs is named by what it was really doing, not by its neighbours.

Real worker processes hang on a known key (a sleeping encoder, a regex that holds the GIL) or
in the planner; the loader's watchdog (`LoaderOptions.timeout_s`) must name that worker (the
pid the hanging process wrote itself), the sample and shard it was in, and how it ended, never
a worker that simply finished its batches ("exited with status 0").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from crash_helpers import HangingPlanner, HangOn
from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner

from fcp_data.errors import DataError
from fcp_data.loader import FCPDataLoader, LoaderOptions


class ShardedTarIndex(TarIndex):
    """A TarIndex that tells each sample's shard, as LengthIndex.shard_url does."""

    def shard_url(self, i: int) -> str:
        return self.where[i][0]


class GilHog:
    """Byte-encodes samples; on the marked one runs a regex that backtracks for hours without
    releasing the GIL, so the per-sample time limit's thread cannot fire."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        raw = sample["txt"]
        if raw.startswith(self.marker):
            re.match(r"(a+)+$", "a" * 64 + "b")
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64) + 1


def make(index: Any, cost: Any, replica: int, workers: int, **opts: Any) -> FCPDataLoader:
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


def placed(index: Any, cost: Any, key: str) -> tuple[int, int]:
    """(global batch, replica) that read `key` (planning only: nothing is read)."""
    ld = make(index, cost, 0, 0)
    pos = list(index.keys).index(key)
    for b in range(ld.num_batches):
        ids = list(ld.sampler.batch(0, b))
        if pos in ids:
            plan = ld._builder.plan(np.asarray(ids))
            s = ids.index(pos)
            return b, next(r for g in plan.groups if s in g.sequence_ids for r in g.replicas)
    raise AssertionError(key)


def _raise(ld: FCPDataLoader) -> str:
    """The error that ended the wait: each caller checks that it is the watchdog's, naming the
    hang (a hang waited out instead would end without that error)."""
    with pytest.raises(DataError) as info:
        list(ld)
    return str(info.value)


def test_a_worker_hung_on_a_sample_names_that_sample_and_its_state(
    shards, cost, tmp_path: Path
) -> None:
    """Was: "DataLoader worker 0 ... exited with status 0" and the keys of worker 0's batch."""
    index = ShardedTarIndex(shards[0], ByteTokenizer())
    victim = "s00021"
    batch, replica = placed(index, cost, victim)
    pid_file = tmp_path / "pid"
    enc = HangOn(shards[1][victim][:24], str(pid_file), hang_s=60)
    msg = _raise(make(index, cost, replica, 2, encode=enc, timeout_s=1.0))
    pid = int(pid_file.read_text())  # the process that really hung
    shard = index.shard_url(list(index.keys).index(victim))
    assert f"DataLoader worker {batch % 2} (pid {pid}) hung with global batches [{batch}" in msg
    assert f"it had been reading sample {victim!r} (shard {shard}) for " in msg, msg
    assert "within sample_timeout_s=120 s" in msg, msg
    assert "alive but silent, it was stopped by the loader: it exited with status 0 on the " in msg
    assert msg.count("DataLoader worker ") == 1, msg  # the finished worker is not blamed
    assert f"The sample it was in: [{victim!r}]" in msg, msg
    others = set(make(index, cost, replica, 0)._builder.own_keys(0, batch)) - {victim}
    assert others and not any(repr(k) in msg for k in others), msg


def test_a_read_that_holds_the_gil_past_sample_timeout_s_is_named(shards, cost) -> None:
    """The per-sample limit cannot fire while a C call holds the GIL; the watchdog names it.

    The victim sits in worker 1's first batch: a worker frozen with the GIL while its queue
    thread is half-way through sending an earlier batch would block torch's receive itself.
    """
    index = ShardedTarIndex(shards[0], ByteTokenizer())
    victim = str(index.keys[int(make(index, cost, 0, 0).sampler.batch(0, 1)[0])])
    batch, replica = placed(index, cost, victim)
    assert batch == 1
    ld = make(
        index,
        cost,
        replica,
        2,
        encode=GilHog(shards[1][victim][:24]),
        timeout_s=1.5,
        sample_timeout_s=0.5,
    )
    msg = _raise(ld)
    assert f"DataLoader worker {batch % 2} (pid " in msg and " hung with global batches" in msg
    assert f"reading sample {victim!r} (shard " in msg, msg
    assert "past its sample_timeout_s=0.5 s" in msg, msg
    assert f"The sample it was in: [{victim!r}]" in msg, msg


@pytest.mark.parametrize(
    "batch, says",
    [
        (1, "it had not started reading a sample yet, so it was stuck planning"),
        (3, "it was not reading a sample: its last call ("),
    ],
)
def test_a_worker_hung_outside_a_sample_read_names_no_sample(
    shards, cost, batch: int, says: str
) -> None:
    """Worker 1 hangs planning its first batch (1) or its second (3, after reading batch 1)."""
    index = TarIndex(shards[0], ByteTokenizer())
    probe = make(index, cost, 0, 0)
    total = int(index.seqlens[probe.sampler.batch(0, batch)].sum())
    msg = _raise(make(index, cost, 0, 2, planner=HangingPlanner(total), timeout_s=1.0))
    assert "DataLoader worker 1 (pid " in msg and f" hung with global batches [{batch}" in msg
    assert says in msg and "stuck planning" in msg, msg
    assert "The sample it was in" not in msg and "one of which is the likely cause" in msg
    assert msg.count("DataLoader worker ") == 1, msg
