"""Build a length index: scan shards in a process pool, write arrays and header.

Shards are dealt to a spawn-context process pool in chunks of consecutive shards (about four
chunks per worker: enough to balance uneven shards, few enough that each chunk's single video
probe child, ~0.5 s to start, is amortised). A big plain `.jsonl`, `.parquet` or megatron
`.bin` is first cut into pieces of about 1/(4 x workers) of the bytes (at least
`MIN_PIECE_BYTES`): byte ranges of whole lines, runs of row groups, runs of documents, so one
55 MB file no longer runs on one worker while the others idle. Results are merged in shard
order (a JSON Lines piece's line numbers are shifted by the lines before it), so the index is
identical for any worker count. The consecutive-failure fuse spans shard boundaries: each shard
reports the failures at its head and tail and the parent joins the runs.

Progress counts bytes read inside every file, so a long single file shows its bytes, samples,
rate and time left: scanned here, every `REPORT_BYTES` (1 MiB) or second; in workers, the same
through a manager queue once the build holds `LIVE_REPORT_BYTES` (64 MiB; below it a finished
chunk reports, sparing the manager's ~1 s start).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np

from ..errors import ConfigError
from ..progress import Progress
from .checksum import MemberHasher, pipe_fingerprint
from .errors import (
    EmptyIndexError,
    ErrorPolicy,
    SkippedFile,
    TooManyFailures,
    empty_scan_message,
)
from .index_format import (
    CHECKSUM_ARRAY,
    CHECKSUM_DTYPE,
    FORMAT_VERSION,
    HEADER_NAME,
    MEMBER_ARRAYS,
    SAMPLE_ARRAYS,
    IndexHeader,
    ShardEntry,
    index_fingerprint,
)
from .length_index import LengthIndex
from .pieces import Piece, ShardResult, merge_pieces, plan_pieces
from .remote import is_remote
from .scan import SampleRecord, ScanConfig, Scanner
from .shards import as_local_path, expand_shards, is_seekable, shard_fingerprint
from .sources.registry import format_for
from .text import TokenCounter, as_counter, load_counter
from .token_store import TokenRecorder, pack_ids, storable, write_store

__all__ = [
    "LIVE_REPORT_BYTES",
    "REPORT_BYTES",
    "ProgressOptions",
    "build_index",
]

REPORT_BYTES = 1 << 20  # a worker tells the parent every MiB read (or every second)
REPORT_S = 1.0
# bytes from which worker processes report progress inside files: their queue lives in a
# manager process that costs ~0.5-1.5 s to start on 2 busy cores; below this a build reports
# per finished chunk of pieces instead (it takes seconds at ~20 MB/s a worker anyway)
LIVE_REPORT_BYTES = 64 << 20


@dataclass(kw_only=True, slots=True)
class ProgressOptions:
    """Where `build_index` reports progress: `stream` (default stderr; a bar on a terminal,
    else a plain line every `every_s` seconds, 10 by default, and one at the end)."""

    stream: IO[str] | None = None
    every_s: float = 10.0


class _Meter:
    """Progress of one piece: bytes read and samples, sent on every `REPORT_BYTES` or
    `REPORT_S`, never past the piece's share of the file (the last report tops it up)."""

    def __init__(self, piece: Piece, send: Callable[[int, int], None] | None) -> None:
        self.piece, self.send = piece, send
        self.budget = piece.end - piece.start
        self.bytes = self.samples = 0  # sent so far
        self._t = time.perf_counter()

    def at(self, done: int, samples: int, *, last: bool = False) -> None:
        if self.send is None:
            return
        done = max(self.bytes, min(done, self.budget) if self.budget > 0 else done)
        now = time.perf_counter()
        if last or done - self.bytes >= REPORT_BYTES or now - self._t >= REPORT_S:
            if done > self.bytes or samples > self.samples:
                self.send(done - self.bytes, samples - self.samples)
            self.bytes, self.samples, self._t = done, samples, now

    def position(self, scanner: Scanner, rec: SampleRecord) -> int:
        """Bytes of the piece read once `rec` is scanned: the format's own fraction (JSON
        Lines, tables) or the end of the record's last member (tars, megatron)."""
        cursor = scanner.cursor
        if cursor is not None and self.budget > 0:
            return int(cursor.done_fraction() * self.budget)
        end = max((off + size for off, size in rec.members.values()), default=0)
        return end - self.piece.start


def _scan_shard(
    scanner: Scanner,
    piece: Piece | str,
    recorder: TokenRecorder | None = None,
    send: Callable[[int, int], None] | None = None,
) -> ShardResult:
    if isinstance(piece, str):
        piece = Piece(piece)
    url = piece.url
    fmt = format_for(url)
    first = piece.part == 0
    timeout_s = scanner.config.stream_timeout_s
    meta = fmt.meta(url, timeout_s) if first and fmt.meta is not None else {}
    # members are read back later by range or row, not shipped to the parent; a stream's
    # samples (pipe:, FIFO) cannot be read again and keep theirs
    drop = is_seekable(url) or is_remote(url)
    start = len(scanner.log.skipped)
    records: list[SampleRecord] = []
    ids: list[np.ndarray] = []
    head = -1
    last = start  # skipped count when the last good record was seen
    crcs: list[int] = []
    meter = _Meter(piece, send)
    hasher = MemberHasher(url, timeout_s=scanner.config.stream_timeout_s)
    for rec in scanner.scan(url, piece.span):
        now = len(scanner.log.skipped)
        if head < 0:
            head = now - start
        last = now
        records.append(rec)
        if recorder is not None:
            ids.append(recorder.take(rec))
        crcs.extend(hasher.record(rec))  # before the payload goes: hashed from memory
        meter.at(meter.position(scanner, rec), len(records))
        if drop:
            rec.payload = None  # members are fetched by range later, not shipped to the parent
    lines = int(getattr(scanner.cursor, "lines", 0) or 0)
    skipped = scanner.log.skipped[start:]
    head = len(skipped) if head < 0 else head
    tail = len(skipped) if not records else len(scanner.log.skipped) - last
    hasher.close()
    meter.at(meter.budget, len(records), last=True)
    size = os.path.getsize(url) if is_seekable(url) else 0
    checksums = np.array(crcs, dtype=CHECKSUM_DTYPE)
    fingerprint = shard_fingerprint(url) if first else ""
    if url.startswith("pipe:"):  # was "": a changed command output was never seen
        fingerprint = pipe_fingerprint([m for r in records for m in r.members.values()], checksums)
    res = ShardResult(
        url, records, skipped, head, tail, fingerprint, size, checksums=checksums, format=fmt.name
    )
    res.meta, res.lines = meta, lines
    if recorder is not None and not recorder.unusable:
        res.token_ids = pack_ids(ids)
    return res


def _scan_chunk(
    pieces: list[Piece], config: ScanConfig, counter: TokenCounter, report: Any = None
) -> list[ShardResult]:
    """Scan consecutive shards (or pieces) with one Scanner, so one probe child serves them
    all; `report` (a manager queue) gets (bytes, samples) as they are read."""
    recorder = counter if isinstance(counter, TokenRecorder) else None
    send = None if report is None else lambda b, n: report.put((b, n))
    with Scanner(config, counter) as scanner:
        return [_scan_shard(scanner, p, recorder, send) for p in pieces]


def _check_runs(results: list[ShardResult], policy: ErrorPolicy) -> None:
    """Raise when bad samples run on across shard boundaries past the policy's limit."""
    run = 0
    for res in results:
        if res.records:
            run += res.head_failures
            if run < policy.max_consecutive_failures:
                run = res.tail_failures
                continue
        else:
            run += len(res.skipped)
            if run < policy.max_consecutive_failures:
                continue
        raise TooManyFailures(
            f"{run} consecutive bad samples across shards, up to {res.url}; the dataset looks "
            f"broken. Fix it or raise max_consecutive_failures "
            f"(now {policy.max_consecutive_failures})"
        )


def _write(
    out: Path, header: IndexHeader, results: list[ShardResult], recorder: TokenRecorder | None
) -> None:
    records = [r for res in results for r in res.records]
    n = len(records)
    cols: dict[str, np.ndarray] = {k: np.zeros(n, dtype=v) for k, v in SAMPLE_ARRAYS.items()}
    shard_of = {res.url: s for s, res in enumerate(results)}
    exts: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    for i, r in enumerate(records):
        cols["shard"][i] = shard_of[r.url]
        cols["modality"][i] = r.modality
        cols["text_tokens"][i] = r.text_tokens
        cols["vision_tokens"][i] = r.vision_tokens
        cols["special_tokens"][i] = r.special_tokens
        cols["causal"][i] = r.causal
        cols["member_start"][i] = len(exts)
        cols["member_count"][i] = len(r.members)
        cols["num_frames"][i], cols["fps"][i] = r.num_frames, r.fps
        cols["width"][i], cols["height"][i] = r.width, r.height
        for ext, (off, size) in r.members.items():
            exts.append(ext)
            offsets.append(off)
            sizes.append(size)
    cols["seqlens"][:] = cols["text_tokens"] + cols["vision_tokens"] + cols["special_tokens"]
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "keys.npy", np.array([r.key for r in records], dtype=str))
    np.save(tmp / "member_ext.npy", np.array(exts, dtype=str))
    np.save(tmp / "member_offset.npy", np.array(offsets, dtype=MEMBER_ARRAYS["member_offset"]))
    np.save(tmp / "member_size.npy", np.array(sizes, dtype=MEMBER_ARRAYS["member_size"]))
    for name, arr in cols.items():
        np.save(tmp / f"{name}.npy", arr)
    crcs = [r.checksums for r in results if r.checksums is not None]
    np.save(tmp / f"{CHECKSUM_ARRAY}.npy", np.concatenate(crcs or [np.zeros(0, CHECKSUM_DTYPE)]))
    head = msgspec.json.format(msgspec.json.encode(header))
    try:  # the header must read back (nan/inf encode as null): never rename in a bad index
        msgspec.json.decode(head, type=IndexHeader)
    except msgspec.ValidationError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"the index header of {out} would not read back ({exc})") from exc
    (tmp / HEADER_NAME).write_bytes(head)
    if recorder is not None:
        pieces = (r.token_ids for r in results)
        write_store(
            tmp,
            tokenizer=header.tokenizer,
            vocab_size=recorder.vocab_size(),
            pieces=pieces,
            index_fingerprint=index_fingerprint(header),
        )
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def _recorder(counter: TokenCounter, store_tokens: bool | None) -> TokenRecorder | None:
    """The token store's recorder: always (`True`, refusing an estimate), never (`False`),
    or by default (`None`) when the counter tokenizes (a tokenizer file, `py:` ids)."""
    if store_tokens is None:
        return TokenRecorder(counter, required=False, keep_npy=False) if storable(counter) else None
    return TokenRecorder(counter) if store_tokens else None


def _tokenizer_file(counter: Any) -> str:
    """The absolute path of the file `counter` was loaded from, or ""."""
    inner = getattr(counter, "fn", counter)
    return str(getattr(counter, "source", "") or getattr(inner, "source", "") or "")


def _bar(progress: bool | ProgressOptions, pieces: list[Piece]) -> Progress | None:
    if progress is False:
        return None
    opts = progress if isinstance(progress, ProgressOptions) else ProgressOptions()
    known = all(p.end > 0 for p in pieces)  # remote / pipe: no total, no time left
    total = sum(p.end - p.start for p in pieces) if known else 0
    return Progress(
        "fcp index",
        total,
        unit="bytes",
        extra="samples",
        every_s=opts.every_s,
        stream=opts.stream,
    )


def _drain(report: Any, bar: Progress) -> None:
    while True:
        try:
            nbytes, samples = report.get_nowait()
        except queue.Empty:
            return
        bar.advance(nbytes, extra=samples)


def _scan_all(
    pieces: list[Piece],
    config: ScanConfig,
    counter: TokenCounter,
    recorder: TokenRecorder | None,
    workers: int,
    bar: Progress | None,
) -> list[ShardResult]:
    """Every piece's result, in order: in this process, or in a spawn pool whose workers
    report (bytes, samples) through a manager queue the parent drains while it waits."""
    send = None if bar is None else lambda b, n: bar.advance(b, extra=n)
    # Chunks of consecutive pieces: about 4 per worker balance load while each chunk starts
    # at most one probe child (a spawn costs ~0.5 s).
    size = max(1, -(-len(pieces) // (workers * 4)))
    chunks = [pieces[k : k + size] for k in range(0, len(pieces), size)]
    if workers == 1 or len(chunks) == 1:
        with Scanner(config, counter) as scanner:
            return [_scan_shard(scanner, p, recorder, send) for p in pieces]
    ctx = mp.get_context("spawn")
    live = bar is not None and sum(p.end - p.start for p in pieces) >= LIVE_REPORT_BYTES
    manager = ctx.Manager() if live else None
    try:
        report = manager.Queue() if manager is not None else None
        with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=ctx) as pool:
            futures: list[Future[list[ShardResult]]] = [
                pool.submit(_scan_chunk, c, config, counter, report) for c in chunks
            ]
            owner = {f: c for f, c in zip(futures, chunks)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                if report is not None and bar is not None:
                    _drain(report, bar)
                elif bar is not None:  # no live reports: a chunk's bytes when it is done
                    for f in done:
                        got = f.result()
                        nbytes = sum(p.end - p.start for p in owner[f])
                        bar.advance(nbytes, extra=sum(len(r.records) for r in got))
            results = [r for f in futures for r in f.result()]
            if report is not None and bar is not None:
                _drain(report, bar)
            return results
    finally:
        if manager is not None:
            manager.shutdown()


def build_index(
    shards: Sequence[str] | str,
    out: str | os.PathLike[str],
    *,
    config: ScanConfig | None = None,
    counter: TokenCounter | Any = None,
    workers: int = 1,
    progress: bool | ProgressOptions = False,
    store_tokens: bool | None = False,
    allow_empty: bool = False,
) -> LengthIndex:
    """Scan `shards` (paths, globs, braces, pipe:) and write an index directory at `out`.

    `counter` (any picklable TokenCounter) overrides `config.tokenizer`; its spec is recorded,
    and the file it was loaded from (`header.tokenizer_file`). Raises SampleError
    (on_error="raise") or TooManyFailures; otherwise skipped samples are listed in
    `index.skipped`, and files inside data directories that are not data (a tokenizer.json, a
    README) in `index.header.skipped_files`. `store_tokens`: a token store beside the index
    with every text sample's ids, captured while the workers count them (readers.token_store):
    None (what `fcp index` does unless `--no-store`) writes one when the counter tokenizes (a
    tokenizer file, `py:` ids; not a `bytes:R` estimate) and some text needs it, True always
    (an estimate is refused), False (the default here) never. `progress`: True or a
    ProgressOptions reports bytes read inside every file. A scan that finds no sample raises
    EmptyIndexError naming the skips and writes nothing, unless `allow_empty` (an empty source
    meant for a Blend at weight 0, say).
    """
    from fcp_data import __version__

    config = config or ScanConfig()
    counter = as_counter(counter) if counter is not None else load_counter(config.tokenizer)
    if store_tokens is not None and not isinstance(store_tokens, bool):
        raise ConfigError(f"store_tokens={store_tokens!r} must be None (auto), True or False")
    recorder = _recorder(counter, store_tokens)
    tokenizer_file = _tokenizer_file(counter)
    counter = recorder or counter
    policy = ErrorPolicy(
        on_error=config.on_error,  # type: ignore[arg-type]
        max_consecutive_failures=config.max_consecutive_failures,
    )
    # every setting is checked (Scanner: ScanConfig fields, rule overrides) before any work
    rule_settings = Scanner(config, counter).rule.settings()
    not_data: list[SkippedFile] = []
    urls = expand_shards(shards, skipped=not_data)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r} must be an integer >= 1")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / HEADER_NAME).is_file():
        raise FileExistsError(
            f"{out} exists and is not a length index; refusing to replace it. "
            "Choose a new or empty output directory"
        )
    pieces = plan_pieces(urls, workers)
    bar = _bar(progress, pieces)
    if bar is not None:
        bar.__enter__()
    try:
        results = merge_pieces(pieces, _scan_all(pieces, config, counter, recorder, workers, bar))
    except BaseException:
        if bar is not None:
            bar.__exit__(*sys.exc_info())
        raise
    if bar is not None:
        bar.__exit__(None, None, None)
    _check_runs(results, policy)
    if not allow_empty and not any(r.records for r in results):
        raise EmptyIndexError(
            empty_scan_message(
                f"No index was written at {out}.", urls, [s for r in results for s in r.skipped]
            )
        )
    if recorder is not None and store_tokens is None:
        stored = [r.token_ids for r in results]
        if any(t is None for t in stored) or not any(len(t[0]) for t in stored):
            recorder = None  # count-only counter, or nothing the loader would tokenize

    def rel(url: str) -> str:
        if not is_seekable(url):
            return url
        return as_local_path(os.path.relpath(os.path.abspath(url), out.resolve()))

    header = IndexHeader(
        # the oldest version that can record every format used (tars alone: version 1)
        format_version=max((format_for(u).index_version for u in urls), default=FORMAT_VERSION),
        num_samples=sum(len(r.records) for r in results),
        scan=config,
        rule=rule_settings,
        tokenizer=counter.spec,
        shards=[
            ShardEntry(
                url=rel(r.url),
                fingerprint=r.fingerprint,
                size=r.size,
                num_samples=len(r.records),
                format=r.format,
                meta=r.meta,
            )
            for r in results
        ],
        skipped=[s for r in results for s in r.skipped],
        fcp_version=__version__,
        tokenizer_file=tokenizer_file,
        skipped_files=not_data,
    )
    _write(out, header, results, recorder)
    # the commands were this caller's own arguments: the index it gets back may run them
    # (one opened later from disk may not, unless asked: LengthIndex.open(allow_pipe=True))
    return LengthIndex.open(out, allow_pipe=any(u.startswith("pipe:") for u in urls))
