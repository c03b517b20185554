"""Readers benchmark: index throughput, video metadata rate, random-access latency.

    .venv/bin/python bench/readers_index.py [--text 2000] [--video 40] [--reads 500] [--quick]

Writes bench/results/readers_index.json (or -o) and prints a table. Data is generated with
`make_shards` into a temporary directory (stdlib source text, tiny mp4s); runs in well under a
minute on 2 cores. Numbers are for warm page cache: they measure CPU cost, not the disk.
"""

from __future__ import annotations

import random
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import console, make_parser, out_path, print_table, write_json

__all__ = ["main"]


def _best(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _plain_tar_read(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        with tarfile.open(p, "r:") as tf:
            for info in tf:
                f = tf.extractfile(info)
                if f is not None:
                    n += len(f.read())
    return n


def _scan_to(path: str, key: str) -> bytes:
    with tarfile.open(path, "r:") as tf:
        for info in tf:
            if info.name.startswith(key + "."):
                f = tf.extractfile(info)
                return f.read() if f is not None else b""
    raise KeyError(key)


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--text", type=int, default=2000)
    ap.add_argument("--video", type=int, default=40)
    ap.add_argument("--reads", type=int, default=500)
    args = ap.parse_args(argv)
    if args.quick:
        args.text, args.video, args.reads = 64, 2, 20

    import webdataset as wds

    from fcp_data.readers import build_index, make_shards
    from fcp_data.vision.media_meta import parse_sidecar
    from fcp_data.vision.probe import Prober, probe_fields

    rows: list[tuple[str, float, str]] = []
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        paths = make_shards(
            root / "s", text=args.text, video=args.video, seed=0, samples_per_shard=256
        )
        results["make_shards_s"] = time.perf_counter() - t0
        text_paths = [p for p in paths if p.name.startswith("text")]
        video_paths = [p for p in paths if p.name.startswith("video")]
        nbytes = sum(p.stat().st_size for p in text_paths)
        mb = nbytes / 1e6

        t_tar = _best(lambda: _plain_tar_read(text_paths))
        t_wds = _best(
            lambda: sum(1 for _ in wds.WebDataset([str(p) for p in text_paths], shardshuffle=False))
        )
        t_idx = _best(lambda: build_index([str(p) for p in text_paths], root / "ti"))
        t_idx2 = _best(lambda: build_index([str(p) for p in text_paths], root / "ti", workers=2), 1)
        for name, t in (
            ("plain tarfile read", t_tar),
            ("webdataset iteration", t_wds),
            ("fcp index build (1 proc)", t_idx),
            ("fcp index build (2 procs, incl. spawn)", t_idx2),
        ):
            rows.append((f"text: {name}", args.text / t, f"{mb / t:.0f} MB/s"))
            slug = "_".join(name.replace("(", "").replace(")", "").replace(",", "").split()[:4])
            results[f"text_{slug}_samples_per_s"] = args.text / t
        results["text_index_mb_per_s"] = mb / t_idx
        results["text_mb"] = mb

        # video metadata: sidecar vs probes, over every video in the shard(s)
        vids: list[bytes] = []
        sidecars: list[bytes] = []
        for s in wds.WebDataset([str(p) for p in video_paths], shardshuffle=False):
            vids.append(s["mp4"])
            if "json" in s:
                sidecars.append(s["json"])
        t_side = _best(lambda: [parse_sidecar(b) for b in sidecars]) / max(1, len(sidecars))
        rows.append(("video meta: sidecar", 1 / t_side, f"{t_side * 1e6:.1f} µs/video"))
        results["video_sidecar_per_s"] = 1 / t_side
        for backend in ("decord", "pyav"):
            try:
                t_in = _best(lambda b=backend: [probe_fields(v, b) for v in vids], 1) / len(vids)
            except ImportError:
                continue
            with Prober(backend, timeout_s=30) as prober:  # type: ignore[arg-type]
                prober.probe(vids[0])  # start the child outside the timing
                t_child = _best(lambda p=prober: [p.probe(v) for v in vids], 1) / len(vids)
            rows.append(
                (
                    f"video meta: {backend} probe (in-process)",
                    1 / t_in,
                    f"{t_in * 1e3:.2f} ms/video",
                )
            )
            rows.append(
                (
                    f"video meta: {backend} probe (child, timeout)",
                    1 / t_child,
                    f"{t_child * 1e3:.2f} ms/video",
                )
            )
            results[f"video_{backend}_probe_per_s"] = 1 / t_in
            results[f"video_{backend}_probe_child_per_s"] = 1 / t_child

        # random access: index.read vs scanning the shard to the sample
        index = build_index([str(p) for p in text_paths], root / "ti2")
        rng = random.Random(0)
        picks = [rng.randrange(len(index)) for _ in range(args.reads)]
        t_read = _best(lambda: [index.read(i) for i in picks]) / len(picks)
        scan_picks = picks[: max(20, args.reads // 10)]
        t_scan = _best(
            lambda: [_scan_to(index.shard_url(i), str(index.keys[i])) for i in scan_picks], 1
        ) / len(scan_picks)
        rows.append(("random read: index.read", 1 / t_read, f"{t_read * 1e6:.0f} µs/read"))
        rows.append(("random read: scan shard to key", 1 / t_scan, f"{t_scan * 1e6:.0f} µs/read"))
        results["random_read_index_us"] = t_read * 1e6
        results["random_read_scan_us"] = t_scan * 1e6
        results["text_samples"], results["video_samples"] = args.text, args.video

    cells = [(name, f"{rate:,.0f}", detail) for name, rate, detail in rows]
    print_table("fcp readers", ("measurement", "items/s", "detail"), cells)
    console().print(
        f"{args.text} text samples ({results['text_mb']:.1f} MB), {args.video} videos;"
        f" make_shards took {results['make_shards_s']:.1f} s"
    )
    write_json(out_path(args, "readers_index"), dict(results), quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
