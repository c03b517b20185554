"""Train a small megatron-core GPTModel (RoPE) with FCPDataLoader + fcp_exec on CPU processes.

    python examples/train_megatron.py --replicas 4 --steps 6            # sample shards, 4 procs
    python examples/train_megatron.py --index out/demo/index --no-cp    # + the same without CP
    torchrun --nproc-per-node 4 examples/train_megatron.py --index out/demo/index

Each process is one replica (gloo). Every replica's FCPDataLoader plans the same global batch
(no collective) and yields only its own zigzag shards; `cp_context` binds each wave's CP group
into megatron-core; `FCPCoreAttention` runs exact ring attention; after the last wave the
gradient is summed over all replicas (the loss is divided by the global batch's loss-token
count, so the sum is the exact per-token mean) and Adam steps. Each step prints its plan
(waves, degrees) and the planner's predicted time beside the measured one (the slowest
replica's forward + backward time over the waves, what the prediction covers; the gradient
all-reduce and the optimizer step are not in either). The model has the
shape of the shipped `cpu-small` profile, whose measured coefficients the planner uses.

Text is tokenized 4 bytes to a token (ids hashed into the vocabulary), so token counts equal
`fcp index`'s default `bytes:4` count exactly. Video samples enter as their placeholder tokens:
the vision-token positions are embedded as the placeholder id (no vision encoder yet).
Samples longer than --max-tokens are left out to keep a CPU run to a minute or two.
`--no-cp` then trains the same batches again with every sequence on one replica (degree 1) and
prints the per-step loss difference: ring attention is exact, so it is float rounding only
(the no-CP plan ignores the per-replica token cap: on CPU it is a numerical check).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fcp_exec.launch import free_port

__all__ = ["ChunkTokenizer", "TrainConfig", "TrainReport", "launch", "main", "no_cp_planner"]

TEXT_IDS, EOD, SPECIAL, VISION = 500, 501, 502, 503  # ids 1..500 text, 0 padding


class ChunkTokenizer:
    """4 utf-8 bytes -> one id in 1..500 (a multiplicative hash): ceil(bytes / 4) tokens."""

    spec = "bytes:4"

    def __call__(self, text: str) -> np.ndarray:
        raw = text.encode("utf-8")
        buf = np.frombuffer(raw + b"\0" * (-len(raw) % 4), dtype="<u4").astype(np.uint64)
        return 1 + ((buf * np.uint64(2654435761)) % np.uint64(1 << 32)) % np.uint64(TEXT_IDS)


class CappedSource:
    """A length index seen without its samples longer than `max_tokens` (arrays re-indexed)."""

    def __init__(self, source: Any, max_tokens: int) -> None:
        self._src = source
        self._keep = np.flatnonzero(np.asarray(source.seqlens) <= max_tokens)
        self._n = len(source.seqlens)
        if self._keep.size == 0:
            raise ValueError(f"no sample has <= {max_tokens} tokens; raise --max-tokens")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._src, name)
        if isinstance(value, np.ndarray) and value.shape[:1] == (self._n,):
            return value[self._keep]
        return value

    def read(self, i: int) -> Any:
        return self._src.read(int(self._keep[i]))


def no_cp_planner(seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any) -> Any:
    """Every sequence on one replica (degree 1), dealt longest first to the least loaded."""
    from fcp_data.planner import CPGroup, Plan, Wave

    lens = np.asarray(seqlens, np.int64)
    flags = np.broadcast_to(np.asarray(causal, bool), lens.shape)
    load = np.zeros(cluster.num_replicas)
    owned: list[list[int]] = [[] for _ in range(cluster.num_replicas)]
    for i in np.argsort(-lens, kind="stable"):
        r = int(np.argmin(load))
        owned[r].append(int(i))
        load[r] += cost.group_time(lens[[i]], 1, causal=flags[[i]])
    groups = tuple(
        CPGroup(replicas=(r,), degree=1, sequence_ids=tuple(ids),
                seqlens=tuple(int(x) for x in lens[ids]), causal=tuple(bool(c) for c in flags[ids]),
                predicted_time=cost.group_time(lens[ids], 1, causal=flags[ids]))
        for r, ids in enumerate(owned) if ids
    )  # fmt: skip
    return Plan(num_replicas=cluster.num_replicas, waves=(Wave(groups=groups),),
                predicted_time=max(g.predicted_time for g in groups), lower_bound=0.0,
                strategy="no-cp", winner="no-cp").with_digest()  # fmt: skip


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
    index: str | None = None
    shards: list[str] = field(default_factory=list)
    out: str | None = None
    text: int = 48
    video: int = 8
    no_cp: bool = False
    workers: int = 0


@dataclass(kw_only=True, slots=True)
class TrainReport:
    """Per-step records from rank 0 (loss, waves, degrees, predicted and measured seconds)."""

    steps: list[dict[str, Any]]
    no_cp_steps: list[dict[str, Any]]
    wall_s: float


def _model(seed: int) -> Any:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp_data.profiling import SHAPES
    from fcp_exec.megatron import FCPCoreAttention, fcp_process_groups, keep_rotary_on_cpu

    s = SHAPES["cpu-small"]
    torch.manual_seed(seed)  # same seed on every replica: identical initial weights
    config = TransformerConfig(
        num_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads,
        num_query_groups=s.kv_heads, kv_channels=s.head_dim, ffn_hidden_size=s.ffn,
        gated_linear_unit=True, normalization="RMSNorm", use_cpu_initialization=True,
        attention_dropout=0.0, hidden_dropout=0.0, params_dtype=torch.float32,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=s.vocab,
                     max_sequence_length=1 << 16, position_embedding_type="rope",
                     pg_collection=fcp_process_groups())  # fmt: skip
    keep_rotary_on_cpu(model)
    return model


def _loader(cfg: TrainConfig, rank: int, no_cp: bool) -> Any:
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.profiling import shipped_profile

    if cfg.index:
        from fcp_data.readers import LengthIndex

        src: Any = LengthIndex.open(cfg.index)
    else:
        from fcp_data.loader.source import open_source

        src = open_source(cfg.shards, tokenizer=ChunkTokenizer())
    options = LoaderOptions(eod_id=EOD, special_token_id=SPECIAL, vision_token_id=VISION,
                            planner=no_cp_planner if no_cp else None)  # fmt: skip
    return FCPDataLoader(
        CappedSource(src, cfg.max_tokens), replica=rank, global_batch_size=cfg.global_batch,
        cluster=Cluster(cfg.replicas, tokens_per_replica=cfg.tokens_per_replica),
        cost=CostModel.load(shipped_profile("cpu-small")), seed=cfg.seed,
        num_workers=cfg.workers, tokenizer=ChunkTokenizer(), strategy=cfg.strategy,
        options=options,
    )  # fmt: skip


def _epochs(loader: Any) -> Any:
    """Micro-batches of epoch 0, 1, 2, ... back to back (a short index runs out in 5 steps)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def _train(cfg: TrainConfig, rank: int, world: int, cache: Any, no_cp: bool) -> list[dict]:
    import torch
    import torch.distributed as dist

    from fcp_exec import cp_context
    from fcp_exec.megatron import packed_seq_params

    model = _model(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = _loader(cfg, rank, no_cp)
    records: list[dict] = []
    loss_sum, busy, t_step = torch.zeros(()), 0.0, time.perf_counter()
    for mb in _epochs(loader):
        with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups, verify=not records):
            if not mb.is_empty:
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
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # the DP x CP gradient all-reduce: sum of exact per-token shares
        offset = 0
        for p, g in zip(model.parameters(), grads):
            p.grad = flat[offset : offset + g.numel()].view_as(p)
            offset += g.numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats = torch.tensor([float(loss_sum), busy, time.perf_counter() - t_step])
        dist.all_reduce(stats[:1])
        dist.all_reduce(stats[1:], op=dist.ReduceOp.MAX)
        m = loader.metrics
        assert m is not None
        records.append({"step": len(records) + 1, "loss": float(stats[0]),
                        "waves": m.num_waves, "degrees": sorted(m.degrees, reverse=True),
                        "tokens": m.num_tokens, "predicted_s": m.predicted_time,
                        "measured_s": float(stats[1]), "wall_s": float(stats[2])})  # fmt: skip
        if rank == 0:
            r = records[-1]
            mix = " ".join(f"⟨{d}⟩×{r['degrees'].count(d)}"
                           for d in sorted(set(r["degrees"]), reverse=True))  # fmt: skip
            print(
                f"{'no-cp' if no_cp else 'fcp':>5} step {r['step']}: loss {r['loss']:.4f} | "
                f"{r['tokens']} tokens, {r['waves']} wave(s) {mix} | predicted "
                f"{r['predicted_s']:.3f} s, measured {r['measured_s']:.3f} s",
                flush=True,
            )
        loss_sum, busy, t_step = torch.zeros(()), 0.0, time.perf_counter()
        if len(records) == cfg.steps:
            break
    return records


def worker(cfg: TrainConfig, report: str | None) -> None:
    """One replica's process: RANK / WORLD_SIZE / MASTER_* from the environment (torchrun)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from fcp_exec import CPGroupCache, ReplicaRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != cfg.replicas:
        raise ValueError(f"--replicas {cfg.replicas} but WORLD_SIZE={world}; make them equal")
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    cache = CPGroupCache(ReplicaRanks(world_size=world), capacity=128)
    steps = _train(cfg, rank, world, cache, no_cp=False)
    base = _train(cfg, rank, world, cache, no_cp=True) if cfg.no_cp else []
    if rank == 0 and base:
        for a, b in zip(steps, base):
            print(
                f"step {a['step']}: loss fcp {a['loss']:.6f}, no-cp {b['loss']:.6f}, "
                f"|diff| {abs(a['loss'] - b['loss']):.2e}"
            )
    if rank == 0 and report:
        Path(report).write_text(json.dumps({"steps": steps, "no_cp_steps": base}))
    cache.clear()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _prepare_source(cfg: TrainConfig) -> TrainConfig:
    """Make and index sample shards when the config names no source (before processes start)."""
    if cfg.index or cfg.shards:
        return cfg
    from fcp_data.readers import build_index, make_shards

    root = Path(cfg.out or tempfile.mkdtemp(prefix="fcp-train-"))
    paths = make_shards(root / "shards", text=cfg.text, video=cfg.video, seed=cfg.seed,
                        samples_per_shard=32)  # fmt: skip
    build_index([str(p) for p in paths], root / "index")
    cfg.index = str(root / "index")
    return cfg


def launch(cfg: TrainConfig, *, timeout_s: float = 600.0) -> TrainReport:
    """Run `cfg.replicas` worker processes of this script on one host (what torchrun does:
    RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment); exit codes are checked."""
    cfg = _prepare_source(cfg)
    port = free_port()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report, config = Path(tmp) / "report.json", Path(tmp) / "config.json"
        config.write_text(json.dumps(asdict(cfg)))
        procs = []
        for r in range(cfg.replicas):
            env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "OMP_NUM_THREADS": "1",
                   "WORLD_SIZE": str(cfg.replicas), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "PYTHONWARNINGS": "ignore"}  # fmt: skip
            cmd = [sys.executable, __file__, "--config", str(config), "--report", str(report)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else
                                          subprocess.DEVNULL))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"training did not finish within {timeout_s:.0f} s") from None
        if any(codes):
            for q in procs:
                q.kill()
            raise RuntimeError(f"training processes exited with codes {codes} (see stderr)")
        data = json.loads(report.read_text())
    return TrainReport(steps=data["steps"], no_cp_steps=data["no_cp_steps"],
                       wall_s=time.perf_counter() - t0)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = TrainConfig()
    for name in TrainConfig.__slots__:  # type: ignore[attr-defined]
        v = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(v, bool):
            p.add_argument(flag, action="store_true")
        elif isinstance(v, list):
            p.add_argument(flag, nargs="+", default=[])
        else:
            p.add_argument(flag, type=type(v) if v is not None else str, default=v)
    p.add_argument("--report", help="rank 0 writes the per-step records here (JSON)")
    p.add_argument("--config", help="a TrainConfig as JSON (what `launch` hands its workers)")
    args = vars(p.parse_args(argv))
    report, config = args.pop("report"), args.pop("config")
    cfg = TrainConfig(**(json.loads(Path(config).read_text()) if config else args))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(cfg, report)
        return 0
    out = launch(cfg)
    losses = [r["loss"] for r in out.steps]
    print(
        f"{len(losses)} steps on {cfg.replicas} processes in {out.wall_s:.1f} s: loss "
        f"{losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
