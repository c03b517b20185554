"""Helpers of the source-format tests: one corpus written as a tar and as each other format,
a trained BPE tokenizer, loaders over an index, and every field of an epoch's micro-batches."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel

__all__ = [
    "EOD",
    "assert_same_batches",
    "corpus",
    "epoch_fields",
    "make_loader",
    "range_server",
    "train_bpe",
    "write_tar",
]

EOD = 1
FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "local_cu_seqlens")


def corpus(n: int, *, seed: int, max_bytes: int = 4000) -> list[str]:
    """n texts cut from stdlib sources with long-tailed (lognormal) lengths, 40..max_bytes."""
    files = sorted(p for p in Path(os.__file__).parent.glob("*.py") if p.stat().st_size > 20000)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        text = files[i % len(files)].read_text(encoding="utf-8")
        size = int(np.clip(rng.lognormal(6.0, 1.0), 40, max_bytes))
        at = int(rng.integers(0, len(text) - size))
        out.append(text[at : at + size])
    return out


def train_bpe(path: Path, texts: list[str]) -> Path:
    """A small byte-level BPE trained offline on `texts`, saved as tokenizer.json."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["[UNK]", "<eod>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path


def range_server(root: Path) -> Any:
    """The Range-honouring loopback HTTP server of the data-path tests (tests/datapath)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "datapath" / "servers.py"
    spec = importlib.util.spec_from_file_location("fcp_test_servers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RangeServer(root)


def write_tar(path: Path, samples: list[dict[str, Any]]) -> str:
    """The oracle: samples ({ext: value}) written as a WebDataset tar by webdataset itself."""
    from webdataset import TarWriter

    with TarWriter(str(path)) as w:
        for i, sample in enumerate(samples):
            w.write({"__key__": f"s{i:05d}", **sample})
    return str(path)


def make_loader(
    source: Any, tokenizer: Any, *, n: int = 2, replica: int = 0, gbs: int = 8, **opts: Any
) -> FCPDataLoader:
    seqlens = np.asarray(source.seqlens)
    cap = int(seqlens.max()) // min(n, 2) + 64
    return FCPDataLoader(
        source,
        cluster=Cluster(n, replicas_per_node=4, tokens_per_replica=cap),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica,
        global_batch_size=gbs,
        num_workers=0,
        tokenizer=tokenizer,
        options=LoaderOptions(eod_id=EOD, **opts),
    )


def epoch_fields(ld: FCPDataLoader, stop: int | None = None) -> list[dict[str, Any]]:
    """Every packed field of every micro-batch (to `stop` global batches), as numpy."""
    out = []
    for mb in ld:
        got = {k: getattr(mb, k).numpy().copy() for k in FIELDS}
        got["sample_ids"] = np.asarray(mb.sample_ids)
        got["batch"] = (mb.batch_index, mb.wave)
        out.append(got)
        if stop is not None and mb.is_last_wave and mb.batch_index + 1 == stop:
            break
    return out


def assert_same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x["batch"] == y["batch"]
        for k in (*FIELDS, "sample_ids"):
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
