"""Entry point of one replica process in test_multiprocess (imports no pytest: fast spawn).

Besides dumping what its loader yielded, each replica joins a gloo group (FileStore, no port)
and runs fcp_exec's ring attention over every micro-batch with its CP group, then compares the
rows it holds with plain attention over the whole sequence read back from the shards: the
loader's layout and the executor's agree end to end.
"""

from __future__ import annotations

import datetime
import pickle
from pathlib import Path

import torch
import torch.distributed as dist
from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import CostModel

__all__ = ["replica_main"]

HEADS, DIM = 2, 8


def _qkv(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic per-token q, k, v (the same on every replica for the same token id)."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(258, 3, HEADS, DIM, generator=g, dtype=torch.float32)
    x = table[tokens]
    return x[:, 0], x[:, 1], x[:, 2]


def _max_attention_error(mbs: list, index: TarIndex) -> tuple[float, int]:
    """Worst |ring - reference| over the first two global batches, and rings of degree > 1."""
    from fcp_exec import ring_attention

    worst, rings = 0.0, 0
    for mb in mbs:
        if mb.rank_plan.is_empty or mb.batch_index >= 2:  # two batches cover mixed degrees; ~1 s
            continue
        rings += mb.rank_plan.degree > 1
        q, k, v = _qkv(mb.tokens)
        out = ring_attention(
            q,
            k,
            v,
            mb.cu_seqlens,
            mb.cu_seqlens_padded,
            ring=mb.rank_plan.group_replicas,
            causal=mb.causal,
        )
        lcu = mb.local_cu_seqlens_padded
        for j, sid in enumerate(mb.sample_ids):
            full = torch.tensor(ByteTokenizer()(index.read(sid)["txt"].decode()))
            fq, fk, fv = (t.transpose(0, 1) for t in _qkv(full))
            ref = torch.nn.functional.scaled_dot_product_attention(
                fq, fk, fv, is_causal=mb.causal[j]
            ).transpose(0, 1)
            a, b = int(lcu[j]), int(lcu[j + 1])
            pos = mb.position_ids[a:b]
            real = pos < len(full)
            err = (out[a:b][real] - ref[pos[real]]).abs().max().item()
            worst = max(worst, err)
    return worst, rings


def replica_main(
    replica: int, n: int, urls: list[str], out: str, num_workers: int, store: str
) -> None:
    """One replica: its own index handle and loader; dumps every micro-batch it yielded."""
    index = TarIndex(urls, ByteTokenizer())
    ld = FCPDataLoader(
        index,
        cluster=cluster(n),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica,
        global_batch_size=16,
        seed=3,
        num_workers=num_workers,
        tokenizer=ByteTokenizer(),
        options=LoaderOptions(planner=simple_planner),
    )
    mbs = list(ld)
    Path(out).write_bytes(pickle.dumps(mbs))
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, n),
        rank=replica,
        world_size=n,
        timeout=datetime.timedelta(seconds=90),
    )
    try:
        err, rings = _max_attention_error(mbs, index)
        Path(out + ".err").write_text(f"{err!r} {rings}")
    finally:
        dist.destroy_process_group()
