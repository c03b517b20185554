"""Optional packages (PyAV, decord, torchcodec, Pillow, tokenizers, ...) imported on first use.

A missing optional package is a configuration error, not a bad sample: without PyAV every
video fails to probe or decode, and skipping them one by one would turn a broken install into
an "empty" dataset with exit status 0 (the loader counts any non-ConfigError of a sample as a
skip). `require` raises `MissingDependencyError` (a ConfigError, so it always stops the run)
naming the feature, the package and the extra to install. An installed package whose native
part does not load counts as missing too: torchcodec's PyPI wheel raises RuntimeError at import
when its FFmpeg / CUDA libraries are absent, decord an OSError when libavcodec is.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from .errors import MissingDependencyError

__all__ = ["EXTRAS", "require"]

# The pip extra of fcp that brings each optional package (pyproject.toml), by top-level name
# (a submodule such as "matplotlib.pyplot" or "pyarrow.parquet" uses its package's entry);
# None: in no extra, installed by its own name (torchcodec's wheel must match torch and CUDA).
EXTRAS: Mapping[str, str | None] = MappingProxyType(
    {
        "av": "video",
        "decord": "video",
        "PIL": "video",
        "torchcodec": None,
        "tokenizers": "text",
        "pyarrow": "sources",
        "zstandard": "sources",
        "matplotlib": "viewer",
        "fsspec": "remote",
        "s3fs": "remote",
        "aiohttp": "remote",
    }
)
# pip names of packages whose import name differs from the distribution's
_PIP_NAMES: Mapping[str, str] = MappingProxyType({"PIL": "pillow"})


def require(module: str, feature: str) -> ModuleType:
    """Import `module` or raise MissingDependencyError saying what needs it and how to fix."""
    try:
        return importlib.import_module(module)
    except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError/OSError: a native part
        top = module.split(".")[0]
        extra = EXTRAS.get(module, EXTRAS.get(top))
        hint = f"pip install 'fcp[{extra}]'" if extra else f"pip install {_PIP_NAMES.get(top, top)}"
        raise MissingDependencyError(
            f"{feature} needs the optional package {top!r}, which is not installed or does not "
            f"load ({type(exc).__name__}: {exc}); install it: {hint}"
        ) from exc
