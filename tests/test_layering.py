"""The package's layers hold: an import walk over every fcp_data module.

Every `import` / `from ... import` (module level, inside functions and classes, relative ones
resolved; `from pkg import name` is an edge to `pkg.name` when that is a module of the tree)
and every `importlib.import_module("...")` / `__import__("...")` with a constant name is an
edge. The rules:

- `fcp_data` never reaches `fcp_exec` (the training side), not even lazily;
- megatron-core and transformers only from the optional adapters listed in `OPTIONAL`, and
  only inside a function (imported when that feature is used, never by importing the module);
- the planner is handed arrays only: it imports nothing of readers, vision, loader, collate,
  commands or the viewer, lazily neither (`fcp_data.vision.work` builds its `VisionWork`);
- `fcp_data.vision` (what a sample is: modality, model families, templates, payload) sits
  below readers, loader and collation: it imports none of them, except under
  `if TYPE_CHECKING:` (annotations cost nothing at run time);
- readers import vision only through its public modules (`PUBLIC_VISION`), so its internals
  can move without touching a reader.

Each rule has a planted violation below: a rule that cannot fail is not a test.
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


# the modules of fcp_data.vision a reader may import (packages by their own name only)
PUBLIC_VISION = (
    "fcp_data.vision",
    "fcp_data.vision.modality",
    "fcp_data.vision.families",
    "fcp_data.vision.decode",
    "fcp_data.vision.probe",
    "fcp_data.vision.media_meta",
)


@dataclass(frozen=True, slots=True)
class Layer:
    """Modules under `source` may not import modules under `banned`, except the exact modules
    in `allowed`; `type_checking_ok`: imports under `if TYPE_CHECKING:` are exempt."""

    rule: str
    source: str
    banned: tuple[str, ...]
    allowed: tuple[str, ...] = ()
    type_checking_ok: bool = False


LAYERS = (
    Layer(
        rule="planner imports",
        source="fcp_data.planner",
        banned=tuple(
            f"fcp_data.{p}"
            for p in ("readers", "vision", "loader", "collate", "commands", "viewer")
        ),
    ),
    Layer(
        rule="vision imports",
        source="fcp_data.vision",
        banned=("fcp_data.readers", "fcp_data.loader", "fcp_data.collate"),
        type_checking_ok=True,
    ),
    Layer(
        rule="readers import vision internals",
        source="fcp_data.readers",
        banned=("fcp_data.vision",),
        allowed=PUBLIC_VISION,
    ),
)


@dataclass(frozen=True, slots=True)
class Edge:
    module: str
    target: str
    line: int
    top_level: bool
    type_checking: bool = False  # inside the body of `if TYPE_CHECKING:` (not its else)


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


def _is_module(name: str, root: Path) -> bool:
    """True when `name` is a module or package of the tree at `root` (fcp_data/...)."""
    parts = name.split(".")
    if parts[0] != root.name:
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
            base = _resolve(module, is_package, node.level, node.module)
            # `from pkg import sub` imports the module pkg.sub when there is one
            subs = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}", root)]
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


def _is_under(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def _layer_breaks(edge: Edge) -> list[str]:
    """The `LAYERS` rules `edge` breaks, by name."""
    out = []
    for layer in LAYERS:
        if not _is_under(edge.module, layer.source) or _is_under(edge.target, layer.source):
            continue
        if not any(_is_under(edge.target, b) for b in layer.banned):
            continue
        if edge.target in layer.allowed or (layer.type_checking_ok and edge.type_checking):
            continue
        out.append(layer.rule)
    return out


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
            bad += [f"{rule}: {where}" for rule in _layer_breaks(edge)]
    return bad


def _package_root() -> Path:
    return Path(fcp_data.__file__).parent


def test_fcp_data_layers_hold() -> None:
    """No training side, heavy packages only in adapters, and every layer of `LAYERS`."""
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


def _plant(root: Path, files: dict[str, str]) -> None:
    """Write `files` (paths under `root`), then an empty __init__.py in every folder without."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        if not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")


def _hits(bad: list[str], rule: str, path: Path) -> list[str]:
    return [b for b in bad if b.startswith(f"{rule}: {path}:")]


def test_the_planner_layer_catches_planted_edges(tmp_path: Path) -> None:
    """Every package above the planner, top level or lazy, TYPE_CHECKING no excuse."""
    root = tmp_path / "fcp_data"
    _plant(
        root,
        {
            "planner/cost.py": "X = 1\n",
            "planner/clean.py": "import numpy\nfrom .cost import X\nfrom ..errors import E\n",
            "planner/bad.py": (
                "from ..readers import get_rule\n"
                "import fcp_data.vision.work\n"
                "from fcp_data.collate import zigzag\n"
                "def f():\n    from ..loader import FCPDataLoader\n"
                "def g():\n    import importlib\n"
                "    return importlib.import_module('fcp_data.viewer')\n"
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..commands import index\n"
            ),
            "errors.py": "E = 1\n",
        },
    )
    bad = layering_violations(root)
    hits = _hits(bad, "planner imports", root / "planner" / "bad.py")
    assert len(hits) == 6, bad
    for target in ("readers", "vision.work", "collate", "loader", "viewer", "commands"):
        assert any(f"imports fcp_data.{target}" in h for h in hits), (target, hits)
    assert not any("clean.py" in b for b in bad)


def test_the_vision_layer_catches_planted_edges(tmp_path: Path) -> None:
    """Readers, loader, collate from vision: caught unless under `if TYPE_CHECKING:` (its
    body, not its else), an exemption of this rule only."""
    root = tmp_path / "fcp_data"
    _plant(
        root,
        {
            "vision/typed.py": (
                "from typing import TYPE_CHECKING\nimport typing\n"
                "if TYPE_CHECKING:\n    from ..readers.sample_source import SampleSource\n"
                "else:\n    from ..collate import pack\n"
                "if typing.TYPE_CHECKING:\n    from fcp_data.loader.encode import EncodedSample\n"
            ),
            "vision/bad.py": (
                "from ..readers.rules import get_rule\n"
                "def f():\n    from ..loader import encode\n"
                "import fcp_data.collate.zigzag\n"
            ),
            "vision/clean.py": (
                "from .families import get_rule\nfrom ..errors import E\n"
                "def f():\n    from ..planner.vision_work import VisionWork\n"
            ),
            "vision/families/__init__.py": "get_rule = 1\n",
            "planner/vision_work.py": "VisionWork = 1\n",
            "errors.py": "E = 1\n",
        },
    )
    bad = layering_violations(root)
    typed = _hits(bad, "vision imports", root / "vision" / "typed.py")
    assert len(typed) == 1 and "imports fcp_data.collate" in typed[0], typed  # the else branch
    assert len(_hits(bad, "vision imports", root / "vision" / "bad.py")) == 3, bad
    assert not any("clean.py" in b for b in bad)
    edges = imports_of(root / "vision" / "typed.py", root)
    assert [e.type_checking for e in edges if e.target.startswith("fcp_data.")] == [
        True,
        False,
        True,
    ]


def test_the_readers_layer_catches_planted_edges(tmp_path: Path) -> None:
    """A reader reaches vision through its public modules only; a submodule named in
    `from pkg import sub` counts as that submodule."""
    root = tmp_path / "fcp_data"
    files = {f"vision/{m}.py": "x = 1\n" for m in ("modality", "probe", "media_meta", "chat")}
    files |= {
        "vision/families/__init__.py": "get_rule = 1\n",
        "vision/families/qwen.py": "smart_resize = 1\n",
        "vision/decode/__init__.py": "decode_video_frames = 1\n",
        "vision/decode/sample.py": "decode_frames = 1\n",
        "readers/ok.py": (
            "from ..vision import is_chat\n"
            "from ..vision.families import get_rule\n"
            "from fcp_data.vision.modality import Modality\n"
            "from ..vision import probe, media_meta\n"
            "def f():\n    from ..vision.decode import decode_video_frames\n"
        ),
        "readers/deep.py": (
            "from ..vision.families.qwen import smart_resize\n"
            "from ..vision import chat\n"
            "import fcp_data.vision.template\n"
            "def f():\n    from ..vision.decode.sample import decode_frames\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ..vision.families import qwen\n"
        ),
    }
    _plant(root, files)
    bad = layering_violations(root)
    hits = _hits(bad, "readers import vision internals", root / "readers" / "deep.py")
    assert len(hits) == 5, bad
    for target in ("families.qwen", "chat", "template", "decode.sample"):
        assert any(f"imports fcp_data.vision.{target}" in h for h in hits), (target, hits)
    assert not any("ok.py" in b for b in bad), bad
