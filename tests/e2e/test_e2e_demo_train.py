"""`fcp demo --skip-train` end to end."""

from __future__ import annotations

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
