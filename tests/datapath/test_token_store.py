"""Token store: written once at index time, equal loader output, refused when it does not fit.

Oracles: the `tokenizers` library's own ids for every text (read back from the tar with
webdataset), and the loader's output without a store (it tokenizes in the loader).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from datapath_helpers import EOD, fields, loader
from tokenizers import Tokenizer

from fcp.cli import main
from fcp_data.collate import pack_shard
from fcp_data.errors import ConfigError, IndexMismatchError
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.text import load_counter
from fcp_data.readers.token_store import (
    FLAT_NAME,
    OFFSETS_NAME,
    STORE_HEADER_NAME,
    StoredTokens,
    TokenStore,
    TokenStoreMismatchError,
)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, text_shards, bpe_file: Path) -> Path:
    """`fcp index --store-tokens --tokenizer bpe.json` over the text shards."""
    out = tmp_path_factory.mktemp("dp-idx") / "index"
    argv = ["index", *text_shards, "-o", str(out), "--tokenizer", str(bpe_file)]
    assert main([*argv, "--store-tokens"]) == 0
    return out


def _wds_texts(shards: list[str]) -> dict[str, str]:
    out = {}
    for s in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
        raw = s["txt"] if "txt" in s else json.loads(s["json"])["text"].encode()
        out[s["__key__"]] = raw.decode("utf-8")
    return out


def test_store_holds_the_tokenizers_ids_in_the_narrowest_dtype(stored, text_shards, bpe_file):
    index = LengthIndex.open(stored)
    store = TokenStore.open(stored, index=index)
    raw = Tokenizer.from_file(str(bpe_file))
    texts = _wds_texts(text_shards)
    assert len(store) == len(index) == len(texts)
    assert store.flat.dtype == np.uint16  # 400 ids: more than uint8 holds
    for i, key in enumerate(index.keys):
        want = raw.encode(texts[str(key)], add_special_tokens=False).ids
        np.testing.assert_array_equal(store.ids(i), want)
    assert store.header.num_tokens == int(index.text_tokens.sum())
    assert (stored / FLAT_NAME).stat().st_size == 2 * store.header.num_tokens


def test_parallel_index_workers_write_the_same_store(stored, text_shards, bpe_file, tmp_path):
    par = build_index(
        text_shards,
        tmp_path / "par",
        counter=load_counter(str(bpe_file)),
        workers=2,
        store_tokens=True,
    )
    for name in (FLAT_NAME, OFFSETS_NAME, STORE_HEADER_NAME):
        assert (par.path / name).read_bytes() == (stored / name).read_bytes()


@pytest.mark.parametrize("n", [1, 3, 4])
def test_loader_output_with_the_store_equals_without(stored, bpe_file, cost, n: int) -> None:
    index = LengthIndex.open(stored)
    cap = int(index.seqlens.max()) // min(n, 3) + 64  # the longest needs degree >= 3 if n >= 3
    degrees: set[int] = set()
    for r in range(n):
        plain = [
            fields(mb)
            for mb in loader(stored, n, r, cost, store=False, tokenizer=str(bpe_file), cap=cap)
        ]
        # no tokenizer at all: text can only come from the store
        fast = [
            fields(mb) for mb in loader(stored, n, r, cost, store=True, tokenizer=None, cap=cap)
        ]
        assert len(plain) == len(fast) > 0
        degrees |= {int(f["degree"]) for f in plain}
        for a, b in zip(plain, fast):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{k}, replica {r} of {n}")
    assert n < 3 or max(degrees) >= 3  # sequences really split over CP groups


def test_loader_without_a_store_still_needs_its_tokenizer(stored, cost) -> None:
    ld = loader(stored, 1, 0, cost, store=False, tokenizer=None, cap=1 << 16)
    with pytest.raises(ConfigError, match="no tokenizer"):  # the setup's fault: never skipped
        next(iter(ld))


class _Recording:
    """A flat array that records which [start, stop) ranges were read from it."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr, self.reads = arr, []

    def __getitem__(self, s: slice) -> np.ndarray:
        self.reads.append((s.start, s.stop))
        return self.arr[s]


@pytest.mark.parametrize("degree", [2, 3, 5])
def test_a_replica_reads_only_its_zigzag_chunks(degree: int) -> None:
    ids = np.arange(10, 10 + 997, dtype=np.uint16)
    want = np.concatenate([ids, [EOD] * 2]).astype(np.int64)
    for index in range(degree):
        flat = _Recording(np.concatenate([np.zeros(5, np.uint16), ids]))
        lazy = StoredTokens(flat, 5, len(ids), 2, EOD)  # type: ignore[arg-type]
        got = pack_shard([lazy], degree=degree, index=index)
        ref = pack_shard([want], degree=degree, index=index)
        for k in ("tokens", "labels", "position_ids", "loss_mask"):
            np.testing.assert_array_equal(getattr(got, k), getattr(ref, k))
        held = set(got.position_ids.tolist())
        read = {p - 5 for a, b in flat.reads for p in range(a, b)}
        # only the held chunks (+1 token past each for the label) are touched
        assert read <= held | {p + 1 for p in held}
        assert len(read) <= len(ids) * 2 // degree + 4


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_store_of_another_tokenizer_is_refused_naming_the_file(stored, tmp_path, text_shards):
    idx = _copy(stored, tmp_path / "idx")
    head = json.loads((idx / STORE_HEADER_NAME).read_text())
    head["tokenizer"] = "hf:sha256=0000000000000000"
    (idx / STORE_HEADER_NAME).write_text(json.dumps(head))
    with pytest.raises(IndexMismatchError, match=STORE_HEADER_NAME) as err:
        TokenStore.open(idx, index=LengthIndex.open(idx))
    assert "hf:sha256=0000000000000000" in str(err.value)


def test_truncated_store_is_refused_by_the_loader(stored, tmp_path, bpe_file, cost) -> None:
    idx = _copy(stored, tmp_path / "idx")
    data = (idx / FLAT_NAME).read_bytes()
    (idx / FLAT_NAME).write_bytes(data[:-6])
    with pytest.raises(TokenStoreMismatchError, match=FLAT_NAME):
        loader(idx, 2, 0, cost, store=True, tokenizer=str(bpe_file), cap=1 << 16)
    # the option off: the loader tokenizes and never opens the store
    ld = loader(idx, 2, 0, cost, store=False, tokenizer=str(bpe_file), cap=1 << 16)
    assert next(iter(ld)).num_tokens > 0


def test_store_with_wrong_lengths_is_refused_naming_the_sample(stored, tmp_path) -> None:
    idx = _copy(stored, tmp_path / "idx")
    off = np.load(idx / OFFSETS_NAME)
    off[3] += 1  # sample 2 one id longer, sample 3 one shorter: same total, same file size
    np.save(idx / OFFSETS_NAME, off)
    with pytest.raises(TokenStoreMismatchError, match=r"sample 2 has") as err:
        TokenStore.open(idx, index=LengthIndex.open(idx))
    assert OFFSETS_NAME in str(err.value)


def test_store_of_another_index_is_refused(stored, tmp_path, text_shards, bpe_file) -> None:
    small = build_index(text_shards[:2], tmp_path / "small", counter=load_counter(str(bpe_file)))
    for name in (FLAT_NAME, OFFSETS_NAME, STORE_HEADER_NAME):
        shutil.copy(stored / name, small.path / name)
    with pytest.raises(TokenStoreMismatchError, match=r"samples, its index"):
        TokenStore.open(small.path, index=small)


def test_store_tokens_needs_a_real_tokenizer(text_shards, tmp_path) -> None:
    with pytest.raises(ConfigError, match="needs a real tokenizer"):
        build_index(text_shards[:1], tmp_path / "x", store_tokens=True)
    argv = ["index", text_shards[0], "-o", str(tmp_path / "y"), "--store-tokens"]
    assert main(argv) == 2  # bytes:4 is an estimate: the CLI says so and exits 2
