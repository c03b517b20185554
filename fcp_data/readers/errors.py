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
    "EmptyIndexError",
    "ErrorPolicy",
    "FailureLog",
    "SampleError",
    "SkippedFile",
    "SkippedSample",
    "TooManyFailures",
]

_DECOMPRESS = {"gzip": "gzip -dc", "bzip2": "bzip2 -dc", "xz": "xz -dc", "zstd": "zstd -dc"}

SAME_ERROR_HEAD = 8


class TooManyFailures(DataError):
    """Raised after `max_consecutive_failures` bad samples in a row."""


class EmptyIndexError(DataError):
    """A scan that found no sample at all: every one was skipped, or the shards hold none.

    An index of 0 samples used to be written with exit status 0, so a typo in a field name or a
    0-byte shard looked like success; the error lists the skips that explain it.
    """


def empty_scan_message(what: str, urls: list[str], skipped: list[SkippedSample]) -> str:
    """Why a scan of `urls` gave no sample: the shards and the first skips, and the fix."""
    shards = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
    if skipped:
        first = "; ".join(f"{s.shard}: {s.key!r}: {s.reason}" for s in skipped[:3])
        why = f"all {len(skipped)} skipped ({first}{'; ...' if len(skipped) > 3 else ''})"
    else:
        why = "the shards hold no sample"
    return (
        f"no sample to index in {shards}: {why}. {what + ' ' if what else ''}Fix what the "
        "reasons name (the shards, --text-field, the tokenizer)"
    )


class CompressedShardError(DataError):
    """A compressed shard (`.tar.gz`, or gzip/bzip2/xz/zstd/lz4 magic bytes): refused.

    The index stores each member's byte offset so the loader reads one sample with one seek;
    offsets into a compressed stream cannot be seeked, so fcp needs uncompressed tars.
    """

    def __init__(self, url: str, fmt: str) -> None:
        tool = _DECOMPRESS.get(fmt, f"{fmt} -dc")
        super().__init__(
            f"{url}: {fmt}-compressed shard. fcp reads a member by seeking to its byte offset "
            "in the shard, which a compressed stream does not allow. Either decompress it once "
            f"({tool} SHARD > SHARD.tar) and index the .tar (members read by offset, like any "
            f"tar), or index it as 'pipe:{tool} SHARD', as webdataset streams it: such a shard "
            "has no byte ranges, so before its first sample is read the loader decompresses "
            "it whole into the shard cache (~/.cache/fcp/shards; once per host, the disk of "
            "the whole tar) and the index runs the command only when opened with "
            "LoaderOptions(allow_pipe=True) or LengthIndex.open(..., allow_pipe=True)"
        )
        self.url, self.fmt = url, fmt

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.url, self.fmt)  # survives process pools


class SkippedSample(msgspec.Struct, frozen=True, array_like=True):
    shard: str
    key: str
    reason: str


class SkippedFile(msgspec.Struct, frozen=True, array_like=True):
    """A file inside a data directory that is not data (a tokenizer.json, a README, a config):
    left out of the index and counted in its header, where it used to stop the build."""

    path: str
    reason: str


_NOTHING_TO_COUNT = "include no text"  # the scanner's reason for a sample without a payload


def same_error_message(head: list[SkippedSample]) -> str:
    """Why the first samples of a scan all failed alike, with advice that fits the reason.

    The reasons are compared with their numbers masked (byte offsets, line numbers differ from
    sample to sample), so the message quotes the first and the last verbatim rather than
    calling them "the same"; a sample that holds nothing fcp counts is a matter of the
    shards' layout, which no setting fixes.
    """
    first, last = head[0], head[-1]
    same = first.reason == last.reason
    quoted = (
        f"{last.shard}: {last.key!r}: {last.reason}"
        if same
        else f"first {first.shard}: {first.key!r}: {first.reason}; last {last.shard}: "
        f"{last.key!r}: {last.reason}"
    )
    kind = "the same error" if same else "errors that differ only in their numbers"
    if _NOTHING_TO_COUNT in last.reason:
        advice = (
            "these shards hold samples with no member fcp can count: it counts text in .txt, "
            ".json (its --text-field) or .npy members (also gzipped: .txt.gz, .json.gz), "
            "images (.jpg, .png, .webp) and videos (.mp4, .mkv, .webm, .mov, .avi); rename "
            "the members or re-create the shards"
        )
    else:
        advice = (
            "when every sample fails alike the cause is usually the setup (a missing "
            "package, a wrong --text-field, the wrong tokenizer) rather than the data: fix "
            "what the reason names, or remove these samples from the shards"
        )
    return f"the first {len(head)} samples all failed with {kind} ({quoted}); {advice}"


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
            head = self.skipped[-SAME_ERROR_HEAD:]
            reasons = {re.sub(r"\d+", "#", s.reason) for s in head}
            if len(reasons) == 1:
                raise TooManyFailures(same_error_message(head))
        if self.consecutive >= self.policy.max_consecutive_failures:
            raise TooManyFailures(
                f"{self.consecutive} consecutive bad samples (last: {shard}: {key!r}: {reason}); "
                "the dataset looks broken. Fix the shards, or raise max_consecutive_failures "
                f"(now {self.policy.max_consecutive_failures}) if this many bad samples in a row "
                "is expected"
            )
