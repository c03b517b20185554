"""JSON Lines and Parquet shards end to end: index, loader, resume, bad input.

The oracle is the same corpus written as a WebDataset tar: the length index must count the
same tokens and the loader must build identical micro-batches (tokens, labels, positions,
cu_seqlens) for every replica, so nothing about a sample depends on the file format.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from sources_helpers import (
    assert_same_batches,
    corpus,
    epoch_fields,
    make_loader,
    range_server,
    train_bpe,
    write_tar,
)

from fcp.cli import main
from fcp_data.errors import ConfigError, MissingDependencyError, SampleError
from fcp_data.readers import LengthIndex, ScannedSource, build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.sources import UnreadableSourceError

TEXTS = corpus(36, seed=11)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("src-jsonl")


@pytest.fixture(scope="module")
def bpe(root: Path) -> str:
    return str(train_bpe(root / "bpe.json", TEXTS))


@pytest.fixture(scope="module")
def tar_index(root: Path, bpe: str) -> LengthIndex:
    url = write_tar(root / "oracle.tar", [{"json": {"text": t}} for t in TEXTS])
    return build_index(url, root / "i-tar", config=ScanConfig(tokenizer=bpe))


def _jsonl(path: Path, rows: list[dict], opener=open) -> str:
    with opener(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _same_as_tar(index: LengthIndex, tar_index: LengthIndex, bpe: str) -> None:
    np.testing.assert_array_equal(index.seqlens, tar_index.seqlens)
    for r in range(2):
        assert_same_batches(
            epoch_fields(make_loader(index, bpe, replica=r)),
            epoch_fields(make_loader(tar_index, bpe, replica=r)),
        )


def test_jsonl_matches_the_tar_oracle(root: Path, bpe: str, tar_index: LengthIndex) -> None:
    rows = [{"id": i, "text": t} for i, t in enumerate(TEXTS)]
    a = _jsonl(root / "a.jsonl", rows[:20])
    b = _jsonl(root / "b.jsonl", rows[20:])
    index = build_index([a, b], root / "i-jsonl", config=ScanConfig(tokenizer=bpe), workers=2)
    assert [s.format for s in index.header.shards] == ["jsonl", "jsonl"]
    assert list(index.keys[:2]) == ["line 1", "line 2"]
    assert json.loads(index.read(20)["json"])["text"] == TEXTS[20]
    _same_as_tar(index, tar_index, bpe)
    again = LengthIndex.open(root / "i-jsonl")  # verified on open: fingerprints and arrays
    assert len(again) == len(TEXTS)


def test_compressed_jsonl_gz_matches(root: Path, bpe: str, tar_index: LengthIndex) -> None:
    path = _jsonl(root / "c.jsonl.gz", [{"text": t} for t in TEXTS], opener=gzip.open)
    index = build_index(path, root / "i-gz", config=ScanConfig(tokenizer=bpe))
    assert index.header.shards[0].format == "jsonl.gz"
    index.shard_cache = None
    _same_as_tar(index, tar_index, bpe)


def test_jsonl_zst_needs_zstandard_or_reads(root: Path, bpe: str) -> None:
    try:
        import zstandard
    except ImportError:
        (root / "d.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")
        with pytest.raises(MissingDependencyError, match="zstandard"):
            build_index(str(root / "d.jsonl.zst"), root / "i-zst")
        return
    raw = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:5]).encode()
    (root / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    index = build_index(str(root / "d.jsonl.zst"), root / "i-zst", config=ScanConfig(tokenizer=bpe))
    assert [json.loads(index.read(i)["json"])["text"] for i in range(5)] == TEXTS[:5]


def test_jsonl_resume_is_exactly_once(root: Path, bpe: str) -> None:
    rows = [{"text": t} for t in TEXTS]
    index = build_index(
        _jsonl(root / "r.jsonl", rows), root / "i-r", config=ScanConfig(tokenizer=bpe)
    )
    full = make_loader(index, bpe, gbs=6)
    whole = epoch_fields(full)
    first = make_loader(index, bpe, gbs=6)
    head = epoch_fields(first, stop=2)
    state = first.state_dict()
    again = make_loader(LengthIndex.open(root / "i-r"), bpe, gbs=6)
    again.load_state_dict(state)
    assert_same_batches(head + epoch_fields(again), whole)
    # elastic: 3 replicas resume from the same state and cover the remaining samples once
    rest = [int(p) for b in range(2, full.sampler.num_batches()) for p in full.sampler.batch(0, b)]
    seen: set[int] = set()
    for r in range(3):
        ld = make_loader(index, bpe, n=3, replica=r, gbs=6)
        ld.load_state_dict(state)
        seen |= {int(s) for mb in ld for s in mb.sample_ids}
    assert seen == set(rest) and len(rest) == len(set(rest))


def test_malformed_jsonl_lines_are_counted_by_line(root: Path, bpe: str) -> None:
    path = root / "bad.jsonl"
    path.write_text('{"text": "good one"}\n\n{"text": broken\n{"other": 1}\n{"text": "fine"}\n')
    index = build_index(str(path), root / "i-bad", config=ScanConfig(tokenizer=bpe))
    assert list(index.keys) == ["line 1", "line 5"]  # the blank line 2 is no sample
    assert [(s.key, s.shard.endswith("bad.jsonl")) for s in index.skipped] == [
        ("line 3", True),
        ("line 4", True),
    ]
    assert "not valid JSON" in index.skipped[0].reason
    with pytest.raises(SampleError, match=r"bad\.jsonl: sample 'line 3': .*not valid JSON"):
        build_index(str(path), root / "i-bad2", config=ScanConfig(tokenizer=bpe, on_error="raise"))


def test_parquet_matches_the_tar_oracle(root: Path, bpe: str, tar_index: LengthIndex) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"id": list(range(len(TEXTS))), "body": TEXTS})
    pq.write_table(table, root / "t.parquet", row_group_size=7)  # 6 row groups
    config = ScanConfig(tokenizer=bpe, text_field="body")
    index = build_index(str(root / "t.parquet"), root / "i-pq", config=config)
    assert index.header.shards[0].format == "parquet"
    assert index.read(30) == {"txt": TEXTS[30].encode()}
    np.testing.assert_array_equal(index.seqlens, tar_index.seqlens)
    for r in range(2):
        assert_same_batches(
            epoch_fields(make_loader(index, bpe, replica=r)),
            epoch_fields(make_loader(tar_index, bpe, replica=r)),
        )
    with pytest.raises(ConfigError, match=r"no column 'text'; its columns are \['id', 'body'\]"):
        build_index(str(root / "t.parquet"), root / "i-pq2", config=ScanConfig(tokenizer=bpe))
    scanned = ScannedSource.scan(str(root / "t.parquet"), config=config)  # no index
    assert scanned.read(3) == {"txt": TEXTS[3].encode()}


def test_a_directory_is_expanded_sorted(root: Path, bpe: str) -> None:
    d = root / "tree"
    (d / "b").mkdir(parents=True)
    _jsonl(d / "b" / "2.jsonl", [{"text": "two"}])
    _jsonl(d / "a.jsonl", [{"text": "one"}])
    (d / "README.md").write_text("about this data")
    index = build_index(str(d), root / "i-dir", config=ScanConfig(tokenizer=bpe))
    assert [Path(u).relative_to(d).as_posix() for u in index.shard_urls] == ["a.jsonl", "b/2.jsonl"]


def test_files_fcp_cannot_read_are_errors_with_exit_2(root: Path, capsys) -> None:
    csv = root / "data.csv"
    csv.write_text("text\nhello\n")
    with pytest.raises(UnreadableSourceError, match=r"data\.csv.*fcp reads WebDataset \.tar"):
        build_index(str(csv), root / "i-csv")
    assert main(["index", str(csv), "-o", str(root / "i-csv")]) == 2
    err = capsys.readouterr().err
    assert "data.csv" in err and "Parquet" in err and "megatron" in err
    pq_named_wrong = root / "rows.dat"
    pq_named_wrong.write_bytes(b"PAR1" + bytes(600))
    with pytest.raises(
        UnreadableSourceError, match=r"rows\.dat: Parquet data: name it \*\.parquet"
    ):
        build_index(str(pq_named_wrong), root / "i-dat")
    d = root / "mixed"
    d.mkdir()
    (d / "notes.bin").write_bytes(b"x")
    with pytest.raises(UnreadableSourceError, match=r"notes\.bin.*needs .*notes\.idx"):
        build_index(str(d), root / "i-mixed")


def test_remote_tables_and_compressed_jsonl_are_refused() -> None:
    from fcp_data.readers.shards import expand_shards

    for url in ("https://example.invalid/x.parquet", "s3://b/x.jsonl.gz"):
        with pytest.raises(ConfigError, match="read locally only"):
            expand_shards(url)
    assert expand_shards("https://example.invalid/x.jsonl") == ["https://example.invalid/x.jsonl"]
    with pytest.raises(ConfigError, match=r"by its \.bin URL"):
        expand_shards("https://example.invalid/corpus_text_document.idx")


def test_remote_jsonl_lines_are_byte_ranges(root: Path, bpe: str, tar_index: LengthIndex) -> None:
    pytest.importorskip("aiohttp")
    www = root / "www"
    www.mkdir()
    _jsonl(www / "r.jsonl", [{"text": t} for t in TEXTS])
    with range_server(www) as srv:
        url = f"{srv.url}/r.jsonl"
        index = build_index(url, root / "i-http", config=ScanConfig(tokenizer=bpe))
        assert index.shard_urls == [url] and index.header.shards[0].format == "jsonl"
        srv.requests.clear()
        assert json.loads(index.read(7)["json"])["text"] == TEXTS[7]
        assert [m for m, _, rng in srv.requests if rng] == ["GET"]  # one range for one line
        _same_as_tar(LengthIndex.open(root / "i-http"), tar_index, bpe)


def test_blend_of_jsonl_and_parquet_resumes(root: Path, bpe: str) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from fcp_data.loader import Blend

    config = ScanConfig(tokenizer=bpe)
    a = build_index(
        _jsonl(root / "ba.jsonl", [{"text": t} for t in TEXTS[:20]]), root / "ba", config=config
    )
    pq.write_table(pa.table({"text": TEXTS[20:]}), root / "bb.parquet", row_group_size=4)
    b = build_index(str(root / "bb.parquet"), root / "bb", config=config)

    def blend() -> Blend:
        return Blend([a.path, b.path], weights=[0.6, 0.4], names=["a", "b"], batches_per_epoch=4)

    whole = epoch_fields(make_loader(blend(), bpe, gbs=6))
    first = make_loader(blend(), bpe, gbs=6)
    head = epoch_fields(first, stop=2)
    state = first.state_dict()
    again = make_loader(blend(), bpe, gbs=6)
    again.load_state_dict(state)
    again.num_workers = 1  # the Parquet reader is rebuilt in the worker process
    assert_same_batches(head + epoch_fields(again), whole)
    assert any(m.source_counts[1] for m in first.metrics_history)


def test_a_cut_jsonl_gz_keeps_the_lines_before_the_cut(root: Path) -> None:
    raw = gzip.compress(b"".join(b'{"text": "line %d of the file"}\n' % i for i in range(20000)))
    (root / "cut.jsonl.gz").write_bytes(raw[: len(raw) // 2])
    index = build_index(str(root / "cut.jsonl.gz"), root / "i-cut")
    assert 1000 < len(index) < 20000
    assert [json.loads(index.read(i)["json"])["text"] for i in (0, len(index) - 1)] == [
        "line 0 of the file",
        f"line {len(index) - 1} of the file",
    ]
    assert index.skipped[-1].key == "(shard)" and "stops decoding" in index.skipped[-1].reason


def test_an_index_of_other_formats_is_version_2_and_a_tar_index_stays_1(tmp_path: Path) -> None:
    """A reader that knows only tars (version 1) must refuse an index whose offsets are rows or
    lines, not take them for byte offsets; tar-only indexes keep version 1."""
    jl = tmp_path / "a.jsonl"
    jl.write_text('{"text": "one two"}\n{"text": "three"}\n')
    idx = build_index(str(jl), tmp_path / "ij")
    assert json.loads((Path(idx.path) / "header.json").read_text())["format_version"] == 2
    tar = write_tar(tmp_path / "a.tar", [{"txt": "one two"}, {"txt": "three"}])
    idx_t = build_index(tar, tmp_path / "it")
    assert json.loads((Path(idx_t.path) / "header.json").read_text())["format_version"] == 1
