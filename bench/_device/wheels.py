"""Packages a bare GPU box lacks, installed from wheels that travel with the tree.

The box the device suite runs on has torch, transformers, numba and pyarrow but not fcp's other
dependencies (msgspec, webdataset, braceexpand, PyAV, rich) and no network.
`bench/fetch_device_wheels.sh` downloads them, on a machine with network, into the ignored
folder `bench/.wheels`; `activate_wheels` installs the ones whose module is missing with
`pip install --no-index --no-deps --target bench/.wheels/site` (once: a stamp records what
was installed) and puts that folder on `sys.path` and `PYTHONPATH`, so spawned ranks see it
too. Without the folder it does nothing: the parts that need a missing package are skipped,
named, by the suite.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["activate_wheels"]

# distribution name (as in the wheel file name) -> the module it provides
MODULES = {
    "msgspec": "msgspec",
    "webdataset": "webdataset",
    "braceexpand": "braceexpand",
    "av": "av",
    "rich": "rich",
    "markdown_it_py": "markdown_it",
    "mdurl": "mdurl",
    "pygments": "pygments",
}


def activate_wheels(folder: Path) -> dict[str, str]:
    """{distribution: 'present' | 'installed' | 'missing, no wheel' ...} for MODULES."""
    report: dict[str, str] = {}
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    site = folder / "site"
    if site.is_dir():
        _add_path(site)
    todo: list[Path] = []
    for dist, module in MODULES.items():
        if _present(module):
            report[dist] = "present"
            continue
        found = [w for w in wheels if w.name.lower().startswith(dist.lower() + "-")]
        if found:
            todo.append(found[-1])
            report[dist] = f"installed from {found[-1].name}"
        else:
            report[dist] = "missing, no wheel in bench/.wheels"
    if todo:
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
               "--target", str(site), *map(str, todo)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            for w in todo:
                report[w.name.split("-")[0]] = f"pip failed: {proc.stderr.strip()[-200:]}"
        _add_path(site)
        importlib.invalidate_caches()
    return report


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it: as absent
        return False


def _add_path(site: Path) -> None:
    if str(site) not in sys.path:
        sys.path.insert(1, str(site))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(site) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *parts])
