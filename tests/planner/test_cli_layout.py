"""`fcp plan` / `fcp simulate` layout flags: --tp --pp --sequence-parallel --zero --recompute
--devices-per-node --memory-reserve, and --tokens-per-replica derived by the memory model."""

import argparse
import json

import numpy as np
import pytest

from fcp.cli import main
from fcp.commands._common import add_problem_args, cluster_and_budget_from_args
from fcp_data.layout import shard_tokens
from fcp_data.planner import Plan

LLAMA = ["--model", "llama3-70b", "--tp", "8", "--sequence-parallel", "--replicas", "8"]


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_problem_args(p)
    return p.parse_args(list(argv))


def test_tp8_gives_one_replica_per_node_and_the_derived_tokens():
    cl, budget = cluster_and_budget_from_args(parse(*LLAMA))
    assert cl.replicas_per_node == 1 and cl.num_nodes == 8  # 8 H200 per node at TP = 8
    assert cl.pad_unit == 8 and cl.tokens_per_replica == budget.tokens_per_replica == 21568
    cl, budget = cluster_and_budget_from_args(parse("--tp", "2", "--replicas", "64"))
    assert cl.replicas_per_node == 4 and cl.pad_unit == 1
    cl, budget = cluster_and_budget_from_args(parse("--tp", "2", "--devices-per-node", "16"))
    assert cl.replicas_per_node == 8
    cl, budget = cluster_and_budget_from_args(parse("--tokens-per-replica", "4096", "--tp", "4"))
    assert budget is None and cl.tokens_per_replica == 4096 and cl.replicas_per_node == 2


def test_each_flag_reaches_the_budget():
    base = cluster_and_budget_from_args(parse("--replicas", "16"))[1]
    z3 = cluster_and_budget_from_args(parse("--replicas", "16", "--zero", "3"))[1]
    full = cluster_and_budget_from_args(parse("--replicas", "16", "--recompute", "full"))[1]
    bare = cluster_and_budget_from_args(parse("--replicas", "16", "--memory-reserve", "0"))[1]
    big = cluster_and_budget_from_args(parse("--replicas", "16", "--memory-reserve", "30e9"))[1]
    pp = cluster_and_budget_from_args(parse("--replicas", "16", "--pp", "2"))[1]
    assert base.layout.zero_stage == 1 and base.layout.recompute == "selective"
    assert z3.optimizer_bytes == pytest.approx(base.optimizer_bytes)  # both shard Adam over 16
    assert z3.weight_bytes == pytest.approx(base.weight_bytes / 16)
    assert full.activation_bytes_per_token < base.activation_bytes_per_token / 4
    assert bare.reserve_bytes == 0 and big.reserve_bytes == 30e9
    assert big.tokens_per_replica < base.tokens_per_replica < bare.tokens_per_replica
    assert pp.layers_per_device == 18 and pp.micro_batches == 2


def test_plan_prints_the_derivation_and_plans_within_it(capsys):
    argv = ["plan", "--distribution", "github", "--batch", "48", *LLAMA, "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("memory: llama3-70b TP=8 PP=1 SP ZeRO-1")
    assert "model states 66.1 GB/device" in err[0] and "tokens_per_replica=21568" in err[1]
    plan = Plan.from_json(out.out)
    for g in plan.groups:
        held = sum(int(shard_tokens(s, g.degree, 8)) for s in g.seqlens)
        assert held <= 21568 and held % 16 == 0
    assert main(["plan", "--distribution", "c4", "--batch", "16", *LLAMA]) == 0
    table = capsys.readouterr().out
    assert "tokens_per_replica=21568" in table and "plan of 16 sequences on 8" in table
    given = ["plan", "--distribution", "c4", "--batch", "16", "--tokens-per-replica", "8192"]
    assert main(given) == 0
    assert "memory:" not in capsys.readouterr().out


def test_simulate_shares_the_layout_flags(capsys, tmp_path):
    out = tmp_path / "sim.json"
    argv = ["simulate", "--distribution", "c4", "--batch", "32", *LLAMA, "--json",
            "--strategies", "fcp", "static", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    got = capsys.readouterr()
    assert "tokens_per_replica=21568" in got.err
    rows = json.loads(got.out)
    assert {r["strategy"] for r in rows} == {"fcp", "static"}
    assert json.loads(out.read_text()) == rows


def test_the_layout_changes_the_predicted_time(capsys):
    base = ["plan", "--distribution", "c4", "--batch", "32", "--model", "llama3-70b",
            "--replicas", "8", "--tokens-per-replica", "16384", "--json"]  # fmt: skip
    assert main([*base, "--tp", "8"]) == 0
    tp8 = Plan.from_json(capsys.readouterr().out)
    assert main([*base, "--tp", "4"]) == 0
    tp4 = Plan.from_json(capsys.readouterr().out)
    assert tp4.predicted_time > 1.5 * tp8.predicted_time  # half the devices per replica
    assert np.isfinite(tp8.predicted_time)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--tp", "3"], "does not tile nodes of 8 devices"),
        (["--sequence-parallel"], "--sequence-parallel needs --tp > 1"),
        (["--zero", "0"], "leaves no room for one sequence: model states take 1.474e+11 B"),
        (["--model", "llama3-70b", "--tp", "16", "--devices-per-node", "16"], "8 KV heads"),
        (
            [
                "--model",
                "llama3-70b",
                "--tp",
                "8",
                "--replicas-per-node",
                "4",
                "--devices-per-node",
                "8",
            ],
            "contradicts --devices-per-node 8",
        ),
        (["--model", "llama3-70b", "--pp", "3", "--replicas-per-node", "1"], "80 layers"),
        (["--memory-reserve", "-1"], "--memory-reserve: -1 is outside [0"),
        (["--tp", "0"], "--tp: 0 is outside [1,"),
        (["--model", "gpt-9", "--cost", "cpu-small"], "--model 'gpt-9' is not a preset"),
    ],
)
def test_bad_layouts_are_one_line_errors(capsys, extra, needle):
    for cmd in ("plan", "simulate"):
        try:  # a value the flag's type refuses exits from argparse; the rest return 2
            code = main([cmd, "--distribution", "c4", "--batch", "8", *extra])
        except SystemExit as exc:
            code = exc.code
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fcp {cmd}: error: "), err
        assert needle in err[0], err[0]


def test_idle_and_sync_waves_reach_the_cluster_and_the_plan(tmp_path):
    cl, _ = cluster_and_budget_from_args(parse("--idle", "fill", "--sync-waves", *LLAMA))
    assert cl.idle == "fill" and cl.sync_waves
    cl, _ = cluster_and_budget_from_args(parse("--tokens-per-replica", "512", "--idle", "empty"))
    assert cl.idle == "empty" and not cl.sync_waves
    out = tmp_path / "plan.json"
    argv = ["plan", "--distribution", "github", "--replicas", "8", "--tokens-per-replica",
            "16384", "--batch", "64", "--sync-waves", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    barriers = [w.get("barrier", False) for w in json.loads(out.read_text())["waves"]]
    assert barriers and all(barriers)  # every wave ends with a barrier under sync_waves
    with pytest.raises(SystemExit):
        parse("--idle", "sometimes")
