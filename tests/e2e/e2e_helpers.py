"""Helpers of the end-to-end tests: load an example script (examples/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["REPO", "load_example"]

REPO = Path(__file__).resolve().parents[2]


def load_example(name: str) -> ModuleType:
    """examples/<name>.py as a module (cached in sys.modules, so spawned children find it)."""
    key = f"fcp_examples_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
