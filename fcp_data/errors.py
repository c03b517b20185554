"""One family of errors: everything fcp raises on purpose derives from `FCPError`.

Users catch one root (or one branch of it) instead of a zoo of ValueError / RuntimeError
subclasses; the CLI prints any `FCPError` as one line with exit status 2. Each subclass also
derives from the builtin it replaces (ValueError, RuntimeError, ...), so code written against
the builtins keeps working. Messages name the bad value, what is allowed and how to fix it.

    FCPError
    ├── ConfigError (ValueError)          an option or argument out of range, a missing extra
    │   ├── MissingDependencyError (ImportError)
    │   ├── ArgumentTypeError (TypeError)     an argument of the wrong type
    │   ├── OutOfRangeError (IndexError)      a batch, sample or row index past the end
    │   └── MissingFileError (FileNotFoundError)  a path or shard spec that names nothing
    ├── SampleError (ValueError)          one bad sample: shard, key, reason
    ├── MemberError (ValueError)          one member's bytes or fields (a sidecar, an image, a
    │                                     video, chat JSON) before its shard and key are known
    ├── DataError (RuntimeError)          a dataset-level fault: too many failures, lost shard data
    ├── StaleIndexError (RuntimeError)    shards changed since the index was built
    ├── IndexMismatchError (ValueError)   index built with another rule / tokenizer, corrupt arrays
    ├── StateError (ValueError)           a resume state that does not fit this loader
    ├── PlanningError (ValueError)        the planner cannot place a batch on the cluster
    └── ExecError (RuntimeError)          the training side: plan or layout disagreement, groups
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ConfigError",
    "DataError",
    "ExecError",
    "FCPError",
    "IndexMismatchError",
    "MemberError",
    "MissingDependencyError",
    "MissingFileError",
    "OutOfRangeError",
    "PlanningError",
    "SampleError",
    "StaleIndexError",
    "StateError",
]


class FCPError(Exception):
    """Root of every error fcp raises on purpose."""


class ConfigError(FCPError, ValueError):
    """An option, argument or setting that is not allowed; the message names the allowed ones."""


class MissingDependencyError(ConfigError, ImportError):
    """An optional package a feature needs is not installed; the message names the extra."""


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of the wrong type (a dict where a Cluster goes); still a TypeError, so code
    that checks types the builtin way keeps working."""


class OutOfRangeError(ConfigError, IndexError):
    """An index past the end (a batch of an epoch, a sample of an index, a row of a file); an
    IndexError too, so sequence iteration by `__getitem__` still stops where it should."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A path or shard spec that names no file; a FileNotFoundError too, for callers that test
    for a missing file the builtin way."""


class MemberError(FCPError, ValueError):
    """One member of a sample whose bytes or fields are not usable (a sidecar field that is not
    a number, an image that does not decode, chat JSON of the wrong shape). Raised where the
    shard and key are not known: the reader that knows them counts it as a skip or names it."""


class SampleError(FCPError, ValueError):
    """One bad sample; the message names the shard, key, bad value and the fix."""

    def __init__(self, shard: str, key: str, reason: str) -> None:
        super().__init__(f"{shard}: sample {key!r}: {reason}")
        self.shard, self.key, self.reason = shard, key, reason

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), (self.shard, self.key, self.reason)  # survives process pools


class DataError(FCPError, RuntimeError):
    """A dataset-level fault: too many bad samples in a row, a shard cut short, a dead worker."""


class StaleIndexError(FCPError, RuntimeError):
    """Shards changed since the index was built; rebuild it."""


class IndexMismatchError(FCPError, ValueError):
    """An index that does not fit: another vision rule or tokenizer, or inconsistent arrays."""


class StateError(FCPError, ValueError):
    """A resume state that does not belong to this loader (dataset, sampler, field ranges)."""


class PlanningError(FCPError, ValueError):
    """The planner cannot place a global batch (a sequence too long for the cluster, ...)."""


class ExecError(FCPError, RuntimeError):
    """The training side: members of a CP group disagree on the plan or layout, bad groups."""
