"""Remote video and text shards over loopback HTTP with a per-request delay: read-ahead or not.

    .venv/bin/python bench/remote_media.py                      # table + JSON, ~3-4 min
    .venv/bin/python bench/remote_media.py --delays-ms 0 50 --repeats 1 -o out.json
    .venv/bin/python bench/remote_media.py --quick               # seconds: proves it runs

Shards: `make_shards` text (stdlib sources) and mp4 clips (PyAV, every clip with a .json
sidecar), served by a threaded HTTP/1.1 server in this process that honours Range, keeps
connections alive (listen backlog 128) and sleeps `delay` before answering each request (0 /
10 / 50 ms: loopback, a datacenter object store, a cross-region one). Each set is indexed twice
(local paths, http URLs) with the byte tokenizer (near-free, so reading dominates).

Throughput (samples/s of one replica, `--workers` DataLoader workers, median of `--repeats`
epochs; every row of every delay timed in one interleaved round, so a busy machine slows all
rows alike): FCPDataLoader over http with the read-ahead (`LoaderOptions.read_ahead_bytes`,
default 256 MiB) and without (0), over the local shards, and a plain webdataset pipeline over
the same http shards (each shard streamed whole by one `curl` GET, as webdataset does: a delay
costs it one round trip a shard). The video rows decode every sampled frame of every clip at the
qwen2.5-vl rule's size in both pipelines (FCP's held tubelets are every tubelet on one
replica); the text rows tokenise. The first epoch of every loader is a warm-up whose batches are
compared with the local loader's (identical tokens, or the run stops).

Downloads per CP member: for d = 1, 2, 4 replicas in one CP group (every sequence of every batch
planned onto all d: `vision_encode.one_group_planner`), the range GETs and body bytes each
member fetches in one epoch (num_workers=0, no delay), beside one DP replica reading each sample
once (d = 1) and webdataset streaming each shard once. Every member reads its group's samples
whole (BPE cannot start mid-text; a clip's bytes are one member), so d members fetch d times;
with a token store (`store_tokens=True`) no member reads a text sample at all.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from _common import ByteTokenizer, RangeHandler, make_parser, out_path, write_json

__all__ = ["main"]

RULE = "qwen2.5-vl"


class _Delayed(RangeHandler):
    """Range-honouring file server: sleeps `server.delay_s` per request, counts GETs/bytes."""

    server: _Server

    def _serve(self, *, head: bool) -> None:
        time.sleep(self.server.delay_s)
        super()._serve(head=head)

    def answered(self, head: bool, nbytes: int) -> None:
        srv = self.server
        with srv.lock:
            srv.counts["head" if head else "get"] += 1
            srv.counts["bytes"] += 0 if head else nbytes


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # http.server's 5 drops SYNs of concurrent range requests

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Delayed)
        self.root, self.delay_s = root, 0.0
        self.lock = threading.Lock()
        self.counts = {"get": 0, "head": 0, "bytes": 0}

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


# ---- the plain webdataset pipeline ----------------------------------------------------------
class _PlainText:
    """A text sample -> token ids (the same byte tokenizer and EOD as FCP's)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def __call__(self, sample: dict[str, Any]) -> int:
        text = sample["txt"].decode() if "txt" in sample else json.loads(sample["json"])["text"]
        return int(len(self.tok(text)) + 1)


class _PlainVideo:
    """A clip -> its caption's ids and every frame the rule samples, decoded at the rule's size
    (what FCP does for the tubelets a replica holds: all of them on one replica)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def __call__(self, sample: dict[str, Any]) -> int:
        from fcp_data.vision import get_rule
        from fcp_data.vision.decode import decode_frames

        meta = json.loads(sample["json"])
        vt = get_rule(RULE).video(
            num_frames=int(meta["num_frames"]),
            fps=float(meta["fps"]),
            height=int(meta["height"]),
            width=int(meta["width"]),
        )
        px = decode_frames(
            sample["mp4"],
            list(vt.frame_indices),
            vt.resized,
            native=(int(meta["height"]), int(meta["width"])),
        )
        return int(px.shape[0]) + len(self.tok(meta["caption"]))


def _count(batch: list[int]) -> int:
    return len(batch)


def plain_loader(urls: list[str], kind: str, gbs: int, workers: int, tok: Any) -> Any:
    import torch
    import webdataset as wds

    fn = _PlainVideo(tok) if kind == "video" else _PlainText(tok)
    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .map(fn)
        .batched(gbs, collation_fn=_count, partial=True)
    )
    return torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=workers, prefetch_factor=2 if workers else None
    )


# ---- FCP ------------------------------------------------------------------------------------
def fcp_loader(
    index: Any,
    kind: str,
    *,
    replicas: int = 1,
    replica: int = 0,
    gbs: int,
    workers: int,
    read_ahead: int,
    tok: Any,
    planner: Any = None,
) -> Any:
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel

    cap = int(index.seqlens.max()) // replicas + 64
    return FCPDataLoader(
        index.path,
        cluster=Cluster(replicas, tokens_per_replica=cap if planner is None else 1 << 22),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica,
        global_batch_size=gbs,
        num_workers=workers,
        tokenizer=tok,
        vision_rule=RULE if kind == "video" else None,
        options=LoaderOptions(
            read_ahead_bytes=read_ahead, planner=planner, vision_token_id=7, special_token_id=8
        ),
    )


def _digest(mbs: list[Any]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for mb in mbs:
        h.update(mb.tokens.numpy().tobytes())
        for v in mb.vision:
            h.update(v.pixels.numpy().tobytes())
    return h.hexdigest()


def _epoch(ld: Any, plain: bool) -> tuple[int, float, float]:
    """(samples, seconds, samples/s after the first batch) of one epoch of `ld`: the last
    leaves out worker start-up and each worker's first batch (nothing read ahead for it,
    shard checks), which an epoch of thousands of batches amortises."""
    t0 = time.perf_counter()
    n, first, at = 0, 0, 0.0
    for item in ld:
        n += item if plain else len(item.sample_ids)
        if not at:
            first, at = n, time.perf_counter()
    t1 = time.perf_counter()
    return n, t1 - t0, (n - first) / max(t1 - at, 1e-9)


def throughput(
    sets: dict[str, dict[str, Any]], srv: _Server, args: argparse.Namespace, tok: Any
) -> list[dict[str, Any]]:
    rows = ("fcp http + read-ahead", "fcp http", "fcp local", "webdataset http")
    loaders: dict[tuple[str, str], Any] = {}
    for kind, s in sets.items():
        common = {"gbs": s["gbs"], "workers": args.workers, "tok": tok}
        loaders[kind, rows[0]] = fcp_loader(s["remote"], kind, read_ahead=256 << 20, **common)
        loaders[kind, rows[1]] = fcp_loader(s["remote"], kind, read_ahead=0, **common)
        loaders[kind, rows[2]] = fcp_loader(s["local"], kind, read_ahead=0, **common)
        loaders[kind, rows[3]] = plain_loader(s["urls"], kind, s["gbs"], args.workers, tok)
        want = _digest(list(loaders[kind, rows[2]]))  # warm-up epoch, and the oracle
        for row in rows[:2]:
            got = _digest(list(loaders[kind, row]))
            if got != want:
                raise SystemExit(f"{kind}: {row} delivered other batches than fcp local")
        _epoch(loaders[kind, rows[3]], plain=True)
    times: dict[tuple[str, float, str], list[float]] = {}
    steady: dict[tuple[str, float, str], list[float]] = {}
    samples: dict[tuple[str, str], int] = {}
    for _ in range(args.repeats):
        for delay in args.delays_ms:
            srv.delay_s = delay / 1e3
            for kind in sets:
                for row in rows:
                    n, sec, rate = _epoch(loaders[kind, row], plain=row.startswith("webdataset"))
                    times.setdefault((kind, delay, row), []).append(sec)
                    steady.setdefault((kind, delay, row), []).append(rate)
                    samples[kind, row] = n
    srv.delay_s = 0.0
    out = []
    for kind in sets:
        for delay in args.delays_ms:
            sps = {r: samples[kind, r] / float(np.median(times[kind, delay, r])) for r in rows}
            st = {r: float(np.median(steady[kind, delay, r])) for r in rows}
            out.append(
                {
                    "data": kind,
                    "delay_ms": delay,
                    "samples_per_s": sps,
                    "steady_samples_per_s": st,
                    "vs_local": {r: sps[r] / sps["fcp local"] for r in rows},
                    "steady_vs_local": {r: st[r] / st["fcp local"] for r in rows},
                }
            )
    return out


def downloads(
    sets: dict[str, dict[str, Any]], srv: _Server, degrees: list[int], tok: Any
) -> list[dict[str, Any]]:
    """Range GETs and bytes each member of a one-group CP of d replicas fetches in an epoch."""
    from vision_encode import one_group_planner

    out = []
    srv.delay_s = 0.0
    cases = [(k, k, s["remote"]) for k, s in sets.items()]
    cases.insert(1, ("text, token store", "text", sets["text"]["stored"]))
    for label, kind, index in cases:
        s = sets[kind]
        shard_bytes = sum(Path(u).stat().st_size for u in s["paths"])
        for d in degrees:
            members = []
            for r in range(d):
                ld = fcp_loader(
                    index,
                    kind,
                    replicas=d,
                    replica=r,
                    gbs=s["gbs"],
                    workers=0,
                    read_ahead=256 << 20,
                    tok=tok,
                    planner=one_group_planner,
                )
                before = srv.snapshot()
                for _ in ld:
                    pass
                after = srv.snapshot()
                members.append({k: after[k] - before[k] for k in after})
            out.append(
                {
                    "data": label,
                    "degree": d,
                    "members": members,
                    "webdataset": {"get": len(s["paths"]), "bytes": shard_bytes},
                }
            )
    dp = {row["data"]: row["members"][0] for row in out if row["degree"] == 1}
    for row in out:
        gets = sum(m["get"] for m in row["members"])
        got = sum(m["bytes"] for m in row["members"])
        base = dp[row["data"]]
        row["x_dp_requests"] = gets / base["get"] if base["get"] else float("nan")
        row["x_dp_bytes"] = got / base["bytes"] if base["bytes"] else float("nan")
    return out


def print_tables(thr: list[dict[str, Any]], dl: list[dict[str, Any]]) -> None:
    rows = ("fcp http + read-ahead", "fcp http", "fcp local", "webdataset http")
    short = ("read-ahead", "no read-ahead", "webdataset http")
    print("| data | delay | " + " | ".join(f"{r} (samples/s)" for r in rows)
          + " | " + " | ".join(f"{r} / local" for r in short)
          + " | " + " | ".join(f"{r} / local, steady" for r in short) + " |")  # fmt: skip
    print("| --- | --- |" + " --- |" * (len(rows) + 6))
    for t in thr:
        sps, vs, st = t["samples_per_s"], t["vs_local"], t["steady_vs_local"]
        print(f"| {t['data']} | {t['delay_ms']:g} ms | "
              + " | ".join(f"{sps[r]:,.0f}" for r in rows)
              + " | " + " | ".join(f"{vs[r]:.2f}" for r in (rows[0], rows[1], rows[3]))
              + " | " + " | ".join(f"{st[r]:.2f}" for r in (rows[0], rows[1], rows[3]))
              + " |")  # fmt: skip
    print()
    print(
        "| data | CP degree | GETs per member / epoch | MB per member / epoch | x DP requests "
        "(all members) | x DP bytes (all members) | webdataset GETs, MB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in dl:
        gets = "/".join(str(m["get"]) for m in row["members"])
        mb = "/".join(f"{m['bytes'] / 1e6:.2f}" for m in row["members"])
        wds = row["webdataset"]
        xs = [f"{x:.2f}" if x == x else "-" for x in (row["x_dp_requests"], row["x_dp_bytes"])]
        print(
            f"| {row['data']} | {row['degree']} | {gets} | {mb} | {xs[0]} | {xs[1]} | "
            f"{wds['get']}, {wds['bytes'] / 1e6:.2f} |"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = make_parser(__doc__)
    ap.add_argument("--text", type=int, default=512, help="text samples (64 a shard)")
    ap.add_argument("--videos", type=int, default=48, help="mp4 clips (8 a shard)")
    ap.add_argument("--text-batch", type=int, default=32, help="global batch of the text set")
    ap.add_argument("--video-batch", type=int, default=8, help="global batch of the video set")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 10.0, 50.0])
    ap.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3, help="timed epochs per row; the median")
    args = ap.parse_args(argv)
    if args.quick:
        args.text, args.videos, args.text_batch, args.video_batch = 16, 2, 8, 2
        args.workers, args.delays_ms, args.degrees, args.repeats = 0, [0.0], [1, 2], 1

    from fcp_data.readers import build_index, make_shards
    from fcp_data.readers.text import CallableCounter

    tok = ByteTokenizer()
    counter = CallableCounter(tok, spec=ByteTokenizer.spec)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        www = Path(tmp) / "www"
        text = make_shards(www, text=args.text, seed=0, samples_per_shard=64)
        # every clip with a .json sidecar: a remote clip without one cannot be indexed (the
        # scan would probe its frames by opening the URL as a local file)
        video = make_shards(
            www, video=args.videos, seed=1, samples_per_shard=8, sidecar_fraction=1.0
        )
        srv = _Server(www)
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        try:
            base = f"http://127.0.0.1:{srv.server_address[1]}"
            sets: dict[str, dict[str, Any]] = {}
            for kind, paths, gbs in (
                ("text", text, args.text_batch),
                ("video", video, args.video_batch),
            ):
                urls = [f"{base}/{p.name}" for p in paths]
                sets[kind] = {
                    "paths": [str(p) for p in paths],
                    "urls": urls,
                    "gbs": gbs,
                    "local": build_index(
                        [str(p) for p in paths], Path(tmp) / f"{kind}-local", counter=counter
                    ),
                    "remote": build_index(urls, Path(tmp) / f"{kind}-http", counter=counter),
                }
            sets["text"]["stored"] = build_index(
                sets["text"]["urls"], Path(tmp) / "text-stored", counter=counter, store_tokens=True
            )
            thr = throughput(sets, srv, args, tok)
            dl = downloads(sets, srv, args.degrees, tok)
        finally:
            srv.shutdown()
            srv.server_close()
    result = {
        "text": args.text,
        "videos": args.videos,
        "workers": args.workers,
        "repeats": args.repeats,
        "seconds": time.perf_counter() - t_start,
        "throughput": thr,
        "downloads": dl,
    }
    print_tables(thr, dl)
    print(f"\n{result['seconds']:.0f} s")
    write_json(out_path(args, "remote_media"), result, quick=args.quick)
    return result


if __name__ == "__main__":
    main()
