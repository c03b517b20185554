"""A bounded local cache of whole `pipe:` shards, so that indexed pipe shards can be loaded.

A `pipe:CMD` shard cannot seek, so the loader streams the command's output once into
`<dir>/<sha256(url, fingerprint)[:24]>.tar` and reads members from the copy by offset. The
fingerprint is the index's (size of the indexed members plus a digest of their crc32s,
computed while indexing): a shard rewritten and re-indexed gets a new copy, never the old one.
Rules:

* partial files are never used: the copy is written to `<name>.partial-<pid>` and renamed into
  place only when the command exited 0; a failed or interrupted copy is deleted;
* the cache holds at most `max_bytes`: after each new copy the least recently used files
  (by mtime, which every use refreshes) are removed until the rest fit; a single shard larger
  than the limit is refused;
* a full disk (ENOSPC, EDQUOT) raises `CacheFullError` naming the directory, never a half copy;
* the command is read through `select` under the index's `stream_timeout_s` (60 s by default):
  a command that goes quiet is killed with its children and the copy discarded, and the
  failure is remembered for the shard in this process, so the other samples of that shard
  fail at once instead of each costing a whole sample_timeout_s; a sample that gives up on the
  copy first (its `sample_timeout_s`, shorter than the stall limit) ends the command and its
  children at once (`readers.abandon`), with the same effect;
* a finished copy is checked against the index's member checksums before it is used
  (`verify`): a command whose output changed since indexing is named, not loaded.

Workers share the directory: names are per pid until the atomic rename, and a file evicted
while another worker has it open stays readable through that open descriptor (POSIX unlink).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError, StaleIndexError
from .abandon import on_abandon
from .byte_source import open_source

__all__ = ["CacheFullError", "ShardCache", "default_cache_dir"]

DEFAULT_MAX_BYTES = 20 << 30  # 20 GiB: a few hundred 64 MiB shards
CHUNK = 1 << 20
STALL_S = 60.0  # ScanConfig.stream_timeout_s's default


class CacheFullError(DataError):
    """The cache directory's disk is full, or a shard is larger than the cache limit."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/fcp/shards (~/.cache/fcp/shards), else a temp-dir fallback."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base or tempfile.gettempdir()) / "fcp" / "shards"


@dataclass(kw_only=True)
class ShardCache:
    """Whole-shard cache for `pipe:` URLs (see the module docstring)."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES
    # per process: copies that failed (key -> why) and one lock so a copy runs once at a time
    _failed: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory, self.max_bytes = state["directory"], state["max_bytes"]
        self._failed, self._lock = {}, threading.Lock()

    def path_of(self, url: str, fingerprint: str = "") -> Path:
        key = hashlib.sha256(f"{url}\0{fingerprint}".encode()).hexdigest()[:24]
        return Path(self.directory) / (key + ".tar")

    def get(
        self,
        url: str,
        *,
        fingerprint: str = "",
        timeout_s: float = STALL_S,
        verify: Callable[[str], None] | None = None,
    ) -> Path:
        """The cached copy of `url` as indexed under `fingerprint`, made now if missing (and
        older copies evicted). `verify(path)` checks a new copy before it is used; a copy that
        failed (stall, exit status, verify) raises the same error again at once."""
        path = self.path_of(url, fingerprint)
        with self._lock:  # a second sample of the shard waits for the first's copy
            if path.name in self._failed:
                raise DataError(f"{self._failed[path.name]} (copy failed earlier in this process)")
            if path.is_file():
                with contextlib.suppress(OSError):  # evicted by another worker: re-fetch
                    os.utime(path)
                    return path
            try:
                self._fetch(url, path, timeout_s, verify)
            except (DataError, StaleIndexError) as exc:  # StaleIndexError: failed `verify`
                self._failed[path.name] = str(exc)
                raise
            self._evict(keep=path)
            return path

    def _fetch(
        self, url: str, path: Path, timeout_s: float, verify: Callable[[str], None] | None
    ) -> None:
        if not url.startswith("pipe:"):
            raise ConfigError(f"{url!r} is not a pipe: URL; only pipe: shards are cached")
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.partial-{os.getpid()}")
        src = open_source(url, timeout_s=timeout_s)  # own session, select-bounded reads
        unhook = on_abandon(src.abort)  # a sample that gives up on the copy ends the command
        size, ok, drained = 0, False, False
        try:
            with open(part, "wb") as out:
                while chunk := src.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise CacheFullError(
                            f"{url}: the shard is over the cache limit of {self.max_bytes} bytes "
                            f"({self.directory}); raise the limit or index local copies"
                        )
                    out.write(chunk)
            if src.aborted is not None:
                drained = True  # killed already: close() only reaps it
                src.close(drained=False)
                raise DataError(
                    f"{url}: the command stalled after {size} bytes and was ended ({src.aborted}"
                    "): it and its children were killed and the partial copy discarded, so the "
                    "other samples of this shard fail at once in this process; check the "
                    "command, or raise LoaderOptions.sample_timeout_s if it is only slow"
                )
            drained = True
            status = src.close(drained=True)
            if status is not None:
                raise DataError(f"{url}: {status}; the copy is incomplete and was discarded")
            if verify is not None:
                verify(str(part))
            os.replace(part, path)
            ok = True
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheFullError(
                    f"{url}: the cache directory {self.directory} is out of space after "
                    f"{size} bytes; free space there or lower the cache's max_bytes"
                ) from exc
            raise
        finally:
            unhook()
            if not drained:
                src.close(drained=False)  # kills the command and its children
            if not ok:
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()

    def _evict(self, keep: Path) -> None:
        """Remove least recently used copies until the cache is within max_bytes."""
        files = []
        for p in Path(self.directory).glob("*.tar"):
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, s, p in sorted(files):
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            total -= s

    def size(self) -> int:
        """Bytes of complete copies in the cache."""
        return sum(p.stat().st_size for p in Path(self.directory).glob("*.tar"))
