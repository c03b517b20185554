"""examples/train_fsdp.py as a user runs it: 2 replicas, 2 steps, FSDP2 over both ranks.

Run as a subprocess from a temporary working directory: without torchrun's environment the
script starts torchrun itself, rank 0 writes and indexes sample text shards, every step prints
its plan and the closing summary line is checked (~50 s on a busy 2-core box, most of it two
processes importing torch and transformers).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

from e2e_helpers import REPO

SUMMARY = re.compile(
    r"(\d+) steps on (\d+) replicas \((FSDP|HSDP \d+x\d+)\): loss ([\d.]+) -> ([\d.]+); "
    r"([\d,]+) loss tokens/s; (\d+) placeholder micro-batches"
)


def test_two_steps_on_two_replicas(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_fsdp.py"), "--replicas", "2",
         "--steps", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    m = SUMMARY.search(out.stdout)
    assert m is not None, out.stdout
    assert (int(m[1]), int(m[2]), m[3]) == (2, 2, "FSDP")
    first, last = float(m[4]), float(m[5])
    assert math.isfinite(last) and 0 < last < first, out.stdout  # AdamW on 2 batches learns
    assert int(m[6].replace(",", "")) > 0
    assert len(re.findall(r"^step \d+: loss", out.stdout, flags=re.M)) == 2
    degrees = [int(d) for d in re.findall(r"⟨(\d+)⟩×\d+", out.stdout)]
    assert max(degrees) > 1, "no CP group: the run did not exercise ring attention"
    # tokens/s counts what trained; dropped samples are counted (and named) apart
    steps = re.findall(r"(\d+) tokens trained, dropped (\d+).*\| ([\d.]+) s, ([\d,]+) tokens/s",
                       out.stdout)  # fmt: skip
    assert len(steps) == 2, out.stdout
    for trained, _, wall, rate in steps:
        per_s = int(rate.replace(",", ""))
        assert int(trained) > 0 and abs(per_s - int(trained) / float(wall)) <= 1 + 0.01 * per_s
    assert (tmp_path / "out" / "train_fsdp" / "index" / "header.json").is_file()
