"""Token store content checks: chunk digests verified on first touch, the store bound to its
index, an edited tokens.json refused, ids past the vocabulary a counted skip at index time.
Real stores written by `fcp index --store-tokens`, real byte edits, a real loader."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import msgspec
import numpy as np
import pytest
from datapath_helpers import loader

from fcp.cli import main
from fcp_data.loader.encode import SampleEncoder
from fcp_data.loader.global_batch import SampleReadError
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.text import as_tokenizer, load_counter
from fcp_data.readers.token_store import (
    FLAT_NAME,
    STORE_HEADER_NAME,
    StoreHeader,
    TokenStore,
    TokenStoreCorruptError,
    TokenStoreMismatchError,
    vocab_size_of,
)
from fcp_data.readers.token_store.store import _header_digest


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, text_shards, bpe_file: Path) -> Path:
    out = tmp_path_factory.mktemp("dp-dig") / "index"
    argv = ["index", *text_shards[:3], "-o", str(out), "--tokenizer", str(bpe_file)]
    assert main([*argv, "--store-tokens"]) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_the_header_records_chunk_digests_and_its_index(stored, bpe_file) -> None:
    head = json.loads((stored / STORE_HEADER_NAME).read_text())
    assert head["chunk_bytes"] == 4 << 20 and len(head["chunk_blake2b"]) == 1
    assert len(head["index_fingerprint"]) == 32 and len(head["header_blake2b"]) == 32
    assert 0 < head["max_id"] < head["vocab_size"] == vocab_size_of(load_counter(str(bpe_file)))


def test_bytes_swapped_inside_tokens_bin_are_named(stored, tmp_path, bpe_file, cost) -> None:
    idx = _copy(stored, tmp_path / "idx")
    data = bytearray((idx / FLAT_NAME).read_bytes())
    data[100:102], data[102:104] = data[102:104], data[100:102]  # same size, other ids
    assert data != (stored / FLAT_NAME).read_bytes()
    (idx / FLAT_NAME).write_bytes(bytes(data))
    store = TokenStore.open(idx, index=LengthIndex.open(idx))  # opening reads no chunk
    with pytest.raises(TokenStoreCorruptError, match=r"chunk 0 \(bytes 0\.\.") as err:
        store.ids(0)
    assert FLAT_NAME in str(err.value) and "recorded" in str(err.value)
    with pytest.raises(SampleReadError, match="chunk 0"):  # the loader names it, by key
        list(loader(idx, 1, 0, cost, store=True, tokenizer=None, cap=1 << 16))
    # the untouched store verifies each chunk once, then not again
    good = TokenStore.open(stored, index=LengthIndex.open(stored))
    good.ids(0)
    assert good._verified.all()


def _rekeyed(src: list[str], root: Path) -> list[str]:
    """The same samples under other keys: equal lengths, other shard bytes."""
    out = []
    for s in src:
        dst = root / Path(s).name
        with tarfile.open(s) as tin, tarfile.open(dst, "w") as tout:
            for m in tin.getmembers():
                data = tin.extractfile(m).read()  # type: ignore[union-attr]
                m.name = "x" + m.name
                tout.addfile(m, io.BytesIO(data))
        out.append(str(dst))
    return out


def test_store_of_another_index_with_the_same_lengths_is_refused(
    stored, tmp_path, text_shards, bpe_file
) -> None:
    root = tmp_path / "rekeyed"
    root.mkdir()
    other = build_index(
        _rekeyed(text_shards[:3], root), tmp_path / "other", counter=load_counter(str(bpe_file))
    )
    mine = LengthIndex.open(stored)
    np.testing.assert_array_equal(other.text_tokens, mine.text_tokens)  # lengths agree
    for name in (FLAT_NAME, "token_offsets.npy", STORE_HEADER_NAME):
        shutil.copy(stored / name, other.path / name)
    with pytest.raises(TokenStoreMismatchError, match="fingerprint") as err:
        TokenStore.open(other.path, index=other)
    assert STORE_HEADER_NAME in str(err.value)


def _edit_header(idx: Path, *, resign: bool, **fields) -> None:
    raw = json.loads((idx / STORE_HEADER_NAME).read_text())
    raw.update(fields)
    if resign:  # a careful forger: the digest recomputed too
        raw["header_blake2b"] = _header_digest(msgspec.convert(raw, StoreHeader))
    (idx / STORE_HEADER_NAME).write_text(json.dumps(raw))


@pytest.mark.parametrize(
    ("fields", "resign", "match"),
    [
        ({"dtype": ">u2"}, False, "was edited"),  # big-endian: same size, garbage ids
        ({"dtype": ">u2"}, True, "little-endian unsigned"),
        ({"dtype": "<i2"}, True, "little-endian unsigned"),
        ({"dtype": "|u1", "num_tokens": 0}, True, "were written as"),
        ({"vocab_size": 100}, True, "past the vocabulary"),
        ({"vocab_size": 100}, False, "was edited"),
    ],
)
def test_an_edited_tokens_json_is_refused(stored, tmp_path, fields, resign, match) -> None:
    idx = _copy(stored, tmp_path / "idx")
    _edit_header(idx, resign=resign, **fields)
    with pytest.raises(TokenStoreMismatchError, match=match) as err:
        TokenStore.open(idx, index=LengthIndex.open(idx))
    assert STORE_HEADER_NAME in str(err.value)


def test_a_store_without_digests_loads_and_says_so(stored, tmp_path) -> None:
    idx = _copy(stored, tmp_path / "idx")
    raw = json.loads((idx / STORE_HEADER_NAME).read_text())
    for k in ("max_id", "index_fingerprint", "chunk_bytes", "chunk_blake2b", "header_blake2b"):
        raw.pop(k)
    (idx / STORE_HEADER_NAME).write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="not verified"):
        store = TokenStore.open(idx, index=LengthIndex.open(idx))
    np.testing.assert_array_equal(store.ids(0), TokenStore.open(stored).ids(0))


def _npy_shard(path: Path, rows: dict[str, np.ndarray | str]) -> str:
    from webdataset import TarWriter

    with TarWriter(str(path)) as w:
        for key, v in rows.items():
            w.write({"__key__": key, "txt" if isinstance(v, str) else "npy": v})
    return str(path)


@pytest.mark.parametrize("store", [False, True])
def test_npy_ids_negative_or_past_the_vocabulary_are_counted_skips(tmp_path, bpe_file, store):
    vocab = vocab_size_of(load_counter(str(bpe_file)))
    rows = {
        "ok": np.array([5, 6, vocab - 1], dtype=np.int32),
        "neg": np.array([5, -1, 7], dtype=np.int32),
        "big": np.array([5, vocab, 7], dtype=np.int64),
        "text": "def f(x): return x",
    }
    shard = _npy_shard(tmp_path / "npy.tar", rows)
    index = build_index(
        [shard], tmp_path / "idx", counter=load_counter(str(bpe_file)), store_tokens=store
    )
    assert sorted(map(str, index.keys)) == ["ok", "text"]
    why = {s.key: s.reason for s in index.skipped}
    assert set(why) == {"neg", "big"}
    assert ">= 0" in why["neg"] and f"past the tokenizer's vocabulary of {vocab}" in why["big"]
    if store:
        s = TokenStore.open(index.path, index=index)
        ok = list(map(str, index.keys)).index("ok")
        np.testing.assert_array_equal(s.ids(ok), [5, 6, vocab - 1])


def test_the_loader_refuses_bad_npy_ids_as_a_bad_sample(bpe_file) -> None:
    enc = SampleEncoder(tokenizer=as_tokenizer(str(bpe_file)))
    buf = io.BytesIO()
    np.save(buf, np.array([1, 2, 4000]))
    with pytest.raises(ValueError, match="past the tokenizer's vocabulary"):
        enc.text_ids({"npy": buf.getvalue()})
    buf = io.BytesIO()
    np.save(buf, np.array([1, -2]))
    with pytest.raises(ValueError, match=">= 0"):
        SampleEncoder().text_ids({"npy": buf.getvalue()})
