"""What a corpus format is: the one record each format module declares (`FORMATS`).

The readers never ask "is this a Parquet file?": they look the shard's format up in the
registry (`sources.registry`) and call what it declares. A format says which names are its own
(`suffixes`), whether a member's offset is a byte range of the file (`byte_range`: one `pread`
or one HTTP range reads it, so remote copies can be read), how a big file is cut into pieces
for `fcp index --workers` (`split`), how its samples are iterated while indexing (`samples`)
and how a sample's members are read back (`rows`, `local_copy`, `present`). Everything else is
optional and defaults to "nothing special", so a new format is one module and one line in
`registry.MODULES` (docs/design.md, "Adding a format").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CorpusFormat", "Span", "SplitPiece"]

Span = tuple[int, int]  # a piece of one file, in the format's own unit (bytes, row groups, docs)
SplitPiece = tuple[Span, int, int]  # (span, first byte, end byte) the piece accounts for


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusFormat:
    """One corpus format (see the module docstring); `name` is what an index records, `title`
    how error messages list it ("" for a variant the title of another already names).

    - `samples(url, config, span)`: the shard's samples while indexing, as `RawSample` /
      `BadMember` (or ready `SampleRecord`s for a format that counts without a tokenizer); the
      iterable may offer `lines` and `done_fraction()` (progress inside a file).
    - `split(url, size, n)`: about `n` pieces of a big local file, or [] to keep it whole.
    - `rows(url, text_field)`: random access to rows (`.member(row)`) when offsets are rows.
    - `local_copy(url, fingerprint, directory, end)`: a local file the offsets index (a
      decompressed copy) when they index no file fcp can pread directly.
    - `present(meta, members, limit)`: members as the loader reads them, after their crc32.
    - `meta(url, timeout_s)`: what reading the shard back needs (stored in its ShardEntry).
    - `stale(url, meta)`: why a local shard's side files changed since indexing ("" if not).
    - `resolve_local(path)` / `check_local(path)`: a local file as the shard to index (raising
      when unreadable), and a check run on every expanded local shard.
    - `prefix(path)`: the shard a name that is no file stands for (a megatron dataset named
      by its prefix), or "".
    - `magic(head)`, `hint`: whether the first 512 bytes of a file named for no format look
      like this format's data, and the rename hint the refusal then gives; `confirm(path)`:
      inside a directory, "" when such a file really is data, else why it is not (skipped).
    - `check_remote(url)`: a remote URL's extra rule (raises ConfigError).
    - `index_version`: the oldest length-index format version that can record this format.
    """

    name: str
    title: str
    suffixes: tuple[str, ...]
    byte_range: bool
    samples: Callable[[str, Any, Span | None], Iterable[Any]]
    split: Callable[[str, int, int], list[SplitPiece]] | None = None
    rows: Callable[[str, str], Any] | None = None
    local_copy: Callable[[str, str, Path, int], str] | None = None
    present: Callable[[dict[str, Any], dict[str, bytes], int], dict[str, bytes]] | None = None
    meta: Callable[[str, float], dict[str, Any]] | None = None
    stale: Callable[[str, dict[str, Any]], str] | None = None
    resolve_local: Callable[[str], str] | None = None
    prefix: Callable[[str], str] | None = None
    magic: Callable[[bytes], bool] | None = None
    hint: str = ""
    confirm: Callable[[str], str] | None = None
    check_local: Callable[[str], None] | None = None
    check_remote: Callable[[str], None] | None = None
    index_version: int = 2  # index_format.SOURCES_FORMAT_VERSION: what records non-tar shards

    def present_members(
        self, meta: dict[str, Any], members: dict[str, bytes], limit: int = 0
    ) -> dict[str, bytes]:
        """The members as the loader reads them: the format's `present`, else gzipped text
        members (`.txt.gz`) gunzipped to their inner extension, at most `limit` bytes each
        (0: the scan's default, 16 GiB)."""
        if self.present is not None:
            return self.present(meta, members, limit)
        from ..members import GZ_INNER, gunzip_members

        if not any(e in GZ_INNER for e in members):
            return members
        from ..shards import STREAM_MAX_BYTES

        return gunzip_members(members, limit or STREAM_MAX_BYTES)

    @property
    def keeps_payload(self) -> bool:
        """True when a scan keeps each sample's bytes: offsets that are rows or positions in
        a decompressed stream cannot be re-read from the file to checksum or serve them."""
        return not self.byte_range
