"""examples/train_megatron.py as a user runs it, on 4 replicas (its defaults run 2: docs/training.md
runs that command as written, tests/test_readme.py).

Run as a subprocess from a temporary working directory: without torchrun's environment the
script starts torchrun itself (world size and rank then come from RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT), rank 0 writes and indexes sample data, and every
step prints its plan; the closing summary line is checked.
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
    r"(\d+) steps on (\d+) replicas: loss ([\d.]+) -> ([\d.]+); forward\+backward predicted "
    r"([\d.]+) s, measured ([\d.]+) s \([\d.]+x\); ([\d,]+) loss tokens/s"
)


# a step line counts only what trained: "tokens trained" and tokens/s over them, and names
# what it dropped; megatron's warnings about TransformerEngine and Apex are filtered
STEP = re.compile(
    r"^step \d+: loss [\d.]+ \| \d+ loss tokens, (\d+) tokens trained, dropped (\d+)[^|]* \| "
    r"\d+ wave\(s\) ((?:⟨\d+⟩×\d+(?:, )?)+) \|.*\| wall ([\d.]+) s, ([\d,]+) tokens/s,",
    re.M,
)
NOISE = ("Apex is not installed", "Transformer Engine and Apex", "GPTModel IS DEPRECATED")


def _run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_megatron.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert not [w for w in NOISE if w in out.stderr], out.stderr[-3000:]
    for m in STEP.finditer(out.stdout):  # tokens/s is trained tokens over the wall time
        trained, wall, rate = int(m[1]), float(m[4]), int(m[5].replace(",", ""))
        assert trained > 0 and abs(rate - trained / wall) <= 0.01 * rate + 1, m[0]
    return out.stdout


def _check(stdout: str, steps: int, replicas: int) -> None:
    m = SUMMARY.search(stdout)
    assert m is not None, stdout
    assert (int(m[1]), int(m[2])) == (steps, replicas)
    first, last = float(m[3]), float(m[4])
    assert math.isfinite(last) and 0 < last < first, stdout  # Adam on 4 batches learns
    assert float(m[5]) > 0 and float(m[6]) > 0 and int(m[7].replace(",", "")) > 0
    assert len(re.findall(r"^step \d+: loss", stdout, flags=re.M)) == steps
    assert len(STEP.findall(stdout)) == steps, stdout
    degrees = [int(d) for d in re.findall(r"⟨(\d+)⟩×\d+", stdout)]
    assert max(degrees) > 1, "no CP group: the run did not exercise ring attention"


def test_defaults_on_four_replicas(tmp_path: Path) -> None:
    _check(_run(tmp_path, "--replicas", "4"), steps=4, replicas=4)
    assert (tmp_path / "out" / "train_example" / "index" / "header.json").is_file()


def _losses(stdout: str) -> list[float]:
    losses = [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+)", stdout, flags=re.M)]
    assert losses, stdout
    return losses


def test_tensor_parallel_with_sequence_parallel_and_pipeline_parallel(tmp_path: Path) -> None:
    """2 replicas of TP = 2 with sequence parallel, megatron DDP (overlapped buckets) and its
    distributed optimizer, then 2 replicas of PP = 2 (megatron's 1F1B schedule), 4 processes
    each. TP splits the same initial weights the TP = 1 run starts from and the distributed
    Adam is torch's Adam sharded, so both steps' losses are the TP = 1 run's; PP stages
    initialise their layers on their own, so that run only has to train."""
    base = _run(tmp_path, "--steps", "2")
    tp = _run(tmp_path, "--tp", "2", "--sequence-parallel", "--distributed-optimizer",
              "--steps", "2")  # fmt: skip
    _check(tp, steps=2, replicas=2)
    assert len(_losses(base)) == 2
    for a, b in zip(_losses(base), _losses(tp)):
        assert abs(a - b) < 1e-3, (base, tp)
    _check(_run(tmp_path, "--pp", "2", "--steps", "2"), steps=2, replicas=2)
