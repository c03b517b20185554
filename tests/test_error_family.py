"""Every error a user can reach is an `FCPError`: the library raises no bare builtins.

The test reads the source (AST) of fcp_data, fcp_exec and fcp and fails on any
`raise ValueError(...)` (or TypeError, RuntimeError, KeyError, FileNotFoundError, IndexError,
OSError, NotImplementedError) outside the allow-list below. Each allowed raise is a protocol
Python itself defines or an invariant no user input reaches; the reason is written beside it.
A user-facing error uses a class of fcp_data.errors instead, which also derives from the
builtin it replaces, so `except ValueError` callers keep working.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fcp_data.errors as errors

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fcp_data", "fcp_exec", "fcp")
BUILTINS = frozenset(
    {
        "ValueError",
        "TypeError",
        "RuntimeError",
        "KeyError",
        "FileNotFoundError",
        "IndexError",
        "OSError",
        "NotImplementedError",
    }
)

# (file name, enclosing function's qualified name, builtin) -> why it stays a builtin.
ALLOWED: dict[tuple[str, str, str], str] = {
    # Python's len() protocol: len(loader) of an unsized loader must be a plain TypeError
    ("dataloader.py", "FCPDataLoader.__len__", "TypeError"): "len() protocol",
    # a Mapping's __getitem__: KeyError is how `in`, .get() and ** find a missing key
    ("data.py", "FCPStep.__getitem__", "KeyError"): "Mapping protocol",
    # a file object's read(): a stream that does not decompress raises OSError, as
    # gzip.BadGzipFile does; the JSON Lines reader catches it and names the damaged region
    ("jsonl.py", "Decompressed._decompress", "OSError"): "io protocol",
    # an abstract method: a subclass that forgets it is a bug in fcp, not in user input
    ("text.py", "TokenCounter.count", "NotImplementedError"): "abstract method",
    # the blend asks only positions it built a token store for: a bug in fcp if reached
    ("blend.py", "_BlendStore.tokens", "KeyError"): "internal invariant",
    # candidate names are fcp's own constants; a collision is a bug in fcp, not user input
    ("api.py", "plan_global_batch", "RuntimeError"): "internal invariant",
    # megatron-core's scheduler must return every sample once: a bug in megatron-core if not
    ("baselines.py", "megatron_hybrid", "RuntimeError"): "third-party invariant",
}


def _raises(path: Path) -> list[tuple[str, int, str]]:
    """(qualified name of the enclosing function, line, builtin) of each bare builtin raise."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTINS:
                    found.append((".".join(scope), child.lineno, exc.id))
            visit(child, scope)

    visit(tree, ())
    return found


def _library_raises() -> dict[tuple[str, str, str], list[str]]:
    out: dict[tuple[str, str, str], list[str]] = {}
    for package in PACKAGES:
        root = REPO / package
        for path in sorted(root.rglob("*.py")) if root.is_dir() else ():
            for scope, line, name in _raises(path):
                where = f"{path.relative_to(REPO)}:{line}"
                out.setdefault((path.name, scope, name), []).append(where)
    return out


def test_no_bare_builtin_raise_on_a_user_reachable_path() -> None:
    found = _library_raises()
    bad = sorted(w for key, where in found.items() if key not in ALLOWED for w in where)
    assert not bad, (
        f"{len(bad)} bare builtin raise(s); raise a fcp_data.errors class (it derives from the "
        "builtin too) or, for a protocol or internal invariant, allow it here with a reason:\n"
        + "\n".join(bad)
    )


def test_the_allow_list_is_short_and_current() -> None:
    found = _library_raises()
    stale = [key for key in ALLOWED if key not in found]
    assert not stale, f"allowed raises that no longer exist, drop them: {stale}"
    assert len(ALLOWED) <= 8


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_class_is_an_fcp_error_and_a_builtin(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.FCPError)
    if cls is not errors.FCPError:
        assert any(b in cls.__mro__ for b in (ValueError, RuntimeError, LookupError, OSError))


def test_new_classes_keep_the_builtin_callers_catch() -> None:
    assert issubclass(errors.ArgumentTypeError, TypeError)
    assert issubclass(errors.OutOfRangeError, IndexError)
    assert issubclass(errors.MissingFileError, FileNotFoundError)
    assert issubclass(errors.MemberError, ValueError)


def test_the_walker_finds_a_planted_raise(tmp_path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "class A:\n"
        "    def f(self, x):\n"
        "        if x:\n"
        "            raise ValueError(f'x={x}')\n"
        "        raise KeyError\n"
        "def g():\n"
        "    raise errors.ConfigError('fine')\n"
    )
    assert _raises(planted) == [("A.f", 4, "ValueError"), ("A.f", 5, "KeyError")]
