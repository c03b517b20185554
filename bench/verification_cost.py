"""What verified bytes cost the loader: tokens/s with and without each check, interleaved.

Three pairs, each over the same index, run in one process and interleaved round by round (on,
off, on, off, ...) so that machine noise hits both sides alike; the figure is the median epoch
time over `--rounds`, after one warm-up epoch per loader:

* local shards: per-member crc32 checked on every read (`LengthIndex.verify_checksums`);
* token store: every 4 MiB chunk of tokens.bin verified on first touch (blake2b); the flags are
  reset before each epoch, so every epoch pays the first touch (the worst case: a fresh worker);
* HTTP shards on 127.0.0.1: every range answer checked (status, Content-Range, ETag; always on)
  plus the crc32; "off" turns off the crc32 only. A second row times one range read alone:
  the verified GET against fsspec's unverified `cat_file` on the same session.

num_workers=0 and one replica, so the loader's own work is timed, not worker start-up. The text
is tokenized by a byte tokenizer (near-free, so reading and checking dominate: the strictest
case for the checks).

    .venv/bin/python bench/verification_cost.py [--samples 600] [--rounds 5] [--quick]
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from _common import ByteTokenizer, RangeHandler, make_parser, out_path, print_table, write_json

__all__ = ["main"]


def _loader(index: Any, tok: Any, *, store: bool, remote: Any = None) -> Any:
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex

    index = LengthIndex.open(index) if isinstance(index, Path) else index
    cap = int(index.seqlens.max()) + 64
    return FCPDataLoader(
        index,
        cluster=Cluster(1, tokens_per_replica=cap),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=0,
        global_batch_size=32,
        num_workers=0,
        tokenizer=None if store else tok,
        options=LoaderOptions(shuffle=False, token_store=store, remote=remote),
    )


def _epoch(ld: Any, before: Callable[[], None]) -> tuple[int, float]:
    before()
    t = time.perf_counter()
    tokens = sum(int(mb.local_cu_seqlens[-1]) for mb in ld)
    return tokens, time.perf_counter() - t


def _pair(
    name: str, on: Any, off: Any, rounds: int, reset: Callable[[Any], None]
) -> dict[str, Any]:
    """Median epoch time of two loaders, alternating on/off each round."""
    for ld in (on, off):
        _epoch(ld, lambda ld=ld: reset(ld))  # warm-up: page cache, planner kernels, sessions
    t_on, t_off, tokens = [], [], 0
    for r in range(rounds):
        order = [(on, t_on), (off, t_off)] if r % 2 == 0 else [(off, t_off), (on, t_on)]
        for ld, out in order:
            tokens, s = _epoch(ld, lambda ld=ld: reset(ld))
            out.append(s)
    a, b = float(np.median(t_on)), float(np.median(t_off))
    return {
        "case": name,
        "tokens": tokens,
        "on_s": a,
        "off_s": b,
        "on_tokens_per_s": tokens / a,
        "off_tokens_per_s": tokens / b,
        "ratio": b / a,  # throughput with checks / without: 1.0 = free
    }


def _range_read_cost(index: Any, reads: int) -> dict[str, Any]:
    """One sample's range read: verified GET vs fsspec cat_file (same pooled session)."""
    from fcp_data.readers.remote import RemoteReader, remote_filesystem

    reader = RemoteReader({})
    fs = remote_filesystem(index.shard_url(0))
    spans = [
        (index.shard_url(i), *RemoteReader.span(index.members(i), None))
        for i in range(min(reads, len(index)))
    ]
    t_on, t_off = [], []
    for r in range(3):
        for which in (0, 1) if r % 2 == 0 else (1, 0):
            t = time.perf_counter()
            for u, a, b in spans:
                if which == 0:
                    reader.fetch(u, a, b)
                else:
                    fs.cat_file(u, start=a, end=b)
            (t_on if which == 0 else t_off).append((time.perf_counter() - t) / len(spans))
    a, b = float(np.median(t_on)), float(np.median(t_off))
    return {"case": "one range read (HTTP)", "on_s": a, "off_s": b, "ratio": b / a}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = make_parser(__doc__)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.rounds = 64, 1

    from fcp_data.readers import LengthIndex, build_index, make_shards
    from fcp_data.readers.remote import RemoteOptions
    from fcp_data.readers.text import as_counter

    tok = ByteTokenizer()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = make_shards(root / "shards", text=args.samples, seed=0, samples_per_shard=64)
        urls = [str(p) for p in paths]
        local = build_index(urls, root / "local", counter=as_counter(tok), store_tokens=True)

        def crc_off(ld: Any) -> None:
            ld.source.verify_checksums = False

        on, off = _loader(local.path, tok, store=False), _loader(local.path, tok, store=False)
        crc_off(off)
        rows.append(_pair("local shards: crc32 per member", on, off, args.rounds, lambda _: None))

        on, off = _loader(local.path, tok, store=True), _loader(local.path, tok, store=True)
        off._builder.encoder.store.verify_chunks = False

        def fresh(ld: Any) -> None:
            ld._builder.encoder.store._verified[:] = False  # every epoch a first touch

        rows.append(_pair("token store: chunk blake2b", on, off, args.rounds, fresh))

        handler = type("Handler", (RangeHandler,), {"root": root / "shards"})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            base = f"http://127.0.0.1:{srv.server_address[1]}"
            http = [f"{base}/{p.name}" for p in paths]
            remote = build_index(http, root / "remote", counter=as_counter(tok))
            opts = RemoteOptions()
            on = _loader(LengthIndex.open(remote.path), tok, store=False, remote=opts)
            off = _loader(LengthIndex.open(remote.path), tok, store=False, remote=opts)
            crc_off(off)
            rows.append(
                _pair("HTTP shards: range checks + crc32", on, off, args.rounds, lambda _: None)
            )
            rows.append(_range_read_cost(remote, 20 if args.quick else 200))
        finally:
            srv.shutdown()
            srv.server_close()

    cells = []
    for r in rows:
        unit = "ms/read" if "read" in r["case"] else "s/epoch"
        scale = 1e3 if unit == "ms/read" else 1.0
        cells.append(
            (
                r["case"],
                f"{r['on_s'] * scale:.3f} {unit}",
                f"{r['off_s'] * scale:.3f} {unit}",
                f"{r['ratio']:.3f}",
            )
        )
    print_table(
        "Cost of verified bytes (one run, interleaved; ratio = off time / on)",
        ("case", "with checks", "without", "throughput ratio"),
        cells,
    )
    result = {"samples": args.samples, "rounds": args.rounds, "rows": rows}
    write_json(out_path(args, "verification_cost"), result, quick=args.quick)
    return result


if __name__ == "__main__":
    main()
