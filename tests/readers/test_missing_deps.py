"""A missing optional package stops `fcp index` with a clear error, never "all skipped".

The packages are hidden for real: `fcp index` runs in a subprocess whose PYTHONPATH starts
with a `sitecustomize.py` that makes importing `av`, `decord` or `tokenizers` fail (spawned
probe children inherit it). Without the fix, every video sample is skipped as "does not
decode" and the command exits 0 with an empty index.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fcp.cli import main
from fcp_data.readers import make_shards
from fcp_data.readers.errors import SAME_ERROR_HEAD, ErrorPolicy, FailureLog, TooManyFailures

BLOCKER = """
import importlib.abc, sys
BLOCKED = {names!r}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Block())
"""


def _fcp_without(tmp: Path, names: tuple[str, ...], *args: str) -> subprocess.CompletedProcess:
    site = tmp / f"site-{'-'.join(names)}"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=names))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(root)])}
    cmd = [sys.executable, "-c", "import sys; from fcp.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*cmd, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_index_without_pyav_fails_loudly(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "s", video=3, sidecar_fraction=0.0, time_scale=0.05)
    args = ("index", *map(str, shards), "-o", str(tmp_path / "i"))
    out = _fcp_without(tmp_path, ("av", "decord"), *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "'av'" in out.stderr and "pip install 'fcp[video]'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "i").exists()
    # the same shards index fine where PyAV is importable: the failure above is the block
    assert main(["index", *map(str, shards), "-o", str(tmp_path / "ok")]) == 0


def test_index_without_tokenizers_fails_loudly(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "s", text=4)
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")  # never read: the import fails first
    args = ("index", *map(str, shards), "-o", str(tmp_path / "i"), "--tokenizer", str(tok))
    out = _fcp_without(tmp_path, ("tokenizers",), *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "'tokenizers'" in out.stderr and "fcp[text]" in out.stderr, out.stderr


def test_same_error_on_the_first_samples_stops_the_scan(tmp_path: Path, capsys) -> None:
    """A wrong --text-field fails every .json sample the same way: stop, do not index 0."""
    from webdataset import TarWriter

    shard = tmp_path / "j.tar"
    with TarWriter(str(shard)) as w:
        for i in range(SAME_ERROR_HEAD + 4):
            w.write({"__key__": f"k{i}", "json": b'{"body": "%d words here"}' % i})
    args = ["index", str(shard), "-o", str(tmp_path / "i")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the first {SAME_ERROR_HEAD} samples all failed with the same error" in err
    assert "'text'" in err  # the reason names the field it looked for
    assert main([*args, "--text-field", "body"]) == 0


def test_head_fuse_needs_one_reason_and_no_success() -> None:
    def run(reasons: list[str], ok_first: bool = False) -> None:
        log = FailureLog(ErrorPolicy(on_error="skip"))
        if ok_first:
            log.ok()
        for k, r in enumerate(reasons):
            log.fail("s.tar", f"k{k}", r)

    with pytest.raises(TooManyFailures, match="same error"):
        run(["bad utf-8 at position 3"] * SAME_ERROR_HEAD)
    # reasons equal only with their numbers masked: quoted, never called "the same" (was)
    with pytest.raises(TooManyFailures) as err:
        run([f"bad utf-8 at position {k}" for k in range(SAME_ERROR_HEAD)])
    assert "same error" not in str(err.value)
    assert "errors that differ only in their numbers" in str(err.value)
    assert "first s.tar: 'k0': bad utf-8 at position 0; last s.tar: 'k7'" in str(err.value)
    run(["empty text"] * (SAME_ERROR_HEAD - 1) + ["no payload"] * 3)  # mixed reasons: skipped
    run(["empty text"] * (SAME_ERROR_HEAD + 3), ok_first=True)  # data that worked before
