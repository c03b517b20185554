"""The `fcp` command line: its surface is frozen here, and each planning command runs."""

import json

import numpy as np
import pytest

from fcp_data.cli import build_parser, main
from fcp_data.planner import Plan


def test_subcommands_are_the_documented_ones():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"plan", "simulate", "demo"} <= set(sub.choices)
    for name, parser in sub.choices.items():
        assert parser.description, f"`fcp {name}` has no description"


def test_plan_json_is_a_plan(capsys, tmp_path):
    lens = tmp_path / "lens.txt"
    lens.write_text("\n".join(str(x) for x in [900, 12000, 300, 4000, 70000, 50]))
    assert main(["plan", "--lengths", str(lens), "--replicas", "8", "--json"]) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    assert sorted(plan.sequence_ids()) == list(range(6))
    np.save(tmp_path / "lens.npy", np.array([5, 6, 7]))
    assert main(["plan", "--lengths", str(tmp_path / "lens.npy"), "--replicas", "2"]) == 0
    assert "plan of 3 sequences on 2 replicas" in capsys.readouterr().out


def test_simulate_json_has_every_strategy(capsys):
    assert (
        main(
            [
                "simulate",
                "--distribution",
                "c4",
                "--batch",
                "64",
                "--replicas",
                "8",
                "--strategies",
                "fcp",
                "static",
                "static-balanced",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    by = {r["strategy"]: r for r in rows}
    assert set(by) == {"fcp", "static", "static-balanced"}
    assert by["fcp"]["makespan"] <= by["static-balanced"]["makespan"] * (1 + 1e-12)
    assert all(r["ratio"] >= 1 - 1e-9 for r in rows)


def test_bad_input_exits_2_with_a_message(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("12\nabc\n")
    assert main(["plan", "--lengths", str(bad)]) == 2
    assert "every line must be one integer" in capsys.readouterr().err
    assert main(["plan", "--lengths", str(tmp_path / "missing.txt")]) == 2
    with pytest.raises(SystemExit):
        main(["plan", "--strategy", "nope"])


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_package_import_is_light_and_exports_the_loader():
    import subprocess
    import sys

    code = (
        "import sys, fcp_data\n"
        "assert 'torch' not in sys.modules and 'numba' not in sys.modules, sorted(sys.modules)\n"
        "from fcp_data import FCPDataLoader, LoaderOptions\n"
        "print(FCPDataLoader.__name__, LoaderOptions.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["FCPDataLoader", "LoaderOptions"]
