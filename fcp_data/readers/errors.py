"""Bad-input policy: skip and count, or raise; and a consecutive-failure fuse.

A sample can be bad in many ways (truncated tar, an orphan member, a video that does not
decode, a sidecar with 0 fps, empty text). With `on_error="skip"` each is recorded as
(shard, key, reason) and the scan goes on; with "raise" the first one raises `SampleError`.
Either way `max_consecutive_failures` bad samples in a row raise `TooManyFailures`: a shard
directory full of corrupt files must not look like a small dataset (Megatron-Energon's
failure_tolerance plays the same role, default 100). Sooner still, when the first
`SAME_ERROR_HEAD` (8) samples all fail with the same reason (numbers aside), the scan stops:
that is a configuration problem (a missing package, a wrong text field), not 8 bad samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from ..errors import ConfigError, DataError, SampleError

__all__ = [
    "SAME_ERROR_HEAD",
    "CompressedShardError",
    "ErrorPolicy",
    "FailureLog",
    "SampleError",
    "SkippedSample",
    "TooManyFailures",
]

_DECOMPRESS = {"gzip": "gzip -dc", "bzip2": "bzip2 -dc", "xz": "xz -dc", "zstd": "zstd -dc"}

SAME_ERROR_HEAD = 8


class TooManyFailures(DataError):
    """Raised after `max_consecutive_failures` bad samples in a row."""


class CompressedShardError(DataError):
    """A compressed shard (`.tar.gz`, or gzip/bzip2/xz/zstd/lz4 magic bytes): refused.

    The index stores each member's byte offset so the loader reads one sample with one seek;
    offsets into a compressed stream cannot be seeked, so fcp needs uncompressed tars.
    """

    def __init__(self, url: str, fmt: str) -> None:
        tool = _DECOMPRESS.get(fmt, f"{fmt} -dc")
        super().__init__(
            f"{url}: {fmt}-compressed shard; compressed shards are unsupported because fcp "
            "reads each member by seeking to its byte offset, which needs an uncompressed tar. "
            f"Decompress it ({tool} SHARD > SHARD.tar), or stream it without an index as "
            f"'pipe:{tool} SHARD'"
        )
        self.url, self.fmt = url, fmt

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.url, self.fmt)  # survives process pools


class SkippedSample(msgspec.Struct, frozen=True, array_like=True):
    shard: str
    key: str
    reason: str


@dataclass(kw_only=True, slots=True)
class ErrorPolicy:
    """`on_error`: "skip" records and continues, "raise" stops at the first bad sample."""

    on_error: Literal["raise", "skip"] = "skip"
    max_consecutive_failures: int = 100

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={self.on_error!r}; allowed: 'raise', 'skip'")
        if self.max_consecutive_failures < 1:
            raise ConfigError(
                f"max_consecutive_failures={self.max_consecutive_failures} must be >= 1"
            )


@dataclass(slots=True)
class FailureLog:
    """Applies an ErrorPolicy to a stream of outcomes; keeps the skipped list."""

    policy: ErrorPolicy
    skipped: list[SkippedSample] = field(default_factory=list)
    consecutive: int = 0
    seen_ok: bool = False

    def ok(self) -> None:
        self.consecutive = 0
        self.seen_ok = True

    def fail(self, shard: str, key: str, reason: str) -> None:
        """Record a bad sample; raise per policy or when the consecutive fuse blows."""
        if self.policy.on_error == "raise":
            raise SampleError(shard, key, reason)
        self.skipped.append(SkippedSample(shard, key, reason))
        self.consecutive += 1
        if not self.seen_ok and self.consecutive == SAME_ERROR_HEAD:
            reasons = {re.sub(r"\d+", "#", s.reason) for s in self.skipped[-SAME_ERROR_HEAD:]}
            if len(reasons) == 1:
                raise TooManyFailures(
                    f"the first {SAME_ERROR_HEAD} samples all failed with the same error "
                    f"(last: {shard}: {key!r}: {reason}); this is a configuration problem, not "
                    "bad data: fix the setup (a missing package, a wrong text field) or remove "
                    "these samples from the shards"
                )
        if self.consecutive >= self.policy.max_consecutive_failures:
            raise TooManyFailures(
                f"{self.consecutive} consecutive bad samples (last: {shard}: {key!r}: {reason}); "
                "the dataset looks broken. Fix the shards, or raise max_consecutive_failures "
                f"(now {self.policy.max_consecutive_failures}) if this many bad samples in a row "
                "is expected"
            )
