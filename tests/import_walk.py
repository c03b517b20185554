"""How the layering tests read the code: every import of a module as an edge, and the
circles of a graph. `test_layering.py` states the rules and the measure on top of it.

Every `import` / `from ... import` (module level, inside functions and classes, relative ones
resolved; `from pkg import name` is an edge to `pkg.name` when that is a module of the tree)
and every `importlib.import_module("...")` / `__import__("...")` with a constant name is an
edge.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PACKAGES",
    "Edge",
    "circles",
    "imports_of",
    "is_module",
    "is_under",
    "module_name",
    "resolve",
]

PACKAGES = ("fcp_data", "fcp_exec", "fcp")  # the walked packages: two libraries, one application


@dataclass(frozen=True, slots=True)
class Edge:
    """One import: `module` imports `target` at `line` (at module level or lazily)."""

    module: str
    target: str
    line: int
    top_level: bool
    type_checking: bool = False  # inside the body of `if TYPE_CHECKING:` (not its else)


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the file at `path` in the package at `root` (a package by its own)."""
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module of `from {'.' * level}{name} import ...` written in `module`."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def is_module(name: str, root: Path) -> bool:
    """True when `name` is a module or package of one of `PACKAGES` beside `root`."""
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return False
    path = root.parent.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING` (any `X.TYPE_CHECKING`)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of every node inside the body (not the else) of an `if TYPE_CHECKING:`."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                inside |= {id(n) for n in ast.walk(stmt)}
    return inside


def imports_of(path: Path, root: Path) -> list[Edge]:
    """Every import edge of one source file (see the module docstring)."""
    module = module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(node) for node in tree.body}
    typing_only = _type_checking_nodes(tree)
    edges: list[Edge] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, is_package, node.level, node.module)
            # `from pkg import sub` imports the module pkg.sub when there is one
            subs = [f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}", root)]
            targets = subs if len(subs) == len(node.names) else [base, *subs]
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
        edges += [
            Edge(module, t, node.lineno, id(node) in top, id(node) in typing_only) for t in targets
        ]
    return edges


def is_under(target: str, package: str) -> bool:
    """True when `target` is `package` or inside it (`fcp_data.x` is not under `fcp`)."""
    return target == package or target.startswith(package + ".")


def circles(rooms: tuple[str, ...], arrows: set[tuple[str, str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one room (Tarjan's algorithm)."""
    out: dict[str, list[str]] = {r: [] for r in rooms}
    for a, b in sorted(arrows):
        out[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in out[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for r in rooms:
        if r not in index:
            visit(r)
    return sorted(found)
