"""The code of README.md and of the docs pages runs as written, and their paths and links hold.

Pages: README.md, every .md under docs/, and BENCHMARKS.md. A block is runnable when the line
before its fence is `<!-- runnable -->` (a ```python block runs as a script, a ```bash block
with `bash -e`) or `<!-- runnable: torchrun N -->` (the python block runs under
`torchrun --standalone --nproc-per-node N`, as its text says to). A page's runnable blocks run
in page order in one temporary working directory of their own that looks like a clone (links to
the checkout's examples/, fcp_data/, ...), so a later block uses what an earlier one of the same
page wrote under out/ (shards, tokenizer, index); this checkout is on PYTHONPATH and the
interpreter's bin directory (fcp, torchrun, python) first on PATH. Every other ```python block
must compile and every other ```bash block must pass `bash -n` (except on docs/layouts/ pages,
whose blocks are fragments of a loop).

Paths: every local path a code block names (`out/index`, `examples/train_megatron.py`,
`'out/shards/*.tar'`, ...) must exist when the block is reached: in the checkout, or written by
an earlier runnable block of the same page; a runnable block may also name what it writes
itself, and a path given to `-o/--output` in a block that does not run is an output. Paths under
`.venv/` are what the Makefile creates. Links: every relative link of a page points to an
existing file, and an anchor to an existing heading; every page under docs/ can be reached from
README.md by links.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from braceexpand import braceexpand

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- runnable(?::\s*torchrun\s+(\d+))?\s*-->$")
FENCE = re.compile(r"^```(\w*)")
PAGES = sorted(
    [REPO / "README.md", REPO / "BENCHMARKS.md", *(REPO / "docs").rglob("*.md")],
    key=lambda p: (p.name != "README.md", str(p)),
)
FRONT_PAGE_MAX_BYTES = 14_000  # README.md is a front page: detail belongs in docs/


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    runnable: bool
    nproc: int = 0  # > 0: run under torchrun with this many processes


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, j = i, i + 1
        while not lines[j].startswith("```"):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARK.match(lines[k].strip()) if k >= 0 else None
        out.append(
            Block(
                lang=m[1],
                code="\n".join(lines[start + 1 : j]) + "\n",
                line=start + 1,
                runnable=mark is not None,
                nproc=int(mark[1]) if mark is not None and mark[1] else 0,
            )
        )
        i = j + 1
    return out


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


BLOCKS = {_name(p): blocks(p.read_text(encoding="utf-8")) for p in PAGES}
README = BLOCKS["README.md"]
RUN_PAGES = [name for name, bs in BLOCKS.items() if any(b.runnable for b in bs)]


def test_markers_sit_on_blocks_that_can_run() -> None:
    for page in PAGES:
        name, text = _name(page), page.read_text(encoding="utf-8")
        assert len(re.findall(r"<!-- runnable", text)) == sum(b.runnable for b in BLOCKS[name])
        for b in BLOCKS[name]:
            if b.runnable:
                assert b.lang in ("python", "bash"), f"{name} line {b.line}: {b.lang!r} cannot run"
                assert b.nproc == 0 or b.lang == "python", f"{name} line {b.line}"
    # what a newcomer copies first must be among them (the test is not vacuous)
    assert sum(b.runnable and b.lang == "python" for b in README) >= 2
    assert sum(b.runnable and b.lang == "bash" for b in README) >= 2
    assert any(b.nproc >= 2 for b in README)
    # the pages the README's detail moved to keep their runnable blocks
    for name in ("docs/sources.md", "docs/training.md", "docs/planner.md", "docs/cli.md"):
        assert name in RUN_PAGES, f"{name} has no runnable block"
    assert any(b.nproc >= 2 for b in BLOCKS["docs/training.md"])


def test_readme_is_a_front_page() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= FRONT_PAGE_MAX_BYTES, (
        f"README.md is {size} bytes: keep it a front page (what fcp is, the two commands, three "
        "examples, the status table, links) and move detail to a page under docs/"
    )


# docs/layouts/ pages show fragments of a loop (`TransformerConfig(..., sequence_parallel=SP)`):
# their paths and links are checked, their code is not compiled.
OTHER = [
    (n, b)
    for n, bs in BLOCKS.items()
    for b in bs
    if not b.runnable and not n.startswith("docs/layouts/")
]


@pytest.mark.parametrize(("page", "block"), OTHER, ids=[f"{n}:L{b.line}" for n, b in OTHER])
def test_other_blocks_parse(page: str, block: Block) -> None:
    if block.lang == "python":
        compile(block.code, f"{page}:{block.line}", "exec")
    elif block.lang == "bash":
        out = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
        assert out.returncode == 0, f"{page}:{block.line}: {out.stderr}"


# -- paths named in code blocks ------------------------------------------------------------

TOP = {p.name for p in REPO.iterdir()} | {"out"}
FILE_SUFFIX = re.compile(r"\.(json|py|tar|npy|bin|png|md|txt|toml|mp4|sh|yaml|yml)$")
TOKEN = re.compile(r"[\w.*?{}/~$:,-]+")
OUTPUT_FLAG = re.compile(r"(?:^|\s)(?:-o|--output|--out)[\s=]+['\"]?$")


def named_paths(code: str) -> Iterator[tuple[str, bool]]:
    """(path, is an output) for each local path `code` names: relative, with a '/', starting at
    a top-level entry of the checkout or out/, or ending in a file suffix. URLs, absolute paths,
    `pipe:` / `py:` specs and shell variables are left out."""
    for m in TOKEN.finditer(code):
        tok = m[0].rstrip(".,:")
        if "/" not in tok or tok.startswith(("/", "~", "$")) or ":" in tok or "$" in tok:
            continue
        if "," in tok:
            continue
        first = tok.split("/", 1)[0]
        if first not in TOP and not FILE_SUFFIX.search(tok):
            continue
        yield tok, OUTPUT_FLAG.search(code[: m.start()].rsplit("\n", 1)[-1]) is not None


def _exists(root: Path, path: str) -> bool:
    for p in braceexpand(path):
        if any(c in p for c in "*?"):
            if not glob.glob(str(root / p)):
                return False
        elif not (root / p).exists():
            return False
    return True


def missing_paths(block: Block, root: Path, *, ran: bool) -> list[str]:
    """Paths `block` names that do not exist under `root` (outputs count only if it ran)."""
    if block.lang not in ("python", "bash"):
        return []
    bad = []
    for path, output in named_paths(block.code):
        if path.startswith(".venv/"):
            continue  # the Makefile's venv (checked in test_venv_paths_are_the_makefiles)
        if output and not ran:
            continue
        if not _exists(root, path):
            bad.append(path)
    return bad


def test_venv_paths_are_the_makefiles() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^VENV \?= \.venv$", makefile, re.M), "the pages say .venv/: so must make"
    for name, bs in BLOCKS.items():
        for b in bs:
            for path, _ in named_paths(b.code):
                if path.startswith(".venv/"):
                    assert path.split("/")[1] == "bin", f"{name}:{b.line}: {path}"


def test_named_paths_finds_what_it_should() -> None:
    code = (
        "fcp index 'out/shards/*.tar' -o out/index --tokenizer tok/tokenizer.json\n"
        'x = f("https://host/a/b.tar", "pipe:cat", "/abs/x.json", "MB/token", "$HOME/a.json")\n'
        "python examples/train_megatron.py  # tokens/s, 1/TP\n"
    )
    assert list(named_paths(code)) == [
        ("out/shards/*.tar", False),
        ("out/index", True),
        ("tok/tokenizer.json", False),
        ("examples/train_megatron.py", False),
    ]


NO_RUN = [name for name in BLOCKS if name not in RUN_PAGES]


@pytest.mark.parametrize("page", NO_RUN)
def test_paths_in_pages_without_runnable_blocks_exist(page: str) -> None:
    for b in BLOCKS[page]:
        bad = missing_paths(b, REPO, ran=False)
        assert not bad, f"{page} line {b.line} names paths that do not exist: {bad}"


# -- runnable blocks -------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


# what megatron-core prints on a CPU without TransformerEngine and Apex (it falls back to torch):
# a documented loop filters it, so its own step lines are what a user reads
TRAINING_NOISE = ("Transformer Engine and Apex are not installed", "Apex is not installed",
                  "GPTModel IS DEPRECATED")  # fmt: skip


@pytest.mark.parametrize("page", RUN_PAGES)
def test_runnable_blocks_run_in_order(page: str, tmp_path: Path) -> None:
    """A page's runnable blocks, in order, in one working directory; the paths every block
    names (runnable or not) exist when it is reached."""
    env = _env()
    for entry in REPO.iterdir():  # the commands run from a clone's root
        if not entry.name.startswith(".") and entry.name != "out":
            (tmp_path / entry.name).symlink_to(entry)
    for n, b in enumerate(BLOCKS[page]):
        if not b.runnable:
            bad = missing_paths(b, tmp_path, ran=False)
            assert not bad, f"{page} line {b.line} names paths no earlier block wrote: {bad}"
            continue
        if b.lang == "bash":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", b.code]
        else:
            script = tmp_path / f"page_block_{n}.py"
            script.write_text(b.code, encoding="utf-8")
            cmd = [sys.executable, str(script)]
            if b.nproc:
                run = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={b.nproc}"]
                cmd = [sys.executable, *run, str(script)]
        out = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420, check=False
        )
        assert out.returncode == 0, (
            f"{page} line {b.line} ({b.lang}) exited {out.returncode}:\n{b.code}\n"
            f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-4000:]}"
        )
        if b.nproc:  # a training loop says what it trained, not megatron's import noise
            assert re.search(r"^step \d+: loss [\d.]+", out.stdout, re.M), (
                f"{page} line {b.line}: no step line (loss, tokens, time):\n{out.stdout[-2000:]}"
            )
            noise = [w for w in TRAINING_NOISE if w in out.stderr]
            assert not noise, f"{page} line {b.line}: unfiltered warnings {noise}"
        bad = missing_paths(b, tmp_path, ran=True)
        assert not bad, f"{page} line {b.line} names paths that neither exist nor it wrote: {bad}"


# -- links -----------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code, inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> Iterator[tuple[str, Path, str]]:
    """(link text as written, target file, anchor) of every relative link of `page`."""
    for line in _prose(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            target = m[1]
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            yield target, (page.parent / path).resolve() if path else page, anchor


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_point_to_files_and_headings(page: Path) -> None:
    for target, file, anchor in links(page):
        assert file.exists(), f"{_name(page)}: link {target} points to no file"
        if anchor:
            assert file.suffix == ".md", f"{_name(page)}: link {target}: anchor into a non-page"
            assert anchor in anchors(file), f"{_name(page)}: link {target}: no such heading"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    seen, todo = {REPO / "README.md"}, [REPO / "README.md"]
    while todo:
        for _, file, _ in links(todo.pop()):
            if file.suffix == ".md" and file.exists() and file not in seen:
                seen.add(file)
                todo.append(file)
    lost = sorted(_name(p) for p in (REPO / "docs").rglob("*.md") if p.resolve() not in seen)
    assert not lost, f"no chain of links from README.md reaches {lost}"
