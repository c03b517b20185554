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

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main"]


class _Range(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = Path(".")

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def answered(self, head: bool, nbytes: int) -> None:
        """Called once per request before the answer (a subclass counts requests here)."""

    def _serve(self, *, head: bool) -> None:
        path = getattr(self.server, "root", self.root) / self.path.lstrip("/")
        size = path.stat().st_size
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        start, end = (int(m.group(1)), int(m.group(2) or size - 1) + 1) if m else (0, size)
        end = min(end, size)
        self.answered(head, end - start)
        self.send_response(206 if m else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{size:x}-{path.stat().st_mtime_ns:x}"')
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not head:
            with open(path, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start))


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "remote.json"))
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).parent))
    from loader_throughput import ByteTokenizer

    from fcp_data.planner import CostModel
    from fcp_data.readers import build_index, make_shards
    from fcp_data.readers.text import CallableCounter

    cost = CostModel.from_model("qwen3-1.7b", "cpu")
    tok = ByteTokenizer()
    counter = CallableCounter(tok, spec=ByteTokenizer.spec)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_shards(Path(tmp) / "shards", text=args.samples, seed=0, samples_per_shard=64)
        handler = type("Handler", (_Range,), {"root": Path(tmp) / "shards"})
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
        "command": "python bench/remote_throughput.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
    }
    print(f"{'replicas':>8} {'local tok/s':>14} {'http tok/s':>14} {'ratio':>6}")
    for r in rows:
        print(
            f"{r['replicas']:>8} {r['local_tps']:>14,.0f} {r['remote_tps']:>14,.0f} "
            f"{r['ratio']:>6.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
