"""Progress of long commands off a terminal: periodic plain lines with counts, rate, time left."""

from __future__ import annotations

import io
import subprocess
import sys

from fcp_data.progress import Progress


def test_off_a_terminal_lines_carry_counts_rate_and_time_left() -> None:
    out = io.StringIO()
    with Progress("fcp index", 4, unit="shards", extra="samples", every_s=0.0, stream=out) as p:
        assert not p.terminal  # a StringIO is not a TTY
        p.advance(1, extra=1000)
        p.advance(1, extra=234)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # one per advance (every_s=0); the closing one repeats nothing
    assert lines[0].startswith("fcp index: 1/4 shards (25%), 1,000 samples, ")
    assert "shards/s" in lines[0] and "s left" in lines[0]
    assert lines[-1].startswith("fcp index: 2/4 shards (50%), 1,234 samples")


def test_lines_are_periodic_not_per_item() -> None:
    out = io.StringIO()
    with Progress("fcp make-shards", 10_000, unit="samples", every_s=3600.0, stream=out) as p:
        for _ in range(10_000):
            p.advance()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]  # the closing line
    assert "10000/10000 samples (100%)" in out.getvalue()


def test_fcp_index_reports_progress_in_a_log(tmp_path) -> None:
    """Run as a subprocess with stderr to a pipe (a CI log): the closing line is there."""
    from webdataset import TarWriter

    with TarWriter(str(tmp_path / "a.tar")) as w:
        for i in range(5):
            w.write({"__key__": f"k{i}", "txt": b"some words here"})
    done = subprocess.run(
        [sys.executable, "-m", "fcp.cli", "index", str(tmp_path / "a.tar"), "-o",
         str(tmp_path / "idx")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    size = (tmp_path / "a.tar").stat().st_size / 1e3  # bytes read inside the shard
    assert f"fcp index: {size:.1f} kB/{size:.1f} kB (100%), 5 samples" in done.stderr
