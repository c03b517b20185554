"""The prepared device suite's CPU dry run, end to end, so the GPU suite cannot rot unnoticed.

The dry run spawns 4 real gloo processes (rings of d = 1..4), times the d = 1 kernel against
SDPA, fits a cost profile and a vision encoder profile, and measures gloo P2P and overlap; the
test checks the JSON schema, that every exactness number is within the fp32 / bf16 tolerances
of the float64 reference, and that CUDA-only parts are skipped with a reason. ~15 s on an idle
2-core box (most of it is 4 processes importing torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "device_suite.py"
PARTS = {"hot_path", "exactness", "p2p", "overlap", "kernel_d1", "cost_profile", "te_attention",
         "vision_profile", "video_decode"}  # fmt: skip
# what the lent GPU box lacks (besides flash-attn, TransformerEngine and megatron-core)
BARE = ("msgspec", "webdataset", "braceexpand", "av", "flash_attn", "flash_attn_interface",
        "transformer_engine", "megatron", "decord", "torchcodec")  # fmt: skip
_BLOCKER = """
import sys
for name in {names!r}:  # absent as for an import and for importlib.util.find_spec
    sys.modules[name] = None
"""


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], dict]:  # fmt: skip
    out = tmp_path / "device.json"
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--dry-run", "-o", str(out), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.exists(), proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def _check_exactness(part: dict) -> None:
    assert part["status"] == "ok" and part["all_pass"] is True
    cases = part["cases"]
    assert {c["degree"] for c in cases} == {1, 2, 3, 4}
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    assert {c["gqa"] for c in cases} == {True, False}
    assert {c["transport"] for c in cases} == {"direct", "host-staged"}
    for c in cases:
        assert c["status"] == "ok", c
        assert c["kv_heads"] < c["heads"] if c["gqa"] else c["kv_heads"] == c["heads"]
        assert any(n % (2 * c["degree"]) for n in c["seqlens"]), "no padded sequence"
        rels = [c[f"{f}_rel"] for f in ("out", "dq", "dk", "dv")]
        assert c["pass"] == (max(rels) <= c["tol_rel"])
        if c["dtype"] == "float32":  # the exec tests' own bounds, on absolute errors
            assert c["out_abs"] <= 1e-5, c
            assert max(c["dq_abs"], c["dk_abs"], c["dv_abs"]) <= 1e-4, c
        else:
            assert max(rels) <= 2.5e-2, c
            assert max(rels) > 1e-5, "bf16 errors this small mean bf16 was not used"


def test_dry_run_schema_and_exactness(tmp_path: Path) -> None:
    proc, r = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r["schema"] == "fcp-device-suite/1" and r["dry_run"] is True
    assert r["device"]["kind"] == "cpu" and r["device"]["torch"] == torch.__version__
    assert set(r["parts"]) == PARTS
    te = r["parts"].pop("te_attention")  # TransformerEngine does not install on a CPU box
    assert te["status"] == "skipped" and "transformer_engine" in te["reason"], te
    assert all(p["status"] == "ok" for p in r["parts"].values()), r["parts"]
    _check_exactness(r["parts"]["exactness"])
    _check_hot_path(r["parts"]["hot_path"])

    k = r["parts"]["kernel_d1"]
    assert k["fcp_kernel"] == "cpu-flash" and len(k["rows"]) == 2
    for row in k["rows"]:
        assert row["fcp_ms"] > 0 and row["sdpa_ms"] > 0
        assert abs(row["fcp_over_sdpa"] - row["fcp_ms"] / row["sdpa_ms"]) < 1e-9
    assert any("CUDA" in s["reason"] for s in k["skipped"] if s["what"] == "flash_attn")

    prof = r["parts"]["cost_profile"]
    assert set(prof["compute_fit"]["coef"]) == {"alpha1", "alpha2", "beta1"}
    assert len(prof["compute_fit"]["rows"]) == 4 and prof["cost_model"]["alpha3"] > 0
    vis = r["parts"]["vision_profile"]
    assert len(vis["encoder_fit"]["rows"]) == 4 and vis["decode_fit"]["status"] == "ok"

    dec = r["parts"]["video_decode"]
    by = {(row["backend"], row["device"]): row for row in dec["rows"]}
    assert by["pyav", "cpu"]["vs_pyav"] == 1.0 and by["pyav", "cpu"]["seconds"] > 0
    if ("decord", "cpu") in by:  # same frames, bit for bit
        assert by["decord", "cpu"]["max_pixel_diff_vs_pyav"] == 0
    loaded = {b for b, _ in by}
    assert all(s["reason"] for s in dec["skipped"])
    assert loaded | {s["backend"].split("/")[0] for s in dec["skipped"]} >= {"pyav", "torchcodec"}
    p2p, ov = r["parts"]["p2p"], r["parts"]["overlap"]
    assert len(p2p["rows"]) == 3 and p2p["latency_s"] >= 0 and p2p["backend"].startswith("gloo")
    assert ov["ring_s"] > 0 and ov["compute_s"] > 0 and ov["comm_s"] > 0
    assert 0.0 <= ov["hidden_share"] <= 1.0
    reasons = {s["part"]: s["reason"] for s in r["skipped"]}
    assert "flash-attn comparison" in reasons and all(reasons.values())
    assert "exactness" in proc.stdout and "kernel_d1" in proc.stdout  # the printed table


def _check_hot_path(part: dict) -> None:
    assert part["status"] == "ok" and part["all_pass"] is True and part["kernel"] == "cpu-flash"
    rows = {(r["batch"], r["member"]): r for r in part["rows"]}
    assert set(rows) == {("A", 0), ("B", 0), ("C", 0), ("C", 3)}
    assert rows["A", 0]["sequences"] == 40 and rows["C", 3]["degree"] == 8
    for r in rows.values():  # one varlen call per ring step, whatever the sequences
        assert r["calls_per_step"] == {"fwd": 1.0, "bwd": 1.0}, r
        assert r["fcp_ms"] > 0 and r["bare_ms"] > 0 and r["host_ms"] > 0
        assert abs(r["fcp_over_bare"] - r["fcp_ms"] / r["bare_ms"]) < 1e-9
    ex = part["exactness"]
    assert ex["pass"] and 0 < max(ex[f"{n}_rel"] for n in ("out", "dq", "dk", "dv")) <= 2.5e-2
    step = part["model_step"]
    assert step["status"] == "ok" and step["fcp_ms"] > 0 and step["plain_ms"] > 0
    assert "cpu-flash" in step["kernel"][0]


def test_bare_box_runs_the_hot_path_and_names_what_it_lacks(tmp_path: Path) -> None:
    """The lent GPU box's import path: no msgspec, webdataset, PyAV, flash-attn, TE, megatron.
    The suite still runs, the hot path and the ring exactness measure, and the parts that need a
    missing package are skipped with its name and the wheel fix (never a crash at import)."""
    site = tmp_path / "bare"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCKER.format(names=BARE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    (tmp_path / "no-wheels").mkdir()
    proc, r = _run(tmp_path, "--wheels-dir", str(tmp_path / "no-wheels"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parts = r["parts"]
    _check_hot_path(parts["hot_path"])
    assert parts["exactness"]["status"] == "ok" and parts["exactness"]["all_pass"]
    for name in ("cost_profile", "vision_profile", "video_decode"):
        assert parts[name]["status"] == "skipped", (name, parts[name])
        assert "needs msgspec" in parts[name]["reason"] or "needs av" in parts[name]["reason"]
        assert "fetch_device_wheels.sh" in parts[name]["reason"]
    assert r["device"]["wheels"]["msgspec"] == "missing, no wheel in bench/.wheels"


def test_time_budget_skips_instead_of_overrunning(tmp_path: Path) -> None:
    proc, r = _run(tmp_path, "--time-budget-s", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(p["status"] == "skipped" for p in r["parts"].values()), r["parts"]
    assert all("time budget" in p["reason"] for p in r["parts"].values())
    assert {s["part"] for s in r["skipped"]} >= PARTS
