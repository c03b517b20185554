"""The demo training job: one gloo process per replica, FCPDataLoader + cp_context + ring attention.

Every replica's FCPDataLoader plans the same global batch (no collective) and yields only its
own zigzag shards; `cp_context` binds each wave's CP group into megatron-core; after the last
wave the gradient is summed over all replicas (the loss is divided by the global batch's
loss-token count, so the sum is the exact per-token mean) and Adam steps. Each step records its
plan (waves, degrees) and the planner's predicted time beside the measured one: the slowest
replica's forward + backward time over the waves, what the prediction covers (the gradient
all-reduce and the optimizer step are in neither).

With a `baseline` (e.g. "static": the measured price of one fixed CP degree) the two are
timed as paired steps: each global batch is run by both strategies back to back, each on its
own model copy from the same initial weights, `rounds` times over with the order alternating
(fcp first on even step + round, the baseline first on odd), and only then does each take its
optimizer step. A pair sees the same batch under the same load within about a second, so its
ratio is what the plans differ by; the drift of a shared machine between pairs (one issue
report: 0.858 s against 0.370 s for the same plan a few seconds apart) cancels out of it.
`TrainReport.rounds` holds every round's measured seconds per step, from which `fcp demo`
takes the median paired ratio and its interval. `no_cp` (every sequence at degree 1: ring
attention is exact, so the loss differs by float rounding only) is a separate pass after them.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fcp_data.errors import ConfigError, ExecError

from .parts import build_loader, build_model

__all__ = ["TrainConfig", "TrainReport", "launch", "worker"]


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """One training run. Source: `index` (a length index dir), else `shards`, else sample
    shards made under `out` (make_shards: `text` stdlib files, `video` small mp4 clips)."""

    replicas: int = 4
    steps: int = 6
    global_batch: int = 8
    max_tokens: int = 4096
    tokens_per_replica: int = 1024
    lr: float = 5e-3
    seed: int = 0
    strategy: str = "fcp"
    baseline: str = ""
    cost: str = "cpu-small"
    index: str | None = None
    shards: list[str] = field(default_factory=list)
    out: str | None = None
    text: int = 48
    video: int = 8
    no_cp: bool = False
    workers: int = 0
    rounds: int = 1

    def __post_init__(self) -> None:
        names = ("replicas", "steps", "global_batch", "max_tokens", "tokens_per_replica", "rounds")
        for name in names:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"TrainConfig.{name}={v!r} must be an integer >= 1")


@dataclass(kw_only=True, slots=True)
class TrainReport:
    """Per-step records from rank 0 (loss, waves, degrees, predicted and measured seconds, plan
    digest) of the first round; `rounds` holds every round's measured seconds per step,
    {"strategy_s": [...], "baseline_s": [...], "strategy_first": [...]}: with a baseline,
    strategy_s[k] and baseline_s[k] of one round are a pair, the same batch back to back."""

    steps: list[dict[str, Any]]
    baseline_steps: list[dict[str, Any]]
    no_cp_steps: list[dict[str, Any]]
    wall_s: float
    rounds: list[dict[str, list[float]]] = field(default_factory=list)


def _epochs(loader: Any) -> Iterator[Any]:
    """Micro-batches of epoch 0, 1, 2, ... back to back (a short index runs out in 5 steps)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def _train(
    cfg: TrainConfig, rank: int, cache: Any, strategy: str, no_cp: bool, quiet: bool = False
) -> list[dict]:
    import torch
    import torch.distributed as dist

    from fcp_exec import cp_context
    from fcp_exec.grads import all_reduce_gradients
    from fcp_exec.megatron import packed_seq_params

    model = build_model(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = build_loader(cfg, rank, strategy=strategy, no_cp=no_cp)
    name = "no-cp" if no_cp else strategy
    records: list[dict] = []
    loss_sum, busy, t_step = torch.zeros(()), 0.0, time.perf_counter()
    for mb in _epochs(loader):
        with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups, verify=not records):
            t0 = time.perf_counter()
            out = model(
                mb.tokens[None],
                mb.position_ids[None],
                None,
                labels=mb.labels[None],
                packed_seq_params=packed_seq_params(mb),
            )
            loss = (out[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens
            loss.backward()
            busy += time.perf_counter() - t0
            loss_sum += loss.detach()
        if not mb.is_last_wave:
            continue
        all_reduce_gradients(model)  # a sum: each replica holds exact per-token shares
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats = torch.tensor([float(loss_sum), busy, time.perf_counter() - t_step])
        dist.all_reduce(stats[:1])
        dist.all_reduce(stats[1:], op=dist.ReduceOp.MAX)
        m = loader.metrics
        assert m is not None
        records.append(
            {
                "step": len(records) + 1,
                "loss": float(stats[0]),
                "waves": m.num_waves,
                "degrees": sorted(m.degrees, reverse=True),
                "tokens": m.num_tokens,
                "predicted_s": m.predicted_time,
                "measured_s": float(stats[1]),
                "wall_s": float(stats[2]),
                "digest": m.digest,
            }
        )
        if rank == 0 and not quiet:
            _print_step(name, records[-1])
        loss_sum, busy, t_step = torch.zeros(()), 0.0, time.perf_counter()
        if len(records) == cfg.steps:
            break
    return records


def _print_step(name: str, r: dict[str, Any]) -> None:
    """One step line: loss, tokens, plan (the command line's degree notation), times."""
    from fcp_data.planner import format_degrees

    print(
        f"{name:>6} step {r['step']}: loss {r['loss']:.4f} | {r['tokens']} tokens, "
        f"{r['waves']} wave(s) {format_degrees(r['degrees'])} | predicted "
        f"{r['predicted_s']:.3f} s, measured {r['measured_s']:.3f} s",
        flush=True,
    )


def _batches(loader: Any) -> Iterator[list[Any]]:
    """The micro-batches of one global batch at a time (one per wave), epochs back to back."""
    batch: list[Any] = []
    for mb in _epochs(loader):
        batch.append(mb)
        if mb.is_last_wave:
            yield batch
            batch = []


class _Arm:
    """One side of the paired comparison: its own model copy, optimizer and loader."""

    def __init__(self, cfg: TrainConfig, rank: int, strategy: str) -> None:
        import torch

        self.name = strategy
        self.model = build_model(cfg.seed)  # the same initial weights on both arms
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.loader = build_loader(cfg, rank, strategy=strategy, no_cp=False)
        self.batches = _batches(self.loader)

    def run(self, batch: list[Any], cache: Any, *, verify: bool) -> tuple[float, float]:
        """Forward + backward of one global batch: (this replica's loss share, max busy s)."""
        import torch
        import torch.distributed as dist

        from fcp_exec import cp_context
        from fcp_exec.megatron import packed_seq_params

        self.opt.zero_grad(set_to_none=True)
        loss_sum, t0 = 0.0, time.perf_counter()
        for mb in batch:
            with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups, verify=verify):
                out = self.model(
                    mb.tokens[None],
                    mb.position_ids[None],
                    None,
                    labels=mb.labels[None],
                    packed_seq_params=packed_seq_params(mb),
                )
                loss = (out[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens
                loss.backward()
                loss_sum += float(loss.detach())
        busy = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(busy, op=dist.ReduceOp.MAX)  # also a barrier: passes never overlap
        return loss_sum, float(busy[0])

    def step(self) -> None:
        from fcp_exec.grads import all_reduce_gradients

        all_reduce_gradients(self.model)  # a sum: each replica holds exact per-token shares
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _paired(
    cfg: TrainConfig, rank: int, cache: Any
) -> tuple[list[dict], list[dict], list[dict[str, list[float]]]]:
    """fcp and the baseline on the same global batches as paired steps (module docstring):
    (strategy records, baseline records, rounds of measured seconds)."""
    import torch
    import torch.distributed as dist

    arms = (_Arm(cfg, rank, cfg.strategy), _Arm(cfg, rank, cfg.baseline))
    records: tuple[list[dict], list[dict]] = ([], [])
    rounds = [{"strategy_s": [], "baseline_s": [], "strategy_first": []} for _ in range(cfg.rounds)]
    for k in range(cfg.steps):
        batches = [next(arm.batches) for arm in arms]
        if k == 0:  # one untimed pass each first: neither pays the process's cold start
            for arm, batch in zip(arms, batches):
                arm.run(batch, cache, verify=True)
        losses = [0.0, 0.0]
        for r in range(cfg.rounds):
            first = (k + r) % 2  # 0: the strategy first, 1: the baseline first
            order = (0, 1) if first == 0 else (1, 0)
            seconds = [0.0, 0.0]
            for i in order:
                loss, seconds[i] = arms[i].run(batches[i], cache, verify=False)
                if r == 0:
                    losses[i] = loss
            rounds[r]["strategy_s"].append(seconds[0])
            rounds[r]["baseline_s"].append(seconds[1])
            rounds[r]["strategy_first"].append(float(first == 0))
        for i, arm in enumerate(arms):
            arm.step()
            total = torch.tensor([losses[i]])
            dist.all_reduce(total)
            m = arm.loader.metrics
            assert m is not None
            records[i].append(
                {
                    "step": k + 1,
                    "loss": float(total[0]),
                    "waves": m.num_waves,
                    "degrees": sorted(m.degrees, reverse=True),
                    "tokens": m.num_tokens,
                    "predicted_s": m.predicted_time,
                    "measured_s": rounds[0][("strategy_s", "baseline_s")[i]][-1],
                    "wall_s": sum(rd[("strategy_s", "baseline_s")[i]][-1] for rd in rounds),
                    "digest": m.digest,
                }
            )
            if rank == 0:
                _print_step(arm.name, records[i][-1])
    return records[0], records[1], rounds


def worker(cfg: TrainConfig, report: str | None) -> None:
    """One replica's process: RANK / WORLD_SIZE / MASTER_* from the environment (torchrun)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from fcp_exec import CPGroupCache, ReplicaRanks

    torch.set_num_threads(1)
    logging.getLogger("megatron").setLevel(logging.ERROR)  # GPTModel's deprecation, per rank
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != cfg.replicas:
        raise ConfigError(f"--replicas {cfg.replicas} but WORLD_SIZE={world}; make them equal")
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    cache = CPGroupCache(ReplicaRanks(world_size=world), capacity=128)
    rounds: list[dict[str, list[float]]] = []
    steps: list[dict] = []
    base: list[dict] = []
    if cfg.baseline:  # paired steps: the same batch back to back, alternating order
        steps, base, rounds = _paired(cfg, rank, cache)
    else:
        for r in range(cfg.rounds):
            again = _train(cfg, rank, cache, cfg.strategy, no_cp=False, quiet=r > 0)
            steps = steps or again
            rounds.append({"strategy_s": [s["measured_s"] for s in again], "baseline_s": []})
    no_cp = _train(cfg, rank, cache, cfg.strategy, no_cp=True) if cfg.no_cp else []
    if rank == 0 and no_cp:
        for a, b in zip(steps, no_cp):
            print(
                f"step {a['step']}: loss {cfg.strategy} {a['loss']:.6f}, no-cp {b['loss']:.6f},"
                f" |diff| {abs(a['loss'] - b['loss']):.2e}"
            )
    if rank == 0 and report:
        Path(report).write_text(
            json.dumps(
                {"steps": steps, "baseline_steps": base, "no_cp_steps": no_cp, "rounds": rounds}
            )
        )
    cache.clear()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _prepare_source(cfg: TrainConfig) -> TrainConfig:
    """Make and index sample shards when the config names no source (before processes start)."""
    if cfg.index or cfg.shards:
        return cfg
    from fcp_data.readers import build_index, make_shards

    root = Path(cfg.out or tempfile.mkdtemp(prefix="fcp-train-"))
    paths = make_shards(
        root / "shards", text=cfg.text, video=cfg.video, seed=cfg.seed, samples_per_shard=32
    )
    build_index([str(p) for p in paths], root / "index")
    cfg.index = str(root / "index")
    return cfg


def launch(cfg: TrainConfig, *, timeout_s: float = 600.0) -> TrainReport:
    """Run `cfg.replicas` processes of `python -m fcp.demo` on this host (what torchrun
    does: RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment); exit codes are checked."""
    from fcp.profiling.spawn import free_port

    cfg = _prepare_source(cfg)
    port = free_port()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report, config = Path(tmp) / "report.json", Path(tmp) / "config.json"
        config.write_text(json.dumps(asdict(cfg)))
        procs = []
        for r in range(cfg.replicas):
            env = {
                **os.environ,
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "OMP_NUM_THREADS": "1",
                "WORLD_SIZE": str(cfg.replicas),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONWARNINGS": "ignore",
            }
            cmd = [
                sys.executable,
                "-m",
                "fcp.demo",
                "--config",
                str(config),
                "--report",
                str(report),
            ]
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL)
            )
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise ExecError(f"training did not finish within {timeout_s:.0f} s") from None
        if any(codes):
            for q in procs:
                q.kill()
            raise ExecError(f"training processes exited with codes {codes} (see stderr)")
        data = json.loads(report.read_text())
    return TrainReport(
        steps=data["steps"],
        baseline_steps=data["baseline_steps"],
        no_cp_steps=data["no_cp_steps"],
        wall_s=time.perf_counter() - t0,
        rounds=data.get("rounds", []),
    )
