"""Vision encoder work per replica: encode what you hold vs every held video whole on every member.

    python bench/vision_encode.py                       # 6 clips, d = 1..4, table + JSON
    python bench/vision_encode.py --videos 8 --degrees 1 2 4 -o out/vision_encode.json

For each degree d, the demo's mp4 clips (qwen2.5-vl rule, real loader payloads) are planned as
one CP group of d replicas; each replica's micro-batch holds the tubelets whose tokens sit in
its zigzag chunks. Measured per replica, side by side in one process: tubelets encoded and the
time of the vision tower forward + backward on its payload (best of --repeats interleaved
rounds) (the tiny Qwen2.5-VL ViT of the VLM
demo: 2 blocks, window + full attention), against the baseline every other system runs:
each member encodes every video of the group whole. Expected: tubelets ~ 1/d of the whole plus
the edge tubelets (a replica holds 2 chunks of each sequence, so at most 4 cut tubelets per
sequence, typically 2); time follows, minus per-call overheads. Clips: --videos mp4 files of
--frames frames (±25%) at 10 fps, 112x84 (the rule samples 2 fps: frames / 10 tubelets).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import make_parser, out_path, print_table, write_json


def one_group_planner(
    seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any
) -> Any:
    """Every sequence in one CP group of all replicas (the degree under test)."""
    from fcp_data.planner import CPGroup, Plan, Wave

    lens = [int(x) for x in seqlens]
    flags = np.broadcast_to(np.asarray(causal, bool), (len(lens),))
    group = CPGroup(
        replicas=tuple(range(cluster.num_replicas)), degree=cluster.num_replicas,
        sequence_ids=tuple(range(len(lens))), seqlens=tuple(lens),
        causal=tuple(bool(c) for c in flags), predicted_time=0.0,
    )  # fmt: skip
    return Plan(num_replicas=cluster.num_replicas, waves=(Wave(groups=(group,)),),
                predicted_time=0.0, lower_bound=0.0, strategy="one-group",
                winner="one-group").with_digest()  # fmt: skip


def clips(out: Path, count: int, frames: int, seed: int) -> str:
    """A tar of `count` mp4 clips (10 fps, 112x84, frames ±25%) with .json sidecars."""
    from webdataset import TarWriter

    from fcp_data.readers.synth import encode_video

    rng = np.random.default_rng(seed)
    url = str(out / "clips.tar")
    with TarWriter(url) as w:
        for i in range(count):
            n = int(frames * rng.uniform(0.75, 1.25))
            meta = {"num_frames": n, "fps": 10, "width": 112, "height": 84, "caption": "a clip"}
            w.write({"__key__": f"v{i:04d}", "mp4": encode_video(n, 112, 84, 10, seed=seed + i),
                     "json": json.dumps(meta).encode()})  # fmt: skip
    return url


def payloads(index: Path, tok: Any, degree: int, batch: int) -> list[Any]:
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex
    from fcp_data.vision import VisionOptions

    out = []
    for r in range(degree):
        loader = FCPDataLoader(
            LengthIndex.open(index), replica=r, global_batch_size=batch, num_workers=0,
            cluster=Cluster(degree, tokens_per_replica=1 << 20),
            cost=CostModel.from_model("qwen3-1.7b", "cpu"), tokenizer=tok,
            options=LoaderOptions(vision=VisionOptions(), planner=one_group_planner),
        )  # fmt: skip
        out.append(next(iter(loader)))
    return out


def encode_seconds(tower: Any, px: torch.Tensor, grid: torch.Tensor) -> float:
    """Seconds of one forward + backward of the tower on (px, grid)."""
    tower.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    tower(px, grid_thw=grid).pooler_output.square().sum().backward()
    return time.perf_counter() - t0


def side_by_side(tower: Any, whole: Any, mbs: list[Any], repeats: int) -> tuple[float, list[float]]:
    """Best-of-`repeats` seconds of the whole batch and of each replica's payload, interleaved
    (whole, r0, r1, ... per round) so that a busy machine slows both sides alike."""
    t_whole, t_rep = [], [[] for _ in mbs]
    for _ in range(repeats):
        t_whole.append(encode_seconds(tower, whole.pixel_values, whole.grid_thw))
        for i, mb in enumerate(mbs):
            t_rep[i].append(encode_seconds(tower, mb.pixel_values, mb.grid_thw))
    return min(t_whole), [min(t) for t in t_rep]


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    p.add_argument("--videos", type=int, default=6)
    p.add_argument("--frames", type=int, default=160, help="frames per clip (10 fps), ±25%%")
    p.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--repeats", type=int, default=5, help="rounds; the best of each is kept")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.videos, args.frames, args.degrees, args.repeats = 2, 20, [1, 2], 1
    from tokenizers import Tokenizer

    from fcp.demo.vlm import prepare, tiny_qwen25_vl

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="fcp-vision-encode-"))
    index, tok_path = prepare(tmp, text=0, video=0, seed=args.seed,
                              shards=[clips(tmp, args.videos, args.frames, args.seed)])  # fmt: skip
    tok = Tokenizer.from_file(str(tok_path))
    tower = tiny_qwen25_vl(tok, args.seed).model.visual
    (whole,) = payloads(index, tok, 1, args.videos)
    whole_units = int(whole.grid_thw[:, 0].sum())
    encode_seconds(tower, whole.pixel_values, whole.grid_thw)  # warm-up
    rows = []
    for d in args.degrees:
        mbs = payloads(index, tok, d, args.videos)
        units = [mb.vision_units for mb in mbs]
        partial = [mb.vision_partial_units for mb in mbs]
        t_whole, secs = side_by_side(tower, whole, mbs, args.repeats)
        rows.append({
            "degree": d, "sequences": args.videos, "whole_tubelets": whole_units,
            "max_tubelets": max(units), "mean_tubelets": float(np.mean(units)),
            "ideal_tubelets": whole_units / d, "max_edge_tubelets": max(partial),
            "edge_bound": 4 * args.videos, "whole_s": t_whole, "max_s": max(secs),
            "mean_s": float(np.mean(secs)), "work_ratio": max(units) / whole_units,
            "time_ratio": max(secs) / t_whole,
            "extra_per_sequence": (max(units) - whole_units / d) / args.videos,
        })  # fmt: skip
    columns = ("d", "whole", "max/rep", "ideal", "edges", "work", "extra/seq", "whole s",
               "max s", "time")  # fmt: skip
    cells = [
        (r["degree"], r["whole_tubelets"], r["max_tubelets"], f"{r['ideal_tubelets']:.1f}",
         r["max_edge_tubelets"], f"{r['work_ratio']:.2f}", f"{r['extra_per_sequence']:.2f}",
         f"{r['whole_s']:.3f}", f"{r['max_s']:.3f}", f"{r['time_ratio']:.2f}")
        for r in rows
    ]  # fmt: skip
    title = f"{args.videos} clips, one CP group of degree d; slowest replica vs every member whole"
    print_table(title, columns, cells)
    payload = {"rows": rows, "args": vars(args)}
    write_json(out_path(args, "vision_encode"), payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
