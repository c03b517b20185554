"""Data never runs commands: file names and index headers are data, only a typed spec is a command.

A shard file may be named `pipe:touch PWNED;.tar` and an index header can be edited by anyone
who can write it; neither may make fcp run a shell command. Each test checks, by the file the
command would create, that nothing ran.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import msgspec
import pytest

from fcp.cli import main
from fcp_data.errors import ConfigError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel
from fcp_data.readers.build import build_index
from fcp_data.readers.cache import ShardCache
from fcp_data.readers.index_format import HEADER_NAME
from fcp_data.readers.length_index import LengthIndex, PipeNotAllowedError
from fcp_data.readers.shards import expand_shards

EVIL = "pipe:touch PWNED;.tar"


def _write_tar(path: Path, texts: dict[str, str]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, text in texts.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture()
def evil_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a real tar named like a command, and one plain tar."""
    _write_tar(tmp_path / EVIL, {"a": "alpha " * 20, "b": "beta " * 30})
    _write_tar(tmp_path / "plain.tar", {"c": "gamma " * 10})
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_glob_result_named_like_a_command_is_a_file(evil_dir: Path) -> None:
    urls = expand_shards("*.tar")
    assert urls == ["./" + EVIL, "plain.tar"]
    index = build_index("*.tar", evil_dir / "idx")
    assert not (evil_dir / "PWNED").exists()
    assert sorted(index.keys.tolist()) == ["a", "b", "c"]
    assert index.header.shards[0].url == "../" + EVIL  # recorded as a path, relative
    assert index.read(0) == {"txt": b"alpha " * 20}
    reopened = LengthIndex.open(evil_dir / "idx")  # verify fingerprints: a file, not a command
    assert reopened.read(1)["txt"] == b"beta " * 30
    assert not (evil_dir / "PWNED").exists()


def test_fcp_index_with_a_quoted_glob_runs_nothing(evil_dir: Path) -> None:
    assert main(["index", "*.tar", "-o", "idx"]) == 0
    assert not (evil_dir / "PWNED").exists()
    assert len(LengthIndex.open("idx")) == 3


def test_an_unquoted_glob_that_is_both_a_file_and_a_command_is_refused(
    evil_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fcp index *.tar` in a shell passes the file name itself: fcp refuses to guess."""
    with pytest.raises(ConfigError, match=r"both a local file and a pipe: command.*\./pipe:"):
        expand_shards([EVIL, "plain.tar"])
    assert main(["index", EVIL, "plain.tar", "-o", "idx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fcp index: error: shard spec"), err
    assert not (evil_dir / "PWNED").exists() and not (evil_dir / "idx").exists()
    assert len(build_index(["./" + EVIL], evil_dir / "idx2")) == 2  # the way out it names


def test_a_file_in_a_folder_named_like_a_url_is_a_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "http:").mkdir()
    _write_tar(tmp_path / "http:" / "x.tar", {"k": "kappa " * 5})
    monkeypatch.chdir(tmp_path)
    assert expand_shards("http:/*.tar") == ["http:/x.tar"]  # no "://": never a URL
    assert len(build_index("http:/*.tar", tmp_path / "idx")) == 1


def _index_with_pipe_header(tmp_path: Path) -> tuple[Path, Path]:
    """A real index whose header was edited to list a `pipe:` command as its shard."""
    shard = tmp_path / "s.tar"
    _write_tar(shard, {"a": "alpha " * 20, "b": "beta " * 30})
    out = tmp_path / "idx"
    build_index(str(shard), out)
    head = out / HEADER_NAME
    raw = msgspec.json.decode(head.read_bytes())
    marker = tmp_path / "PWNED"
    raw["shards"][0]["url"] = f"pipe:touch {marker}; cat {shard}"
    raw["shards"][0]["fingerprint"] = ""
    head.write_bytes(msgspec.json.encode(raw))
    return out, marker


def _loader(index: object, options: LoaderOptions | None = None) -> FCPDataLoader:
    return FCPDataLoader(
        index,
        cluster=Cluster(2, replicas_per_node=2, tokens_per_replica=4096),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=0,
        global_batch_size=2,
        num_workers=0,
        tokenizer=None,  # construction is what is tested: no sample is encoded
        options=options,
    )


def test_a_pipe_command_in_an_index_header_runs_only_when_allowed(tmp_path: Path) -> None:
    out, marker = _index_with_pipe_header(tmp_path)
    index = LengthIndex.open(out)  # opening reads lengths only: nothing runs
    with pytest.raises(PipeNotAllowedError, match=r"index .*idx lists 1 pipe: shard.*allow_pipe"):
        index.read(0)
    with pytest.raises(PipeNotAllowedError, match=r"LoaderOptions\(allow_pipe=True\)"):
        _loader(str(out))
    with pytest.raises(PipeNotAllowedError):
        pickle.loads(pickle.dumps(index)).read(0)  # a DataLoader worker's copy refuses too
    assert not marker.exists()

    allowed = LengthIndex.open(out, allow_pipe=True)
    allowed.shard_cache = ShardCache(directory=tmp_path / "cache")
    assert pickle.loads(pickle.dumps(allowed)).allow_pipe
    _loader(str(out), LoaderOptions(allow_pipe=True))  # the loader's opt-in is accepted
    assert allowed.read(0) == {"txt": b"alpha " * 20}
    assert marker.exists()  # the opted-in command did run


def test_allow_pipe_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="allow_pipe='yes' must be True or False"):
        LoaderOptions(allow_pipe="yes")  # type: ignore[arg-type]
