"""Every optional package is imported through one `fcp_data.optional.require()`.

A bare `import av` that fails raises a plain ImportError; the loader turns any error of a
sample that is not a ConfigError into a counted skip, so a machine without PyAV would skip
every video and finish with exit 0 on an empty corpus. `require()` raises
MissingDependencyError (a ConfigError: always fatal) naming the package and the extra. This
walk finds every import of an optional package in fcp_data (module level or inside a function)
outside `fcp_data.optional`, and checks that `require` knows the extra of each.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import fcp_data
from fcp_data.errors import MissingDependencyError
from fcp_data.optional import EXTRAS, require

# packages not in `dependencies` of pyproject.toml that fcp_data may use (transformers and
# megatron-core have their own rule in test_layering: adapters only, inside functions)
OPTIONAL = (
    "av",
    "decord",
    "torchcodec",
    "PIL",
    "tokenizers",
    "pyarrow",
    "zstandard",
    "matplotlib",
    "fsspec",
    "s3fs",
    "aiohttp",
)


def bare_optional_imports(root: Path) -> list[str]:
    """`path:line imports pkg` for each import of an OPTIONAL package outside fcp_data.optional."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "optional.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in OPTIONAL:
                    bad.append(f"{path}:{node.lineno} imports {name}")
    return bad


def test_every_optional_import_goes_through_require() -> None:
    assert bare_optional_imports(Path(fcp_data.__file__).parent) == []


def test_the_walk_finds_planted_imports(tmp_path: Path) -> None:
    root = tmp_path / "fcp_data"
    root.mkdir()
    (root / "optional.py").write_text("import importlib\nimport av\n")  # the one place
    (root / "a.py").write_text("def f():\n    import av\n    from PIL import Image\n")
    (root / "b.py").write_text("import numpy\nfrom fsspec.asyn import sync\n")
    bad = bare_optional_imports(root)
    assert len(bad) == 3
    assert {b.rsplit(" ", 1)[1] for b in bad} == {"av", "PIL", "fsspec.asyn"}


def test_require_knows_every_optional_package() -> None:
    assert set(OPTIONAL) <= {m.split(".")[0] for m in EXTRAS}


def test_a_missing_package_names_itself_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    with pytest.raises(MissingDependencyError, match=r"'av'.*fcp\[video\]"):
        require("av", "decoding video frames")
