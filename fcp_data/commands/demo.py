"""`fcp demo`: the bundled end-to-end job (what `make demo` runs).

1. Planner comparison: a long-tailed GitHub-like and an extreme global batch (512 sequences,
   up to 128K tokens) for Qwen3-8B on 64 H200 replicas (8 per node, 16K tokens each), planned
   by fcp and the baselines and scored by the same cost model (simulated, nothing trained).
2. The real pipeline on this machine: write sample WebDataset shards (stdlib sources, many
   short and a few long, and small mp4 clips), index them, time real d = 1 and d = 2 ring
   groups here (~10 s; on CPU gloo ring transfers share the cores that compute, so they hide
   behind little), plan one global batch with the shipped cpu-small profile priced with that
   ring, and draw fcp beside static CP and megatron-core's hybrid CP.
3. Train a small megatron-core GPT on gloo processes with FCPDataLoader + fcp_exec
   (`python -m fcp_exec.demo`, a separate process: the data side never imports the training
   side), then the same batches again with static CP, and print measured step times side by
   side; both are timed --repeats times, alternating, and a difference within the spread
   between those runs is reported as run-to-run noise, not as a speedup.
4. Two steps of a tiny Qwen2.5-VL-architecture model (transformers) on the same processes'
   count (`python -m fcp_exec.demo.vlm`): each replica encodes only the video tubelets it
   holds; --skip-vlm leaves it out.

About 1.5-2 minutes on 2 CPU cores after install (most of it process start-up and
megatron-core imports; --repeats 1 times step 3 once instead of twice); --skip-train leaves
out step 3 (~25 s then). Pictures are never
overwritten: a rerun writes plan-1.png, plan-2.png, ... beside the first. A ring fit that
priced communication as free (its bandwidth term fitted as 0, or faster than the idle link)
is measured once more and, if it stays so, not used: the demo says so and what it implies.
Planning times are warm (each strategy plans a tiny batch first, untimed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ExecError, MissingDependencyError
from ..planner import Cluster, CostModel, generate_lengths
from ..planner.compare import DEFAULT_STRATEGIES, StrategyResult
from ..viewer.compare import compare_warm
from ._args import int_in
from ._output import write_atomic

__all__ = ["WHEN_EQUAL", "measured_comparison", "register", "ring_fit_problems", "run"]

WHEN_EQUAL = (
    "fcp equals static CP when one degree suits every sequence: short or uniform data (all "
    "fit at d = 1), or a cluster small enough that one ring over all replicas is balanced and "
    "its communication hides behind attention; it wins on long-tailed batches, where a fixed "
    "degree makes the long sequences straggle or the short ones pay for rings they do not need."
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="end to end: shards -> index -> plan picture -> short multi-process training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--seed",
        type=int_in(0, 2**31 - 1),
        default=0,
        help="seed of batches and shards (default 0)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("out/demo"),
        help="directory for shards, index, pictures and plan (default out/demo)",
    )
    p.add_argument("--skip-train", action="store_true", help="stop after the plan picture")
    p.add_argument(
        "--skip-vlm",
        action="store_true",
        help="leave out step 4, the vision-language model (python -m fcp_exec.demo.vlm)",
    )
    p.add_argument(
        "--skip-compare",
        action="store_true",
        help="leave out the simulated 64-replica comparison (step 1)",
    )
    p.add_argument(
        "--replicas",
        type=int_in(1, 64, why="one gloo training process each, on this host"),
        help="training processes, one replica each (default: CPU cores, at most 4; more "
        "processes than cores make ring partners wait for each other's turn on a core)",
    )
    p.add_argument(
        "--steps",
        type=int_in(1, 1000),
        default=3,
        help="training steps per strategy (default 3)",
    )
    p.add_argument(
        "--repeats",
        type=int_in(1, 20),
        default=2,
        help="timed runs of each strategy's steps, alternating (default 2): the spread between "
        "runs says which measured differences are run-to-run noise",
    )
    p.add_argument(
        "--cost",
        metavar="NAME|FILE",
        help="plan and train with this cost profile instead of cpu-small priced with the ring "
        "measured here (e.g. --cost cpu-small: the idle ping-pong price)",
    )
    p.set_defaults(func=run)


def _compare(seed: int, picture: Path) -> Path:
    """Step 1: simulated tables, and the GitHub batch drawn by the viewer."""
    from ..viewer import VIEW_STRATEGIES, batch_from_lengths, draw, print_comparison

    cost = CostModel.from_model("qwen3-8b", "h200")
    cluster = Cluster(64, replicas_per_node=8, tokens_per_replica=16384)
    drawn = picture
    for name in ("github", "extreme"):
        lens = generate_lengths(name, 512, seed=seed)
        results = compare_warm(lens, cluster, cost, DEFAULT_STRATEGIES)
        print_comparison(
            results,
            f"{name}: 512 sequences (max {int(lens.max())} tokens), "
            "Qwen3-8B on 64 H200 replicas, 16K tokens each (simulated)",
            lens.size,
        )
        if name == "github":
            batch = batch_from_lengths(lens, f"synthetic {name} (simulated)")
            keep = [r for r in results if r.strategy in VIEW_STRATEGIES]
            drawn = draw(keep, batch, cluster, cost, picture)
    return drawn


def _speedup(results: list[StrategyResult]) -> float:
    by = {r.strategy: r.makespan for r in results if r.plan is not None}
    return by.get("static", float("nan")) / by.get("fcp", float("nan"))


def ring_fit_problems(fit: Any, base: CostModel) -> list[str]:
    """Why a ring fit cannot be a price of the ring here, one clause each ([] when it can).

    The fit is C(s) = (alpha3 s / 2) x + beta2 over the communication real d = 2 groups
    exposed. x = 0 says the exposed time did not grow with the bytes sent: the non-negative
    fit dropped the term, and `with_ring` would price ring traffic at 10^12 B/s (printed as
    1000000 MB/s), i.e. free. A bandwidth above the idle ping-pong's is as absurd: traffic that
    shares the cores with compute cannot move faster than over an idle link. Either way the
    planner would see rings as free and put every sequence on one degree, like static CP.
    beta2 = 0 alone only leaves the per-step latency unpriced."""
    spb, beta2 = fit.coef["seconds_per_byte"], fit.coef["beta2"]
    out: list[str] = []
    if spb <= 0:
        out.append(
            "its bandwidth term was fitted as 0 (the exposed time did not grow with the bytes "
            "sent), which prices ring traffic as free"
        )
    elif 1.0 / spb > base.intra_node_bandwidth:
        out.append(
            f"it prices the ring at {1e-6 / spb:,.0f} MB/s, faster than the idle ping-pong "
            f"({base.intra_node_bandwidth / 1e6:,.0f} MB/s): transfers that share the cores "
            "with compute cannot beat an idle link"
        )
    if beta2 <= 0:
        out.append("its per-step latency (β2) was fitted as 0")
    return out


def _local_cost(args: argparse.Namespace, out: Path) -> tuple[Path, str]:
    """The profile for this machine's batch: --cost, or cpu-small with the ring timed here."""
    from ..profiling import fit_ring, measure_ring, resolve_cost, shape_from_name, with_ring

    if args.cost:
        return resolve_cost(args.cost), f"cost profile {args.cost}"
    base = CostModel.load(resolve_cost("cpu-small"))
    if importlib.util.find_spec("fcp_exec") is None:
        return resolve_cost(
            "cpu-small"
        ), "cost profile cpu-small (fcp_exec missing: ring not timed)"
    t0 = time.perf_counter()
    problems: list[str] = []
    for attempt in range(2):  # a noisy measurement once more; a degenerate one twice is data
        print(
            f"timing d = 1 and d = 2 ring groups on 2 gloo processes here (~10 s"
            f"{', again' if attempt else ''})",
            flush=True,
        )
        try:
            fit = fit_ring(measure_ring(shape_from_name("cpu-small")), base)
        except ConfigError as exc:  # the ring hid behind compute here: the ping-pong price holds
            return resolve_cost("cpu-small"), f"ring timed here: {exc}; planning with cpu-small"
        problems = ring_fit_problems(fit, base)
        free = [p for p in problems if "β2" not in p]  # the ring priced as free, or absurd
        if problems:
            print(
                f"fcp demo: warning: the ring fit is degenerate: {'; '.join(problems)}"
                f"{'; measuring once more' if free and attempt == 0 else ''}",
                file=sys.stderr,
                flush=True,
            )
        if not free:  # a latency fitted as 0 alone is said, not measured again
            break
    if free:
        return resolve_cost("cpu-small"), (
            f"ring timed here twice ({time.perf_counter() - t0:.0f} s), and both fits were "
            f"degenerate: {free[0]}. Not used: planning with cpu-small's idle ping-pong price "
            f"({base.intra_node_bandwidth / 1e6:,.0f} MB/s). Under either price a ring looks "
            "(almost) free here, so fcp is expected to plan like static CP (one degree for "
            "every sequence) and the fcp-vs-static numbers below say nothing about the ring "
            "on this machine; rerun on an idle machine, or time it with `fcp profile --ring`"
        )
    cost = with_ring(base, fit)
    path = out / "cost-ring.json"
    cost.save(path)
    worst = max(fit.rows, key=lambda r: r.x)
    return path, (
        f"ring timed here ({time.perf_counter() - t0:.0f} s): a d = 2 group of "
        f"{int(worst.x):,} tokens exposes {worst.measured * 1e3:.0f} ms of communication; "
        f"effective bandwidth {cost.intra_node_bandwidth / 1e6:.0f} MB/s (idle ping-pong: "
        f"{base.intra_node_bandwidth / 1e6:.0f} MB/s), β2 {cost.beta2 * 1e3:.1f} ms"
        f"{' (fitted as 0: per-step latency is not priced)' if problems else ''} -> {path}"
    )


def _spread(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def measured_comparison(rounds: list[dict[str, list[float]]], same_plan_steps: int) -> list[str]:
    """Lines comparing fcp's and static CP's measured step time over repeated runs.

    A measured difference is only a speedup when it is larger than what the same work varies by
    between runs: with `rounds` runs of each, the spread is the larger of the two strategies'
    max - min of their total time, and a difference of medians within it is reported as noise.
    `same_plan_steps` counts the steps where both planned the same groups (equal digests):
    there any measured difference is noise by construction."""
    fcp = [sum(r["strategy_s"]) for r in rounds]
    static = [sum(r["baseline_s"]) for r in rounds]
    f_mid, s_mid = statistics.median(fcp), statistics.median(static)
    steps = len(rounds[0]["strategy_s"]) if rounds else 0
    lines = [
        f"measured step time over {steps} steps, {len(rounds)} run(s) each: fcp "
        f"{f_mid:.2f} s (runs {_spread(fcp)}), static CP {s_mid:.2f} s (runs "
        f"{_spread(static)}): {s_mid / f_mid:.2f}x"
    ]
    spread = max(max(fcp) - min(fcp), max(static) - min(static))
    diff = s_mid - f_mid
    if len(rounds) < 2:
        lines.append(
            "  one run each, so the run-to-run spread is unknown and so is how much of that "
            "difference is noise (--repeats 2 or more measures it)"
        )
    elif abs(diff) <= spread:
        lines.append(
            f"  the difference, {diff:+.2f} s, is within the run-to-run spread of {spread:.2f} s: "
            "noise, not a measured speedup either way"
        )
    else:
        lines.append(
            f"  the difference, {diff:+.2f} s, is larger than the run-to-run spread of "
            f"{spread:.2f} s"
        )
    if same_plan_steps:
        lines.append(
            f"  fcp and static CP planned the same groups in {same_plan_steps} of {steps} "
            "step(s): whatever differs there is run-to-run noise"
        )
    return lines


def _train(args: argparse.Namespace, index: Path, cost: Path, report: Path) -> dict:
    """Step 3 in a child process: fcp, then static CP on the same batches."""
    if importlib.util.find_spec("fcp_exec") is None or importlib.util.find_spec("megatron") is None:
        raise MissingDependencyError(
            "training needs fcp_exec and megatron-core: pip install 'fcp[megatron]', or pass "
            "--skip-train"
        )
    cap = 1024  # tokens per replica: the longest sample kept fits the whole cluster
    cmd = [sys.executable, "-m", "fcp_exec.demo", "--replicas", str(args.replicas),
           "--steps", str(args.steps), "--index", str(index), "--seed", str(args.seed),
           "--global-batch", "16", "--tokens-per-replica", str(cap),
           "--max-tokens", str(cap * args.replicas),
           "--baseline", "static", "--cost", str(cost), "--report", str(report),
           "--rounds", str(args.repeats)]  # fmt: skip
    code = subprocess.call(cmd)
    if code:
        raise ExecError(f"training exited with status {code}: {' '.join(cmd)}")
    return json.loads(report.read_text())


def _train_vlm(args: argparse.Namespace, out: Path) -> str:
    """Step 4 in child processes: the vision-language example, a few steps (~1-2 min)."""
    if importlib.util.find_spec("transformers") is None:
        return "vision-language step skipped: pip install 'transformers>=5' to run it"
    cmd = [sys.executable, "-m", "fcp_exec.demo.vlm", "--replicas", str(args.replicas),
           "--steps", "2", "--seed", str(args.seed), "--out", str(out)]  # fmt: skip
    code = subprocess.call(cmd)
    if code:
        raise ExecError(f"vision-language training exited with status {code}: {' '.join(cmd)}")
    return (
        "vision-language model: each replica encoded only the tubelets it holds (step lines "
        f"above: encoded / whole videos); data, tokenizer and index in {out}"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..readers import build_index, make_shards
    from ..viewer import batch_from_index, summarize, view
    from ..viewer.saved import plan_document

    con = Console()
    t_start = time.perf_counter()
    if args.replicas is None:
        args.replicas = max(2, min(4, os.cpu_count() or 2))
    out: Path = args.output
    lines: list[str] = []
    if not args.skip_compare:
        con.rule("1. planner comparison (simulated, 64 H200 replicas)")
        sim = _compare(args.seed, out / "plan-h200-github.png")
        lines.append(f"simulated plan picture (Qwen3-8B, 64 H200): {sim.resolve()}")
    con.rule("2. the pipeline on this machine")
    t0 = time.perf_counter()
    paths = make_shards(out / "shards", text=64, video=8, seed=args.seed, samples_per_shard=24)
    index = build_index([str(p) for p in paths], out / "index")
    lens = index.seqlens
    con.print(
        f"shards: {len(paths)} tar files in {out / 'shards'} (64 stdlib source files, 8 mp4 "
        f"clips); index: {len(index)} samples, {int(lens.sum()):,} tokens, median "
        f"{int(sorted(lens)[len(lens) // 2]):,}, longest {int(lens.max()):,} "
        f"({time.perf_counter() - t0:.1f} s)",
        soft_wrap=True,
    )
    cost_path, how = _local_cost(args, out)
    con.print(how, soft_wrap=True)
    cost = CostModel.load(cost_path)
    batch = batch_from_index(out / "index", batch_size=32, seed=args.seed)
    cluster = Cluster(8, tokens_per_replica=4096)
    picture, results = view(batch, cluster, cost, out / "plan.png")
    summarize(results, batch, picture)
    fcp = next(r for r in results if r.strategy == "fcp")
    assert fcp.plan is not None
    plan_path = out / "plan.json"
    write_atomic(plan_path, plan_document(fcp.plan, cost, cluster))  # `fcp view --plan` prices
    lines += [
        f"plan picture of this machine's batch ({cost.name}): {picture.resolve()}",
        f"fcp plan (JSON, `fcp view --plan {plan_path}`): {plan_path.resolve()}",
    ]
    lines += [
        f"  {r.strategy:>16}: predicted makespan {r.makespan:.3f} s ({r.ratio:.2f}x lower bound)"
        for r in results
        if r.plan is not None
    ]
    lines.append(f"  predicted speedup of fcp over static CP: {_speedup(results):.2f}x")
    if len(set(fcp.plan.degrees)) == 1:
        lines.append(
            f"  fcp planned one degree for every group (d = {fcp.plan.degrees[0]}), as static CP "
            f"does: under {cost.name} no mix of degrees is predicted faster on this batch"
        )
    if not args.skip_train:
        con.rule(f"3. training on {args.replicas} gloo processes: fcp, then static CP")
        with tempfile.TemporaryDirectory() as tmp:
            rep = _train(args, out / "index", cost_path, Path(tmp) / "report.json")
        first, last = rep["steps"][0], rep["steps"][-1]
        lines.append(
            f"training: {len(rep['steps'])} steps per strategy, loss {first['loss']:.4f} -> "
            f"{last['loss']:.4f}"
        )
        rounds = rep.get("rounds") or [
            {"strategy_s": [r["measured_s"] for r in rep["steps"]],
             "baseline_s": [r["measured_s"] for r in rep["baseline_steps"]]}
        ]  # fmt: skip
        same = sum(
            a.get("digest") is not None and a.get("digest") == b.get("digest")
            for a, b in zip(rep["steps"], rep["baseline_steps"])
        )
        lines += measured_comparison(rounds, same)
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        if load > cores:
            lines.append(
                f"  (load average {load:.1f} on {cores} cores: other work shares the cores, so "
                "measured times are noisy; rerun on an idle machine to compare)"
            )
    if not args.skip_train and not args.skip_vlm:
        con.rule(f"4. a tiny Qwen2.5-VL on {args.replicas} gloo processes: encode what you hold")
        lines.append(_train_vlm(args, out / "vlm"))
    lines.append(WHEN_EQUAL)
    con.rule("report")
    for line in lines:
        con.print(line, soft_wrap=True)
    con.print(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0
