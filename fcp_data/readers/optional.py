"""Optional packages (PyAV, decord, tokenizers) imported where a feature first needs them.

A missing optional package is a configuration error, not a bad sample: without PyAV every
video fails to probe, and skipping them one by one would turn a broken install into an
"empty" dataset with exit status 0. `require` raises `MissingDependencyError` naming the
feature and the extra to install, and the scanners let that error stop the scan.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingDependencyError

__all__ = ["EXTRAS", "require"]

# The pip extra of fcp that brings each optional module (pyproject.toml).
EXTRAS = {"av": "video", "decord": "video", "PIL": "video", "tokenizers": "text"}
EXTRAS |= {"pyarrow": "sources", "pyarrow.parquet": "sources", "zstandard": "sources"}


def require(module: str, feature: str) -> ModuleType:
    """Import `module` or raise MissingDependencyError saying what needs it and how to fix."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module)
        hint = f"pip install 'fcp[{extra}]'" if extra else f"pip install {module}"
        raise MissingDependencyError(
            f"{feature} needs the optional package {module!r}, which is not installed "
            f"({exc}); install it: {hint}"
        ) from exc
