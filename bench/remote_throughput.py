"""Tokens/s of FCPDataLoader over shards served by HTTP on the loopback vs the same shards local.

The same text shards (`make_shards`) are indexed twice: from disk, and from
http://127.0.0.1:PORT/ served by a small threaded HTTP/1.1 server that honours Range requests
(keep-alive, so fsspec's aiohttp session reuses connections). Both loaders use the byte
tokenizer (near-free, so reading dominates: the strictest comparison) and the same workers;
the remote loader fetches each sample's members with one byte-range request, prefetched
concurrently per micro-batch. Ratio = remote tokens/s / local tokens/s, measured in one run,
median of `--repeat` epochs after a warm-up.

    .venv/bin/python bench/remote_throughput.py [--samples 600] [--workers 2] [--replicas 4]
"""

from __future__ import annotations

import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from _common import ByteTokenizer, RangeHandler, make_parser, out_path, print_table, write_json

__all__ = ["main"]


def _epoch_tps(
    index: Any, n: int, gbs: int, workers: int, cost: Any, repeat: int, tok: Any
) -> float:
    """Job tokens/s: all replicas' tokens / the slowest replica's median epoch time."""
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster

    cap = int(index.seqlens.max()) // n + 2 * n + 64
    total, slowest = 0, 0.0
    for r in range(n):
        ld = FCPDataLoader(
            index,
            cluster=Cluster(n, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=gbs,
            num_workers=workers,
            tokenizer=tok,
            options=LoaderOptions(shuffle=False),
        )
        for _ in zip(range(2), ld):
            pass
        times = []
        for e in range(1, repeat + 1):
            ld.set_epoch(e)
            t0 = time.perf_counter()
            tokens = sum(int(mb.local_cu_seqlens[-1]) for mb in ld)
            times.append(time.perf_counter() - t0)
        total += tokens
        slowest = max(slowest, float(np.median(times)))
    return total / slowest


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = make_parser(__doc__)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.global_batch, args.workers = 64, 8, 0
        args.replicas, args.repeat = 2, 1

    from fcp_data.planner import CostModel
    from fcp_data.readers import build_index, make_shards
    from fcp_data.readers.text import CallableCounter

    cost = CostModel.from_model("qwen3-1.7b", "cpu")
    tok = ByteTokenizer()
    counter = CallableCounter(tok, spec=ByteTokenizer.spec)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_shards(Path(tmp) / "shards", text=args.samples, seed=0, samples_per_shard=64)
        handler = type("Handler", (RangeHandler,), {"root": Path(tmp) / "shards"})
        # listen backlog 128 (http.server's default is 5: a client opening 32 concurrent
        # range connections would see SYNs dropped and 1 s retransmits, which nginx's 511 avoids)
        server_cls = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 128})
        server = server_cls(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}"
            local = build_index([str(p) for p in paths], Path(tmp) / "local", counter=counter)
            remote = build_index(
                [f"{base}/{p.name}" for p in paths], Path(tmp) / "remote", counter=counter
            )
            for n in (1, args.replicas):
                common = (n, args.global_batch, args.workers, cost, args.repeat, tok)
                loc = _epoch_tps(local, *common)
                rem = _epoch_tps(remote, *common)
                rows.append(
                    {"replicas": n, "local_tps": loc, "remote_tps": rem, "ratio": rem / loc}
                )
        finally:
            server.shutdown()
            server.server_close()
    result = {
        "samples": args.samples,
        "workers": args.workers,
        "repeat": args.repeat,
        "rows": rows,
    }
    cells = [
        (r["replicas"], f"{r['local_tps']:,.0f}", f"{r['remote_tps']:,.0f}", f"{r['ratio']:.2f}")
        for r in rows
    ]
    print_table("local vs HTTP shards", ("replicas", "local tok/s", "http tok/s", "ratio"), cells)
    write_json(out_path(args, "remote_throughput"), result, quick=args.quick)
    return result


if __name__ == "__main__":
    main()
