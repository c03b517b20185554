"""Encoders that fail on purpose (module-level so DataLoader workers can unpickle them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["ExitOn", "RaiseOn"]


class RaiseOn:
    """Byte-encodes samples, raising on the one whose payload starts with `marker`."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        raw = sample["txt"]
        if raw.startswith(self.marker):
            raise OSError("simulated decoder failure")
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64) + 1


class ExitOn(RaiseOn):
    """Kills the worker process outright (a segfaulting decoder) on the marked sample."""

    def __call__(self, sample: Mapping[str, Any]) -> np.ndarray:
        if sample["txt"].startswith(self.marker):
            os._exit(3)
        return super().__call__(sample)
