"""Stalls that end and integrity errors that are counted: real commands, a real server.

* A `pipe:` command that stalls while the loader copies it: the sample that gives up on it
  (sample_timeout_s) kills the command and its children at once, and the other samples of the
  shard fail at once naming it. Was: every sample waited out the whole limit and the command
  was left running.
* A remote shard that stalls mid-body while the loader reads inline: the stalled requests are
  cancelled (their connections closed), the shard's other samples in that batch fail at once,
  and closing the loader does not wait for stuck read-ahead threads. Was: no batch after 45 s.
* A `ChecksumMismatchError` (changed bytes, a lying range answer, a changed `pipe:` output)
  met while counting a chat's loss tokens escaped `on_error="skip"` as an exception; it is the
  counted skip that option promises.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from datapath_helpers import ended
from servers import RangeServer
from webdataset import TarWriter

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel
from fcp_data.readers import LengthIndex, ScanConfig, build_index
from fcp_data.readers.cache import ShardCache
from fcp_data.readers.remote import RemoteOptions
from fcp_data.readers.text import load_counter


def _loader(index: Any, bpe_file: Path, cost: CostModel, **opts: Any) -> FCPDataLoader:
    return FCPDataLoader(
        index,
        cluster=Cluster(1, tokens_per_replica=1 << 15),
        replica=0,
        cost=cost,
        global_batch_size=opts.pop("gbs", 8),
        num_workers=opts.pop("workers", 0),
        tokenizer=str(bpe_file),
        options=LoaderOptions(on_error="skip", **opts),
    )


def _first_batch(ld: FCPDataLoader) -> list[tuple[str, str]]:
    """The skips of the whole first global batch (built before its first micro-batch)."""
    it = iter(ld)
    mb = next(it)
    skipped = list(mb.skipped)
    while not mb.is_last_wave:
        mb = next(it)
        skipped += mb.skipped
    it.close()  # ends the read-ahead: its threads must not outlive the iteration
    return skipped


# ---- pipe: commands that stall at load -----------------------------------------------------
def test_a_pipe_command_stalling_at_load_is_ended_once_for_its_shard(
    tmp_path: Path, text_shards, bpe_file, cost
) -> None:
    shard, script = tmp_path / "s.tar", tmp_path / "cmd.sh"
    pidfile, done = tmp_path / "pid", tmp_path / "done"
    shutil.copy(text_shards[0], shard)
    script.write_text(f"cat {shard}\n")
    build_index([f"pipe:sh {script}"], tmp_path / "idx", counter=load_counter(str(bpe_file)))
    index = LengthIndex.open(tmp_path / "idx", allow_pipe=True)  # stream_timeout_s: 60 s
    index.shard_cache = ShardCache(directory=tmp_path / "cache")
    # the command now sends 3000 bytes, then goes quiet for 30 s (a dead upstream)
    script.write_text(f"echo $$ > {pidfile}\nhead -c 3000 {shard}\nsleep 30\ntouch {done}\n")
    ld = _loader(index, bpe_file, cost, sample_timeout_s=1.0, allow_pipe=True)
    skipped = _first_batch(ld)
    pid = int(pidfile.read_text())
    assert ended(pid)  # killed when its sample gave up (was: left running)
    assert not done.exists()
    assert len(skipped) == 8  # the whole batch lives in this one shard: every sample counted
    # one whole limit was waited (a read, or the loss count's read of a .json sample), then
    # the command was ended and every sample of its shard failed at once, naming it
    timed_out = [r for _, r in skipped if r.startswith("SampleTimeout: ")]
    assert len(timed_out) <= 1, timed_out  # was: all 8, one whole limit each
    rest = [r for _, r in skipped if r not in timed_out]
    assert len(rest) >= 7
    assert all("the command stalled after 3000 bytes and was ended (" in r for r in rest), rest
    assert all("did not finish within sample_timeout_s=1 s" in r for r in rest), rest
    assert all("children were killed" in r and "copy failed earlier" in r for r in rest)


# ---- remote shards that stall mid-body, inline ---------------------------------------------
def _pending_range_requests() -> int:
    """Range requests still running on fsspec's event loop (a stalled one sits for 30 s)."""
    from fsspec.asyn import get_loop

    async def count() -> int:
        return sum(
            1
            for t in asyncio.all_tasks()
            if not t.done()
            and ("_http_range" in repr(t.get_coro()) or "RemoteReader._one" in repr(t.get_coro()))
        )

    return asyncio.run_coroutine_threadsafe(count(), get_loop()).result(timeout=10)


def test_a_remote_shard_stalling_inline_is_bounded_and_ended(
    tmp_path: Path, text_shards, bpe_file, cost
) -> None:
    root = tmp_path / "www"
    root.mkdir()
    for s in text_shards[:3]:
        shutil.copy(s, root / Path(s).name)
    with RangeServer(root) as srv:
        urls = [f"{srv.url}/{Path(s).name}" for s in text_shards[:3]]
        index = build_index(urls, tmp_path / "idx", counter=load_counter(str(bpe_file)))
        srv.stall_s = 30.0  # half of every range body, then 30 s of silence
        ld = _loader(
            index.path,
            bpe_file,
            cost,
            sample_timeout_s=1.0,
            remote=RemoteOptions(retries=0, stall_timeout_s=30.0),
        )
        skipped = _first_batch(ld)
        shards = {str(index.shard_url(i)) for i in ld.sampler.batch(0, 0)}
        assert len(skipped) == 8  # every sample of the batch is a counted skip
        waited = [r for _, r in skipped if "did not finish within sample_timeout_s=1 s (" in r]
        at_once = [r for _, r in skipped if "stalled earlier in this global batch" in r]
        assert len(waited) + len(at_once) == 8
        assert len(waited) <= len(shards) < 8  # one whole limit per stalled shard at most
        assert at_once  # was: 8 whole limits, each a new request left on the stalled server
        # what stalled was ended: no range request is still waiting on the server, and no
        # read-ahead thread outlived the iteration (close() used to wait 10 s for each)
        deadline = time.monotonic() + 10
        while _pending_range_requests() and time.monotonic() < deadline:
            time.sleep(0.05)  # cancellation lands on the event loop's thread
        assert _pending_range_requests() == 0
        ahead = [t for t in threading.enumerate() if t.name.startswith("fcp-read-ahead")]
        assert not [t for t in ahead if t.is_alive()]
        srv.stall_s = 0.0


# ---- integrity errors met while counting a chat's loss tokens ------------------------------
def _chat_shard(path: Path, n: int = 12) -> str:
    with TarWriter(str(path)) as w:
        for i in range(n):
            turns = [
                {"role": "user", "content": f"question {i}: " + "why " * (i + 2)},
                {"role": "assistant", "content": "because " * (i + 3)},
            ]
            w.write({"__key__": f"c{i:03d}", "json": json.dumps({"messages": turns}).encode()})
    return str(path)


def _flip(path: Path, at: int) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x20]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _chat_index(urls: list[str], out: Path, bpe_file: Path, **kw: Any) -> LengthIndex:
    config = ScanConfig(text_field="messages", tokenizer=str(bpe_file))
    return build_index(urls, out, config=config, **kw)


@pytest.mark.parametrize("path", ["local", "remote", "pipe"])
def test_integrity_errors_on_a_chat_are_counted_skips(
    tmp_path: Path, bpe_file, cost, path: str
) -> None:
    shard = Path(_chat_shard(tmp_path / "chat.tar"))
    opts: dict[str, Any] = {"text_field": "messages", "gbs": 12}
    if path == "local":
        index = _chat_index([str(shard)], tmp_path / "idx", bpe_file)
        ld = _loader(index, bpe_file, cost, **opts)
        off, size = index.members(3)["json"]
        _flip(shard, off + size // 2)  # mid-run, same size: only the member crc32 sees it
        skipped = [s for mb in ld for s in mb.skipped]
        assert [k for k, _ in skipped] == ["c003"]
        assert "ChecksumMismatchError" in skipped[0][1] and "crc32" in skipped[0][1]
        return
    if path == "pipe":
        index = _chat_index([f"pipe:cat {shard}"], tmp_path / "idx", bpe_file)
        index = LengthIndex.open(tmp_path / "idx", allow_pipe=True)
        index.shard_cache = ShardCache(directory=tmp_path / "cache")
        off, size = index.members(3)["json"]
        _flip(shard, off + size // 2)  # the command's output changed since indexing
        ld = _loader(index, bpe_file, cost, allow_pipe=True, **opts)
        skipped = [s for mb in ld for s in mb.skipped]
        assert len(skipped) == 12  # the copy is refused whole: every sample counted, named
        assert any("differs from what index" in r for _, r in skipped)
        return
    root = tmp_path / "www"
    root.mkdir()
    shutil.copy(shard, root / "chat.tar")
    with RangeServer(root) as srv:
        index = _chat_index([f"{srv.url}/chat.tar"], tmp_path / "idx", bpe_file)
        srv.shift, srv.lie = 5, True  # other bytes under a Content-Range claiming the asked one
        ld = _loader(index.path, bpe_file, cost, remote=RemoteOptions(retries=0), **opts)
        skipped = [s for mb in ld for s in mb.skipped]
        assert len(skipped) == 12  # every answer lies: every sample counted, none raised
        assert all("ChecksumMismatchError" in r for _, r in skipped)
