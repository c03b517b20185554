"""N replicas in N separate processes (spawn), as in a real job: exit codes and a timeout.

Each replica also runs fcp_exec's ring attention on its micro-batches (see mp_replica).
"""

from __future__ import annotations

import pickle

import torch.multiprocessing as mp
from loader_helpers import ByteTokenizer, TarIndex
from mp_replica import replica_main
from test_loader_epoch import check_epoch

N = 3


def test_replicas_in_separate_processes(shards, tmp_path) -> None:
    ctx = mp.get_context("spawn")
    procs = []
    for r in range(N):
        # replica 1 plans in DataLoader workers inside its process, the others inline
        p = ctx.Process(
            target=replica_main,
            args=(
                r,
                N,
                shards[0],
                str(tmp_path / f"r{r}.pkl"),
                2 if r == 1 else 0,
                str(tmp_path / "store"),
            ),
        )
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
    # fcp_exec's ring attention over the loader's shards equals attention on whole sequences
    results = [(tmp_path / f"r{r}.pkl.err").read_text().split() for r in range(N)]
    errors = [float(e) for e, _ in results]
    assert max(errors) < 1e-4, errors  # float32 kernels; a layout bug is O(1)
    assert sum(int(n) for _, n in results) > 0, "no ring of degree > 1 was checked: vacuous"
