"""The three parts and the layers inside them hold: an import walk over fcp_data, fcp_exec, fcp.

Every import, lazy ones included, is an edge (`import_walk.py` reads them). The rules:

- three parts (`PARTS`): `fcp_data` (the input side) and `fcp_exec` (the training side) are
  libraries that never import `fcp` (the application: command line, demo, profiling);
  `fcp_data` never imports `fcp_exec`; `fcp` may import both. Not even lazily;
- megatron-core and transformers only from the optional adapters listed in `OPTIONAL`, and
  only inside a function (imported when that feature is used, never by importing the module);
- the planner is handed arrays only: it imports nothing of readers, vision, loader, collate
  or the viewer, lazily neither (`fcp_data.vision.work` builds its `VisionWork`);
- `fcp_data.vision` (what a sample is: modality, model families, templates, payload) sits
  below readers, loader and collation: it imports none of them, except under
  `if TYPE_CHECKING:` (annotations cost nothing at run time);
- readers import vision only through its public modules (`PUBLIC_VISION`), so its internals
  can move without touching a reader.

Each rule has a planted violation below: a rule that cannot fail is not a test. The same walk
measures the tree (rooms and arrows, below); `python tests/test_layering.py` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from import_walk import PACKAGES, Edge, circles, imports_of, is_under, module_name

import fcp_data

# part -> the parts it may import (itself included), and what an import of any other part is
PARTS: dict[str, tuple[str, ...]] = {
    "fcp_data": ("fcp_data",),
    "fcp_exec": ("fcp_exec", "fcp_data"),
    "fcp": ("fcp", "fcp_exec", "fcp_data"),
}
PART_NAMES = {"fcp_exec": "training side", "fcp": "application"}
HEAVY = ("megatron", "transformers")
# module -> heavy packages it may import inside functions, with why
OPTIONAL: dict[str, tuple[str, ...]] = {
    # strategy="megatron-hybrid" runs megatron-core's own BalancedCPScheduler as a baseline
    "fcp_data.planner.strategies.baselines": ("megatron",),
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
        banned=tuple(f"fcp_data.{p}" for p in ("readers", "vision", "loader", "collate", "viewer")),
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


def _layer_breaks(edge: Edge) -> list[str]:
    """The `LAYERS` rules `edge` breaks, by name."""
    out = []
    for layer in LAYERS:
        if not is_under(edge.module, layer.source) or is_under(edge.target, layer.source):
            continue
        if not any(is_under(edge.target, b) for b in layer.banned):
            continue
        if edge.target in layer.allowed or (layer.type_checking_ok and edge.type_checking):
            continue
        out.append(layer.rule)
    return out


def _part_break(edge: Edge) -> str | None:
    """The name of the part `edge` may not reach ("training side", "application"), or None."""
    part = edge.module.split(".")[0]
    target = edge.target.split(".")[0]
    if part not in PARTS or target not in PACKAGES or target in PARTS[part]:
        return None
    return PART_NAMES[target]


def layering_violations(*roots: Path) -> list[str]:
    """Edges of the packages at `roots` that break the rules (empty when the layering holds)."""
    bad: list[str] = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            bad += _file_violations(path, root)
    return bad


def _file_violations(path: Path, root: Path) -> list[str]:
    bad: list[str] = []
    for edge in imports_of(path, root):
        where = f"{path}:{edge.line} ({edge.module} imports {edge.target})"
        part = _part_break(edge)
        if part is not None:
            bad.append(f"{part}: {where}")
        if is_under(edge.module, "fcp_data"):  # the input side keeps its heavy imports lazy
            for heavy in HEAVY:
                if not is_under(edge.target, heavy):
                    continue
                if heavy not in OPTIONAL.get(edge.module, ()):
                    bad.append(f"{heavy} outside an optional adapter: {where}")
                elif edge.top_level:
                    bad.append(f"{heavy} imported at module level: {where}")
        bad += [f"{rule}: {where}" for rule in _layer_breaks(edge)]
    return bad


def _package_roots() -> list[Path]:
    """The folders of `PACKAGES` in this tree (found beside fcp_data, imported by none)."""
    base = Path(fcp_data.__file__).parent.parent
    return [base / name for name in PACKAGES]


def test_the_layers_hold() -> None:
    """The three parts, heavy packages only in adapters, and every layer of `LAYERS`."""
    assert layering_violations(*_package_roots()) == []


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
    (root / "planner" / "strategies").mkdir(parents=True)
    (root / "planner" / "__init__.py").write_text("")
    (root / "planner" / "strategies" / "__init__.py").write_text("")
    (root / "planner" / "strategies" / "baselines.py").write_text("import megatron.core\n")
    bad = layering_violations(root)
    lazy = str(root / "collate" / "lazy.py")
    assert sum(f"{lazy}:" in b and "training side" in b for b in bad) == 3
    assert any("heavy.py:1" in b and "megatron outside an optional adapter" in b for b in bad)
    assert any("baselines.py:1" in b and "module level" in b for b in bad)
    assert not any("clean.py" in b for b in bad)
    edges = imports_of(root / "collate" / "clean.py", root)
    assert {e.target for e in edges} == {"numpy", "fcp_data.errors"}


def test_the_three_parts_catch_planted_edges(tmp_path: Path) -> None:
    """Each rule of `PARTS` on planted packages: a library importing the application (top
    level and lazily), the input side importing the training side; the application may
    import both, and a name that merely starts with "fcp" is not the application."""
    _plant(
        tmp_path,
        {
            "fcp/cli.py": "import fcp_data.errors\nfrom fcp_exec import ring\nfrom . import demo\n",
            "fcp/demo.py": "def f():\n    from fcp_exec.ring import r\n",
            "fcp_exec/ring.py": "from fcp_data.errors import E\nimport fcp_data_extra\n",
            "fcp_exec/bad.py": "def f():\n    from fcp.cli import main\n",
            "fcp_data/errors.py": "E = 1\n",
            "fcp_data/bad.py": "import fcp\nfrom fcp_exec import ring\n",
        },
    )
    bad = layering_violations(*(tmp_path / name for name in PACKAGES))
    assert _hits(bad, "application", tmp_path / "fcp_exec" / "bad.py") != []  # lazy, too
    assert _hits(bad, "application", tmp_path / "fcp_data" / "bad.py") != []
    assert _hits(bad, "training side", tmp_path / "fcp_data" / "bad.py") != []
    assert len(bad) == 3, bad
    assert not any(f"{tmp_path / 'fcp'}/" in b for b in bad), bad  # fcp imports both


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
                "if TYPE_CHECKING:\n    from ..readers.index import LengthIndex\n"
            ),
            "errors.py": "E = 1\n",
        },
    )
    bad = layering_violations(root)
    hits = _hits(bad, "planner imports", root / "planner" / "bad.py")
    assert len(hits) == 6, bad
    for target in ("readers", "readers.index", "vision.work", "collate", "loader", "viewer"):
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


# The room/arrow measure: rooms are the packages (folders with an __init__.py) of `PACKAGES`;
# a module lives in the room of its folder (a package's __init__ in the package's own room).
# An arrow is a pair of different rooms (a, b) where a module of a imports, at run time, a
# module or package of b: imports under `if TYPE_CHECKING:` are left out (they cost nothing
# at run time), and so are the imports of a package face (`__init__.py`) from its own
# sub-rooms (a face shows what its rooms hold; no module of the room depends on them).
# Layers, lowest first: a room sits in the layer of the longest prefix listed, sub-rooms with
# their parent room; every room directly under fcp_data is listed. An arrow runs back up when
# it goes from a room to a room of a higher layer; arrows within a layer run neither way. A
# circle is a strongly connected component of more than one room: rooms that reach each other
# through arrows.
ROOM_LAYERS: tuple[tuple[str, ...], ...] = (
    ("fcp_data", "fcp_data.profiles"),  # errors, progress, layout; the shipped cost profiles
    ("fcp_data.planner",),  # lengths in, plans out: arrays only
    ("fcp_data.vision",),  # what a sample is: modality, families, templates, payload
    ("fcp_data.readers",),
    ("fcp_data.collate",),
    ("fcp_data.loader",),
    ("fcp_data.inmemory",),
    ("fcp_data.viewer",),
    ("fcp_exec",),  # the training side, above the whole input side
    ("fcp",),  # the application, above both libraries
)


@dataclass(frozen=True, slots=True)
class Rooms:
    """The measure of the tree: rooms, arrows between them, the arrows that run back up and
    the circles (each a sorted tuple of rooms)."""

    rooms: tuple[str, ...]
    arrows: tuple[tuple[str, str], ...]
    back_up: tuple[tuple[str, str], ...]
    circles: tuple[tuple[str, ...], ...]


def layer_of(room: str) -> int:
    """The index in `ROOM_LAYERS` of the longest listed prefix of `room`."""
    best, depth = -1, -1
    for i, layer in enumerate(ROOM_LAYERS):
        for name in layer:
            if is_under(room, name) and name.count(".") > depth:
                best, depth = i, name.count(".")
    if best < 0 or (depth == 0 and room.startswith("fcp_data.")):  # input rooms: say where
        raise AssertionError(f"room {room} is in no layer of ROOM_LAYERS: place it there")
    return best


def _room_of(name: str, rooms: set[str]) -> str | None:
    """The room of module or package `name`: itself when a room, else its longest room prefix."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in rooms:
            return ".".join(parts[:n])
    return None


def measure_rooms(*roots: Path) -> Rooms:
    """Rooms, arrows, arrows back up and circles of the packages at `roots` (see above)."""
    rooms = sorted(module_name(init, root) for root in roots for init in root.rglob("__init__.py"))
    known = set(rooms)
    arrows: set[tuple[str, str]] = set()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            module = module_name(path, root)
            home = _room_of(module, known)
            face = path.name == "__init__.py"
            for edge in imports_of(path, root):
                there = _room_of(edge.target, known)
                if home is None or there is None or there == home or edge.type_checking:
                    continue
                if face and is_under(there, home):
                    continue
                arrows.add((home, there))
    back_up = sorted((a, b) for a, b in arrows if layer_of(b) > layer_of(a))
    return Rooms(
        rooms=tuple(rooms),
        arrows=tuple(sorted(arrows)),
        back_up=tuple(back_up),
        circles=tuple(circles(tuple(rooms), arrows)),
    )


def test_the_room_measure_counts_planted_rooms(tmp_path: Path) -> None:
    """A planted tree: an arrow back up, a circle of two rooms, a face and a typing import
    that are no arrows."""
    _plant(
        tmp_path,
        {
            "fcp_data/errors.py": "E = 1\n",
            "fcp_data/__init__.py": "from .loader import L\n",  # a face: no arrow
            "fcp_data/planner/api.py": "from ..errors import E\nfrom ..vision import V\n",
            "fcp_data/vision/__init__.py": "from ..planner.api import P\nV = 1\n",
            "fcp_data/loader/__init__.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fcp\nL = 1\n"
            ),
            "fcp/__init__.py": "from fcp_data.loader import L\n",
        },
    )
    got = measure_rooms(*(tmp_path / name for name in PACKAGES))
    assert got.rooms == (
        "fcp",
        "fcp_data",
        "fcp_data.loader",
        "fcp_data.planner",
        "fcp_data.vision",
    )
    assert got.arrows == (
        ("fcp", "fcp_data.loader"),
        ("fcp_data.planner", "fcp_data"),
        ("fcp_data.planner", "fcp_data.vision"),
        ("fcp_data.vision", "fcp_data.planner"),
    )
    assert got.back_up == (("fcp_data.planner", "fcp_data.vision"),)
    assert got.circles == (("fcp_data.planner", "fcp_data.vision"),)


def test_no_arrow_runs_back_up() -> None:
    """Every room imports only rooms of its own layer or below (`ROOM_LAYERS`)."""
    assert measure_rooms(*_package_roots()).back_up == ()


def test_at_most_two_circles() -> None:
    """Rooms that import each other read as one: at most two such circles."""
    assert len(measure_rooms(*_package_roots()).circles) <= 2


if __name__ == "__main__":
    found = measure_rooms(*_package_roots())
    print(
        f"{len(found.rooms)} rooms, {len(found.arrows)} arrows, {len(found.back_up)} running "
        f"back up, {len(found.circles)} circles"
    )
    for a, b in found.back_up:
        print(f"  back up: {a} -> {b}")
    for circle in found.circles:
        print(f"  circle: {' <-> '.join(circle)}")
