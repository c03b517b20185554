"""`fcp profile`: measure this machine and fit the cost model the planner uses.

    fcp profile --quick                      # cpu-small shape, ~20 s on 2 cores
    fcp profile --model qwen3-1.7b --layers 1 --lengths 512 1024 2048 4096 -o qwen.json
    fcp profile --model qwen3-8b --device cuda -o h200.json   # a real model's shape: on a GPU
    fcp plan --cost qwen.json ...            # plan with the measured coefficients

Shapes: cpu-small and cpu-medium are for a CPU (seconds per point); the planner's models
(qwen3-8b, llama3-8b, ...) are for a GPU (--device cuda), where one point takes milliseconds
and on a CPU minutes. Progress: a bar on a terminal (points done, rate, time left), one line
per measured point otherwise (logs, CI), with the time left. A --device this machine lacks
(cuda without a driver, cuda:7 on fewer GPUs, npu without torch_npu) is a one-line error
before anything is timed. After the fit, a warning is printed for each sign of a degenerate
fit: a coefficient at 0, no more points than coefficients, or a point off by more than 25%.
An existing output file is never replaced without --overwrite: a profile is minutes of
measurement on a quiet machine (the shipped cpu-small one took ~3 min), and `fcp view` keeps
its pictures the same way; the refusal comes before anything is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fcp_data.errors import ConfigError

from . import _profile_vision as profile_vision
from ._args import int_in

__all__ = ["check_device", "check_output", "register", "run"]

_SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="time attention, per-token layers and P2P here; fit and save a cost model",
        description=(
            "Time attention fwd+bwd (fcp_exec's kernel at d=1) over a grid of sequence lengths, "
            "the per-token layers (projections, SwiGLU MLP, LM head) and two-process P2P "
            "(gloo ping-pong); fit alpha1/alpha2/beta1 and bandwidth/latency by least squares; "
            "print the per-point error table and save a profile CostModel.load reads "
            "(`fcp plan --cost FILE`)."
        ),
    )
    p.add_argument(
        "--model",
        default="cpu-small",
        help="the model whose shape is timed: cpu-small, cpu-medium (CPU) or a planner model "
        "preset, the same names as `fcp plan --model` (qwen3-8b, ...: for a GPU)",
    )
    for flag in _SHAPE_FLAGS:
        p.add_argument(
            f"--{flag.replace('_', '-')}",
            type=int_in(1, 1 << 20),
            dest=flag,
            help=f"override the preset's {flag}",
        )
    p.add_argument(
        "--lengths",
        type=int_in(2, 1 << 20, why="tokens; a longer one exhausts memory in attention"),
        nargs="+",
        help="sequence lengths to time (even; default 256..4096, --quick 256..2048)",
    )
    p.add_argument(
        "--repeats",
        type=int_in(1, 1000),
        help="timed runs per point, median kept (default 3; --ring's groups: 2)",
    )
    p.add_argument(
        "--threads",
        type=int_in(1, 1024),
        default=1,
        help="torch CPU threads (default 1: one replica per core, as the gloo examples run)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="torch device to time on: cpu, cuda, cuda:1, ... (default cpu); not a hardware "
        "preset (that is `fcp plan --hardware`)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="4 lengths, 2 repeats, no full-attention points, 3 P2P sizes (~20 s)",
    )
    p.add_argument("--no-p2p", action="store_true", help="skip the two-process P2P measurement")
    p.add_argument(
        "--head-parallel",
        action="store_true",
        help="also time all-to-alls among 2 processes at the sizes a head-parallel block of the "
        "grid holds, and price the hybrid u x r the shape's heads allow (beta3, a2a_efficiency)",
    )
    profile_vision.add_arguments(p)
    p.add_argument(
        "--ring",
        action="store_true",
        help="also time real d=1 and d=2 groups (fcp_exec's ring attention, 2 gloo processes) "
        "and price the ring by what they expose instead of by an idle ping-pong; for CPU gloo, "
        "where transfers share the cores that compute (~10 s more)",
    )
    p.add_argument(
        "-o", "--output", type=Path, help="profile JSON to write (default out/profile-<model>.json)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the -o file if it exists (without it an existing profile is refused)",
    )
    p.set_defaults(func=run)


def _link_table(title: str, size_column: str, fit: Any) -> Any:
    """A message-size fit (P2P or all-to-all) as a table: measured vs fitted µs per size."""
    from rich.table import Table

    t = Table(title=title)
    for col in (size_column, "measured (µs)", "fitted (µs)", "error"):
        t.add_column(col, justify="right")
    for row in fit.rows:
        t.add_row(
            f"{int(row.x):,}",
            f"{row.measured * 1e6:.1f}",
            f"{row.predicted * 1e6:.1f}",
            f"{row.rel_error:+.1%}",
        )
    return t


def _print_tables(profile: Any, console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"compute fit: t(s) = α1·s² + α2·s + β1  ({profile.cost.name})")
    for col in ("tokens", "attention (ms)", "linear (ms)", "measured (ms)", "fitted (ms)", "error"):
        t.add_column(col, justify="right")
    for pt, row in zip(profile.points, profile.compute.rows):
        t.add_row(
            str(pt.seqlen),
            f"{pt.attention_s * 1e3:.2f}",
            f"{pt.linear_s * 1e3:.2f}",
            f"{row.measured * 1e3:.2f}",
            f"{row.predicted * 1e3:.2f}",
            f"{row.rel_error:+.1%}",
        )
    console.print(t)
    if profile.p2p is not None:
        title = "P2P fit: t(n) = latency + n / bandwidth (2 processes, ping-pong)"
        console.print(_link_table(title, "bytes", profile.p2p))
    if profile.a2a is not None:
        title = "all-to-all fit: t(n) = latency + n_sent / bandwidth (2 processes)"
        console.print(_link_table(title, "bytes sent", profile.a2a))
        console.print(
            f"head-parallel u in {list(profile.cost.head_parallel)}, β3 = "
            f"{profile.cost.beta3 * 1e6:.1f} µs per micro-batch, all-to-all at "
            f"{profile.cost.a2a_efficiency:.2f}x the P2P bandwidth"
        )
    c = profile.cost
    console.print(
        f"α1 = {c.alpha1:.4g} s/token², α2 = {c.alpha2:.4g} s/token, β1 = {c.beta1:.4g} s, "
        f"η = {c.eta_full:.3g}, bandwidth = {c.intra_node_bandwidth / 1e9:.3g} GB/s, "
        f"β2 = {c.beta2 * 1e6:.1f} µs/ring step, α3 = {c.alpha3:.0f} bytes/token; compute "
        f"error max {profile.compute.max_abs_error:.1%}, mean {profile.compute.mean_abs_error:.1%}"
    )


def print_warnings(profile: Any) -> list[str]:
    """Print (to stderr) and return the warnings of a profile's fits."""
    from fcp.profiling import fit_warnings

    found = fit_warnings(profile.compute, "compute fit")
    if profile.p2p is not None:
        found += fit_warnings(profile.p2p, "P2P fit")
    if profile.a2a is not None:
        found += fit_warnings(profile.a2a, "all-to-all fit")
    for w in found:
        print(f"fcp profile: warning: {w}", file=sys.stderr, flush=True)
    return found


def _line_progress(total: int) -> Callable[[str], None]:
    """One line per measured point, for logs: `[3/9] linear s=512 (4.1 s, ~8 s left)`.

    The time left assumes the remaining points take as long as the mean so far (longer
    sequences come later, so it is a lower estimate)."""
    t0, done = time.perf_counter(), [0]

    def step(msg: str) -> None:
        done[0] += 1
        spent = time.perf_counter() - t0
        left = spent / done[0] * (total - done[0])
        tail = f", ~{left:.0f} s left" if done[0] < total else ", done"
        print(f"[{done[0]}/{total}] {msg} ({spent:.1f} s{tail})", flush=True)

    return step


def _measure(config: Any, console: Any) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from fcp.profiling import run_profile

    if not console.is_terminal:
        print(f"profiling {config.shape.name}: {config.num_steps} points", flush=True)
        return run_profile(config, on_step=_line_progress(config.num_steps))
    with Progress(
        TextColumn("[bold]profiling[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(config.shape.name, total=config.num_steps)
        return run_profile(config, on_step=lambda msg: bar.update(task, advance=1, description=msg))


def _ring(profile: Any, shape: Any, console: Any, repeats: int | None = None) -> Any:
    """Replace the ping-pong link price by the ring's exposed cost measured on real groups."""
    from fcp.profiling import (
        fit_ring,
        fit_warnings,
        measure_ring,
        ring_fit_problems,
        with_ring,
    )

    print("timing d=1 and d=2 groups on 2 gloo processes (fcp.profiling.ring_timing)", flush=True)
    rows = measure_ring(shape, repeats=repeats) if repeats else measure_ring(shape)
    fit = fit_ring(rows, profile.cost)
    cost = with_ring(profile.cost, fit, label="ring measured (fcp profile --ring)")
    for r in fit.rows:
        console.print(
            f"  ring s={int(r.x)}: exposed {r.measured * 1e3:.1f} ms, fitted "
            f"{r.predicted * 1e3:.1f} ms ({r.rel_error:+.0%})"
        )
    console.print(
        f"ring: bandwidth {cost.intra_node_bandwidth / 1e6:.0f} MB/s effective, "
        f"β2 = {cost.beta2 * 1e3:.2f} ms per ring step (was "
        f"{profile.cost.intra_node_bandwidth / 1e9:.2f} GB/s, {profile.cost.beta2 * 1e3:.2f} ms)"
    )
    for w in fit_warnings(fit, "ring fit") + ring_fit_problems(fit, profile.cost):
        print(f"fcp profile: warning: {w}", file=sys.stderr, flush=True)
    meta = {**profile.meta, "ring_rows": rows, "ring_fit": fit.coef}
    return dataclasses.replace(profile, cost=cost, meta=meta)


def check_output(out: Path, *, overwrite: bool) -> None:
    """ConfigError (one line, exit 2) when `out` exists and --overwrite was not given.

    Checked before anything is timed: a refusal after minutes of measurement would waste them,
    and a silent replacement would lose a profile taken on a quieter machine."""
    if out.is_dir():
        raise ConfigError(f"-o {out} is a directory; name the profile JSON to write")
    if out.exists() and not overwrite:
        raise ConfigError(
            f"-o {out} exists; pass --overwrite to replace it, or name another file "
            "(a profile is never replaced silently)"
        )


def check_device(spec: str) -> None:
    """ConfigError (one line, exit 2) when torch cannot time on `spec` here.

    Without the check, `--device cuda` on a machine without a driver fails deep inside the
    first timed kernel with torch's RuntimeError and a traceback; `cuda:7` on a 1-GPU machine
    and `npu` without torch_npu likewise. Each is bad input, so it gets the one-line error of
    every other bad flag, naming what this machine has.
    """
    import importlib.util

    import torch

    name = spec.strip().lower()
    if name.split(":")[0] == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            raise ConfigError(
                f"--device {spec}: Ascend NPUs need torch_npu, which is not installed "
                "(pip install 'fcp[npu]'); or use --device cpu"
            )
        import torch_npu  # noqa: F401  # registers the "npu" device type with torch

        _check_count(spec, "npu", torch.npu.is_available(), torch.npu.device_count())
        return
    try:
        dev = torch.device(spec)
    except RuntimeError as exc:
        raise ConfigError(
            f"--device {spec!r} is not a torch device ({exc}); e.g. cpu, cuda, cuda:1, npu"
        ) from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        ok = torch.cuda.is_available()
        _check_count(spec, "cuda", ok, torch.cuda.device_count() if ok else 0)
        return
    try:  # any other backend: one tiny allocation says whether it exists here
        torch.empty(1, device=dev)
    except (RuntimeError, NotImplementedError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--device {spec}: torch cannot use it here ({first})") from None


def _check_count(spec: str, kind: str, available: bool, count: int) -> None:
    """The index in `spec` (default 0) names one of the `count` devices of `kind` here."""
    import torch

    if not available or count < 1:
        if kind == "cuda" and torch.version.cuda is None:
            why = f"this torch ({torch.__version__}) was built without CUDA"
        elif kind == "cuda":
            why = "torch sees no CUDA device (no driver or GPU, or CUDA_VISIBLE_DEVICES hides it)"
        else:
            why = "torch_npu sees no NPU"
        raise ConfigError(
            f"--device {spec}: {why}; profile on a machine that has one, or use --device cpu"
        )
    _, _, index = spec.partition(":")
    if index and not index.isdigit():
        raise ConfigError(f"--device {spec}: the index after ':' must be a number ({kind}:1)")
    if index and int(index) >= count:
        raise ConfigError(
            f"--device {spec}: this machine has {count} {kind} device(s), "
            f"{kind}:0..{kind}:{count - 1}"
        )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fcp.profiling import ProfileConfig, shape_from_name
    from fcp_data.planner import CostModel

    shape = shape_from_name(args.model)
    overrides = {f: getattr(args, f) for f in _SHAPE_FLAGS if getattr(args, f) is not None}
    if overrides:
        shape = dataclasses.replace(shape, name=f"{shape.name}-custom", **overrides)
    kw: dict = {"threads": args.threads, "device": args.device, "p2p": not args.no_p2p}
    kw["head_parallel"] = bool(args.head_parallel)
    if args.lengths:
        kw["seqlens"] = tuple(args.lengths)
    if args.repeats:
        kw["repeats"] = args.repeats
    out = args.output or Path("out") / f"profile-{shape.name}.json"
    check_output(out, overwrite=args.overwrite)
    check_device(args.device)
    config = ProfileConfig.quick(shape, **kw) if args.quick else ProfileConfig(shape=shape, **kw)
    console = Console()
    profile = _measure(config, console)
    _print_tables(profile, console)
    print_warnings(profile)
    if args.ring:
        profile = _ring(profile, shape, console, args.repeats)
    profile_vision.attach_vision(profile, args, console)
    profile.save(out)
    CostModel.load(out)  # what `fcp plan --cost` will do: fail here, not there
    console.print(f"wrote {out} (use it with `fcp plan --cost {out}`)", soft_wrap=True)
    return 0
