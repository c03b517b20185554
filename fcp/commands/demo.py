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
   (`fcp.demo`, one process per replica) with fcp and with static CP as paired steps: each
   global batch runs under both back to back, --repeats times, the order alternating. The
   verdict is the median of the paired ratios (static / fcp) with a distribution-free interval
   for it (order statistics of the binomial, 96% for 9 pairs); an interval that holds 1.0 is
   called noise, whatever the medians say.
4. Two steps of a tiny Qwen2.5-VL-architecture model (transformers) on the same processes'
   count (`fcp.demo.vlm`): each replica encodes only the video tubelets it holds; --skip-vlm
   leaves it out.

About 40 s on 2 quiet CPU cores after install, 2 minutes at a load average of 4-8 (most of it
process start-up and megatron-core imports); --skip-train leaves out step 3 (~25 s then).
Pictures are never overwritten: a rerun writes plan-1.png, plan-2.png, ... beside the first.
A degenerate ring fit (a bandwidth term or per-step latency fitted as 0, or a ring faster than
the idle link: `ring_fit_problems`) is measured once more and, if it stays so, never used: the
demo plans with the shipped profile of this class of machine (cpu-small, whose ring was
measured with `fcp profile --ring`) and says which cost model it used and why. Planning times
are warm (each strategy plans a tiny batch first, untimed).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from fcp_data.errors import ConfigError, ExecError, MissingDependencyError
from fcp_data.planner import Cluster, CostModel, generate_lengths, why_one_degree
from fcp_data.planner.compare import DEFAULT_STRATEGIES, StrategyResult
from fcp_data.viewer.compare import compare_warm

from ..profiling.ring import ring_fit_problems
from ._args import int_in
from ._output import write_atomic

__all__ = [
    "WHEN_EQUAL",
    "PairedRatio",
    "median_interval",
    "paired_comparison",
    "paired_ratio",
    "register",
    "ring_fit_problems",
    "run",
]

SHIPPED_FOR_CPU = "cpu-small"  # the shipped profile of the machines the demo trains on (gloo)
MIN_PAIRS = 4  # fewer paired steps give no verdict: their interval covers the median <= 75%

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
        help="leave out step 4, the vision-language model (fcp.demo.vlm)",
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
        default=3,
        help="timed rounds of each step's pair, the order alternating (default 3): steps x "
        "repeats paired ratios give the median and its interval",
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
    from fcp_data.viewer import VIEW_STRATEGIES, batch_from_lengths, draw, print_comparison

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


def _idle_link(path: Path, cost: CostModel) -> CostModel:
    """`cost` priced at the idle ping-pong bandwidth its profile measured (the profile's
    "p2p_fit", 3.8 GB/s in the shipped cpu-small), which `ring_fit_problems` compares a ring fit
    with. Without one (or with its bandwidth term fitted as 0) the link is taken as 10^12 B/s,
    so no ring fit is called faster than the idle link on no evidence."""
    try:
        spb = json.loads(path.read_text())["profile"]["p2p_fit"]["coef"]["seconds_per_byte"]
    except (KeyError, TypeError, ValueError):
        spb = 0.0
    link = 1.0 / spb if spb > 0 else 1e12
    return dataclasses.replace(cost, intra_node_bandwidth=link, inter_node_bandwidth=link)


def _ring_price(cost: CostModel) -> str:
    return (
        f"ring {cost.intra_node_bandwidth / 1e6:,.0f} MB/s, β2 {cost.beta2 * 1e3:.1f} ms per "
        "ring step"
    )


def _local_cost(args: argparse.Namespace, out: Path) -> tuple[Path, str]:
    """The profile for this machine's batch and a line saying which was used and why: --cost;
    else cpu-small with the ring timed here; else, when that fit is degenerate twice (or the
    ring hid entirely), the shipped cpu-small as it is, whose ring `fcp profile --ring` measured.
    """
    from fcp_data.profiles import resolve_cost

    from ..profiling import fit_ring, measure_ring, shape_from_name, with_ring

    if args.cost:
        return resolve_cost(args.cost), f"cost model used: {args.cost} (--cost)"
    shipped = resolve_cost(SHIPPED_FOR_CPU)
    base = CostModel.load(shipped)
    fallback = (
        f"cost model used: the shipped {SHIPPED_FOR_CPU} profile ({base.name}; "
        f"{_ring_price(base)}, measured with `fcp profile --ring`)"
    )
    idle = _idle_link(shipped, base)
    t0 = time.perf_counter()
    problems: list[str] = []
    fit = None
    for attempt in range(2):  # a noisy measurement once more; degenerate twice is data
        print(
            f"timing d = 1 and d = 2 ring groups on 2 gloo processes here (~10 s"
            f"{', again' if attempt else ''})",
            flush=True,
        )
        try:
            fit = fit_ring(measure_ring(shape_from_name(SHIPPED_FOR_CPU)), base)
        except ConfigError as exc:  # the ring hid behind compute: nothing to fit
            problems = [str(exc)]
        else:
            problems = ring_fit_problems(fit, idle)
        if not problems:
            break
        print(
            f"fcp demo: warning: the ring fit is degenerate: {'; '.join(problems)}"
            f"{'; measuring once more' if attempt == 0 else ''}",
            file=sys.stderr,
            flush=True,
        )
    if problems or fit is None:
        return shipped, (
            f"{fallback}, not the ring timed here ({time.perf_counter() - t0:.0f} s): both "
            f"fits were degenerate ({problems[0]}), and a degenerate fit is never used"
        )
    cost = with_ring(base, fit)
    path = out / "cost-ring.json"
    cost.save(path)
    worst = max(fit.rows, key=lambda r: r.x)
    return path, (
        f"cost model used: {SHIPPED_FOR_CPU} with the ring timed here "
        f"({time.perf_counter() - t0:.0f} s): a d = 2 group of {int(worst.x):,} tokens exposes "
        f"{worst.measured * 1e3:.0f} ms of communication; {_ring_price(cost)} (shipped: "
        f"{_ring_price(base)}) -> {path}"
    )


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class PairedRatio:
    """The median of paired ratios (static CP's step time over fcp's, > 1: fcp faster) and a
    distribution-free interval for it: [low, high] covers the true median with probability
    `coverage` (from the binomial, no normality assumed; 0.961 for 9 pairs)."""

    n: int
    median: float
    low: float
    high: float
    coverage: float

    @property
    def verdict(self) -> str:
        """ "noise" when the interval holds 1.0, else which strategy was measured faster;
        "too few pairs" below 4 (the whole range of 3 covers the median with 75% only)."""
        if self.n < MIN_PAIRS:
            return "too few pairs"
        if self.low <= 1.0 <= self.high:
            return "noise"
        return "fcp faster" if self.low > 1.0 else "static CP faster"


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest order-statistic interval [x_(k), x_(n+1-k)] whose
    coverage of the median, 1 - 2 P(B <= k - 1) for B ~ Binomial(n, 1/2), is >= `level`.

    Below 6 values no such k exists at 95%, and the whole range is returned with its true
    coverage (1 - 2^(1-n): 0.875 for 4 values), which the caller prints. Ties and skew do not
    matter: only ranks are used, which is why a loaded machine's outliers cannot drag it."""
    x = sorted(values)
    n = len(x)
    if n == 0:
        raise ConfigError("no measured pairs: run at least one step (--steps 1)")

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return x[k - 1], x[n - k], coverage(k)


def paired_ratio(fcp_s: list[float], static_s: list[float], level: float = 0.95) -> PairedRatio:
    """Ratios static_s[i] / fcp_s[i] of paired timings (the same batch back to back), their
    median and its interval (`median_interval`)."""
    if len(fcp_s) != len(static_s):
        raise ConfigError(f"{len(fcp_s)} fcp timings but {len(static_s)} static CP timings")
    bad = [t for t in (*fcp_s, *static_s) if not (t > 0 and math.isfinite(t))]
    if bad:
        raise ConfigError(f"step times must be positive seconds, got {bad[:3]}")
    ratios = [b / a for a, b in zip(fcp_s, static_s)]
    low, high, cov = median_interval(ratios, level)
    return PairedRatio(
        n=len(ratios), median=statistics.median(ratios), low=low, high=high, coverage=cov
    )


def paired_comparison(
    rounds: list[dict[str, list[float]]], predicted: float, same_plan_steps: int
) -> list[str]:
    """Lines on fcp against static CP measured as paired steps, beside the predicted ratio.

    `rounds[r]["strategy_s"][k]` and `["baseline_s"][k]` are one pair (step k, round r);
    `predicted` is the planner's static / fcp ratio on the same batches (median over steps);
    `same_plan_steps` counts steps where both planned the same groups (equal digests), where
    any measured difference is noise by construction."""
    fcp = [t for r in rounds for t in r["strategy_s"]]
    static = [t for r in rounds for t in r["baseline_s"]]
    pr = paired_ratio(fcp, static)
    steps = len(rounds[0]["strategy_s"]) if rounds else 0
    lines = [
        f"measured over {pr.n} paired steps ({steps} batches x {len(rounds)} rounds, each "
        f"batch under both back to back, order alternating): median step fcp "
        f"{statistics.median(fcp):.3f} s, static CP {statistics.median(static):.3f} s; "
        f"paired ratio static/fcp {pr.median:.2f}x, {pr.coverage:.0%} interval "
        f"{pr.low:.2f}-{pr.high:.2f}x"
    ]
    if pr.verdict == "too few pairs":
        lines.append(
            f"  {pr.n} pair(s): too few for a verdict (at least {MIN_PAIRS}: raise --steps or "
            "--repeats)"
        )
    elif pr.verdict == "noise":
        lines.append(
            "  the interval holds 1.0: noise, not a measured difference either way (more "
            "--steps/--repeats, or a quieter machine, narrow it)"
        )
    else:
        lines.append(f"  the whole interval is on one side of 1.0: {pr.verdict}")
    way = "fcp faster" if predicted > 1.0 + 1e-9 else "no difference"
    agree = {
        ("fcp faster", "fcp faster"): "measured and predicted point the same way",
        ("no difference", "noise"): "measured and predicted agree: no difference",
        ("fcp faster", "noise"): "the predicted gain is within the measured noise here",
        ("fcp faster", "too few pairs"): "too few pairs to compare",
        ("no difference", "too few pairs"): "too few pairs to compare",
    }.get((way, pr.verdict), "measured and predicted point different ways")
    lines.append(f"  predicted on the same batches: {predicted:.2f}x ({agree})")
    if same_plan_steps:
        lines.append(
            f"  fcp and static CP planned the same groups in {same_plan_steps} of {steps} "
            "step(s): whatever differs there is run-to-run noise"
        )
    return lines


def _train(args: argparse.Namespace, index: Path, cost: Path) -> dict:
    """Step 3 on `args.replicas` gloo processes (`fcp.demo.launch`): fcp, then static CP on
    the same batches; the report as a dict (`TrainReport`'s fields)."""
    if importlib.util.find_spec("megatron") is None:
        raise MissingDependencyError(
            "training needs megatron-core: pip install 'fcp[megatron]', or pass --skip-train"
        )
    from ..demo import TrainConfig, launch

    cap = 1024  # tokens per replica: the longest sample kept fits the whole cluster
    cfg = TrainConfig(
        replicas=args.replicas,
        steps=args.steps,
        index=str(index),
        seed=args.seed,
        global_batch=16,
        tokens_per_replica=cap,
        max_tokens=cap * args.replicas,
        baseline="static",
        cost=str(cost),
        rounds=args.repeats,
    )
    report = launch(cfg)
    losses = [r["loss"] for r in report.steps]
    print(
        f"{len(losses)} steps on {cfg.replicas} processes in {report.wall_s:.1f} s: loss "
        f"{losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    return dataclasses.asdict(report)


def _train_vlm(args: argparse.Namespace, out: Path) -> str:
    """Step 4 on `args.replicas` gloo processes (`fcp.demo.vlm`): the vision-language example,
    a few steps (~1-2 min)."""
    if importlib.util.find_spec("transformers") is None:
        return "vision-language step skipped: pip install 'transformers>=5' to run it"
    from ..demo import vlm

    argv = [
        "--replicas",
        str(args.replicas),
        "--steps",
        "2",
        "--seed",
        str(args.seed),
        "--out",
        str(out),
    ]
    code = vlm.main(argv)
    if code:
        raise ExecError(f"vision-language training exited with status {code}: {' '.join(argv)}")
    return (
        "vision-language model: each replica encoded only the tubelets it holds (step lines "
        f"above: encoded / whole videos); data, tokenizer and index in {out}"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fcp_data.readers import build_index, make_shards
    from fcp_data.viewer import batch_from_index, summarize, view
    from fcp_data.viewer.saved import plan_document

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
        how,
        f"plan picture of this machine's batch ({cost.name}): {picture.resolve()}",
        f"fcp plan (JSON, `fcp view --plan {plan_path}`): {plan_path.resolve()}",
    ]
    lines += [
        f"  {r.strategy:>16}: predicted makespan {r.makespan:.3f} s ({r.ratio:.2f}x lower bound)"
        for r in results
        if r.plan is not None
    ]
    lines.append(f"  predicted speedup of fcp over static CP: {_speedup(results):.2f}x")
    why = why_one_degree(fcp.plan, cluster, cost)
    if why is not None:
        lines.append(
            f"  fcp planned one degree for every group (d = {fcp.plan.degrees[0]}), as static "
            f"CP does: {why}"
        )
    if not args.skip_train:
        con.rule(f"3. training on {args.replicas} gloo processes: fcp and static CP, paired")
        rep = _train(args, out / "index", cost_path)
        first, last = rep["steps"][0], rep["steps"][-1]
        lines.append(
            f"training: {len(rep['steps'])} steps per strategy, loss {first['loss']:.4f} -> "
            f"{last['loss']:.4f}"
        )
        same = sum(
            a.get("digest") is not None and a.get("digest") == b.get("digest")
            for a, b in zip(rep["steps"], rep["baseline_steps"])
        )
        predicted = statistics.median(
            b["predicted_s"] / a["predicted_s"] for a, b in zip(rep["steps"], rep["baseline_steps"])
        )
        lines += paired_comparison(rep["rounds"], predicted, same)
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
