"""`fcp demo --skip-train` end to end (no example loaded by path), and the package's training
job (`fcp.demo`, what `fcp demo` step 3 runs) on 2 gloo processes."""

from __future__ import annotations

import math
import sys

from e2e_helpers import REPO

from fcp.cli import main as fcp_main
from fcp_data.planner import Plan


def test_demo_skip_train_writes_shards_index_pictures_and_plan(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert fcp_main(["demo", "--skip-train", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    for name in ("plan.png", "plan-h200-github.png"):
        assert (out / name).stat().st_size > 30_000, name
        assert name in text
    assert len(list((out / "shards").glob("*.tar"))) >= 2
    assert (out / "index").is_dir()
    plan = Plan.from_json((out / "plan.json").read_bytes())
    assert plan.num_replicas == 8 and len(plan.sequence_ids()) == 32
    assert "3. training" not in text and "megatron-hybrid" in text
    assert "fcp equals static CP when" in text and "predicted speedup of fcp over static" in text
    # the ring was timed on this machine, and the report says which cost model planned
    assert "timing d = 1 and d = 2 ring groups" in text and "cost model used: " in text
    if (out / "cost-ring.json").exists():
        from fcp_data.planner import CostModel

        ring = CostModel.load(out / "cost-ring.json")
        assert "ring measured here" in ring.name and ring.intra_node_bandwidth > 0
    # nothing was loaded from examples/ by path: the demo works from a wheel install
    examples = REPO / "examples"
    loaded = [m for m in list(sys.modules.values()) if getattr(m, "__file__", None)]
    assert not [m.__name__ for m in loaded if str(examples) in str(m.__file__)]
    source = (REPO / "fcp" / "commands" / "demo.py").read_text()
    assert "examples" not in source and "spec_from_file_location" not in source


def test_training_job_two_processes_matches_no_cp_and_runs_a_baseline(tmp_path) -> None:
    from fcp.demo import TrainConfig, launch

    cfg = TrainConfig(replicas=2, steps=2, global_batch=6, max_tokens=2048,
                      tokens_per_replica=1024, text=20, video=4, no_cp=True, baseline="static",
                      out=str(tmp_path / "data"))  # fmt: skip
    report = launch(cfg, timeout_s=400)
    assert len(report.steps) == len(report.no_cp_steps) == len(report.baseline_steps) == 2
    for fcp, base, static in zip(report.steps, report.no_cp_steps, report.baseline_steps):
        assert math.isfinite(fcp["loss"]) and fcp["loss"] > 0
        # exact ring attention: the same batches give the same loss up to float rounding
        assert abs(fcp["loss"] - base["loss"]) <= 1e-4 * abs(base["loss"])
        assert abs(fcp["loss"] - static["loss"]) <= 1e-4 * abs(base["loss"])
        assert base["degrees"] == [1] * len(base["degrees"])
        assert len(set(static["degrees"])) == 1, "static CP uses one degree"
        assert fcp["predicted_s"] > 0 and fcp["measured_s"] > 0
    assert any(d > 1 for r in report.steps for d in r["degrees"]), "no CP group: vacuous test"
