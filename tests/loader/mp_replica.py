"""Entry point of one replica process in test_multiprocess (imports no pytest: fast spawn)."""

from __future__ import annotations

import pickle
from pathlib import Path

from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import CostModel

__all__ = ["replica_main"]


def replica_main(replica: int, n: int, urls: list[str], out: str, num_workers: int) -> None:
    """One replica: its own index handle and loader; dumps every micro-batch it yielded."""
    index = TarIndex(urls, ByteTokenizer())
    ld = FCPDataLoader(
        index, cluster=cluster(n), cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica, global_batch_size=16, seed=3, num_workers=num_workers,
        tokenizer=ByteTokenizer(), options=LoaderOptions(planner=simple_planner),
    )
    Path(out).write_bytes(pickle.dumps(list(ld)))
