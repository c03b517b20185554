"""`LoaderOptions` and the argument checks of the loader: every option is checked where it is given.

A typo (`on_error="skp"`), a negative timeout or a replica index of 1.5 (which `int()` would read
as 1, silently loading another replica's data) raise `ConfigError` at construction, naming the
value and what is allowed, instead of surfacing hours later inside a DataLoader worker.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError

__all__ = [
    "DECODE_BACKENDS",
    "MP_CONTEXTS",
    "ON_ERROR",
    "ON_TOO_LONG",
    "LoaderOptions",
    "check_choice",
    "check_int",
    "check_seconds",
]

ON_ERROR = ("raise", "skip")
ON_TOO_LONG = ("raise", "drop")
DECODE_BACKENDS = ("auto", "pyav", "decord", "torchcodec")  # fcp_data.vision.decode.BACKENDS
DECODE_DEVICES = ("cpu", "cuda")
MP_CONTEXTS = (None, "fork", "spawn", "forkserver")


def check_int(name: str, value: Any, *, low: int = 0, what: str = "") -> int:
    """`value` as an int >= `low`; bools, floats (even 2.0) and strings are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ConfigError(
            f"{name}={value!r} must be an integer >= {low}{what}; got {type(value).__name__}"
        )
    if int(value) < low:
        raise ConfigError(f"{name}={value!r} must be an integer >= {low}{what}")
    return int(value)


def check_seconds(name: str, value: Any, *, zero: str = "") -> float:
    """A finite number of seconds >= 0 (`zero` says what 0 means; without it 0 is refused)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    v = float(value) if ok else math.nan
    if not (math.isfinite(v) and (v > 0 or (v == 0 and zero))):
        allowed = f"a finite number of seconds >= 0 ({zero})" if zero else "a number of seconds > 0"
        raise ConfigError(f"{name}={value!r} must be {allowed}")
    return v


def check_choice(name: str, value: Any, allowed: Collection[Any]) -> Any:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}; allowed: {', '.join(repr(a) for a in allowed)}")
    return value


@dataclass(kw_only=True, slots=True)
class LoaderOptions:
    """Less common knobs, kept out of the constructor's signature.

    on_error: "raise" stops at the first unreadable sample (the error names its key); "skip"
    masks it out of the loss, keeps the plan's shapes and reports it in BatchMetrics.skipped.
    It covers everything about a sample: reading, tokenizing, decoding its frames, a frame count
    below the index's, a read that exceeds `sample_timeout_s`, and (for shard specs) the scan.
    on_too_long: "drop" lets the planner leave out samples no CP group can hold (counted); a
    global batch made only of such samples yields one empty micro-batch per replica.
    timeout_s: seconds the main process waits for a DataLoader worker's next global batch before
    raising DataError (0 = wait forever). The default, 600 s, is far above a batch's normal load
    time (seconds) yet bounds a hung worker; a dead worker is detected at once either way.
    sample_timeout_s: seconds one sample may take to read, tokenize and decode (also with
    num_workers=0); past it the sample is bad (skip or raise). Default 120 s: a long video
    decodes in seconds; a read stuck on a dead mount or a decoder stuck in a loop never returns.
    The stuck call is left behind in a daemon thread (Python cannot kill a thread).
    metrics_history: how many global batches' BatchMetrics `FCPDataLoader.metrics_history` keeps
    (10,000 ~ a few MB; older ones are only in the log).
    read_ahead_bytes: with remote shards, the range requests of the next global batch each
    process builds go out in the background while it decodes the current one, into a cache of at
    most this many bytes per loader (split evenly among its DataLoader workers; 0 = off). The
    default, 256 MiB, holds a replica's share of a batch of 100 clips of 2.5 MB or 30,000 texts
    of 8 KB; a sample larger than its process's share is read when needed, as without it.
    decode_backend: the video decoder of every path (the pixel payload, `vision_input`): "auto"
    (default: torchcodec where it loads, else PyAV; decord only by name, see
    fcp_data.vision.decode.backends), "pyav", "decord" or "torchcodec". Resolved once when the
    loader is built, and only when the source holds a video, so every sample of a run decodes
    with the same library; a named backend that is not installed stops the constructor with
    MissingDependencyError. decode_device: "cpu", or "cuda" for torchcodec's GPU decode.
    """

    drop_last: bool = False
    shuffle: bool = True
    on_error: Literal["raise", "skip"] = "raise"
    on_too_long: Literal["raise", "drop"] = "raise"
    pad_id: int = 0
    eod_id: int = 0
    special_token_id: int = 0
    vision_token_id: int = 0
    text_field: str = "text"
    caption_field: str = "caption"
    decode_backend: str = "auto"
    decode_device: str = "cpu"
    timeout_s: float = 600.0
    sample_timeout_s: float = 120.0
    pin_memory: bool = False
    multiprocessing_context: str | None = None
    metrics_history: int = 10_000
    planner: Callable[..., Any] | None = None
    encode: Callable[[Mapping[str, Any]], np.ndarray] | None = None
    vision: Any = None
    """fcp_data.vision.VisionOptions: real templates, pixel payload and M-RoPE ids for media."""
    token_store: bool = True
    """Use the index's token store (`fcp index --store-tokens`) for text when it has one."""
    remote: Any = None
    """fcp_data.readers.remote.RemoteOptions for http(s)/s3 shards (retries, fsspec options)."""
    shard_cache: Any = None
    """fcp_data.readers.cache.ShardCache where pipe: shards are copied to be loaded."""
    chat_loss_roles: tuple[str, ...] = ("assistant",)
    """Text chat samples (`--text-field messages`): the roles whose turns are trained on
    (system, user, assistant, tool); role headers never are (fcp_data.readers.chat_text)."""
    read_ahead_bytes: int = 256 << 20
    allow_pipe: bool = False
    """Run the `pipe:` commands an index lists as shards. An index is data: anyone who can
    write its header could otherwise make every loader run a shell command, so an index with
    pipe: shards raises PipeNotAllowedError (naming the index and command) unless this is set."""

    def __post_init__(self) -> None:
        for name in ("drop_last", "shuffle", "pin_memory", "token_store", "allow_pipe"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be True or False")
        check_choice("on_error", self.on_error, ON_ERROR)
        check_choice("on_too_long", self.on_too_long, ON_TOO_LONG)
        for name in ("pad_id", "eod_id", "special_token_id", "vision_token_id"):
            check_int(name, getattr(self, name), what=" (a token id)")
        for name in ("text_field", "caption_field"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be a non-empty string")
        check_choice("decode_backend", self.decode_backend, DECODE_BACKENDS)
        check_choice("decode_device", self.decode_device, DECODE_DEVICES)
        if self.decode_device == "cuda" and self.decode_backend not in ("auto", "torchcodec"):
            raise ConfigError(
                f"decode_device='cuda' with decode_backend={self.decode_backend!r}: only "
                "torchcodec decodes on the GPU; use decode_backend='torchcodec' (or 'auto')"
            )
        from ..readers.chat_text import check_loss_roles

        self.chat_loss_roles = check_loss_roles(self.chat_loss_roles)
        self.timeout_s = check_seconds("timeout_s", self.timeout_s, zero="0 = wait forever")
        self.sample_timeout_s = check_seconds(
            "sample_timeout_s", self.sample_timeout_s, zero="0 = no limit"
        )
        check_choice("multiprocessing_context", self.multiprocessing_context, MP_CONTEXTS)
        check_int("metrics_history", self.metrics_history, low=1)
        check_int("read_ahead_bytes", self.read_ahead_bytes, what=" (bytes; 0 = no read-ahead)")
        if self.vision is not None:
            from ..vision import VisionOptions

            if not isinstance(self.vision, VisionOptions):
                raise ConfigError(f"vision={self.vision!r} must be a VisionOptions or None")
        for name in ("planner", "encode"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name}={fn!r} must be a callable or None")
