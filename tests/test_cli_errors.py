"""Every bad CLI value is one line and exit status 2, and a failed command leaves no output.

Numeric flags are checked by type (finite, in range, with an upper bound where a larger value
would exhaust memory or time); the message names the flag, the value and the range. A command
that fails after it started writes nothing half-done: files go through a temporary sibling.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fcp.cli import main
from fcp.commands import make_shards as make_shards_cmd
from fcp_data.readers.length_index import LengthIndex


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Exit status and stderr lines of `fcp ARGV`, run in this process."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits from inside parse_args
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture()
def tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for key in ("a", "b"):
            data = (key * 100).encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    monkeypatch.chdir(tmp_path)
    return path


INDEX_CASES = [
    (["--probe-timeout", "-1"], "argument --probe-timeout: -1 is outside (0, 604800]"),
    (["--probe-timeout", "nan"], "argument --probe-timeout: nan is outside"),
    (["--probe-timeout", "0"], "argument --probe-timeout: 0 is outside"),
    (["--stream-timeout", "inf"], "argument --stream-timeout: inf is outside"),
    (["--stream-timeout", "soon"], "argument --stream-timeout: 'soon' is not a number"),
    (["--rule-option", "fps=-2"], "setting fps=-2 must be a finite number"),
    (["--rule-option", "fps=[1]"], "setting fps=[1] must be a finite number"),
    (["--rule-option", "fps=nan"], "setting fps='nan' must be a finite number"),
    (["--rule-option", "fps=1e400"], "setting fps='1e400' must be a finite number"),
    (["--rule-option", "min_frames=2.5"], "setting min_frames=2.5 must be an integer"),
    (["--rule-option", "timestamps=1"], "setting timestamps=1 must be true or false"),
    (["--rule-option", "min_frames=64", "--rule-option", "max_frames=8"], "min_frames=64 is above"),
    (["--rule-option", "fps"], "--rule-option 'fps' must be KEY=VALUE"),
    (["--text-field", ""], "argument --text-field: must not be empty"),
    (["--text-field", "  "], "argument --text-field: must not be empty"),
    (["--workers", "0"], "argument --workers: 0 is outside [1, 256]"),
    (["--workers", "100000"], "argument --workers: 100000 is outside [1, 256]"),
    (["--max-consecutive-failures", "0"], "argument --max-consecutive-failures: 0 is outside"),
    (["--tokenizer", "bytes:-1"], "tokenizer spec 'bytes:-1'"),
]


@pytest.mark.parametrize(("extra", "needle"), INDEX_CASES)
def test_fcp_index_refuses_bad_values_and_writes_nothing(
    tar: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    code, err = _cli(["index", str(tar), "-o", "idx", *extra], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("fcp index: error: ") and needle in err[0], err
    assert sorted(os.listdir(tar.parent)) == ["x.tar"]  # no index, no .partial


def test_valid_boundary_values_still_build(tar: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["index", str(tar), "-o", "idx", "--probe-timeout", "0.5", "--rule-option", "fps=2"]
    assert _cli([*argv, "--stream-timeout", "604800"], capsys)[0] == 0
    assert LengthIndex.open("idx").header.scan.rule_overrides == {"fps": 2}


PLANNING_CASES = [
    (["--replicas", "100000"], "argument --replicas: 100000 is outside [1, 4,096]"),
    (["--replicas", "0"], "argument --replicas: 0 is outside"),
    (["--batch", "100000000"], "argument --batch: 100000000 is outside [1, 1,048,576]"),
    (["--batch", "-1"], "argument --batch: -1 is outside"),
    (["--batch", "2.5"], "argument --batch: '2.5' is not an integer"),
    (["--batch-index", "-1"], "argument --batch-index: -1 is outside >= 0"),
    (["--seed", "-1"], "argument --seed: -1 is outside"),
    (["--tokens-per-replica", "-5"], "argument --tokens-per-replica: -5 is outside"),
    (["--tokens-per-replica", "1e9"], "argument --tokens-per-replica: '1e9' is not an integer"),
    (["--replicas-per-node", "0"], "argument --replicas-per-node: 0 is outside"),
    (["--tp", "0"], "argument --tp: 0 is outside [1, 1,024]"),
    (["--pp", "100000"], "argument --pp: 100000 is outside [1, 1,024]"),
    (["--devices-per-node", "-8"], "argument --devices-per-node: -8 is outside"),
    (["--memory-reserve", "nan"], "argument --memory-reserve: nan is outside"),
    (["--memory-reserve", "-0.1"], "argument --memory-reserve: -0.1 is outside"),
]


@pytest.mark.parametrize("command", ["plan", "simulate", "view"])
@pytest.mark.parametrize(("extra", "needle"), PLANNING_CASES)
def test_planning_commands_refuse_bad_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, extra: list[str], needle: str
) -> None:
    out = tmp_path / "out.json"
    code, err = _cli([command, "--distribution", "github", "-o", str(out), *extra], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"fcp {command}: error: ") and needle in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--max-rows", "-1"], "argument --max-rows: -1 is outside >= 0"),
        (["make-shards", "-o", "ms", "--text", "-1"], "argument --text: -1 is outside"),
        (["make-shards", "-o", "ms", "--video", "1000000"], "argument --video: 1000000 is outside"),
        (["make-shards", "-o", "ms", "--samples-per-shard", "0"], "--samples-per-shard: 0 is"),
        (["make-shards", "-o", "ms", "--time-scale", "nan"], "argument --time-scale: nan is"),
        (["make-shards", "-o", "ms", "--time-scale", "0"], "argument --time-scale: 0 is outside"),
        (["make-shards", "-o", "ms", "--seed", "-2"], "argument --seed: -2 is outside"),
        (["profile", "--lengths", "0"], "argument --lengths: 0 is outside [2, 1,048,576]"),
        (["profile", "--repeats", "0"], "argument --repeats: 0 is outside"),
        (["profile", "--threads", "-1"], "argument --threads: -1 is outside"),
        (["profile", "--hidden", "0"], "argument --hidden: 0 is outside"),
        (["demo", "--replicas", "0"], "argument --replicas: 0 is outside [1, 64]"),
        (["demo", "--steps", "0"], "argument --steps: 0 is outside"),
        (["demo", "--seed", "-1"], "argument --seed: -1 is outside"),
        (["plan", "--strategy", "nope"], "argument --strategy: invalid choice: 'nope'"),
    ],
)
def test_other_subcommands_refuse_bad_values(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = _cli(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"fcp {argv[0]}: error: ") and needle in err[0], err
    assert os.listdir(tmp_path) == []


def test_plan_and_simulate_write_whole_files_or_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = ["--distribution", "github", "--batch", "16", "--replicas", "4"]
    small += ["--tokens-per-replica", "65536"]
    plan = tmp_path / "deep" / "plan.json"
    assert _cli(["plan", *small, "-o", str(plan)], capsys)[0] == 0
    assert json.loads(plan.read_text())["waves"]
    sim = tmp_path / "sim.json"
    assert (
        _cli(["simulate", *small, "--strategies", "fcp", "static", "-o", str(sim)], capsys)[0] == 0
    )
    assert [r["strategy"] for r in json.loads(sim.read_text())] == ["fcp", "static"]
    (tmp_path / "taken").mkdir()  # -o naming a directory: the rename fails, nothing is left
    code, err = _cli(["plan", *small, "-o", str(tmp_path / "taken")], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("fcp plan: error: "), err
    assert os.listdir(tmp_path / "taken") == []
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_make_shards_that_fails_midway_leaves_no_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fcp_data.readers import synth

    real = synth.make_shards

    def text_then_fail(out: Path, **kw: object) -> list[Path]:
        real(out, text=4, samples_per_shard=2)  # two complete shards written ...
        raise OSError("No space left on device")  # ... then the disk fills

    monkeypatch.setattr(synth, "make_shards", text_then_fail)
    out = tmp_path / "shards"
    code, err = _cli(["make-shards", "-o", str(out), "--text", "4"], capsys)
    assert code == 2 and err == ["fcp make-shards: error: No space left on device"], err
    assert os.listdir(tmp_path) == []  # neither the output nor the temporary directory
    monkeypatch.setattr(synth, "make_shards", real)
    assert (
        _cli(["make-shards", "-o", str(out), "--text", "4", "--samples-per-shard", "2"], capsys)[0]
        == 0
    )
    assert sorted(os.listdir(out)) == ["text-000000.tar", "text-000001.tar"]
    assert make_shards_cmd.__doc__


def test_a_real_process_prints_one_line_for_an_argparse_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fcp.cli", "simulate", "--replicas", "100000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "fcp simulate: error: argument --replicas: 100000 is outside [1, 4,096] (planning more "
        "replicas takes minutes and GBs) (see `fcp simulate --help`)"
    ]
