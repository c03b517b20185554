"""Corpus formats as a registry: each format one module, one tuple of modules, nothing else.

The invariants: every suffix is owned by one format, every format and module is listed once,
a shard's format is what the registry says its name is, and no module outside the format
modules (libraries and application alike) compares a format name: the `fmt == "parquet"`
switches that made a new format touch five files. The planted check: a toy format registered
by monkeypatching the tuple alone is read end to end by `build_index`, `LengthIndex.read` and
the loader.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fcp
import fcp_data
import fcp_exec
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.shards import BadMember, RawSample
from fcp_data.readers.sources import registry
from fcp_data.readers.sources.format import CorpusFormat, Span

FORMAT_MODULES = {m.__file__ for m in registry.MODULES}


def test_every_suffix_is_owned_by_one_format() -> None:
    owner: dict[str, str] = {}
    for fmt in registry.formats():
        assert fmt.suffixes, f"{fmt.name} claims no suffix"
        for ends in fmt.suffixes:
            assert ends.startswith(".") and ends == ends.lower(), ends
            assert ends not in owner, f"{ends} is claimed by {owner[ends]} and {fmt.name}"
            owner[ends] = fmt.name


def test_every_format_and_module_is_listed_once() -> None:
    names = [f.name for f in registry.formats()]
    assert len(names) == len(set(names)), names
    assert len(registry.MODULES) == len(set(registry.MODULES))
    for module in registry.MODULES:
        assert module.FORMATS and all(isinstance(f, CorpusFormat) for f in module.FORMATS)
    assert set(names) >= {"tar", "jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow", "megatron"}


def test_detection_goes_through_the_registry() -> None:
    for fmt in registry.formats():
        for ends in fmt.suffixes:
            assert registry.format_of(f"dir/x{ends}") == fmt.name
            assert registry.format_of(f"DIR/X{ends.upper()}") == fmt.name
            assert registry.format_for(f"s3://b/x{ends}?v=2") is fmt
            assert registry.format_named(fmt.name) is fmt
    fallback = registry.fallback()
    assert registry.format_for("pipe:cat x.jsonl") is fallback
    assert registry.format_for("shard-000") is fallback


def test_a_module_left_out_of_the_tuple_reads_nothing(monkeypatch) -> None:
    """Planted: without the tables module, `.parquet` is no longer a format of its own."""
    from fcp_data.readers.sources import tables

    monkeypatch.setattr(registry, "MODULES", tuple(m for m in registry.MODULES if m is not tables))
    assert registry.format_for("x.parquet") is registry.fallback()
    with pytest.raises(fcp_data.errors.ConfigError, match="'parquet' is not one"):
        registry.format_named("parquet")


def _names(fmt_names: set[str], node: ast.AST) -> set[str]:
    """The format names a comparison's string constants spell (`x == "tar"`, `x in (...)`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & fmt_names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {n for e in node.elts for n in _names(fmt_names, e)}
    return set()


def _switches(path: Path, fmt_names: set[str]) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            hit = set().union(*(_names(fmt_names, n) for n in [node.left, *node.comparators]))
            if hit:
                yield f"{path}:{node.lineno}: compares with {sorted(hit)}"


def test_no_format_switch_outside_the_format_modules() -> None:
    names = {f.name for f in registry.formats()}
    found = [
        line
        for package in (fcp_data, fcp_exec, fcp)
        for path in sorted(Path(package.__file__).parent.rglob("*.py"))
        if str(path) not in FORMAT_MODULES
        for line in _switches(path, names)
    ]
    assert found == []


def test_the_switch_walk_catches_a_planted_switch(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('def f(fmt):\n    return fmt == "parquet" or fmt in ("jsonl", "x")\n')
    got = list(_switches(planted, {"parquet", "jsonl"}))
    assert len(got) == 2 and "['parquet']" in got[0] and "['jsonl']" in got[1]


# -- a toy format, registered by the tuple alone ------------------------------------------------


def _toy_samples(url: str, config: Any, span: Span | None) -> Iterator[Any]:
    """`.toy`: a sample per `KEY|TEXT` line, its member `txt` the TEXT's byte range."""
    at = 0
    with open(url, "rb") as f:
        for n, line in enumerate(f.read().split(b"\n"), start=1):
            key, sep, text = line.partition(b"|")
            if sep and text:
                start = at + len(key) + 1
                yield RawSample(
                    key=key.decode(), members={"txt": (start, len(text))}, payload={"txt": text}
                )
            elif line:
                yield BadMember(f"line {n}", "no KEY|TEXT")
            at += len(line) + 1


TOY = types.SimpleNamespace(
    __file__="toy.py",
    FORMATS=(
        CorpusFormat(
            name="toy",
            title="toy lines (.toy)",
            suffixes=(".toy",),
            byte_range=True,
            samples=_toy_samples,
        ),
    ),
)


def test_a_new_format_is_its_module_and_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, TOY))
    texts = {f"k{i:02d}": ("word " * (3 + 7 * i)).strip() for i in range(12)}
    body = "\n".join(f"{k}|{t}" for k, t in texts.items()) + "\nbroken\n"
    path = tmp_path / "corpus.toy"
    path.write_text(body, encoding="utf-8")

    index = build_index(str(path), tmp_path / "index")
    assert index.header.shards[0].format == "toy"
    assert [str(k) for k in index.keys] == list(texts)
    assert [s.key for s in index.skipped] == ["line 13"]
    for i, key in enumerate(index.keys):
        assert index.read(i)["txt"].decode() == texts[str(key)]
    reopened = LengthIndex.open(tmp_path / "index")  # checksums verified on every read
    assert reopened.read(3)["txt"].decode() == texts["k03"]

    cost = CostModel.from_model("qwen3-1.7b", "cpu")
    cap = int(index.seqlens.sum()) + 64
    loader = FCPDataLoader(
        tmp_path / "index",
        cluster=Cluster(1, tokens_per_replica=cap),
        cost=cost,
        replica=0,
        global_batch_size=len(texts),
        num_workers=0,
        options=LoaderOptions(eod_id=0, shuffle=False),
    )
    mbs = list(loader)
    seen = sorted(int(s) for mb in mbs for s in mb.sample_ids)
    assert seen == list(range(len(texts)))
    unpadded = sum(int(mb.cu_seqlens[-1]) for mb in mbs)  # the sequences, without padding
    assert unpadded == int(np.sum(index.seqlens))
