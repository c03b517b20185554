"""The token store by default: `fcp index --tokenizer FILE` writes it unless `--no-store`,
states its disk cost, and a loader over it never runs the tokenizer on the text it holds.

Real parts: tar shards written by webdataset, a BPE trained by the `tokenizers` library, the
`fcp index` command line, the loader in this process (num_workers=0) so every call of its
tokenizer is counted here. The disk cost is checked against the files' sizes on disk.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from datapath_helpers import fields, loader

from fcp.cli import main
from fcp_data.readers import LengthIndex
from fcp_data.readers.text import as_tokenizer
from fcp_data.readers.token_store import FLAT_NAME, OFFSETS_NAME, TokenStore


class _Counting:
    """The BPE, counting its calls: a loader that slices a store must make none for text."""

    def __init__(self, path: Path) -> None:
        self.inner = as_tokenizer(str(path))
        self.spec, self.calls = self.inner.spec, 0

    def __call__(self, text: str) -> np.ndarray:
        self.calls += 1
        return self.inner(text)


def test_fcp_index_with_a_tokenizer_writes_the_store_and_states_its_cost(
    text_shards, bpe_file, cost, tmp_path, capsys
) -> None:
    """Was: no store unless --store-tokens, so every member of a CP group tokenized whole
    sequences (0.38x a plain webdataset loader per replica on 4 replicas)."""
    out = tmp_path / "idx"
    assert main(["index", *text_shards, "-o", str(out), "--tokenizer", str(bpe_file)]) == 0
    summary = capsys.readouterr().out
    assert TokenStore.exists(out)
    index = LengthIndex.open(out)
    store = TokenStore.open(out, index=index)
    assert store.header.num_tokens == int(index.text_tokens.sum()) > 0
    size = (out / FLAT_NAME).stat().st_size + (out / OFFSETS_NAME).stat().st_size
    shown = re.search(r"token store ([\d.]+) (kB|MB) on disk", summary)
    assert shown, summary
    scale = {"kB": 1e3, "MB": 1e6}[shown.group(2)]
    assert abs(float(shown.group(1)) * scale - size) <= 0.05 * scale  # the real disk cost
    cap = int(index.seqlens.max()) // 3 + 64
    for r in range(3):
        tok = _Counting(bpe_file)
        got = [fields(mb) for mb in loader(out, 3, r, cost, store=True, tokenizer=tok, cap=cap)]
        assert got and tok.calls == 0, f"replica {r} tokenized {tok.calls} texts"
        counting = _Counting(bpe_file)
        ref = loader(out, 3, r, cost, store=False, tokenizer=counting, cap=cap)
        plain = [fields(mb) for mb in ref]
        assert counting.calls > 0  # the store-less path does tokenize: the count is live
        for a, b in zip(got, plain, strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_no_store_and_estimates_write_none_and_say_why(text_shards, bpe_file, tmp_path, capsys):
    argv = ["index", *text_shards[:1], "-o", str(tmp_path / "a"), "--tokenizer", str(bpe_file)]
    assert main([*argv, "--no-store"]) == 0
    assert not TokenStore.exists(tmp_path / "a")
    assert "no token store (--no-store)" in capsys.readouterr().out
    assert main(["index", *text_shards[:1], "-o", str(tmp_path / "b")]) == 0
    assert not TokenStore.exists(tmp_path / "b")
    assert "bytes:4 is an estimate" in capsys.readouterr().out
