"""`LengthIndex`: the memory-mapped length index the sampler and planner read.

    index = LengthIndex.open("data/index", expect_rule="qwen2.5-vl")
    seqlens, causal = index.seqlens, index.causal    # np.int64 / np.bool_ in sample order
    members = index.read(i)                          # {"mp4": b"...", "json": b"..."}

Opening checks the format version, cross-checks the arrays against the header and each other
(`index_format.load_arrays`: a truncated or inconsistent file raises `IndexMismatchError` naming
it) and each local shard's fingerprint (size plus three 1 MiB blocks), so an index whose shards
were rewritten raises `StaleIndexError` instead of handing the planner wrong lengths. The
object pickles as its path, so DataLoader workers reopen it cheaply.
"""

from __future__ import annotations

import os
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np

from ..errors import (
    ConfigError,
    IndexMismatchError,
    MissingFileError,
    OutOfRangeError,
    StaleIndexError,
)
from ..vision.modality import MODALITIES
from .errors import SkippedSample
from .index_format import (
    CHECKSUM_ARRAY,
    HEADER_NAME,
    READ_FORMAT_VERSIONS,
    ChecksumMismatchError,
    IndexHeader,
    load_arrays,
)
from .remote import is_remote
from .shards import is_seekable, shard_fingerprint
from .sources.registry import format_named

__all__ = ["LengthIndex", "PipeNotAllowedError", "RuleMismatchError", "StaleIndexError"]

MAX_OPEN_SHARDS = 32  # file handles kept by `read` (LRU)


class RuleMismatchError(IndexMismatchError):
    """The index was built under another vision rule than the caller expects."""


class PipeNotAllowedError(ConfigError):
    """An index lists `pipe:` shards and the caller did not allow running them.

    An index is data: whoever can write its header could otherwise make every loader run a
    shell command. Commands from an index run only with `allow_pipe=True`.
    """


class LengthIndex:
    """Read-only view of an index directory; see the module docstring."""

    def __init__(self, path: Path, header: IndexHeader, arrays: dict[str, np.ndarray]) -> None:
        self.path, self.header = path, header
        self._a = arrays
        # plain ndarray views of the same maps for per-sample lookups: indexing a np.memmap
        # builds a memmap object each time (~5 us); a view is ~10x cheaper, no copy
        self._v = {n: a.view(np.ndarray) for n, a in arrays.items()}
        self._files: OrderedDict[int, int] = OrderedDict()  # shard -> fd, LRU
        self._tables: OrderedDict[int, Any] = OrderedDict()  # shard -> sources.TableRows, LRU
        self._copies: dict[int, str] = {}  # shard -> decompressed copy (.jsonl.gz / .zst)
        self.remote: Any = None  # readers.remote.RemoteOptions for http(s)/s3 shards
        self.shard_cache: Any = None  # readers.cache.ShardCache for pipe: shards
        self._access: Any = None  # readers.shard_access.ShardAccess, made on first use
        self._has_remote: bool | None = None
        # crc32 of every member (index_format.CHECKSUM_ARRAY), checked on each read; False
        # turns the check off (bench/verification_cost.py measures what it costs)
        self.verify_checksums = True
        self._crc = self._v.get(CHECKSUM_ARRAY)
        self.allow_pipe = False  # run the pipe: commands the header lists (see `open`)
        self.shard_urls = [
            u.url if not is_seekable(u.url) else str((path / u.url).resolve())
            for u in header.shards
        ]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        verify: bool = True,
        expect_rule: str | dict[str, Any] | None = None,
        expect_tokenizer: str | None = None,
        allow_pipe: bool = False,
    ) -> LengthIndex:
        """Open memory-mapped; `verify` re-fingerprints shards and checks every array's values
        (without it only files, dtypes and row counts are checked); `expect_rule` is a rule name or
        a full `rule.settings()` dict and `expect_tokenizer` a counter spec ("bytes:4",
        "hf:PATH") that must match what the index was built with. `allow_pipe=True` lets
        `read` run the `pipe:` commands the header lists (an index is data: without it such a
        shard raises PipeNotAllowedError naming the index and the command)."""
        path = Path(path)
        head = path / HEADER_NAME
        if not head.is_file():
            raise MissingFileError(
                f"{path} is not a length index (no {HEADER_NAME}); "
                "build one with `fcp index SHARDS -o INDEX`"
            )
        try:
            raw = msgspec.json.decode(head.read_bytes())
        except msgspec.DecodeError as exc:
            raise StaleIndexError(
                f"{head} is not valid JSON ({exc}); rebuild the index with `fcp index`"
            ) from exc
        version = raw.get("format_version") if isinstance(raw, dict) else None
        if version not in READ_FORMAT_VERSIONS:
            raise StaleIndexError(
                f"{path}: index format {version}, this fcp reads "
                f"{' and '.join(map(str, READ_FORMAT_VERSIONS))}; rebuild it with `fcp index`"
            )
        try:
            header = msgspec.convert(raw, IndexHeader)
        except msgspec.ValidationError as exc:
            raise IndexMismatchError(
                f"{head} does not describe an index ({exc}); rebuild the index with `fcp index`"
            ) from exc
        index = cls(path, header, load_arrays(path, header, full=verify))
        index.allow_pipe = bool(allow_pipe)
        if index._crc is None:  # warnings shows one message once per process
            warnings.warn(
                f"index {path} has no {CHECKSUM_ARRAY}.npy (built before per-member "
                "checksums): bytes read from its shards are not verified; rebuild it with "
                "`fcp index` to turn the checks on",
                stacklevel=2,
            )
        if expect_rule is not None:
            index.check_rule(expect_rule)
        if expect_tokenizer is not None and expect_tokenizer != header.tokenizer:
            raise RuleMismatchError(
                f"index {path} counted text with {header.tokenizer!r}, not {expect_tokenizer!r}; "
                "rebuild with `fcp index --tokenizer SPEC` or load with the matching tokenizer"
            )
        if verify:
            index.verify()
        return index

    def verify(self) -> None:
        """Raise StaleIndexError if a local shard's fingerprint differs from the header's."""
        for entry, url in zip(self.header.shards, self.shard_urls):
            if not is_seekable(url):
                continue
            if not os.path.exists(url):
                raise StaleIndexError(
                    f"shard {url} of index {self.path} is missing; restore it "
                    "or rebuild the index with `fcp index`"
                )
            if shard_fingerprint(url) != entry.fingerprint:
                raise StaleIndexError(
                    f"shard {url} changed since index {self.path} was built; "
                    "rebuild it with `fcp index`"
                )
            stale = format_named(entry.format).stale  # megatron: the .idx beside it
            why = stale(url, entry.meta) if stale is not None else ""
            if why:
                raise StaleIndexError(
                    f"{why} since index {self.path} was built; rebuild it with `fcp index`"
                )

    def check_rule(self, expect: str | dict[str, Any]) -> None:
        built = self.header.rule
        if isinstance(expect, str):
            ok = built.get("name") == expect
        else:
            ok = msgspec.json.encode(dict(sorted(expect.items()))) == msgspec.json.encode(
                dict(sorted(built.items()))
            )
        if not ok:
            raise RuleMismatchError(
                f"index {self.path} was built with vision rule {built}, not {expect}; rebuild "
                "with `fcp index --vision-rule NAME` or load with the matching rule"
            )

    # -- arrays in sample order ------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._a["seqlens"].shape[0])

    @property
    def keys(self) -> np.ndarray:
        """Sample keys (unicode array)."""
        return self._a["keys"]

    @property
    def text_tokens(self) -> np.ndarray:
        """Text tokens (captions for media)."""
        return self._a["text_tokens"]

    @property
    def vision_tokens(self) -> np.ndarray:
        """Vision placeholder tokens."""
        return self._a["vision_tokens"]

    @property
    def special_tokens(self) -> np.ndarray:
        """Template tokens (markers, timestamps, BOS/EOS)."""
        return self._a["special_tokens"]

    @property
    def seqlens(self) -> np.ndarray:
        """text + vision + special tokens: the planner's input."""
        return self._a["seqlens"]

    @property
    def causal(self) -> np.ndarray:
        """Attention kind per sample: True causal, False full."""
        return self._a["causal"]

    @property
    def shard(self) -> np.ndarray:
        """Shard number of each sample (see `shard_urls`)."""
        return self._a["shard"]

    @property
    def modality(self) -> np.ndarray:
        """0 text, 1 video, 2 image (`MODALITIES`)."""
        return self._a["modality"]

    @property
    def num_frames(self) -> np.ndarray:
        """Source frame count (0 for non-video)."""
        return self._a["num_frames"]

    @property
    def fps(self) -> np.ndarray:
        """Source fps (0 for non-video)."""
        return self._a["fps"]

    @property
    def width(self) -> np.ndarray:
        """Source width in pixels (0 for text)."""
        return self._a["width"]

    @property
    def height(self) -> np.ndarray:
        """Source height in pixels (0 for text)."""
        return self._a["height"]

    @property
    def arrays(self) -> Mapping[str, np.ndarray]:
        """Every stored array by name, including the member table (`member_start`,
        `member_count` per sample; `member_ext`, `member_offset`, `member_size` per member)."""
        return MappingProxyType(self._a)

    @property
    def skipped(self) -> list[SkippedSample]:
        """(shard, key, reason) of every sample left out of the index."""
        return list(self.header.skipped)

    def modality_name(self, i: int) -> str:
        return MODALITIES[int(self._a["modality"][i])]

    def members(self, i: int) -> dict[str, tuple[int, int]]:
        """{ext: (data offset, size)} of sample i in its shard."""
        v = self._v
        s = int(v["member_start"][i])
        e = s + int(v["member_count"][i])
        return {
            str(x): (int(o), int(z))
            for x, o, z in zip(
                v["member_ext"][s:e].tolist(),
                v["member_offset"][s:e].tolist(),
                v["member_size"][s:e].tolist(),
            )
        }

    def shard_url(self, i: int) -> str:
        return self.shard_urls[int(self._v["shard"][i])]

    # -- payload ---------------------------------------------------------------------------
    def read(self, i: int, exts: list[str] | None = None) -> dict[str, bytes]:
        """Sample i's members (all, or `exts`) by seeking to their tar offsets."""
        if not 0 <= i < len(self):
            raise OutOfRangeError(f"sample {i} out of range for an index of {len(self)} samples")
        shard = int(self._v["shard"][i])
        url = self.shard_urls[shard]
        entry = self.header.shards[shard]
        fmt = format_named(entry.format)
        limit = self.header.scan.stream_max_bytes
        if fmt.rows is not None:  # rows, not byte ranges
            reader = self._table(shard, url, fmt.rows)
            rows = {
                ext: reader.member(row)
                for ext, (row, _size) in self.members(i).items()
                if exts is None or ext in exts
            }
            self._check_members(i, url, rows)
            return rows
        if not is_seekable(url):
            if url.startswith("pipe:") and not self.allow_pipe:
                self.refuse_pipes()
            got = self._shard_access().read(i, url, exts)
            if isinstance(got, dict):
                self._check_members(i, url, got)
                return fmt.present_members(entry.meta, got, limit)
            url = got  # a pipe: shard's local copy
        elif fmt.local_copy is not None:
            url = self._decompressed(shard, url, fmt.local_copy)
        fd = self._files.get(shard)
        if fd is None:
            fd = os.open(url, os.O_RDONLY)
            self._files[shard] = fd
            if len(self._files) > MAX_OPEN_SHARDS:
                os.close(self._files.popitem(last=False)[1])
        else:
            self._files.move_to_end(shard)
        out: dict[str, bytes] = {}
        for ext, (offset, size) in self.members(i).items():
            if exts is not None and ext not in exts:
                continue
            data = os.pread(fd, size, offset)  # no shared file position: thread-safe
            if len(data) != size:
                raise StaleIndexError(
                    f"{url}: sample {i} member .{ext} truncated; the shard "
                    "changed since indexing, rebuild with `fcp index`"
                )
            out[ext] = data
        self._check_members(i, url, out)
        return fmt.present_members(entry.meta, out, limit)

    def _table(self, shard: int, url: str, open_rows: Callable[[str, str], Any]) -> Any:
        """The row reader of a Parquet / Arrow shard (LRU of MAX_OPEN_SHARDS per process)."""
        reader = self._tables.get(shard)
        if reader is None:
            reader = open_rows(url, self.header.scan.text_field)
            self._tables[shard] = reader
            if len(self._tables) > MAX_OPEN_SHARDS:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(shard)
        return reader

    def _decompressed(self, shard: int, url: str, local_copy: Callable[..., str]) -> str:
        """A local decompressed copy of a compressed JSON Lines shard, made once per host in
        the shard cache directory; its lines are verified by the index's checksums."""
        path = self._copies.get(shard)
        if path is None:
            from .cache import default_cache_dir

            cache = self.shard_cache
            directory = cache.directory if cache is not None else default_cache_dir()
            v = self._v  # the copy stops at the end of the shard's last indexed line
            rows = np.flatnonzero(np.asarray(v["shard"]) == shard)
            end = 0
            if rows.size:
                last = int(v["member_start"][rows[-1]]) + int(v["member_count"][rows[-1]])
                first = int(v["member_start"][rows[0]])
                ends = np.asarray(v["member_offset"][first:last], dtype=np.int64) + np.asarray(
                    v["member_size"][first:last], dtype=np.int64
                )
                end = int(ends.max()) if ends.size else 0
            fingerprint = self.header.shards[shard].fingerprint
            path = local_copy(url, fingerprint, directory, end)
            self._copies[shard] = path
        return path

    def _check_members(self, i: int, url: str, out: dict[str, bytes]) -> None:
        """Raise ChecksumMismatchError when a member read for sample i is not the bytes that
        were indexed (crc32, ~1 GB/s: 0.1 ms for a 100 KB sample)."""
        crc = self._crc
        if crc is None or not self.verify_checksums:
            return
        v = self._v
        s = int(v["member_start"][i])
        for j, ext in enumerate(v["member_ext"][s : s + int(v["member_count"][i])].tolist()):
            data = out.get(ext)
            if data is None:
                continue
            got, want = zlib.crc32(data) & 0xFFFFFFFF, int(crc[s + j])
            if got != want:
                raise ChecksumMismatchError(
                    f"{url}: sample {str(v['keys'][i])!r} member .{ext} ({len(data)} bytes at "
                    f"offset {int(v['member_offset'][s + j])}) has crc32 {got:08x}, the index "
                    f"{self.path} recorded {want:08x}: the shard's bytes changed since "
                    "indexing (edited in place, or a server or cache answered other bytes); "
                    "rebuild the index with `fcp index`"
                )

    def check_shard_copy(self, shard: int, path: str) -> None:
        """Verify a local copy of shard `shard` (a pipe: shard's cache file) against every
        member checksum of the index, once per copy: one pass over the copy's member bytes."""
        if self._crc is None:
            return
        url = self.shard_urls[shard]
        fd = os.open(path, os.O_RDONLY)
        try:
            for i in np.flatnonzero(self._v["shard"] == shard).tolist():
                out = {ext: os.pread(fd, size, off) for ext, (off, size) in self.members(i).items()}
                try:
                    self._check_members(i, url, out)
                except ChecksumMismatchError as exc:
                    raise ChecksumMismatchError(
                        f"the output of {url} differs from what index {self.path} was built "
                        f"from (checked in its copy {path}): {exc}"
                    ) from None
        finally:
            os.close(fd)

    @property
    def pipe_shards(self) -> list[str]:
        """The `pipe:` commands among the shards (run only when `allow_pipe` is set)."""
        return [u for u in self.shard_urls if u.startswith("pipe:")]

    def refuse_pipes(self) -> None:
        """Raise PipeNotAllowedError when the index lists pipe: shards and they are not allowed."""
        pipes = self.pipe_shards
        if pipes and not self.allow_pipe:
            raise PipeNotAllowedError(
                f"index {self.path} lists {len(pipes)} pipe: shard(s), e.g. {pipes[0]!r} (from "
                f"its {HEADER_NAME}); an index is data, so fcp runs no command from it unless "
                "allowed: pass LoaderOptions(allow_pipe=True) or LengthIndex.open(..., "
                "allow_pipe=True) if you trust whoever wrote this index"
            )

    def _shard_access(self) -> Any:
        if self._access is None:
            from .shard_access import ShardAccess

            self._access = ShardAccess(self, self.remote, self.shard_cache)
        return self._access

    @property
    def has_remote(self) -> bool:
        if self._has_remote is None:
            self._has_remote = any(is_remote(u) for u in self.shard_urls)
        return self._has_remote

    def prefetch(self, positions: Any) -> None:
        """Read ahead the remote samples among `positions` (no-op for local shards)."""
        if self.has_remote:
            self._shard_access().prefetch(positions)

    def close(self) -> None:
        while self._files:
            os.close(self._files.popitem()[1])

    def __del__(self) -> None:
        files = self.__dict__.get("_files")
        while files:
            os.close(files.popitem()[1])

    def __reduce__(self) -> tuple[Any, ...]:
        state = {"verify_checksums": self.verify_checksums}  # applied to the reopened index
        return _reopen, (str(self.path), self.remote, self.shard_cache, self.allow_pipe), state

    def __repr__(self) -> str:
        return (
            f"LengthIndex({str(self.path)!r}, samples={len(self)}, "
            f"rule={self.header.rule.get('name')!r}, skipped={len(self.header.skipped)})"
        )


def _reopen(
    path: str, remote: Any = None, cache: Any = None, allow_pipe: bool = False
) -> LengthIndex:
    index = LengthIndex.open(path, verify=False, allow_pipe=allow_pipe)
    index.remote, index.shard_cache = remote, cache
    return index
