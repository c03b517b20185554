"""Vision encoder work per replica: encode what you hold vs every held video whole on every member.

    python bench/vision_encode.py                       # 6 clips, d = 1..4, table + JSON
    python bench/vision_encode.py --videos 8 --degrees 1 2 4 --json out/vision_encode.json

For each degree d, the demo's mp4 clips (qwen2.5-vl rule, real loader payloads) are planned as
one CP group of d replicas; each replica's micro-batch holds the tubelets whose tokens sit in
its zigzag chunks. Measured per replica, side by side in one process: tubelets encoded and the
time of the vision tower forward + backward on its payload (the tiny Qwen2.5-VL ViT of the VLM
demo: 2 blocks, window + full attention), against the baseline every other system runs:
each member encodes every video of the group whole. Expected: tubelets ~ 1/d of the whole plus
the edge tubelets (a replica holds 2 chunks of each sequence, so at most 4 cut tubelets per
sequence, typically 2); time follows, minus per-call overheads. Clips: make_shards with
time_scale 1.0 (10-15 tubelets each at the rule's 2 fps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def encode_seconds(tower: Any, px: torch.Tensor, grid: torch.Tensor, repeats: int) -> float:
    """Median seconds of the tower's forward + backward on (px, grid)."""
    times = []
    for _ in range(repeats):
        tower.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        tower(px, grid_thw=grid).pooler_output.square().sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, default=6)
    p.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="out/vision_encode.json")
    args = p.parse_args(argv)
    from tokenizers import Tokenizer

    from fcp_exec.demo.vlm import prepare, tiny_qwen25_vl

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="fcp-vision-encode-"))
    index, tok_path = prepare(tmp, text=0, video=args.videos, seed=args.seed, time_scale=1.0)
    tok = Tokenizer.from_file(str(tok_path))
    tower = tiny_qwen25_vl(tok, args.seed).model.visual
    (whole,) = payloads(index, tok, 1, args.videos)
    whole_units = int(whole.grid_thw[:, 0].sum())
    t_whole = encode_seconds(tower, whole.pixel_values, whole.grid_thw, args.repeats)
    rows = []
    for d in args.degrees:
        mbs = payloads(index, tok, d, args.videos)
        units = [mb.vision_units for mb in mbs]
        partial = [mb.vision_partial_units for mb in mbs]
        secs = [encode_seconds(tower, mb.pixel_values, mb.grid_thw, args.repeats) for mb in mbs]
        rows.append({
            "degree": d, "sequences": args.videos, "whole_tubelets": whole_units,
            "max_tubelets": max(units), "mean_tubelets": float(np.mean(units)),
            "ideal_tubelets": whole_units / d, "max_edge_tubelets": max(partial),
            "edge_bound": 4 * args.videos, "whole_s": t_whole, "max_s": max(secs),
            "mean_s": float(np.mean(secs)), "work_ratio": max(units) / whole_units,
            "time_ratio": max(secs) / t_whole,
        })  # fmt: skip
    head = (f"{'d':>2} {'whole':>6} {'max/rep':>8} {'ideal':>6} {'edges':>6} {'work':>6} "
            f"{'whole s':>8} {'max s':>7} {'time':>6}")  # fmt: skip
    print(f"{args.videos} clips, one CP group of degree d; slowest replica vs every member whole")
    print(head)
    for r in rows:
        print(
            f"{r['degree']:>2} {r['whole_tubelets']:>6} {r['max_tubelets']:>8} "
            f"{r['ideal_tubelets']:>6.1f} {r['max_edge_tubelets']:>6} {r['work_ratio']:>6.2f} "
            f"{r['whole_s']:>8.3f} {r['max_s']:>7.3f} {r['time_ratio']:>6.2f}"
        )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
