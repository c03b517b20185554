"""The `fcp` command line: its surface and conventions are frozen here, and each command runs."""

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

from fcp.cli import build_parser, main
from fcp_data.planner import STRATEGIES, Plan

WRITERS = {"demo", "index", "make-shards", "plan", "profile", "simulate", "view"}
PLANNERS = {"plan", "simulate", "view"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(sub.choices)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def test_subcommands_are_the_documented_ones():
    cmds = _commands()
    assert {"plan", "simulate", "view", "demo", "profile", "index", "make-shards"} <= set(cmds)
    for name, parser in cmds.items():
        assert parser.description, f"`fcp {name}` has no description"


def test_every_output_is_dash_o_output():
    """One convention: what a command writes is named by -o/--output, nothing else."""
    for name, parser in _commands().items():
        acts = _actions(parser)
        outs = [s for s in acts if "out" in s.lstrip("-").split("-")[0]]
        if name in WRITERS:
            assert acts["-o"] is acts["--output"], name
            assert acts["-o"].option_strings == ["-o", "--output"], name
        assert set(outs) <= {"--output"}, f"`fcp {name}` has {outs}"
        positional = [a.dest for a in parser._actions if not a.option_strings]
        assert not [d for d in positional if "out" in d], f"`fcp {name}`: positional output"


def test_flags_mean_one_thing_across_commands():
    cmds = _commands()
    for name in PLANNERS:
        acts = _actions(cmds[name])
        assert "--device" not in acts, f"`fcp {name}`: the preset is --hardware"
        assert "h200" in acts["--hardware"].help and "accelerator" in acts["--hardware"].help
        assert "model preset" in acts["--model"].help
        assert {"--index", "--shards", "--lengths", "--distribution", "--cost"} <= set(acts)
    device = _actions(cmds["profile"])["--device"]
    assert "torch device" in device.help and "--hardware" in device.help
    assert "fcp plan --model" in _actions(cmds["profile"])["--model"].help
    one = _actions(cmds["plan"])["--strategy"]
    assert one.nargs is None and list(one.choices) == list(STRATEGIES)
    for name in ("simulate", "view"):
        many = _actions(cmds[name])["--strategies"]
        assert many.nargs == "+" and list(many.choices) == list(STRATEGIES)
        assert "--strategy" not in _actions(cmds[name])


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    from fcp_data import __version__

    assert capsys.readouterr().out.strip() == f"fcp {__version__}"


def test_plan_json_is_a_plan(capsys, tmp_path):
    lens = tmp_path / "lens.txt"
    lens.write_text("\n".join(str(x) for x in [900, 12000, 300, 4000, 70000, 50]))
    assert main(["plan", "--lengths", str(lens), "--replicas", "8", "--json"]) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    assert sorted(plan.sequence_ids()) == list(range(6))
    np.save(tmp_path / "lens.npy", np.array([5, 6, 7]))
    assert main(["plan", "--lengths", str(tmp_path / "lens.npy"), "--replicas", "2"]) == 0
    assert "plan of 3 sequences on 2 replicas" in capsys.readouterr().out


def test_plan_from_an_index_is_the_batch_the_viewer_draws(capsys, tmp_path):
    from fcp_data.readers import build_index, make_shards
    from fcp_data.viewer import batch_from_index

    paths = make_shards(tmp_path / "s", text=12, seed=1, samples_per_shard=6)
    build_index([str(p) for p in paths], tmp_path / "idx")
    argv = ["plan", "--index", str(tmp_path / "idx"), "--batch", "6", "--batch-index", "1",
            "--replicas", "4", "--cost", "cpu-small", "--tokens-per-replica", "4096",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    batch = batch_from_index(tmp_path / "idx", batch_size=6, batch_index=1)
    got = {i: s for g in plan.groups for i, s in zip(g.sequence_ids, g.seqlens)}
    assert [got[i] for i in range(6)] == batch.seqlens.tolist()
    assert main([*argv[:-1], "--batch-index", "5"]) == 2
    assert "--batch-index 5" in capsys.readouterr().err


def test_cost_by_shipped_name_or_relative_path(capsys, tmp_path, monkeypatch):
    from fcp_data.profiles import shipped_profile

    base = ["plan", "--distribution", "c4", "--batch", "16", "--replicas", "4",
            "--tokens-per-replica", "4096", "--json"]  # fmt: skip
    assert main([*base, "--cost", "cpu-small"]) == 0
    shipped = Plan.from_json(capsys.readouterr().out)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.json").write_bytes(shipped_profile("cpu-small").read_bytes())
    assert main([*base, "--cost", "mine.json"]) == 0
    assert Plan.from_json(capsys.readouterr().out).digest == shipped.digest
    assert main([*base, "--cost", "nope.json"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nope.json") in err and "shipped: cpu-small" in err


def test_simulate_json_has_every_strategy(capsys, tmp_path):
    out = tmp_path / "sim.json"
    argv = ["simulate", "--distribution", "c4", "--batch", "64", "--replicas", "8", "--json",
            "--strategies", "fcp", "static", "static-balanced", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == rows
    by = {r["strategy"]: r for r in rows}
    assert set(by) == {"fcp", "static", "static-balanced"}
    assert by["fcp"]["makespan"] <= by["static-balanced"]["makespan"] * (1 + 1e-12)
    assert all(r["ratio"] >= 1 - 1e-9 for r in rows)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--lengths", "{bad}"], "every line must be one integer"),
        (["plan", "--lengths", "{missing}"], "no such file"),
        (["plan", "--hardware", "h900"], "--hardware 'h900' is not a preset; known:"),
        (["view", "--plan", "{missing}"], "no such file"),
        (["simulate", "--index", "{tmp}"], "index"),
        (["profile", "--model", "gpt-9", "--no-p2p"], "unknown model shape 'gpt-9'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, needle):
    bad = tmp_path / "bad.txt"
    bad.write_text("12\nabc\n")
    subs = {"bad": str(bad), "missing": str(tmp_path / "missing.txt"), "tmp": str(tmp_path)}
    argv = [a.format(**subs) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fcp {argv[0]}: error: "), captured.err
    assert needle in lines[0] and "Traceback" not in captured.err + captured.out


def test_a_real_process_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("12\nabc\n")
    cmd = [sys.executable, "-m", "fcp.cli", "plan", "--lengths", str(bad)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"fcp plan: error: --lengths {bad}: every line must be one integer token count "
        "(invalid literal for int() with base 10: 'abc')"
    ]


def test_argparse_errors_exit_2_too(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--strategy", "nope"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["plan", "--lengths", "a.txt", "--distribution", "c4"])  # one source only
    assert "not allowed with" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_package_import_is_light_and_exports_the_loader():
    code = (
        "import sys, fcp_data, fcp_data.viewer, fcp.profiling\n"
        "assert 'torch' not in sys.modules and 'numba' not in sys.modules, sorted(sys.modules)\n"
        "assert 'matplotlib' not in sys.modules\n"
        "from fcp_data import FCPDataLoader, LoaderOptions\n"
        "print(FCPDataLoader.__name__, LoaderOptions.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["FCPDataLoader", "LoaderOptions"]
