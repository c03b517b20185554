"""Choosing a decode backend: `BACKENDS`, `resolve_backend(name, device)`, `make_backend`.

"auto" picks the first of `AUTO_ORDER` that loads: torchcodec, then PyAV. torchcodec comes
first because it decodes in C++ with its own exact frame table (no per-frame Python work,
the GIL released while it decodes, NVDEC with device="cuda"); it is not measured here: its
PyPI wheel does not load on a machine without its FFmpeg / CUDA libraries (this one).

decord is never picked by "auto", only by name. It is not faster: bench/media_decode.py
(300-frame H.264 clips, backends interleaved, best of 3, 2 loaded cores) decodes the sampled
frames of the whole video in 0.149 / 0.160 s with decord against 0.133 / 0.145 s with PyAV at
320x240 (GOP 250 / 30) and 0.253 / 0.331 s against 0.216 / 0.214 s at 640x360, and the
slowest CP member's GOP-aware decode is no faster either (640x360, GOP 30, d = 4: 0.146 s
against 0.109 s). And it has two faults no speed would pay for in a training job: it can hang
while holding the GIL (dmlc/decord#373), which stalls a DataLoader worker with no error and
no timeout, and it leaks memory per reader (decord#1, #157), so a worker that opens one reader
per sample grows until it is killed. The probe (fcp_data.vision.probe) runs it only in a
child process under a time limit for that reason; a decode in the loader's worker has no
such guard.

A named backend that is not installed raises MissingDependencyError (a ConfigError: it stops
the run, never a per-sample skip that would silently drop a whole video corpus).
"""

from __future__ import annotations

import re
from types import MappingProxyType

from ...errors import ConfigError, MissingDependencyError
from ...optional import require
from .base import FrameBackend
from .decord_backend import DecordBackend
from .pyav_backend import PyAVBackend
from .torchcodec_backend import TorchCodecBackend

__all__ = ["AUTO_ORDER", "BACKENDS", "make_backend", "resolve_backend"]

BACKENDS = ("auto", "pyav", "decord", "torchcodec")
AUTO_ORDER = ("torchcodec", "pyav")  # fastest first; decord only by name (module docstring)
_MODULES = MappingProxyType({"pyav": "av", "decord": "decord", "torchcodec": "torchcodec.decoders"})
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def _check_device(name: str, device: str) -> bool:
    """True when `device` is a CUDA device; ConfigError for a device `name` cannot use."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ConfigError(
            f"decode device {device!r}; allowed: 'cpu', 'cuda' or 'cuda:N' (torchcodec only)"
        )
    cuda = device != "cpu"
    if cuda and name not in ("auto", "torchcodec"):
        raise ConfigError(
            f"decode device {device!r} with backend {name!r}: only 'torchcodec' decodes on "
            "CUDA; use backend='torchcodec' (or 'auto') or device='cpu'"
        )
    return cuda


def _loads(name: str) -> None:
    """Import the backend's package or raise MissingDependencyError naming it and the extra."""
    require(_MODULES[name], f"decoding video frames with {name} (decode backend {name!r})")


def resolve_backend(name: str = "auto", device: str = "cpu") -> str:
    """The concrete backend `name` stands for on `device`, checked to load.

    ConfigError for an unknown name or a device the backend cannot use; MissingDependencyError
    for a named backend (or, under "auto", every candidate) that is not installed. Resolve once
    (at loader construction) and pass the result on: under "auto" each call retries importing
    torchcodec where it is absent.
    """
    if name not in BACKENDS:
        raise ConfigError(
            f"decode backend {name!r}; allowed: {', '.join(repr(b) for b in BACKENDS)}"
        )
    cuda = _check_device(name, device)
    if name != "auto":
        _loads(name)
        return name
    candidates = ("torchcodec",) if cuda else AUTO_ORDER
    missing: MissingDependencyError | None = None
    for candidate in candidates:
        try:
            _loads(candidate)
        except MissingDependencyError as exc:
            missing = exc
            continue
        return candidate
    assert missing is not None
    raise missing


def make_backend(name: str, device: str = "cpu") -> FrameBackend:
    """The backend object of a resolved name (`resolve_backend`)."""
    if name == "pyav":
        return PyAVBackend()
    if name == "decord":
        return DecordBackend()
    if name == "torchcodec":
        return TorchCodecBackend(device)
    raise ConfigError(f"decode backend {name!r}; allowed: 'pyav', 'decord', 'torchcodec'")
