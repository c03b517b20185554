"""`fcp demo`: the bundled end-to-end job (what `make demo` runs).

1. Planner comparison: a long-tailed GitHub-like and an extreme global batch (512 sequences,
   up to 128K tokens) for Qwen3-8B on 64 H200 replicas (8 per node, 16K tokens each), planned
   by fcp and the baselines and scored by the same cost model (simulated, nothing trained).
2. The real pipeline on this machine: write sample WebDataset shards (stdlib source files as
   long-tailed text, small mp4 clips), index them, plan one global batch with the measured CPU
   profile and draw FCP beside static CP and megatron-core's hybrid CP (examples/plan_viewer.py),
   then train a small megatron-core GPT on several gloo processes with FCPDataLoader + fcp_exec
   (examples/train_megatron.py) and print where everything is.

About 2-4 minutes on 2 CPU cores (most of it process start-up and megatron-core imports);
--skip-train leaves out the training (~30 s then).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

from ..planner import Cluster, CostModel, generate_lengths
from ..planner.compare import DEFAULT_STRATEGIES, compare_strategies
from .simulate import print_comparison

__all__ = ["load_example", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="end to end: shards -> index -> plan picture -> short multi-process training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed of batches and shards (default 0)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out/demo"),
        help="where shards, index, picture and plan go (default out/demo)",
    )
    p.add_argument("--skip-train", action="store_true", help="stop after the plan picture")
    p.add_argument(
        "--skip-compare",
        action="store_true",
        help="leave out the simulated 64-replica comparison (step 1)",
    )
    p.add_argument(
        "--replicas", type=int, default=4, help="training processes, one replica each (default 4)"
    )
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.set_defaults(func=run)


def load_example(name: str) -> ModuleType:
    """examples/<name>.py of the repository this package is installed from (editable/clone)."""
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: `fcp demo` runs the repository's examples; run it from a git "
            "clone (`make demo` or `pip install -e .[all]`), or pass --skip-train"
        )
    key = f"fcp_examples_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def _compare(seed: int, viewer: ModuleType, picture: Path) -> Path:
    """Step 1: simulated tables, and the GitHub batch drawn by the viewer."""
    import numpy as np

    cost = CostModel.from_model("qwen3-8b", "h200")
    cluster = Cluster(64, replicas_per_node=8, tokens_per_replica=16384)
    drawn = picture
    for profile in ("github", "extreme"):
        lens = generate_lengths(profile, 512, seed=seed)
        results = compare_strategies(lens, cluster, cost, DEFAULT_STRATEGIES)
        print_comparison(
            results,
            f"{profile}: 512 sequences (max {int(lens.max())} tokens), "
            "Qwen3-8B on 64 H200 replicas, 16K tokens each (simulated)",
        )
        if profile == "github":
            batch = viewer.Batch(seqlens=lens, causal=np.ones(lens.size, bool),
                                 label=f"synthetic {profile} (simulated)")  # fmt: skip
            keep = [r for r in results if r.strategy in viewer.VIEW_STRATEGIES]
            drawn = viewer.draw(keep, batch, cluster, cost, picture)
    return drawn


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..planner import Plan
    from ..profiling import shipped_profile
    from ..readers import build_index, make_shards

    con = Console()
    t_start = time.perf_counter()
    out: Path = args.out
    viewer = load_example("plan_viewer")
    lines: list[str] = []
    if not args.skip_compare:
        con.rule("1. planner comparison (simulated, 64 H200 replicas)")
        sim = _compare(args.seed, viewer, out / "plan-h200-github.png")
        lines.append(f"simulated plan picture (Qwen3-8B, 64 H200): {sim.resolve()}")
    con.rule("2. the pipeline on this machine")
    t0 = time.perf_counter()
    paths = make_shards(out / "shards", text=48, video=8, seed=args.seed, samples_per_shard=16)
    index = build_index([str(p) for p in paths], out / "index")
    lens = index.seqlens
    con.print(
        f"shards: {len(paths)} tar files in {out / 'shards'} (48 stdlib source files, 8 "
        f"mp4 clips); index: {len(index)} samples, {int(lens.sum()):,} tokens, longest "
        f"{int(lens.max()):,} ({time.perf_counter() - t0:.1f} s)"
    )
    profile = shipped_profile("cpu-small")
    picture = out / "plan.png"
    argv = ["--index", str(out / "index"), "--batch", "32", "--seed", str(args.seed),
            "--replicas", "8", "--tokens-per-replica", "4096", "--cost", str(profile),
            "-o", str(picture)]  # fmt: skip
    vargs = viewer.build_parser().parse_args(argv)
    batch = viewer.load_batch(vargs)
    from ._common import cluster_from_args, cost_from_args

    cluster, cost = cluster_from_args(vargs), cost_from_args(vargs)
    picture, results = viewer.view(batch, cluster, cost, picture)
    viewer.summarize(results, batch, picture)
    fcp = next(r for r in results if r.strategy == "fcp")
    assert fcp.plan is not None
    (out / "plan.json").write_bytes(Plan.to_json(fcp.plan))
    lines += [f"plan picture of this machine's batch (measured CPU profile): "
              f"{picture.resolve()}",
             f"fcp plan (JSON, `python examples/plan_viewer.py --plan ...`): "
             f"{(out / 'plan.json').resolve()}"]  # fmt: skip
    lines += [
        f"  {r.strategy:>16}: predicted makespan {r.makespan:.3f} s ({r.ratio:.2f}x lower bound)"
        for r in results
        if r.plan is not None
    ]
    if not args.skip_train:
        con.rule(f"3. training on {args.replicas} gloo processes (megatron-core GPT, fcp_exec)")
        train = load_example("train_megatron")
        report = train.launch(train.TrainConfig(
            replicas=args.replicas, steps=args.steps, index=str(out / "index"), seed=args.seed,
            tokens_per_replica=2048, max_tokens=4096))  # fmt: skip
        first, last = report.steps[0], report.steps[-1]
        pred = sum(r["predicted_s"] for r in report.steps)
        meas = sum(r["measured_s"] for r in report.steps)
        lines.append(
            f"training: {len(report.steps)} steps, loss {first['loss']:.4f} -> "
            f"{last['loss']:.4f}; step time predicted {pred:.2f} s, measured "
            f"{meas:.2f} s in total ({report.wall_s:.0f} s with process start-up)"
        )
        cores = os.cpu_count() or 1
        if args.replicas > cores:
            lines.append(
                f"  ({args.replicas} processes share {cores} cores: the prediction "
                "assumes a core per replica, and ring partners wait for each other's "
                "turn on a core; see bench/replay.py for a fair comparison)"
            )
    con.rule("report")
    for line in lines:
        con.print(line, soft_wrap=True)
    con.print(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0
