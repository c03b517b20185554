"""N replicas in N separate processes (spawn), as in a real job: exit codes and a timeout."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch.multiprocessing as mp
from conftest import cluster
from loader_helpers import ByteTokenizer, TarIndex, simple_planner
from test_loader_epoch import check_epoch

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import CostModel

N = 3


def _replica_main(replica: int, urls: list[str], out: str, num_workers: int) -> None:
    """One replica's process: its own index handle and loader; dumps what it yielded."""
    index = TarIndex(urls, ByteTokenizer())
    ld = FCPDataLoader(
        index, cluster=cluster(N), cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica, global_batch_size=16, seed=3, num_workers=num_workers,
        tokenizer=ByteTokenizer(), options=LoaderOptions(planner=simple_planner),
    )
    mbs = list(ld)
    Path(out).write_bytes(pickle.dumps(mbs))


def test_replicas_in_separate_processes(shards, tmp_path) -> None:
    ctx = mp.get_context("spawn")
    procs = []
    for r in range(N):
        # replica 1 plans in DataLoader workers inside its process, the others inline
        p = ctx.Process(target=_replica_main,
                        args=(r, shards[0], str(tmp_path / f"r{r}.pkl"), 2 if r == 1 else 0))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(timeout=120)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * N, f"replica exit codes {codes} (None = timed out)"
    per_replica = [pickle.loads((tmp_path / f"r{r}.pkl").read_bytes()) for r in range(N)]
    check_epoch(per_replica, shards[1], TarIndex(shards[0], ByteTokenizer()))
