"""Cutting big files into pieces for the index workers, and joining the pieces' results.

One 55 MB `.jsonl` used to run on one worker while the others idled. A big local file whose
format can be read in parts (`CorpusFormat.split`: byte ranges of whole lines, runs of row
groups, runs of documents) is cut into pieces of about 1/(4 x workers) of all the bytes (at
least `MIN_PIECE_BYTES`); each piece is scanned like a shard, and the results are joined in
order: a JSON Lines piece's line numbers are shifted by the lines before it and the runs of
failures at the pieces' heads and tails are joined, so the index is identical for any worker
count.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import msgspec
import numpy as np

from .errors import SkippedSample
from .scan import SampleRecord
from .shards import is_seekable
from .sources.registry import format_for

__all__ = ["MIN_PIECE_BYTES", "Piece", "ShardResult", "merge_pieces", "plan_pieces"]

MIN_PIECE_BYTES = 1 << 20  # a piece costs a task and a scanner start (~ms): never smaller
_LINE_KEY = re.compile(r"^line (\d+)$")


class Piece(msgspec.Struct, frozen=True):
    """A shard, or a piece of one big file: `span` in the format's own unit (a .jsonl's byte
    range, a .parquet's row groups, a megatron .bin's documents; None: the whole shard), and
    the bytes [start, end) of the file it accounts for in progress (end 0: size unknown)."""

    url: str
    part: int = 0
    parts: int = 1
    span: tuple[int, int] | None = None
    start: int = 0
    end: int = 0


class ShardResult(msgspec.Struct):
    """What scanning one shard (or one piece of it) found, shipped from a worker."""

    url: str
    records: list[SampleRecord]
    skipped: list[SkippedSample]
    head_failures: int  # failures before the first good sample (all, if none is good)
    tail_failures: int
    fingerprint: str
    size: int
    token_ids: Any = None  # (flat ids, per-sample lengths) with a token store, else None
    checksums: Any = None  # uint32 crc32 of every member of `records`, in member order
    format: str = "tar"  # a sources.registry format name
    meta: dict[str, Any] = {}  # what reading it back needs (megatron: dtype, .idx fingerprint)
    lines: int = 0  # JSON Lines: lines the piece held (numbers the lines of the next piece)


def _split(url: str, size: int, target: int) -> list[tuple[tuple[int, int], int, int]]:
    """(span, first byte, end byte) of each piece of a big local file, or [] to keep it whole:
    about size / target pieces, cut where the format allows (its `split`)."""
    split = format_for(url).split
    n = math.ceil(size / target) if target > 0 else 1
    if split is None or n < 2 or not is_seekable(url) or not os.path.isfile(url):
        return []
    return split(url, size, n)


def plan_pieces(urls: list[str], workers: int) -> list[Piece]:
    """Every shard as one piece, and big local files as several when workers > 1."""
    sizes = [os.path.getsize(u) if is_seekable(u) and os.path.isfile(u) else 0 for u in urls]
    target = max(MIN_PIECE_BYTES, sum(sizes) // (workers * 4)) if workers > 1 else 0
    out: list[Piece] = []
    for url, size in zip(urls, sizes):
        cut = _split(url, size, target) if target and size > target else []
        if len(cut) < 2:
            out.append(Piece(url, end=size))
            continue
        out.extend(
            Piece(url, k, len(cut), span, start, end) for k, (span, start, end) in enumerate(cut)
        )
    return out


def _shift_line(key: str, by: int) -> str:
    m = _LINE_KEY.match(key)
    return f"line {int(m.group(1)) + by}" if m and by else key


def _merge(parts: list[ShardResult]) -> ShardResult:
    """The pieces of one file as one shard: records, skips, checksums and ids in order,
    JSON Lines keys renumbered past the lines of the pieces before, the failure runs at the
    head and tail joined across pieces."""
    if len(parts) == 1:
        return parts[0]
    seen = 0
    for p in parts:
        if seen:
            for r in p.records:
                r.key = _shift_line(r.key, seen)
            p.skipped = [
                SkippedSample(s.shard, _shift_line(s.key, seen), s.reason) for s in p.skipped
            ]
        seen += p.lines
    head = tail = 0
    for p in parts:
        head += p.head_failures if p.records else len(p.skipped)
        if p.records:
            break
    for p in reversed(parts):
        tail += p.tail_failures if p.records else len(p.skipped)
        if p.records:
            break
    ids = [p.token_ids for p in parts]
    first = parts[0]
    return ShardResult(
        first.url,
        [r for p in parts for r in p.records],
        [s for p in parts for s in p.skipped],
        head,
        tail,
        first.fingerprint,
        first.size,
        token_ids=None
        if any(t is None for t in ids)
        else (np.concatenate([t[0] for t in ids]), np.concatenate([t[1] for t in ids])),
        checksums=np.concatenate([p.checksums for p in parts]),
        format=first.format,
        meta=first.meta,
        lines=seen,
    )


def merge_pieces(pieces: list[Piece], results: list[ShardResult]) -> list[ShardResult]:
    """One result per shard from the results of its pieces (in piece order)."""
    out: list[ShardResult] = []
    k = 0
    while k < len(pieces):
        n = pieces[k].parts
        out.append(_merge(results[k : k + n]))
        k += n
    return out
