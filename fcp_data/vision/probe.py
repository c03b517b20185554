"""Probe video metadata in a child process under a time limit.

decord is the named backend and PyAV the fallback. decord can hang while holding the GIL
(dmlc/decord#373) and leaks memory per reader (#1, #157), so probing never runs in the caller's
process: a `Prober` keeps one spawned child, sends it (backend, bytes) and waits at most
`timeout_s`; on a timeout it kills the child, starts a fresh one for the next request and
raises `ProbeTimeout`. PyAV's header `frames` is unreliable (decord#54), so when it is 0 the
demuxed video packets are counted instead (no decoding). Moved here from fcp_data.readers
(media I/O sits with the decoder, fcp_data.vision.decode; readers re-exports it).
"""

from __future__ import annotations

import io
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Any, Literal

from ..errors import ConfigError, DataError, MemberError, MissingDependencyError
from ..optional import require
from .media_meta import VideoMeta, video_meta_from_fields

__all__ = ["BACKENDS", "ProbeTimeout", "Prober", "probe_fields"]

Backend = Literal["decord", "pyav", "auto"]
BACKENDS = ("auto", "decord", "pyav")


class ProbeTimeout(DataError, TimeoutError):
    """A media probe ran past its time limit (a hanging decoder)."""


def _pyav_fields(data: bytes) -> dict[str, Any]:
    av = require("av", "probing a video without a .json sidecar (PyAV)")

    with av.open(io.BytesIO(data)) as container:
        if not container.streams.video:
            raise MemberError("no video stream in the member; re-encode it or drop the sample")
        vs = container.streams.video[0]
        fps = float(vs.average_rate or vs.guessed_rate or 0)
        frames = int(vs.frames or 0)
        if frames <= 0:
            frames = sum(1 for p in container.demux(vs) if p.size)
        if vs.duration is not None and vs.time_base is not None:
            duration = float(vs.duration * vs.time_base)
        elif fps > 0:
            duration = frames / fps
        else:
            duration = 0.0
        return {
            "num_frames": frames,
            "fps": fps,
            "width": vs.codec_context.width,
            "height": vs.codec_context.height,
            "duration": duration,
        }


def _decord_fields(data: bytes) -> dict[str, Any]:
    decord = require("decord", "probing a video with decord")

    vr = decord.VideoReader(io.BytesIO(data))
    frames, fps = len(vr), float(vr.get_avg_fps())
    height, width = vr.get_batch([0]).shape[1:3]
    del vr
    return {
        "num_frames": frames,
        "fps": fps,
        "width": int(width),
        "height": int(height),
        "duration": frames / fps if fps > 0 else 0.0,
    }


def probe_fields(data: bytes, backend: Backend) -> tuple[str, dict[str, Any]]:
    """In-process probe (use `Prober` to bound its time): (backend used, raw fields)."""
    if backend in ("decord", "auto"):
        try:
            return "decord", _decord_fields(data)
        except MissingDependencyError:
            if backend == "decord":
                raise
        except Exception as exc:  # decord raises its own DECORDError and RuntimeErrors
            if backend == "decord":
                raise
            try:
                return "pyav", _pyav_fields(data)
            except Exception as exc2:
                raise MemberError(f"decord: {exc}; PyAV fallback: {exc2}") from exc2
    return "pyav", _pyav_fields(data)


def _serve(conn: Connection) -> None:
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        backend, data = request
        try:
            conn.send(("ok", *probe_fields(data, backend)))
        except MissingDependencyError as exc:  # a configuration error: the caller stops
            conn.send(("missing", backend, str(exc)))
        except Exception as exc:
            conn.send(("err", backend, f"{type(exc).__name__}: {exc}"))


class Prober:
    """A reusable probing child process; use as a context manager or call `close()`."""

    def __init__(self, backend: Backend = "auto", timeout_s: float = 20.0) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"probe backend {backend!r}; allowed: {', '.join(BACKENDS)}")
        if timeout_s <= 0:
            raise ConfigError(f"probe timeout_s={timeout_s} must be > 0")
        self.backend, self.timeout_s = backend, timeout_s
        self._proc: Any = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        return parent

    def probe(self, data: bytes) -> VideoMeta:
        """Metadata of an encoded video; ValueError if it does not decode, ProbeTimeout if slow."""
        conn = self._conn if self._conn is not None and self._proc.is_alive() else self._start()
        conn.send((self.backend, data))
        if not conn.poll(self.timeout_s):
            self.close(kill=True)
            if self.backend == "auto":  # decord may hang (decord#373): PyAV gets one try
                return Prober("pyav", self.timeout_s)._probe_once_and_close(data)
            raise ProbeTimeout(
                f"video probe ({self.backend}) took over {self.timeout_s:g} s; the video may be "
                "corrupt, or raise the probe timeout"
            )
        try:
            status, used, payload = conn.recv()
        except EOFError as exc:
            self.close(kill=True)
            raise MemberError(
                "video probe process died (decoder crash); video is unreadable"
            ) from exc
        if status == "missing":
            raise MissingDependencyError(payload)
        if status != "ok":
            raise MemberError(f"video does not decode ({used}: {payload})")
        return video_meta_from_fields(payload, source=used)

    def _probe_once_and_close(self, data: bytes) -> VideoMeta:
        try:
            return self.probe(data)
        finally:
            self.close(kill=True)

    def close(self, kill: bool = False) -> None:
        if self._proc is None:
            return
        if kill:
            self._proc.kill()
        elif self._conn is not None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                self._proc.kill()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self._proc is not None:
            self.close(kill=True)
