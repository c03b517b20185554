"""Build a length index: scan shards in a process pool, write arrays and header.

Shards are dealt to a spawn-context process pool in chunks of consecutive shards (about four
chunks per worker: enough to balance uneven shards, few enough that each chunk's single video
probe child, ~0.5 s to start, is amortised). Results are merged in shard order, so the index is
identical for any worker count. The consecutive-failure fuse spans shard boundaries: each shard
reports the failures at its head and tail and the parent joins the runs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import ConfigError
from ..progress import Progress
from .checksum import MemberHasher, pipe_fingerprint
from .errors import (
    EmptyIndexError,
    ErrorPolicy,
    SkippedSample,
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
    SOURCES_FORMAT_VERSION,
    IndexHeader,
    ShardEntry,
    index_fingerprint,
)
from .length_index import LengthIndex
from .remote import is_remote
from .scan import SampleRecord, ScanConfig, Scanner
from .shards import as_local_path, expand_shards, is_seekable, shard_fingerprint
from .sources import format_of, source_meta
from .text import TokenCounter, as_counter, load_counter
from .token_store import TokenRecorder, pack_ids, write_store

__all__ = ["build_index"]


class _ShardResult(msgspec.Struct):
    url: str
    records: list[SampleRecord]
    skipped: list[SkippedSample]
    head_failures: int  # failures before the first good sample (all, if none is good)
    tail_failures: int
    fingerprint: str
    size: int
    token_ids: Any = None  # (flat ids, per-sample lengths) with a token store, else None
    checksums: Any = None  # uint32 crc32 of every member of `records`, in member order
    format: str = "tar"  # sources.FORMATS
    meta: dict[str, Any] = {}  # what reading it back needs (megatron: dtype, .idx fingerprint)


def _scan_shard(scanner: Scanner, url: str, recorder: TokenRecorder | None = None) -> _ShardResult:
    fmt = format_of(url)
    meta = source_meta(url, fmt, timeout_s=scanner.config.stream_timeout_s)
    drop = is_remote(url) or fmt != "tar"  # rows, decompressed lines, ids: read back later
    start = len(scanner.log.skipped)
    records: list[SampleRecord] = []
    ids: list[np.ndarray] = []
    head = -1
    last = start  # skipped count when the last good record was seen
    crcs: list[int] = []
    hasher = MemberHasher(url, timeout_s=scanner.config.stream_timeout_s)
    for rec in scanner.scan(url):
        now = len(scanner.log.skipped)
        if head < 0:
            head = now - start
        last = now
        records.append(rec)
        if recorder is not None:
            ids.append(recorder.take(rec))
        crcs.extend(hasher.record(rec))  # before the payload goes: hashed from memory
        if drop:
            rec.payload = None  # members are fetched by range later, not shipped to the parent
    skipped = scanner.log.skipped[start:]
    head = len(skipped) if head < 0 else head
    tail = len(skipped) if not records else len(scanner.log.skipped) - last
    hasher.close()
    size = os.path.getsize(url) if is_seekable(url) else 0
    checksums = np.array(crcs, dtype=CHECKSUM_DTYPE)
    fingerprint = shard_fingerprint(url)
    if url.startswith("pipe:"):  # was "": a changed command output was never seen
        fingerprint = pipe_fingerprint([m for r in records for m in r.members.values()], checksums)
    res = _ShardResult(
        url, records, skipped, head, tail, fingerprint, size, checksums=checksums, format=fmt
    )
    res.meta = meta
    if recorder is not None:
        res.token_ids = pack_ids(ids)
    return res


def _scan_chunk(urls: list[str], config: ScanConfig, counter: TokenCounter) -> list[_ShardResult]:
    """Scan consecutive shards with one Scanner, so one probe child serves them all."""
    recorder = counter if isinstance(counter, TokenRecorder) else None
    with Scanner(config, counter) as scanner:
        return [_scan_shard(scanner, u, recorder) for u in urls]


def _check_runs(results: list[_ShardResult], policy: ErrorPolicy) -> None:
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
    out: Path, header: IndexHeader, results: list[_ShardResult], recorder: TokenRecorder | None
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


def build_index(
    shards: Sequence[str] | str,
    out: str | os.PathLike[str],
    *,
    config: ScanConfig | None = None,
    counter: TokenCounter | Any = None,
    workers: int = 1,
    progress: bool = False,
    store_tokens: bool = False,
    allow_empty: bool = False,
) -> LengthIndex:
    """Scan `shards` (paths, globs, braces, pipe:) and write an index directory at `out`.

    `counter` (any picklable TokenCounter) overrides `config.tokenizer`; its spec is recorded.
    Raises SampleError (on_error="raise") or TooManyFailures; otherwise skipped samples are
    listed in `index.skipped`. `store_tokens` also writes every text sample's ids, captured
    while the workers count them, into a token store beside the index (readers.token_store).
    A scan that finds no sample raises EmptyIndexError naming the skips and writes nothing,
    unless `allow_empty` (an empty source meant for a Blend at weight 0, say).
    """
    from fcp_data import __version__

    config = config or ScanConfig()
    counter = as_counter(counter) if counter is not None else load_counter(config.tokenizer)
    recorder = TokenRecorder(counter) if store_tokens else None
    counter = recorder or counter
    policy = ErrorPolicy(
        on_error=config.on_error,  # type: ignore[arg-type]
        max_consecutive_failures=config.max_consecutive_failures,
    )
    # every setting is checked (Scanner: ScanConfig fields, rule overrides) before any work
    rule_settings = Scanner(config, counter).rule.settings()
    urls = expand_shards(shards)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r} must be an integer >= 1")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / HEADER_NAME).is_file():
        raise FileExistsError(
            f"{out} exists and is not a length index; refusing to replace it. "
            "Choose a new or empty output directory"
        )
    # Chunks of consecutive shards: about 4 per worker balance load while each chunk starts
    # at most one probe child (a spawn costs ~0.5 s).
    size = max(1, -(-len(urls) // (workers * 4)))
    chunks = [urls[k : k + size] for k in range(0, len(urls), size)]
    results: list[_ShardResult] = []
    bar = Progress("fcp index", len(urls), unit="shards", extra="samples") if progress else None
    if bar is not None:
        bar.__enter__()
    try:
        if workers == 1 or len(chunks) == 1:
            with Scanner(config, counter) as scanner:
                for url in urls:
                    results.append(_scan_shard(scanner, url, recorder))
                    if bar is not None:
                        bar.advance(1, extra=len(results[-1].records))
        else:
            ctx = mp.get_context("spawn")
            with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=ctx) as pool:
                futures: list[Future[list[_ShardResult]]] = [
                    pool.submit(_scan_chunk, c, config, counter) for c in chunks
                ]
                for f in futures:  # in order: a chunk's shards are counted when it is done
                    got = f.result()
                    results.extend(got)
                    if bar is not None:
                        bar.advance(len(got), extra=sum(len(r.records) for r in got))
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

    def rel(url: str) -> str:
        if not is_seekable(url):
            return url
        return as_local_path(os.path.relpath(os.path.abspath(url), out.resolve()))

    header = IndexHeader(
        format_version=FORMAT_VERSION
        if all(format_of(u) == "tar" for u in urls)
        else SOURCES_FORMAT_VERSION,
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
    )
    _write(out, header, results, recorder)
    # the commands were this caller's own arguments: the index it gets back may run them
    # (one opened later from disk may not, unless asked: LengthIndex.open(allow_pipe=True))
    return LengthIndex.open(out, allow_pipe=any(u.startswith("pipe:") for u in urls))
