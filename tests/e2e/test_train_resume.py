"""examples/train_megatron.py --checkpoint / --resume: a resumed run trains exactly the batch an
uninterrupted run trains next, from the same weights and optimizer state.

Three runs of 2 replicas from one working directory (each starts torchrun itself, rank 0 writes
and indexes the sample data once): 3 steps uninterrupted; 2 steps saving a checkpoint; 1 step
resumed from it. Step 3 of the resumed run must name the same epoch, batch and sample keys as
step 3 of the uninterrupted one, and reach the same loss.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from e2e_helpers import REPO

STEP = re.compile(
    r"^step (\d+): loss ([\d.]+) \|.*\| wall [\d.]+ s, [\d,]+ tokens/s, data wait [\d.]+ s \| "
    r"epoch (\d+) batch (\d+), keys (\w+)$",
    re.M,
)


def _run(cwd: Path, *args: str) -> dict[int, tuple[float, int, int, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_megatron.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    steps = {
        int(m[1]): (float(m[2]), int(m[3]), int(m[4]), m[5]) for m in STEP.finditer(out.stdout)
    }
    assert steps, out.stdout
    assert "waited" in out.stdout and "tokens/s" in out.stdout, out.stdout
    return steps


def test_resume_continues_with_the_batch_an_uninterrupted_run_trains_next(tmp_path: Path) -> None:
    whole = _run(tmp_path, "--steps", "3")
    index = str(tmp_path / "out" / "train_example" / "index")
    first = _run(tmp_path, "--steps", "2", "--index", index, "--checkpoint", "ckpt")
    assert sorted(first) == [1, 2] and (tmp_path / "ckpt" / "rank-00000.pt").is_file()
    state = json.loads((tmp_path / "ckpt" / "loader.json").read_text())
    assert (state["epoch"], state["batch"], state["wave"]) == (0, 2, 0)
    resumed = _run(tmp_path, "--steps", "1", "--index", index, "--resume", "ckpt")
    assert sorted(resumed) == [3], resumed
    for step in (1, 2):  # the same batches before the checkpoint
        assert first[step][1:] == whole[step][1:]
    loss, *where = resumed[3]
    assert where == list(whole[3][1:]), (resumed, whole)
    assert abs(loss - whole[3][0]) <= 1e-4 * whole[3][0], (resumed, whole)
