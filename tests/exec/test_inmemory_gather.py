"""fcp_exec.gather: per-token outputs back in sample order, within CP groups and on every replica.

One job of 3 gloo processes (a reversed degree-2 ring, a degree-1 group, a wave replica 0 sits
out): `gather_sequences` returns each group's sequences on every member, `all_gather_sequences`
every sequence everywhere, both equal to the input values; outputs of the wrong length,
dtype/shape or count, and a replica holding another plan, raise GatherError on every rank (none
hangs). Single-process cases check the local errors without a process group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fcp_data.inmemory import InMemoryBatch, shard_batch
from fcp_data.planner import Cluster, CostModel
from fcp_exec import CPGroupCache, ReplicaRanks
from fcp_exec.gather import GatherError, all_gather_sequences, gather_sequences

from ._dist import run_distributed
from ._inmemory_gather_job import LENS, gather_worker, values


def test_gather_within_groups_and_on_every_replica_on_three_processes(tmp_path: Path) -> None:
    out = tmp_path / "gather"
    run_distributed(gather_worker, 3, str(out), timeout=240)
    results = [torch.load(f"{out}.{r}", weights_only=False) for r in range(3)]
    want = [values(k, n) for k, n in enumerate(LENS)]
    owned = {0: {0, 2}, 1: {1, 3}, 2: {0, 2, 3}}  # the plan of _inmemory_gather_job
    for r, res in enumerate(results):
        assert set(res["group"]) == owned[r]
        for k in owned[r]:
            assert torch.equal(res["group"][k][1:], want[k][1:])  # label-aligned: value 0 fills
            assert not res["group"][k][0].any()
        assert len(res["all"]) == len(LENS)
        for k, t in enumerate(res["all"]):
            assert torch.equal(t[1:], want[k][1:]), (r, k)
            assert torch.equal(res["tokens"][k], torch.arange(1, LENS[k] + 1))
        errs = res["errors"]
        for fn in ("gather_sequences", "all_gather_sequences"):
            assert "outputs of ranks [1] do not fit" in errs[f"rows/{fn}"], errs
            assert "differ in dtype or per-token shape" in errs[f"kind/{fn}"], errs
            assert "outputs of ranks [0] do not fit" in errs[f"count/{fn}"], errs
            assert "replicas gather with different plans" in errs[f"plan/{fn}"], errs
        if r == 1:
            assert "[12, ...]" in errs["rows/gather_sequences"], errs  # its own problem named


def _single() -> tuple:
    batch = InMemoryBatch([[1, 2, 3, 4, 5], [6, 7]], fields={"v": [torch.ones(5), torch.ones(2)]})
    sharded = shard_batch(
        batch,
        Cluster(1, tokens_per_replica=64),
        CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=0,
    )
    return sharded, CPGroupCache(ReplicaRanks(world_size=1))


def test_single_process_gather_and_local_errors() -> None:
    sharded, cache = _single()
    outs = [mb.fields["v"] * 2 for mb in sharded.micro_batches]
    got = gather_sequences(outs, sharded, groups=cache, fill=-1.0)
    assert got[0].tolist() == [-1.0, 2, 2, 2, 2] and got[1].tolist() == [-1.0, 2]
    every = all_gather_sequences(outs, sharded, groups=cache, align="token")
    assert every[0].tolist() == [2.0] * 4 + [0.0]  # token-aligned: the label field's own slots
    mb = sharded.micro_batches[0]
    with pytest.raises(GatherError, match=rf"holds {mb.num_tokens} local tokens"):
        gather_sequences([outs[0][:-1]], sharded, groups=cache)
    with pytest.raises(GatherError, match=r"got 2 outputs for 1 micro-batches"):
        gather_sequences([outs[0], outs[0]], sharded, groups=cache)
    with pytest.raises(GatherError, match=r"got one tensor for 1 micro-batches"):
        all_gather_sequences(outs[0], sharded, groups=cache)
    with pytest.raises(GatherError, match=r"is list, not a tensor"):
        gather_sequences([[1.0]], sharded, groups=cache)
