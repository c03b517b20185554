"""Bytes of one shard, from a regular file, a FIFO or a `pipe:CMD` stream, under a stall limit.

A regular file is read with seeks (skipping a video's bytes costs nothing). A FIFO or a
command's stdout is read through `select` so that a source that stops producing (a FIFO with
no writer, a `curl` on a dead link, `pipe:sleep 30`) raises `StreamStalled` after
`timeout_s` seconds without a byte instead of hanging the build. A command is started in its
own session so that a stall kills it and its children (`sh -c`'s, say), and `close()` reports
its exit status: a non-zero status means the stream may be incomplete, never a clean end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import stat
import subprocess
from typing import IO

from ..errors import DataError

__all__ = ["ByteSource", "StreamStalled", "StreamTooLong", "is_stream", "open_source"]

READ_CHUNK = 1 << 20  # bytes asked of a pipe per read(); larger reads only fill the buffer


class StreamStalled(DataError, TimeoutError):
    """A FIFO or `pipe:` command produced no byte within the stall limit."""


class StreamTooLong(StreamStalled):
    """A FIFO or `pipe:` command produced more than its byte limit: abandoned like a stall.

    A stream's members are held in memory (it cannot be re-read), so an endless one (a
    command that loops) would exhaust memory; the limit bounds it.
    """


def is_stream(url: str) -> bool:
    """True for `pipe:CMD` and for a local FIFO: sources that cannot seek or be re-read."""
    if url.startswith("pipe:"):
        return True
    try:
        return stat.S_ISFIFO(os.stat(url).st_mode)
    except OSError:
        return False


class ByteSource:
    """Sequential reads with a position; `skip` seeks on files and reads through streams."""

    def __init__(
        self,
        url: str,
        *,
        file: IO[bytes] | None = None,
        fd: int = -1,
        proc: subprocess.Popen[bytes] | None = None,
        timeout_s: float = 60.0,
        max_bytes: int = 0,
    ) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.max_bytes = max_bytes  # 0: no limit (a stream's bytes past it: StreamTooLong)
        self.pos = 0
        self._file, self._fd, self._proc = file, fd, proc
        self._buf = bytearray()
        self._eof = False
        self.stalled = False  # set when a read ran past timeout_s
        self.aborted: str | None = None  # why `abort` ended the source early
        self.size = os.fstat(file.fileno()).st_size if file is not None else -1

    @property
    def seekable(self) -> bool:
        return self._file is not None

    def _fill(self, want: int) -> None:
        """Buffer at least `want` bytes from the stream, or up to its end."""
        while len(self._buf) < want and not self._eof:
            have = self.pos + len(self._buf)
            if self.max_bytes and have > self.max_bytes:
                self.stalled = True
                raise StreamTooLong(
                    f"{self.url}: still producing after {self.max_bytes} bytes, the limit for "
                    "one streamed shard (stream_max_bytes, `fcp index --stream-max-bytes`); "
                    "split the shard or raise the limit"
                )
            ready, _, _ = select.select([self._fd], [], [], self.timeout_s)
            if not ready:
                self.stalled = True
                what = "command" if self._proc is not None else "FIFO"
                raise StreamStalled(
                    f"{self.url}: no data for {self.timeout_s:g} s after byte "
                    f"{self.pos + len(self._buf)} (the {what} produced nothing); raise "
                    "stream_timeout_s if the source is just slow, else check the source"
                )
            try:
                # never past limit + 1 byte: what a capped stream yields is exact, and a
                # stream of exactly `max_bytes` still reaches its end
                room = self.max_bytes + 1 - have if self.max_bytes else READ_CHUNK
                chunk = os.read(self._fd, min(READ_CHUNK, room))
            except BlockingIOError:  # a FIFO's writer came and went between select and read
                continue
            if chunk:
                self._buf += chunk
            else:
                self._eof = True

    def read(self, n: int) -> bytes:
        """Up to `n` bytes; fewer only at the end of the source."""
        if self._file is not None:
            data = self._file.read(n)
        else:
            self._fill(n)
            with memoryview(self._buf) as view:  # one copy, not slice-then-bytes
                data = bytes(view[:n])
            del self._buf[:n]
        self.pos += len(data)
        return data

    def unread(self, data: bytes) -> None:
        """Step back over `data`, the last bytes read; the next read returns them again."""
        if self._file is not None:
            self._file.seek(self.pos - len(data))
        else:
            self._buf[:0] = data
        self.pos -= len(data)

    def skip(self, n: int) -> int:
        """Advance `n` bytes; returns how many were there (fewer at the end of the source)."""
        if self._file is not None:
            n = max(0, min(n, self.size - self.pos))
            self._file.seek(self.pos + n)
            self.pos += n
            return n
        done = 0
        while done < n:
            step = len(self.read(min(n - done, READ_CHUNK)))
            if step == 0:
                break
            done += step
        return done

    def abort(self, reason: str) -> None:
        """End a command now, from any thread (its caller gave up: `reason`): its process
        group is killed, so a read blocked on it returns at the end of its output."""
        self.aborted = reason
        if self._proc is not None:
            _kill_group(self._proc)

    def close(self, *, drained: bool) -> str | None:
        """Release the source; for a command, a reason when its exit status is not 0.

        `drained=False` (the reader stopped early, or stalled) kills the command: its status
        then says nothing about the data and is not reported.
        """
        if self._file is not None:
            self._file.close()
            return None
        if self._fd >= 0 and self._proc is None:
            os.close(self._fd)
            return None
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        if not drained:
            _kill_group(proc)
        try:
            status = proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:  # stdout closed but the command lingers
            _kill_group(proc)
            status = proc.wait()
            if drained:
                return (
                    f"command still running {self.timeout_s:g} s after its output ended "
                    f"at byte {self.pos}; killed it (stream_timeout_s)"
                )
        finally:
            proc.stdout.close()
        if not drained or status == 0:
            return None
        how = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return (
            f"command {how} after {self.pos} bytes: its output may be incomplete, so the "
            "shard is not trusted past them; fix the command or the source"
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)


def _grow_pipe(fd: int) -> None:
    """Ask Linux for a 1 MiB pipe buffer (default 64 KiB): 16x fewer select/read rounds."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is not None:
        with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: keep the default
            fcntl.fcntl(fd, set_size, READ_CHUNK)


def open_source(url: str, *, timeout_s: float, max_bytes: int = 0) -> ByteSource:
    """Open a shard URL for reading; OSError when a local path cannot be opened.

    `max_bytes` (0: none) bounds what a FIFO or `pipe:` stream may produce."""
    if "://" in url:
        from .remote import RemoteStream, is_remote

        if is_remote(url):
            return RemoteStream(url, timeout_s=timeout_s)
    if url.startswith("pipe:"):
        proc = subprocess.Popen(
            url[5:],
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,  # its own process group: a stall kills `sh -c` children too
        )
        assert proc.stdout is not None
        _grow_pipe(proc.stdout.fileno())
        return ByteSource(
            url, fd=proc.stdout.fileno(), proc=proc, timeout_s=timeout_s, max_bytes=max_bytes
        )
    if is_stream(url):  # a FIFO: O_NONBLOCK, else open() itself waits forever for a writer
        fd = os.open(url, os.O_RDONLY | os.O_NONBLOCK)
        return ByteSource(url, fd=fd, timeout_s=timeout_s, max_bytes=max_bytes)
    return ByteSource(url, file=open(url, "rb"), timeout_s=timeout_s)
