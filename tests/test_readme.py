"""README.md's code runs as written: every block marked runnable is run, the rest parse.

A block is runnable when the line before its fence is `<!-- runnable -->` (a ```python block
runs as a script, a ```bash block with `bash -e`) or `<!-- runnable: torchrun N -->` (the
python block runs under `torchrun --standalone --nproc-per-node N`, as its text says to).
Runnable blocks run in README order in one temporary working directory that looks like a clone
(links to the checkout's examples/, fcp_data/, ...), so a later block uses what an earlier one
wrote under out/ (shards, tokenizer, index); this checkout is on PYTHONPATH and the
interpreter's bin directory (fcp, torchrun, python) first on PATH. Every other ```python block
must compile and every other ```bash block must pass `bash -n`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- runnable(?::\s*torchrun\s+(\d+))?\s*-->$")
FENCE = re.compile(r"^```(\w*)")


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


README = blocks((REPO / "README.md").read_text(encoding="utf-8"))


def test_markers_sit_on_blocks_that_can_run() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(re.findall(r"<!-- runnable", text)) == sum(b.runnable for b in README)
    for b in README:
        if b.runnable:
            assert b.lang in ("python", "bash"), f"README line {b.line}: {b.lang!r} cannot run"
            assert b.nproc == 0 or b.lang == "python", f"README line {b.line}"
    # what a newcomer copies first must be among them (the test is not vacuous)
    assert sum(b.runnable and b.lang == "python" for b in README) >= 3
    assert sum(b.runnable and b.lang == "bash" for b in README) >= 3
    assert any(b.nproc >= 2 for b in README)


@pytest.mark.parametrize("block", [b for b in README if not b.runnable], ids=lambda b: f"L{b.line}")
def test_other_blocks_parse(block: Block) -> None:
    if block.lang == "python":
        compile(block.code, f"README.md:{block.line}", "exec")
    elif block.lang == "bash":
        out = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
        assert out.returncode == 0, f"README.md:{block.line}: {out.stderr}"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_runnable_blocks_run_in_order(tmp_path: Path) -> None:
    env = _env()
    for entry in REPO.iterdir():  # README commands run from a clone's root
        if not entry.name.startswith(".") and entry.name != "out":
            (tmp_path / entry.name).symlink_to(entry)
    for n, b in enumerate(b for b in README if b.runnable):
        if b.lang == "bash":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", b.code]
        else:
            script = tmp_path / f"readme_block_{n}.py"
            script.write_text(b.code, encoding="utf-8")
            cmd = [sys.executable, str(script)]
            if b.nproc:
                run = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={b.nproc}"]
                cmd = [sys.executable, *run, str(script)]
        out = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420, check=False
        )
        assert out.returncode == 0, (
            f"README.md line {b.line} ({b.lang}) exited {out.returncode}:\n{b.code}\n"
            f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-4000:]}"
        )
