"""A bounded local cache of whole `pipe:` shards, so that indexed pipe shards can be loaded.

A `pipe:CMD` shard cannot seek, so the loader streams the command's output once into
`<dir>/<sha256(url)[:24]>.tar` and reads members from the copy by offset. Rules:

* partial files are never used: the copy is written to `<name>.partial-<pid>` and renamed into
  place only when the command exited 0; a failed or interrupted copy is deleted;
* the cache holds at most `max_bytes`: after each new copy the least recently used files
  (by mtime, which every use refreshes) are removed until the rest fit; a single shard larger
  than the limit is refused;
* a full disk (ENOSPC, EDQUOT) raises `CacheFullError` naming the directory, never a half copy.

Workers share the directory: names are per pid until the atomic rename, and a file evicted
while another worker has it open stays readable through that open descriptor (POSIX unlink).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

__all__ = ["CacheFullError", "ShardCache", "default_cache_dir"]

DEFAULT_MAX_BYTES = 20 << 30  # 20 GiB: a few hundred 64 MiB shards
CHUNK = 1 << 20


class CacheFullError(DataError):
    """The cache directory's disk is full, or a shard is larger than the cache limit."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/fcp/shards (~/.cache/fcp/shards), else a temp-dir fallback."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base or tempfile.gettempdir()) / "fcp" / "shards"


@dataclass(kw_only=True, slots=True)
class ShardCache:
    """Whole-shard cache for `pipe:` URLs (see the module docstring)."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    def path_of(self, url: str) -> Path:
        return Path(self.directory) / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".tar")

    def get(self, url: str) -> Path:
        """The cached copy of `url`, made now if missing (and older copies evicted)."""
        path = self.path_of(url)
        if path.is_file():
            with contextlib.suppress(OSError):  # evicted by another worker just now: re-fetch
                os.utime(path)
                return path
        self._fetch(url, path)
        self._evict(keep=path)
        return path

    def _fetch(self, url: str, path: Path) -> None:
        if not url.startswith("pipe:"):
            raise ValueError(f"{url!r} is not a pipe: URL; only pipe: shards are cached")
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.partial-{os.getpid()}")
        proc = subprocess.Popen(
            url[5:], shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        size, ok = 0, False
        try:
            with open(part, "wb") as out:
                while chunk := proc.stdout.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise CacheFullError(
                            f"{url}: the shard is over the cache limit of {self.max_bytes} bytes "
                            f"({self.directory}); raise the limit or index local copies"
                        )
                    out.write(chunk)
            status = proc.wait()
            if status != 0:
                raise DataError(
                    f"{url}: command exited with status {status} after {size} bytes; the copy "
                    "is incomplete and was discarded; fix the command or the source"
                )
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
            if not ok:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
            proc.stdout.close()

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
