"""A DataLoader worker frozen mid-send: the main process's receive is bounded and named.

torch waits for a worker's batch with a timeout, but once the batch's message arrives it
fetches each tensor's file descriptor from the worker with a receive that has none. A worker
that freezes holding the GIL at that moment (a C call that never returns, a stopped process)
left the training loop waiting forever. The worker here really freezes in its own
`resource_sharer` thread, holding the GIL for 60 s (`crash_helpers.FreezeMidSend`); the
loader's watchdog must kill it and its children and raise one DataError naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crash_helpers import FreezeMidSend
from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner

from fcp_data.errors import DataError
from fcp_data.loader import FCPDataLoader, LoaderOptions


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_worker_frozen_mid_send_is_killed_and_named(shards, cost, tmp_path: Path) -> None:
    index = TarIndex(shards[0], ByteTokenizer())
    probe = FCPDataLoader(
        index, cluster=cluster(4), cost=cost, replica=0, global_batch_size=16,
        num_workers=0, tokenizer=ByteTokenizer(),
        options=LoaderOptions(planner=simple_planner),
    )  # fmt: skip
    ids = [int(i) for i in probe.sampler.batch(0, 1)]  # batch 1: after a good one
    victim = str(index.keys[ids[0]])
    plan = probe._builder.plan(ids)
    replica = next(r for g in plan.groups if 0 in g.sequence_ids for r in g.replicas)
    pid_file, received = tmp_path / "pid", tmp_path / "received"
    ld = FCPDataLoader(
        index,
        cluster=cluster(4),
        cost=cost,
        replica=replica,
        global_batch_size=16,
        num_workers=1,
        tokenizer=ByteTokenizer(),
        options=LoaderOptions(
            planner=simple_planner,
            encode=FreezeMidSend(shards[1][victim][:24], str(pid_file), str(received), freeze_s=60),
            timeout_s=1.5,
        ),
    )
    got = []
    with pytest.raises(DataError) as info:  # was: a wait of the whole 60 s freeze, then on
        for mb in ld:
            got.append(mb.batch_index)
            received.touch()  # batch 0 came whole: the worker may freeze on batch 1 now
    msg = str(info.value)
    pid = int(pid_file.read_text())  # the worker froze for real, mid-send
    assert set(got) == {0}  # batch 0 came whole; batch 1 never did
    assert f"DataLoader worker 0 (pid {pid}) froze: the main process had been receiving" in msg
    assert "watchdog killed it and its children with SIGKILL" in msg, msg
    assert "OOM" not in msg, msg  # the loader killed it, not the kernel
    assert "global batches [1" in msg, msg
    assert not _alive(pid)  # ended, not left frozen
    assert os.getpid() != pid
