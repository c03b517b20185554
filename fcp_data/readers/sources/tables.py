"""Parquet files and HF `datasets` Arrow files: a sample per row of the `--text-field` column.

Both are read with pyarrow (the optional `sources` extra); `datasets` itself is never imported.
A row's member is what the scanner and the loader already understand: a string column gives
`txt` (the UTF-8 text), a chat column (a list of {role, content} structs) gives `json`
(`{"<column>": [...]}`, read by the chat path). The member's "offset" is the row number in the
file and its size the member's byte length, so the index's per-member crc32 still verifies every
read.

Random access: a Parquet file is read one row group at a time (the unit its pages are
compressed in; the reader of each process keeps the last row group it decoded, so the rows of
one group cost one decode); a `save_to_disk` file (an Arrow IPC stream) is memory-mapped whole
and rows are sliced from it without a copy. Neither is read over http(s)/s3: a row is not a
byte range, so remote tables are refused at expansion (copy them locally).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import msgspec
import numpy as np

from ...errors import ConfigError, MemberError, OutOfRangeError
from ...optional import require
from ..shards import BadMember, RawSample
from .format import CorpusFormat, Span, SplitPiece

__all__ = ["FORMATS", "TableRows", "TableSamples", "iter_table", "row_group_rows"]


def _pa(url: str) -> Any:
    return require("pyarrow", f"reading {url} (Parquet / Arrow)")


def _kind(url: str, schema: Any, column: str) -> str:
    """ "txt" for a string column, "json" for a chat column; ConfigError otherwise."""
    pa = _pa(url)
    if column not in schema.names:
        raise ConfigError(
            f"{url} has no column {column!r}; its columns are {schema.names}; choose one with "
            "--text-field (ScanConfig.text_field)"
        )
    typ = schema.field(column).type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "txt"
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_struct(
        typ.value_type
    ):
        return "json"
    raise ConfigError(
        f"{url}: column {column!r} is {typ}, neither text (string) nor a chat (a list of "
        "{role, content} structs); choose another with --text-field"
    )


def _member(kind: str, column: str, value: Any) -> bytes:
    if kind == "txt":
        return value.encode("utf-8")
    return msgspec.json.encode({column: value})


def _open(url: str, fmt: str) -> tuple[Any, Any]:
    """(schema, handle): a ParquetFile, or the memory-mapped table of an Arrow stream file."""
    pa = _pa(url)
    if fmt == "parquet":
        pq = require("pyarrow.parquet", f"reading {url} (Parquet)")
        try:
            f = pq.ParquetFile(url, memory_map=True)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"{url} is not a readable Parquet file ({exc})") from exc
        return f.schema_arrow, f
    try:
        source = pa.memory_map(url, "r")
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{url} is not a readable Arrow IPC file ({exc})") from exc
    return table.schema, table


def row_group_rows(url: str) -> list[int]:
    """Rows of each row group of a Parquet file (its footer only): how `fcp index --workers`
    splits one big file."""
    pq = require("pyarrow.parquet", f"reading {url} (Parquet)")
    meta = pq.ParquetFile(url, memory_map=True).metadata
    return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]


class TableSamples:
    """The samples of one Parquet / Arrow file, or of Parquet row groups [lo, hi) (a piece of
    a file split across `fcp index --workers`): a row each, keyed "row N" counted from 1 in the
    file (as "line N" of JSON Lines and "doc N" of megatron), member offset the 0-based row.
    `done_fraction()` is the share of the span's rows read, for progress inside a file."""

    def __init__(self, url: str, fmt: str, column: str, span: tuple[int, int] | None) -> None:
        self.url, self.fmt, self.column = url, fmt, column
        self.span = span
        self.lines = 0  # rows seen (the builder's count for a piece; keys need no shift)
        self._total = 0

    def done_fraction(self) -> float:
        return min(1.0, self.lines / self._total) if self._total else 0.0

    def __iter__(self) -> Iterator[RawSample | BadMember]:
        url, fmt, column = self.url, self.fmt, self.column
        schema, handle = _open(url, fmt)
        kind = _kind(url, schema, column)
        if fmt == "parquet":
            meta = handle.metadata
            rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            lo, hi = self.span if self.span is not None else (0, len(rows))
            row = sum(rows[:lo])
            self._total = sum(rows[lo:hi])
            chunks = (handle.read_row_group(g, columns=[column]).column(0) for g in range(lo, hi))
        else:
            if self.span is not None:
                raise ConfigError(f"{url}: only Parquet files are read by row group")
            row, self._total = 0, handle.num_rows
            chunks = iter([handle.column(column)])
        for chunk in chunks:
            for value in chunk.to_pylist():
                key = f"row {row + 1}"
                self.lines += 1
                if value is None:
                    yield BadMember(key, f"column {column!r} is null in this row")
                else:
                    data = _member(kind, column, value)
                    yield RawSample(key=key, members={kind: (row, len(data))}, payload={kind: data})
                row += 1


def iter_table(
    url: str, fmt: str, column: str, span: tuple[int, int] | None = None
) -> TableSamples:
    """Samples of one Parquet / Arrow file (see `TableSamples`)."""
    return TableSamples(url, fmt, column, span)


class TableRows:
    """Random access to the rows of one file for `LengthIndex.read` (one per process)."""

    def __init__(self, url: str, fmt: str, column: str) -> None:
        self.url, self.fmt, self.column = url, fmt, column
        schema, self._handle = _open(url, fmt)
        self.kind = _kind(url, schema, column)
        if fmt == "parquet":
            meta = self._handle.metadata
            rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        else:
            rows = [self._handle.num_rows]
        self._starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._cached: tuple[int, Any] = (-1, None)
        self._lock = threading.Lock()  # loader reads may run in helper threads

    def member(self, row: int) -> bytes:
        """The member bytes of `row` (what the scan recorded and checksummed)."""
        if not 0 <= row < int(self._starts[-1]):
            raise OutOfRangeError(f"{self.url} has {int(self._starts[-1])} rows, not row {row}")
        if self.fmt == "parquet":
            g = int(np.searchsorted(self._starts, row, side="right") - 1)
            with self._lock:
                if self._cached[0] != g:
                    col = self._handle.read_row_group(g, columns=[self.column]).column(0)
                    self._cached = (g, col)
                value = self._cached[1][row - int(self._starts[g])].as_py()
        else:
            value = self._handle.column(self.column)[row].as_py()
        if value is None:
            raise MemberError(f"{self.url}: row {row} of column {self.column!r} is null")
        return _member(self.kind, self.column, value)


def _split(url: str, size: int, n: int) -> list[SplitPiece]:
    """About `n` runs of row groups of a Parquet file, each accounting for its rows' share of
    the file's bytes; [] when it has fewer than two row groups or no row."""
    rows = np.asarray(row_group_rows(url), dtype=np.int64)
    if rows.size < 2 or rows.sum() == 0:
        return []
    share = np.concatenate([[0], np.cumsum(rows)]) * size // int(rows.sum())  # bytes by rows
    groups = sorted(
        {int(np.searchsorted(share, size * k // n)) for k in range(n + 1)} | {0, rows.size}
    )
    groups = [g for g in groups if g <= rows.size]
    return [((a, b), int(share[a]), int(share[b])) for a, b in pairwise(groups)]


def _samples(fmt: str) -> Callable[[str, Any, Span | None], TableSamples]:
    def samples(url: str, config: Any, span: Span | None) -> TableSamples:
        return iter_table(url, fmt, config.text_field, span)

    return samples


def _rows(fmt: str) -> Callable[[str, str], TableRows]:
    def rows(url: str, text_field: str) -> TableRows:
        return TableRows(url, fmt, text_field)

    return rows


def _meta(url: str, timeout_s: float) -> dict[str, Any]:
    return {"key_base": 1}  # "row 1": counted from 1 (older indexes named rows from 0)


def _parquet_magic(head: bytes) -> bool:
    return head[:4] == b"PAR1"


def _arrow_magic(head: bytes) -> bool:
    return head[:6] == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff"


FORMATS = (
    CorpusFormat(
        name="parquet",
        title="Parquet (.parquet)",
        suffixes=(".parquet", ".pq"),
        byte_range=False,
        samples=_samples("parquet"),
        split=_split,
        rows=_rows("parquet"),
        meta=_meta,
        magic=_parquet_magic,
        hint="Parquet data: name it *.parquet",
    ),
    CorpusFormat(
        name="arrow",
        title="a HF datasets save_to_disk directory (data-*.arrow)",
        suffixes=(".arrow",),
        byte_range=False,
        samples=_samples("arrow"),
        rows=_rows("arrow"),
        meta=_meta,
        magic=_arrow_magic,
        hint="Arrow IPC data: name it *.arrow",
    ),
)
