"""Helpers for the data-path tests: a trained HF tokenizer, real text shards, loaders.

The tokenizer is a small byte-level BPE trained offline with the `tokenizers` library; the
shards are written by the readers' `make_shards` (Python stdlib sources, long-tailed lengths).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel

__all__ = ["EOD", "ended", "fields", "loader", "train_bpe", "write_text_shards"]

EOD = 3
CORPUS = ["def f(x):\n    return x + 1", "import os, sys", "class A:\n    pass"] * 5


def train_bpe(vocab_size: int = 400, extra: tuple[str, ...] = ()) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["[UNK]", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS + list(extra), trainer=trainer)
    return tok


def loader(
    index: Any, n: int, replica: int, cost: CostModel, *, store: bool, tokenizer: Any, cap: int
) -> FCPDataLoader:
    return FCPDataLoader(
        index,
        cluster=Cluster(n, replicas_per_node=4, tokens_per_replica=cap),
        cost=cost,
        replica=replica,
        global_batch_size=12,
        num_workers=0,
        tokenizer=tokenizer,
        options=LoaderOptions(eod_id=EOD, token_store=store),
    )


def fields(mb: Any) -> dict[str, np.ndarray]:
    """Every packed field of a micro-batch as numpy, for exact comparison."""
    names = (
        "tokens",
        "labels",
        "loss_mask",
        "position_ids",
        "cu_seqlens",
        "cu_seqlens_padded",
        "local_cu_seqlens",
        "local_cu_seqlens_padded",
    )
    out = {k: getattr(mb, k).numpy().copy() for k in names}
    out["sample_ids"] = np.asarray(mb.sample_ids)
    out["degree"] = np.asarray(mb.rank_plan.degree)
    return out


def write_text_shards(
    root: Path, n: int, *, per_shard: int, seed: int, max_bytes: int
) -> list[str]:
    """n .txt/.json samples cut from stdlib sources, long-tailed lengths (lognormal, 40 bytes up
    to `max_bytes`), written with webdataset's TarWriter; every third one is .json."""
    from webdataset import TarWriter

    files = sorted(p for p in Path(os.__file__).parent.glob("*.py") if p.stat().st_size > 20000)
    rng = np.random.default_rng(seed)
    urls = []
    for s in range(-(-n // per_shard)):
        url = str(root / f"text-{s:03d}.tar")
        urls.append(url)
        with TarWriter(url) as w:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                text = files[i % len(files)].read_text(encoding="utf-8")
                size = int(np.clip(rng.lognormal(6.5, 1.0), 40, max_bytes))
                at = int(rng.integers(0, len(text) - size))
                body = text[at : at + size]
                if i % 3 == 2:
                    w.write({"__key__": f"s{i:05d}", "json": {"text": body}})
                else:
                    w.write({"__key__": f"s{i:05d}", "txt": body})
    return urls


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap a killed grandchild)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def ended(pid: int, within_s: float = 10.0) -> bool:
    """True once process `pid` is gone or a zombie. SIGKILL is sent before the loader gives
    up, but a killed process only dies when the kernel next schedules it (tens of ms on a
    loaded machine), so this polls up to `within_s` (a command left running sleeps for 30 s
    in these tests: the bound still tells the two apart)."""
    deadline = time.monotonic() + within_s
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
