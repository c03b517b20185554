"""Megatron indexed datasets (.bin/.idx) as a source, checked against megatron-core itself.

megatron-core's `IndexedDatasetBuilder` writes a real pair; fcp's own reader of the .idx layout
must give every document's length without touching the .bin, and the loader must hand out the
very ids megatron-core's `IndexedDataset` reads, in micro-batches identical to the same ids
stored as `.npy` members of a tar.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from sources_helpers import (
    assert_same_batches,
    epoch_fields,
    make_loader,
    range_server,
    write_tar,
)

from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.sources.megatron import MegatronFormatError, read_idx

indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

VOCAB = 500
# megatron-core's builder converts torch tensors with numpy.array(tensor), which warns on numpy 2
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _docs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(4.0, 1.0, n).astype(int), 1, 3000)
    return [rng.integers(2, VOCAB, size=int(k)).astype(np.int64) for k in lens]


def _write(prefix: Path, docs: list[np.ndarray], dtype: type = np.uint16) -> str:
    builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for d in docs:
        builder.add_document(torch.from_numpy(d), [len(d)])
    builder.finalize(f"{prefix}.idx")
    return f"{prefix}.bin"


def _split_sentences(prefix: Path, docs: list[np.ndarray]) -> str:
    """Documents of several sequences each (preprocess_data --split-sentences)."""
    builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for d in docs:
        cut = [len(d) // 3, len(d) - len(d) // 3]
        parts = [p for p in np.split(d, cut) if len(p)]
        builder.add_document(torch.from_numpy(np.concatenate(parts)), [len(p) for p in parts])
    builder.finalize(f"{prefix}.idx")
    return f"{prefix}.bin"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("src-megatron")


def test_every_document_matches_megatron_core(root: Path) -> None:
    docs = _docs(60, seed=3)
    url = _write(root / "corpus_text_document", docs)
    index = build_index(url, root / "i", config=ScanConfig(text_special_tokens=0))
    ds = indexed.IndexedDataset(str(root / "corpus_text_document"))
    assert len(index) == len(ds) == len(docs)
    np.testing.assert_array_equal(index.text_tokens, ds.sequence_lengths)
    assert index.header.shards[0].format == "megatron"
    assert index.header.shards[0].meta["dtype"] == "uint16"
    for i in range(len(ds)):
        got = np.load(io.BytesIO(index.read(i)["npy"]))
        np.testing.assert_array_equal(got, ds[i])
        assert got.dtype == np.uint16
    # documents of several sequences: one sample each, their sequences concatenated
    url2 = _split_sentences(root / "split", docs[:10])
    split = build_index(url2, root / "i-split")
    ds2 = indexed.IndexedDataset(str(root / "split"))
    assert len(split) == 10 and len(ds2) > 10
    for d in range(10):
        seqs = range(int(ds2.document_indices[d]), int(ds2.document_indices[d + 1]))
        want = np.concatenate([ds2[s] for s in seqs])
        np.testing.assert_array_equal(np.load(io.BytesIO(split.read(d)["npy"])), want)


def test_loader_matches_the_same_ids_in_a_tar(root: Path) -> None:
    docs = _docs(40, seed=5)
    url = _write(root / "loader", docs)
    index = build_index(url, root / "i-loader")
    oracle = write_tar(root / "ids.tar", [{"npy": d.astype(np.uint16)} for d in docs])
    tar_index = build_index(oracle, root / "i-tar")
    np.testing.assert_array_equal(index.seqlens, tar_index.seqlens)
    tok = _NoTokenizer()
    for r in range(2):
        assert_same_batches(
            epoch_fields(make_loader(index, tok, replica=r)),
            epoch_fields(make_loader(tar_index, tok, replica=r)),
        )


class _NoTokenizer:
    """The loader's tokenizer for pre-tokenized data: never called (vocab for the id check)."""

    spec = "bytes:4"
    vocab_size = VOCAB

    def __call__(self, text: str) -> list[int]:
        raise AssertionError("pre-tokenized samples are never tokenized")


def test_short_or_mistyped_bin_and_bad_idx_are_named(root: Path) -> None:
    docs = _docs(8, seed=9)
    url = _write(root / "pair", docs)
    size = Path(url).stat().st_size
    short = root / "short"
    shutil.copy(f"{root / 'pair'}.idx", f"{short}.idx")
    Path(f"{short}.bin").write_bytes(Path(url).read_bytes()[: size - 6])
    with pytest.raises(MegatronFormatError, match=rf"short\.bin is {size - 6} bytes .* short"):
        build_index(f"{short}.bin", root / "i-short")
    wide = root / "wide"  # the ids written as int32 beside a uint16 .idx
    _write(wide, docs, dtype=np.int32)
    shutil.copy(f"{root / 'pair'}.idx", f"{wide}.idx")
    with pytest.raises(MegatronFormatError, match=r"another dtype \(int32"):
        build_index(f"{wide}.bin", root / "i-wide")
    raw = Path(f"{root / 'pair'}.idx").read_bytes()
    with pytest.raises(MegatronFormatError, match=r"not a megatron \.idx"):
        read_idx(b"JUNK" + raw[4:], "x.idx")
    with pytest.raises(MegatronFormatError, match="cut or damaged"):
        read_idx(raw[:-8], "x.idx")


def test_a_changed_idx_makes_the_index_stale(root: Path) -> None:
    from fcp_data.errors import StaleIndexError

    url = _write(root / "stale", _docs(5, seed=1))
    build_index(url, root / "i-stale")
    _write(root / "stale", _docs(5, seed=2))
    with pytest.raises(StaleIndexError, match="changed"):
        LengthIndex.open(root / "i-stale")


def test_remote_bin_is_read_by_document_ranges(root: Path) -> None:
    pytest.importorskip("aiohttp")
    www = root / "www"
    www.mkdir()
    docs = _docs(12, seed=4)
    _write(www / "remote", docs)
    with range_server(www) as srv:
        url = f"{srv.url}/remote.bin"
        index = build_index(url, root / "i-http")
        assert index.shard_urls == [url]
        np.testing.assert_array_equal(index.text_tokens, [len(d) for d in docs])
        srv.requests.clear()
        got = np.load(io.BytesIO(index.read(5)["npy"]))
        np.testing.assert_array_equal(got, docs[5])
        assert [m for m, _, rng in srv.requests if rng] == ["GET"]  # one range, one document


def test_a_dataset_is_found_by_its_prefix_as_megatron_names_it(root: Path, capsys) -> None:
    """`--data-path corpus_text_document` names the pair by its prefix; was "does not exist"."""
    from fcp.cli import main
    from fcp_data.readers import ScannedSource

    docs = _docs(20, seed=6)
    prefix = root / "named" / "corpus_text_document"
    prefix.parent.mkdir()
    _write(prefix, docs)
    assert main(["index", str(prefix), "-o", str(root / "i-prefix")]) == 0
    index = LengthIndex.open(root / "i-prefix")
    assert index.shard_urls == [str(prefix) + ".bin"]
    ds = indexed.IndexedDataset(str(prefix))  # megatron-core opens the same prefix
    np.testing.assert_array_equal(index.text_tokens, ds.sequence_lengths)
    scanned = ScannedSource.scan(str(prefix))  # what FCPDataLoader("...document") scans
    np.testing.assert_array_equal(np.load(io.BytesIO(scanned.read(7)["npy"])), ds[7])
    # a tokenizer given for blending writes no default token store: the .bin is not copied
    argv = ["index", str(prefix), "-o", str(root / "i-tok"), "--tokenizer", "py:shlex:split"]
    assert main(argv) == 0
    assert not (root / "i-tok" / "tokens.json").exists()
    (root / "half").mkdir()
    shutil.copy(f"{prefix}.bin", root / "half" / "c.bin")  # no .idx beside it: named
    assert main(["index", str(root / "half" / "c"), "-o", str(root / "i-half")]) == 2
    assert "c.bin exists but a megatron dataset needs both" in capsys.readouterr().err


def test_keys_count_from_one_as_json_lines_lines_do(root: Path) -> None:
    """ "doc N" is megatron's IndexedDataset[N - 1], like "line N" of JSON Lines (was "doc 0")."""
    docs = _docs(6, seed=8)
    index = build_index(_write(root / "keys", docs), root / "i-keys")
    assert list(index.keys) == [f"doc {n}" for n in range(1, 7)]
    assert index.header.shards[0].meta["key_base"] == 1
    ds = indexed.IndexedDataset(str(root / "keys"))
    np.testing.assert_array_equal(np.load(io.BytesIO(index.read(2)["npy"])), ds[2])  # "doc 3"


def test_one_bin_is_split_across_workers_into_the_same_index(root: Path, monkeypatch) -> None:
    """Was: one pair was one shard, so `--workers` ran it on one process. Pieces of documents,
    merged in order, give the index a single process writes, byte for byte."""
    from fcp_data.readers import pieces as pieces_mod

    docs = _docs(300, seed=12)
    url = _write(root / "big", docs)
    monkeypatch.setattr(pieces_mod, "MIN_PIECE_BYTES", 4096)
    pieces = pieces_mod.plan_pieces([url], 2)
    assert len(pieces) >= 4 and all(p.span is not None for p in pieces)  # really split
    assert [p.span[0] for p in pieces][1:] == [p.span[1] for p in pieces][:-1]  # doc runs tile
    one = build_index(url, root / "i-one")
    two = build_index(url, root / "i-two", workers=2)
    for name in ("keys", "seqlens", "member_offset", "member_size", "member_crc32"):
        np.testing.assert_array_equal(
            np.load(one.path / f"{name}.npy"), np.load(two.path / f"{name}.npy"), err_msg=name
        )
    assert (one.path / "header.json").read_bytes() == (two.path / "header.json").read_bytes()
    ds = indexed.IndexedDataset(str(root / "big"))
    for i in (0, 149, 299):
        np.testing.assert_array_equal(np.load(io.BytesIO(two.read(i)["npy"])), ds[i])


def test_a_plain_index_of_real_vocabulary_ids_loads_without_a_tokenizer(root: Path) -> None:
    """The default index (bytes:4) gives the loader its stand-in tokenizer for text; ids read
    from a .bin are another tokenizer's, up to its vocabulary, and must not be checked against
    the stand-in's 500 ids."""
    rng = np.random.default_rng(2)
    docs = [rng.integers(600, 50_000, size=int(k)).astype(np.int64) for k in (5, 90, 300, 41)]
    url = _write(root / "vocab", docs, dtype=np.int32)
    index = build_index(url, root / "i-vocab")
    assert index.header.tokenizer == "bytes:4"
    got = {}
    for mb in make_loader(index, None, n=1, gbs=4):
        cu, at = mb.cu_seqlens.tolist(), mb.local_cu_seqlens_padded.tolist()
        for k, sid in enumerate(mb.sample_ids):  # one replica: every sequence whole
            got[sid] = mb.tokens[at[k] : at[k] + cu[k + 1] - cu[k]].numpy()
    assert len(got) == 4
    for sid, ids in got.items():
        np.testing.assert_array_equal(ids[:-1], docs[sid])  # then one EOD
