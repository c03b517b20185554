"""Remote read-ahead (`fcp_data.loader.read_ahead`) over a real loopback HTTP server.

The server is the data-path tests' `RangeServer` (Range, ETag, keep-alive) with a handler that
logs every GET as it arrives (before any delay), can delay each request, fail or stall the
first request of each range, and answers `/__log` with the ranges seen so far (so code in a
DataLoader worker can ask). Oracles: the same shards indexed and loaded from local disk, and
the same remote index loaded with the read-ahead off. Nothing asserts on wall-clock time: the
order test blocks on the server's log (a 60 s bound only ends a failing run), and every other
test compares tensors, request multisets and counters.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from loader_helpers import ByteTokenizer

from fcp_data.errors import ConfigError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.remote import RemoteOptions
from fcp_data.readers.text import CallableCounter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "datapath"))
from servers import RangeServer, _Handler  # the data-path tests' server

# no joined neighbours: one request per sample span, so request multisets compare exactly
FAST = RemoteOptions(retries=4, backoff_s=0.01, merge_gap=0)
GBS = 12  # 90 samples: 8 global batches an epoch
THREAD = "fcp-read-ahead"


class _Logged(_Handler):
    """RangeServer's handler, plus: an arrival log, a per-GET delay, a first-request fault."""

    server: LogServer

    def _serve(self, *, head: bool) -> None:
        srv = self.server
        if self.path == "/__log":
            with srv.lock:
                body = json.dumps([list(a) for a in srv.arrivals]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        first = False
        if not head:
            rng = self.headers.get("Range")
            with srv.lock:
                srv.arrivals.append((self.path, rng))
                first = (self.path, rng) not in srv.seen
                srv.seen.add((self.path, rng))
            time.sleep(srv.delay_s)
        if head and srv.head_barrier:  # hold each HEAD until that many are in flight
            with srv.cond:
                srv.heads += 1
                srv.cond.notify_all()
                srv.head_waits.append(srv.cond.wait_for(lambda: srv.heads >= srv.head_barrier, 10))
        if first and srv.first_fails:
            time.sleep(srv.first_stall_s)
            self._empty(500)
            return
        super()._serve(head=head)


class LogServer(RangeServer):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.RequestHandlerClass = _Logged
        self.arrivals: list[tuple[str, str | None]] = []
        self.seen: set[tuple[str, str | None]] = set()
        self.delay_s = 0.0
        self.first_fails = False  # the first GET of each range answers 500
        self.first_stall_s = 0.0  # ... after this long
        self.cond = threading.Condition()
        self.head_barrier = 0  # > 0: each HEAD waits (10 s at most) until this many arrived
        self.heads = 0
        self.head_waits: list[bool] = []

    def reset(self) -> None:
        with self.lock:
            self.arrivals.clear()
            self.seen.clear()
        self.delay_s, self.first_fails, self.first_stall_s = 0.0, False, 0.0
        self.head_barrier, self.heads, self.head_waits = 0, 0, []


@dataclasses.dataclass(frozen=True)
class Setup:
    srv: LogServer
    local: Path
    remote: Path
    cap: int


@pytest.fixture(scope="module")
def setup(shards, tmp_path_factory) -> Any:
    urls, _ = shards
    root = tmp_path_factory.mktemp("ra-www")
    for u in urls:
        shutil.copy(u, root / Path(u).name)
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    out = tmp_path_factory.mktemp("ra-index")
    with LogServer(root) as srv:
        local = build_index(urls, out / "local", counter=counter)
        build_index([f"{srv.url}/{Path(u).name}" for u in urls], out / "remote", counter=counter)
        yield Setup(srv, local.path, out / "remote", int(local.seqlens.max()) + 64)


@pytest.fixture()
def env(setup) -> Any:
    setup.srv.reset()
    yield setup
    setup.srv.reset()


def make(
    path: Path,
    n: int,
    r: int,
    cost,
    *,
    nw: int = 0,
    ahead: int = 0,
    tok: Any = None,
    gbs: int = GBS,
    **kw: Any,
) -> FCPDataLoader:
    return FCPDataLoader(
        str(path),
        cluster=Cluster(n, replicas_per_node=4, tokens_per_replica=path_cap(path, n)),
        cost=cost,
        replica=r,
        global_batch_size=gbs,
        num_workers=nw,
        tokenizer=tok or ByteTokenizer(),
        options=LoaderOptions(read_ahead_bytes=ahead, remote=FAST, **kw),
    )


def path_cap(path: Path, n: int) -> int:
    """Tokens per replica: the longest sample fits one replica's share of n."""
    return int(LengthIndex.open(path).seqlens.max()) // n + 64


def epochs(ld: FCPDataLoader, count: int = 2) -> list[Any]:
    out = []
    for _ in range(count):  # a finished epoch moves the loader to the next one
        out.extend(ld)
    return out


def same(a: Any, b: Any, where: str = "") -> None:
    """Every field of two micro-batches equal: tensors exactly, the rest by value."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, type(a)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def same_batches(want: list[Any], got: list[Any]) -> None:
    assert len(want) == len(got)
    for i, (a, b) in enumerate(zip(want, got)):
        same(a, b, f"mb{i}")


def gets(srv: LogServer) -> Counter[tuple[str, str | None]]:
    with srv.lock:
        return Counter(srv.arrivals)


def read_ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD)]


# ---- (a) identical batches, the same requests -----------------------------------------------
@pytest.mark.parametrize(("n", "nw"), [(1, 0), (2, 0), (1, 2), (2, 2)])
def test_batches_equal_local_and_read_ahead_off(env, cost, n: int, nw: int) -> None:
    """2 epochs, every replica: read-ahead on == off == local shards (every tensor), and on
    fetches exactly the ranges off does, each as often (nothing unused, nothing twice)."""
    for r in range(n):
        want = epochs(make(env.local, n, r, cost))
        env.srv.reset()
        off = epochs(make(env.remote, n, r, cost, nw=nw, ahead=0))
        off_gets = gets(env.srv)
        env.srv.reset()
        ld = make(env.remote, n, r, cost, nw=nw, ahead=64 << 20)
        on = epochs(ld)
        on_gets = gets(env.srv)
        same_batches(want, off)
        same_batches(want, on)
        assert on_gets == off_gets
        if nw == 0:  # the read-ahead ran in this process: it served every batch but the first
            stats = ld._builder.read_ahead.stats
            assert stats.served > 0 and stats.wasted == 0 and stats.failed == 0
    assert not read_ahead_threads()


def test_video_and_text_batches_equal_local(tmp_path, cost) -> None:
    """Remote mp4 clips and text (the media path: members read ahead, frames decoded later):
    read-ahead on == local, every tensor and every frame, on both replicas of 2."""
    from fcp_data.readers import make_shards

    # every clip with a .json sidecar: a remote clip without one cannot be indexed today (the
    # scan probes its frames by opening the URL as a local file)
    paths = make_shards(tmp_path / "www", text=16, video=6, seed=3, samples_per_shard=8,
                        time_scale=0.05, sidecar_fraction=1.0)  # fmt: skip
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    local = build_index([str(p) for p in paths], tmp_path / "local", counter=counter)
    with LogServer(tmp_path / "www") as srv:
        build_index([f"{srv.url}/{p.name}" for p in paths], tmp_path / "remote", counter=counter)
        rule = local.header.rule["name"]
        for r in range(2):
            kw: dict[str, Any] = {"gbs": 8, "vision_rule": rule, "vision_token_id": 7}
            want = list(make_v(local.path, r, cost, ahead=0, **kw))
            ld = make_v(tmp_path / "remote", r, cost, ahead=64 << 20, **kw)
            same_batches(want, list(ld))
            assert ld._builder.read_ahead.stats.served > 0
            assert any(mb.vision for mb in want)  # frames were decoded and compared


def test_chats_read_for_the_loss_count_are_read_ahead_once(tmp_path, cost) -> None:
    """Text chats (.json {"messages"}) are read by every replica to count the global batch's
    loss tokens, held or not: the read-ahead fetches them too, once for both reads of a held
    one, so it makes fewer requests than without it (never more of any range), wastes none,
    and every field, global_num_loss_tokens included, equals the local loader's."""
    from webdataset import TarWriter

    from fcp_data.readers.scan import ScanConfig

    www = tmp_path / "www"
    www.mkdir()
    paths = []
    for s in range(3):
        paths.append(www / f"chat-{s}.tar")
        with TarWriter(str(paths[-1])) as w:
            for i in range(s * 16, s * 16 + 16):
                turns = [
                    {"role": "user", "content": "What is " + "two plus two " * (i % 5 + 1)},
                    {"role": "assistant", "content": "It is four. " * (i % 7 + 1)},
                ]
                if i % 2:
                    w.write({"__key__": f"c{i:03d}", "json": json.dumps({"messages": turns})})
                else:
                    w.write({"__key__": f"t{i:03d}", "txt": "plain text " * (i % 9 + 3)})
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    config = ScanConfig(text_field="messages")
    local = build_index([str(p) for p in paths], tmp_path / "local", config=config, counter=counter)
    with LogServer(www) as srv:
        urls = [f"{srv.url}/{p.name}" for p in paths]
        build_index(urls, tmp_path / "remote", config=config, counter=counter)
        for r in range(2):
            kw: dict[str, Any] = {"gbs": 8, "text_field": "messages"}
            want = list(make(local.path, 2, r, cost, **kw))
            srv.reset()
            off = list(make(tmp_path / "remote", 2, r, cost, ahead=0, **kw))
            off_gets = gets(srv)
            srv.reset()
            ld = make(tmp_path / "remote", 2, r, cost, ahead=64 << 20, **kw)
            on = list(ld)
            on_gets = gets(srv)
            same_batches(want, off)
            same_batches(want, on)
            assert (
                all(on_gets[k] <= n for k, n in off_gets.items())
                and on_gets.keys() <= off_gets.keys()
            )
            assert sum(on_gets.values()) < sum(off_gets.values())
            stats = ld._builder.read_ahead.stats
            assert stats.served > 0 and stats.wasted == 0 and stats.failed == 0


def make_v(path: Path, r: int, cost, *, ahead: int, gbs: int, vision_rule: str, **kw: Any):
    return FCPDataLoader(
        str(path),
        cluster=Cluster(2, tokens_per_replica=path_cap(path, 2)),
        cost=cost,
        replica=r,
        global_batch_size=gbs,
        num_workers=0,
        tokenizer=ByteTokenizer(),
        vision_rule=vision_rule,
        options=LoaderOptions(read_ahead_bytes=ahead, remote=FAST, **kw),
    )


# ---- (b) the next batch's requests go out while this one is built ---------------------------
@dataclasses.dataclass(frozen=True)
class WaitingTokenizer:
    """ByteTokenizer that, for a sample of batch b, returns only once the server has seen every
    range of the batch this process builds after b (b + W): it runs inside b's build, so those
    requests can only come from the read-ahead. Asks the server (works in workers too)."""

    spec = ByteTokenizer.spec
    log_url: str
    after: dict[str, tuple[tuple[str, str], ...]]  # text -> ranges that must have arrived

    def __call__(self, text: str) -> list[int]:
        want = self.after.get(text, ())
        deadline = time.monotonic() + 60.0  # ends a failing run; a passing one waits ms
        while want:
            with urllib.request.urlopen(self.log_url, timeout=30) as r:
                seen = {tuple(a) for a in json.loads(r.read())}
            if all(w in seen for w in want):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(want)} ranges of the next batch were not requested")
            time.sleep(0.01)
        return ByteTokenizer()(text)


def _ranges(index: LengthIndex, positions: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for p in positions:
        m = index.members(int(p))
        a, b = min(o for o, _ in m.values()), max(o + z for o, z in m.values())
        out.append(("/" + index.shard_url(int(p)).rsplit("/", 1)[1], f"bytes={a}-{b - 1}"))
    return tuple(out)


@pytest.mark.parametrize("nw", [0, 2])
def test_next_batch_is_requested_while_this_one_is_built(env, cost, nw: int) -> None:
    """With a 20 ms delay a request, every range of batch b+W reaches the server before batch
    b's samples are tokenised (b's build blocks until they have): issued in the background."""
    index = LengthIndex.open(env.remote)
    probe = make(env.remote, 1, 0, cost)
    stride, nb = max(1, nw), probe.num_batches
    own = []
    for b in range(nb):
        ids = probe.sampler.batch(0, b)
        own.append(probe._builder._own(ids, probe._builder.plan(ids)))
    after = {}
    for b in range(nb - stride):
        nxt = _ranges(index, own[b + stride])
        for p in own[b]:
            after[index.read(int(p))["txt"].decode()] = nxt
    assert len(after) == sum(len(o) for o in own[: nb - stride])  # texts are unique
    tok = WaitingTokenizer(log_url=f"{env.srv.url}/__log", after=after)
    env.srv.delay_s = 0.02
    got = list(make(env.remote, 1, 0, cost, nw=nw, ahead=64 << 20, tok=tok))
    same_batches(list(make(env.local, 1, 0, cost)), got)


# ---- (c) the budget -----------------------------------------------------------------------
def test_budget_smaller_than_a_batch_is_never_exceeded(env, cost) -> None:
    """A budget of the largest sample's span (about a third of a batch's bytes): the most held
    at once stays within it, it still serves samples, and the batches do not change; a budget
    below some samples' size reads those on demand."""
    index = LengthIndex.open(env.remote)
    spans = [
        max(o + z for o, z in index.members(i).values())
        - min(o for o, _ in index.members(i).values())
        for i in range(len(index))
    ]
    want = epochs(make(env.local, 1, 0, cost))
    for budget in (max(spans), int(np.median(spans))):
        probe = make(env.remote, 1, 0, cost)
        batch_bytes = [
            sum(spans[p] for p in probe._builder._own(ids, probe._builder.plan(ids)))
            for ids in (probe.sampler.batch(0, b) for b in range(probe.num_batches))
        ]
        assert budget < min(batch_bytes)
        env.srv.reset()
        ld = make(env.remote, 1, 0, cost, ahead=budget)
        got = epochs(ld)
        same_batches(want, got)
        stats = ld._builder.read_ahead.stats
        assert 0 < stats.max_held <= budget
        assert stats.served > 0 and stats.wasted == 0
        assert ld._builder.read_ahead.held == 0
        seen = gets(env.srv)  # on demand or ahead: each sample's range once an epoch
        assert len(seen) == len(index) and set(seen.values()) == {2}


# ---- (d) read-ahead faults never change a batch ---------------------------------------------
@pytest.mark.parametrize("nw", [0, 2])
def test_failed_read_ahead_requests_change_nothing(env, cost, nw: int) -> None:
    """The first GET of every range answers 500 (the read-ahead's, for every batch but the
    first): the batches equal the local ones."""
    want = epochs(make(env.local, 2, 1, cost))
    env.srv.first_fails = True
    ld = make(env.remote, 2, 1, cost, nw=nw, ahead=64 << 20)
    same_batches(want, epochs(ld))
    assert env.srv.seen  # the faults happened
    if nw == 0:
        assert ld._builder.read_ahead.stats.served > 0  # the read-ahead's own retry got them


def test_slow_read_ahead_is_abandoned_not_waited_for(env, cost) -> None:
    """The first GET of every range stalls 4 s, then fails, under a 1.5 s sample limit: each
    batch waits at most 1.5 s for its read-ahead, reads what is still in flight on demand, and
    no sample times out (a slow read-ahead costs time, never a result)."""
    opts: dict[str, Any] = {"sample_timeout_s": 1.5, "gbs": 30}  # 3 batches
    want = list(make(env.local, 1, 0, cost, **opts))
    env.srv.first_fails, env.srv.first_stall_s = True, 4.0
    got = list(make(env.remote, 1, 0, cost, ahead=64 << 20, **opts))
    same_batches(want, got)
    assert all(not mb.skipped for mb in got)
    assert not read_ahead_threads()  # close() waited for the stalled fetches to end


# ---- (e) threads --------------------------------------------------------------------------
def test_no_thread_is_left_after_close_or_collection(env, cost) -> None:
    """Threads start with the first read-ahead and end with the iteration: finished, closed
    mid-epoch (read-ahead in flight under a 50 ms delay), or dropped and collected."""
    import gc

    assert not read_ahead_threads()
    list(make(env.local, 1, 0, cost, ahead=64 << 20))  # local shards: no read-ahead at all
    assert not read_ahead_threads()
    env.srv.delay_s = 0.05
    ld = make(env.remote, 1, 0, cost, ahead=64 << 20)
    it = iter(ld)
    next(it)
    assert read_ahead_threads()  # batch 1's read-ahead is under way
    it.close()
    assert not read_ahead_threads()
    it = iter(make(env.remote, 1, 0, cost, ahead=64 << 20))
    next(it)
    assert read_ahead_threads()
    del it
    gc.collect()
    assert not read_ahead_threads()
    list(make(env.remote, 1, 0, cost, ahead=64 << 20))
    assert not read_ahead_threads()


# ---- shard checks -------------------------------------------------------------------------
def test_a_batchs_shard_checks_are_in_flight_together(env) -> None:
    """The size/ETag HEADs of the shards a prefetch touches go out together, not one round trip
    each: the server answers none of 3 until all 3 have arrived (a sequential client would wait
    10 s on the first, and the test would fail); the ranges then load and verify as before."""
    from fcp_data.readers.remote import RemoteReader

    index = LengthIndex.open(env.remote)
    urls = index.shard_urls[:3]
    reader = RemoteReader({u: e.fingerprint for u, e in zip(urls, index.header.shards)}, FAST)
    first = [int(np.flatnonzero(index.shard == k)[0]) for k in range(3)]
    ranges = [(index.shard_url(i), *RemoteReader.span(index.members(i), None)) for i in first]
    env.srv.head_barrier = 3
    reader.prefetch(ranges)
    assert env.srv.head_waits == [True, True, True]
    local = LengthIndex.open(env.local)
    for i, (url, _, _) in zip(first, ranges):
        assert reader.read(url, index.members(i)) == local.read(i)


# ---- the option ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 1.5, True, "256M"])
def test_read_ahead_bytes_is_checked(bad: Any) -> None:
    with pytest.raises(ConfigError, match="read_ahead_bytes"):
        LoaderOptions(read_ahead_bytes=bad)


def test_budget_is_split_among_workers(env, cost) -> None:
    """Each building process may hold budget / num_workers; 0 or local shards: none at all."""
    assert make(env.remote, 1, 0, cost, nw=2, ahead=1 << 20)._builder.read_ahead.budget == 1 << 19
    assert make(env.remote, 1, 0, cost, ahead=1 << 20)._builder.read_ahead.budget == 1 << 20
    assert make(env.remote, 1, 0, cost, ahead=0)._builder.read_ahead is None
    assert make(env.local, 1, 0, cost, ahead=1 << 20)._builder.read_ahead is None
