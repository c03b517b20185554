"""Indexing that talks: progress inside a file, one big file split across workers, files beside
the data that are not data, a missing tokenizer file named as missing.

Real files (JSON Lines written line by line, Parquet by pyarrow with small row groups, a
tokenizer.json saved by the `tokenizers` library), real spawn workers; the oracle for a split
build is the single-process build of the same file, array for array and header byte for byte,
and for keys and lines the file itself read back line by line.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from sources_helpers import corpus, train_bpe

from fcp.cli import main
from fcp_data.progress import Progress
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers import build as build_mod
from fcp_data.readers import pieces as pieces_mod
from fcp_data.readers.build import ProgressOptions
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.sources import UnreadableSourceError

ARRAYS = ("keys", "seqlens", "member_offset", "member_size", "member_crc32", "shard")


def _jsonl(path: Path, n: int, *, seed: int) -> list[bytes]:
    """n lines: JSON text (multi-byte characters too), with blank and malformed lines mixed
    in so that piece boundaries fall on every kind of line; returns the lines as written."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        if i % 97 == 13:
            lines.append(b"")
        elif i % 211 == 5:
            lines.append(b'{"text": broken')
        else:
            words = " ".join(
                ["naïve", "café", "word", "δ"][j % 4] for j in range(rng.integers(1, 90))
            )
            lines.append(json.dumps({"text": f"{i} {words}"}, ensure_ascii=False).encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return lines


def _same_index(a: LengthIndex, b: LengthIndex) -> None:
    for name in ARRAYS:
        np.testing.assert_array_equal(
            np.load(a.path / f"{name}.npy"), np.load(b.path / f"{name}.npy"), err_msg=name
        )
    assert (a.path / "header.json").read_bytes() == (b.path / "header.json").read_bytes()


def test_progress_inside_one_file_counts_bytes_samples_rate_and_time_left(tmp_path) -> None:
    """Was: "fcp index: 0/1 shards" until the file was done, then its last line twice."""
    path = tmp_path / "one.jsonl"
    _jsonl(path, 16000, seed=1)
    size = path.stat().st_size
    assert size > 3 * build_mod.REPORT_BYTES  # several reports fit inside the file
    out = io.StringIO()
    index = build_index(str(path), tmp_path / "i", progress=ProgressOptions(stream=out, every_s=0))
    lines = out.getvalue().splitlines()
    inside = [ln for ln in lines if "(100%)" not in ln]
    assert len(inside) >= 3, lines  # while the one file was being read
    done = [float(re.match(r"fcp index: ([\d.]+) MB/", ln).group(1)) for ln in inside]
    assert done == sorted(done) and done[0] < done[-1]
    assert all(re.search(r"[\d,]+ samples, [\d.]+ [kM]?B/s, ~\d+ s left", ln) for ln in inside)
    assert lines[-1].startswith(f"fcp index: {size / 1e6:.1f} MB/{size / 1e6:.1f} MB (100%)")
    assert f"{len(index):,} samples" in lines[-1]
    assert len(lines) == len(set(lines))  # the closing line once


def test_the_closing_line_is_not_printed_twice() -> None:
    out = io.StringIO()
    with Progress("fcp index", 10, unit="bytes", extra="samples", every_s=0.0, stream=out) as p:
        p.advance(10, extra=3)  # the only advance prints (every_s=0): the close must not
    assert len(out.getvalue().splitlines()) == 1


def test_one_jsonl_split_across_workers_is_the_index_one_process_writes(
    tmp_path, monkeypatch
) -> None:
    """Was: a file was one task, so `--workers 2` read one big file on one process."""
    path = tmp_path / "big.jsonl"
    lines = _jsonl(path, 6000, seed=2)
    monkeypatch.setattr(pieces_mod, "MIN_PIECE_BYTES", 64 << 10)
    pieces = pieces_mod.plan_pieces([str(path)], 2)
    assert len(pieces) >= 4  # really split
    cuts = [p.span[0] for p in pieces[1:]]
    starts = {0}
    for ln in lines:
        starts.add(max(starts) + len(ln) + 1)
    assert not set(cuts) <= starts  # cut points fall inside lines, not only between them
    one = build_index(str(path), tmp_path / "one")
    two = build_index(str(path), tmp_path / "two", workers=2)
    _same_index(one, two)
    # keys are the file's own line numbers, counted from 1, skips named by line as well
    for i in (0, len(two) // 2, len(two) - 1):
        n = int(str(two.keys[i]).split()[1])
        assert two.read(i)["json"] == lines[n - 1]
    bad = {s.key for s in two.skipped}
    assert bad == {f"line {i + 1}" for i, ln in enumerate(lines) if ln.startswith(b'{"text": b')}


def test_a_parquet_file_is_split_by_row_groups(tmp_path, monkeypatch) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = corpus(900, seed=4, max_bytes=600)
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=60)
    monkeypatch.setattr(pieces_mod, "MIN_PIECE_BYTES", 4096)
    assert len(pieces_mod.plan_pieces([str(tmp_path / "t.parquet")], 2)) >= 4
    one = build_index(str(tmp_path / "t.parquet"), tmp_path / "one")
    two = build_index(str(tmp_path / "t.parquet"), tmp_path / "two", workers=2)
    _same_index(one, two)
    assert list(two.keys[:2]) == ["row 1", "row 2"]  # counted from 1, as lines are (was "row 0")
    assert two.header.shards[0].meta["key_base"] == 1
    assert two.read(899)["txt"] == texts[899].encode()
    # an index written before keys counted from 1 ("row 0", no key_base) still opens and reads
    head = json.loads((one.path / "header.json").read_text())
    del head["shards"][0]["meta"]["key_base"]
    (one.path / "header.json").write_text(json.dumps(head))
    np.save(one.path / "keys.npy", np.array([f"row {i}" for i in range(900)]))
    old = LengthIndex.open(one.path)
    assert old.keys[0] == "row 0" and old.read(899)["txt"] == texts[899].encode()


def test_files_beside_the_data_that_are_not_data_are_skipped_and_counted(tmp_path, capsys):
    """Was: a tokenizer.json in a data folder stopped indexing ("name it *.jsonl")."""
    data = tmp_path / "model"
    data.mkdir()
    _jsonl(data / "train.jsonl", 50, seed=5)
    tok = train_bpe(data / "tokenizer.json", corpus(40, seed=1))  # pretty-printed JSON
    (data / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    (data / "config.yaml").write_text("lr: 0.1\n")
    (data / "merges.txt").write_text("#version: 0.2\nĠ t\n")
    (data / "README").write_text("about this corpus\n")
    argv = ["index", str(data), "-o", str(tmp_path / "idx"), "--tokenizer", str(tok)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    index = LengthIndex.open(tmp_path / "idx")
    assert [Path(u).name for u in index.shard_urls] == ["train.jsonl"]
    names = sorted(Path(f.path).name for f in index.header.skipped_files)
    assert names == sorted(
        ["tokenizer.json", "tokenizer_config.json", "config.yaml", "merges.txt", "README"]
    )
    assert "5 files that are not data skipped" in out and "not data: " in out
    # data under a wrong name is still refused by name, not skipped: JSON Lines in a .json
    (data / "more.json").write_bytes(b'{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(UnreadableSourceError, match=r"more\.json: JSON Lines: name it \*\.jsonl"):
        build_index(str(data), tmp_path / "idx2")


def test_a_missing_tokenizer_file_is_named_as_missing(tmp_path, capsys) -> None:
    """Was: "tokenizer spec 'tok/tokenizer.json' not understood"."""
    path = tmp_path / "a.jsonl"
    _jsonl(path, 5, seed=6)
    missing = tmp_path / "tok" / "tokenizer.json"
    assert main(["index", str(path), "-o", str(tmp_path / "i"), "--tokenizer", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"tokenizer file '{missing}' does not exist" in err and "bytes:R" in err
    with pytest.raises(ValueError, match="relative to the working directory"):
        build_index(str(path), tmp_path / "j", config=ScanConfig(tokenizer="no/such.json"))
