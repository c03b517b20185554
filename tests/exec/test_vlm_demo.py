"""The VLM example job (`python -m fcp.demo.vlm`, what `fcp demo` step 4 runs) end to end:
real shards, tokenizer and index, 2 gloo processes launched by the module, one step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_vlm_demo_trains_and_encodes_less_than_whole_videos(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fcp.demo.vlm", "--replicas", "2", "--steps", "1",
           "--text", "4", "--video", "3", "--global-batch", "7", "--tokens-per-replica", "512",
           "--max-tokens", "1024", "--out", str(tmp_path / "vlm"), "--timeout", "400"]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("step 1:"))
    loss = float(re.search(r"loss ([0-9.]+)", line).group(1))
    assert 0 < loss < 20
    pairs = [(int(a), int(b)) for a, b in re.findall(r"r\d:(\d+)/(\d+)", line)]
    assert len(pairs) == 2 and all(a <= b for a, b in pairs), line
    assert sum(b for _, b in pairs) > 0, "no video in the batch: vacuous"
