"""`fcp view` writes its picture whole or not at all.

Issue: the PNG was written in place, so a write that failed half-way (a full disk, a file size
limit, a kill) left a truncated picture, over an older complete one under --force. Here the
command runs for real under a file size limit of 16 KiB (a picture is ~150 KB): the write fails
with EFBIG after 16 KiB, and the file must keep its old bytes, with no partial file beside it
and one line on stderr, exit status 2.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))


def test_a_picture_that_fails_half_way_leaves_the_old_file_untouched(tmp_path: Path) -> None:
    out = tmp_path / "plan.png"
    old = b"an older, complete picture" * 10
    out.write_bytes(old)
    cmd = [sys.executable, "-c", "import sys; from fcp.cli import main; sys.exit(main())"]
    args = ["view", "--distribution", "github", "--batch", "32", "--replicas", "8"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [*cmd, *args, "-o", str(out), "--force"],
        preexec_fn=_limit_file_size,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert out.read_bytes() == old  # was: 16 KiB of a truncated PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png"]  # no partial file left
    [line] = [x for x in done.stderr.splitlines() if "error" in x.lower()]
    assert f"cannot write the picture {out}" in line and "nothing was written" in line
