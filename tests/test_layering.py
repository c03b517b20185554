"""The input side never imports the training side: an import walk over every fcp_data module.

Every `import` / `from ... import` (module level, inside functions and classes, relative ones
resolved) and every `importlib.import_module("...")` / `__import__("...")` with a constant name
is an edge. `fcp_data` may not reach `fcp_exec` at all; megatron-core and transformers only
from the optional adapters listed in `OPTIONAL`, and only inside a function (imported when that
feature is used, never by importing the module).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import fcp_data

FORBIDDEN = ("fcp_exec",)
HEAVY = ("megatron", "transformers")
# module -> heavy packages it may import inside functions, with why
OPTIONAL: dict[str, tuple[str, ...]] = {
    # strategy="megatron-hybrid" runs megatron-core's own BalancedCPScheduler as a baseline
    "fcp_data.planner.baselines": ("megatron",),
    # a tokenizer directory without tokenizer.json is loaded with transformers' AutoTokenizer
    "fcp_data.readers.text": ("transformers",),
    # the default M-RoPE positions follow what the installed transformers' get_rope_index
    # computes, found by running it once on a tiny weightless model
    "fcp_data.vision.rope_check": ("transformers",),
}


@dataclass(frozen=True, slots=True)
class Edge:
    module: str
    target: str
    line: int
    top_level: bool


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module of `from {'.' * level}{name} import ...` written in `module`."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def imports_of(path: Path, root: Path) -> list[Edge]:
    """Every import edge of one source file (see the module docstring)."""
    module = module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(node) for node in tree.body}
    edges: list[Edge] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = [_resolve(module, is_package, node.level, node.module)]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            targets = [node.args[0].value]
        edges += [Edge(module, t, node.lineno, id(node) in top) for t in targets]
    return edges


def _is_under(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def layering_violations(root: Path) -> list[str]:
    """Edges of the package at `root` that break the rules (empty when the layering holds)."""
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for edge in imports_of(path, root):
            where = f"{path}:{edge.line} ({edge.module} imports {edge.target})"
            if any(_is_under(edge.target, p) for p in FORBIDDEN):
                bad.append(f"training side: {where}")
            for heavy in HEAVY:
                if not _is_under(edge.target, heavy):
                    continue
                if heavy not in OPTIONAL.get(edge.module, ()):
                    bad.append(f"{heavy} outside an optional adapter: {where}")
                elif edge.top_level:
                    bad.append(f"{heavy} imported at module level: {where}")
    return bad


def _package_root() -> Path:
    return Path(fcp_data.__file__).parent


def test_fcp_data_never_imports_fcp_exec_nor_megatron_outside_adapters() -> None:
    assert layering_violations(_package_root()) == []


def test_the_walk_finds_planted_edges(tmp_path: Path) -> None:
    """The same walk on a planted package: every way of importing is caught."""
    root = tmp_path / "fcp_data"
    (root / "collate").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "collate" / "__init__.py").write_text("from . import clean\n")
    (root / "collate" / "clean.py").write_text("import numpy as np\nfrom ..errors import X\n")
    (root / "collate" / "lazy.py").write_text(
        "def f():\n    from fcp_exec.megatron import packed_seq_params\n"
        "class C:\n    def g(self):\n        import fcp_exec\n"
        "def h():\n    import importlib\n    return importlib.import_module('fcp_exec.ring')\n"
    )
    (root / "collate" / "heavy.py").write_text("from megatron.core import parallel_state\n")
    (root / "planner").mkdir()
    (root / "planner" / "__init__.py").write_text("")
    (root / "planner" / "baselines.py").write_text("import megatron.core\n")  # top level
    bad = layering_violations(root)
    lazy = str(root / "collate" / "lazy.py")
    assert sum(f"{lazy}:" in b and "training side" in b for b in bad) == 3
    assert any("heavy.py:1" in b and "megatron outside an optional adapter" in b for b in bad)
    assert any("baselines.py:1" in b and "module level" in b for b in bad)
    assert not any("clean.py" in b for b in bad)
    edges = imports_of(root / "collate" / "clean.py", root)
    assert {e.target for e in edges} == {"numpy", "fcp_data.errors"}
