"""Every benchmark script runs in its `--quick` mode, so none can rot unseen.

A benchmark nothing runs drifts from the library it measures until the day someone needs its
figure and finds it broken. Each script in bench/ runs here with `--quick` (tiny sizes,
seconds) in its own process, exactly as a user types it, writing its JSON into tmp_path; the
test checks the exit status, the record every result carries (date, command, load average)
and the keys the script's own figures live under. A new script must be added to EXPECTED:
the first test fails until it is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

# script -> (extra arguments, keys its JSON must hold, modules it cannot run without)
EXPECTED: dict[str, tuple[tuple[str, ...], set[str], tuple[str, ...]]] = {
    "attention_hot_path": ((), {"sides", "sequences"}, ()),
    "device_suite": ((), {"schema", "parts", "device"}, ()),
    "hf_trainer": ((), {"measured", "predicted"}, ("transformers", "trl", "datasets")),
    "idle_policy": ((), {"summary", "rows"}, ()),
    "loader_throughput": ((), {"fcp", "plain", "pretokenized"}, ("webdataset",)),
    "media_decode": ((), {"rows", "skipped"}, ("av",)),
    "parallel_layouts": ((), {"setups", "summary", "rows"}, ()),
    "planner_quality": ((), {"summary", "oracle", "rows"}, ()),
    "planner_speed": ((), {"speed", "breakdown", "noise", "degree_mix"}, ()),
    "readers_index": ((), {"text_index_mb_per_s", "random_read_index_us"}, ("webdataset",)),
    "remote_media": ((), {"throughput", "downloads"}, ("av", "webdataset", "fsspec")),
    "remote_throughput": ((), {"rows"}, ("fsspec",)),
    "replay": ((), {"cases", "totals"}, ()),
    "ring_attention": ((), {"local", "ring"}, ()),
    "ring_attention --check": (("--check",), {"check"}, ()),
    "transport_choice": ((), {"summary", "rows"}, ()),
    "transports": ((), {"rows"}, ()),
    "verification_cost": ((), {"rows"}, ("fsspec",)),
    "vision_encode": ((), {"rows"}, ("av", "transformers")),
    "vision_planning": ((), {"summary", "rows"}, ()),
}


def _scripts() -> set[str]:
    return {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}


def test_every_script_is_run_quick() -> None:
    assert _scripts() == {name.split()[0] for name in EXPECTED}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run(name: str, tmp_path: Path) -> None:
    extra, keys, needs = EXPECTED[name]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    script = BENCH / f"{name.split()[0]}.py"
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", *extra, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    run = result["run"]
    assert run["quick"] is True
    assert run["command"].startswith(f"python bench/{script.name} --quick")
    assert {"date", "load_average", "cpus"} <= set(run)
    assert keys <= set(result), sorted(result)
