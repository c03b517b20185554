"""`fcp demo --skip-train` end to end, and the megatron-core training example on 2 processes."""

from __future__ import annotations

import math

from e2e_helpers import load_example

from fcp_data.cli import main as fcp_main
from fcp_data.planner import Plan


def test_demo_skip_train_writes_shards_index_pictures_and_plan(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert fcp_main(["demo", "--skip-train", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for name in ("plan.png", "plan-h200-github.png"):
        assert (out / name).stat().st_size > 30_000, name
        assert name in text
    assert len(list((out / "shards").glob("*.tar"))) >= 2
    assert (out / "index").is_dir()
    plan = Plan.from_json((out / "plan.json").read_bytes())
    assert plan.num_replicas == 8 and len(plan.sequence_ids()) == 32
    assert "3. training" not in text and "megatron-hybrid" in text


def test_train_example_two_processes_matches_no_cp_and_uses_cp(tmp_path) -> None:
    train = load_example("train_megatron")
    cfg = train.TrainConfig(replicas=2, steps=2, global_batch=6, max_tokens=2048,
                            tokens_per_replica=1024, text=20, video=4, no_cp=True,
                            out=str(tmp_path / "data"))  # fmt: skip
    report = train.launch(cfg, timeout_s=240)
    assert len(report.steps) == len(report.no_cp_steps) == 2
    for fcp, base in zip(report.steps, report.no_cp_steps):
        assert math.isfinite(fcp["loss"]) and fcp["loss"] > 0
        # exact ring attention: the same batches give the same loss up to float rounding
        assert abs(fcp["loss"] - base["loss"]) <= 1e-4 * abs(base["loss"])
        assert base["degrees"] == [1] * len(base["degrees"])
        assert fcp["predicted_s"] > 0 and fcp["measured_s"] > 0
    assert any(d > 1 for r in report.steps for d in r["degrees"]), "no CP group: vacuous test"
