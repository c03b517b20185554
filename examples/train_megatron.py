"""Train a small megatron-core GPT with fcp: FCPDataLoader -> cp_context -> ring attention.

    python examples/train_megatron.py                     # 2 replicas on this host (torchrun)
    python examples/train_megatron.py --replicas 4 --steps 8
    python examples/train_megatron.py --tp 2 --sequence-parallel   # 2 replicas of TP = 2
    python examples/train_megatron.py --pp 2                       # megatron's 1F1B schedule
    python examples/train_megatron.py --distributed-optimizer      # megatron DDP + ZeRO-1
    torchrun --nproc-per-node 4 examples/train_megatron.py --index out/index
    python examples/train_megatron.py --index out/index --tokenizer out/tokenizer.json \
        --cost my-profile.json --checkpoint ckpt        # your data, tokenizer and profile
    python examples/train_megatron.py --index out/index --tokenizer out/tokenizer.json \
        --resume ckpt --checkpoint ckpt                 # continue where ckpt stopped

A replica is TP x PP processes (megatron's rank order, TP fastest); world size, rank and
rendezvous come from torchrun's environment, and without it the script starts torchrun on this
host with replicas x TP x PP processes. Every TP and PP rank of a replica builds the loader for
its replica index (the same micro-batches), the layout pads rows for sequence parallel
(`Cluster(tensor_parallel=, sequence_parallel=)`), and with PP > 1 each global batch runs
through megatron's `get_forward_backward_func()`, one micro-batch per wave, after every CP
group of the batch was created (`CPGroupCache.prepare_batch`). The loss is divided by the
global batch's loss-token count, so gradients are SUMMED over replicas (all_reduce_gradients).
Without --index, rank 0 writes and indexes sample shards (stdlib text, small mp4 clips). Text
becomes ids 4 bytes to a token (exactly the index's default `bytes:4` count); video enters as
placeholder ids; `--tokenizer` (the tokenizer.json or directory your index was counted with)
replaces that, and the model's vocabulary grows to fit it. `--cost` plans with your profile
(`fcp profile -o FILE`, or a shipped name such as cpu-small) or a model preset on a hardware
preset (`qwen3-8b@h200`). The model has the shape of the shipped `cpu-small` cost profile.

Every step prints its loss, the loss tokens and the tokens it trained (samples the planner
dropped as too long for the cluster are not counted: they are counted and named on the line
instead), its plan, the predicted and measured forward+backward time, the step's wall time,
trained tokens/s and the time it waited for data (blocked on the loader: planning and loading
that did not overlap compute); the run closes with a summary of the same counts.
`--checkpoint DIR` saves, after the last step, each rank's model and optimizer state with the
loader's `state_dict()` (a few integers: where the next micro-batch comes from); `--resume DIR`
loads them, so the run continues with exactly the batch an uninterrupted run would have
trained next (same replicas and layout: another process count is refused in one line naming
both counts, since the model and optimizer files are per rank; `--steps` counts the steps of
this run). CPU/gloo; `--device cuda` (NCCL, one GPU per process by LOCAL_RANK) was not run on
hardware here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

EOD, SPECIAL, VISION = 501, 502, 503  # text ids are 1..500, 0 pads


def bytes4_ids(text: str) -> np.ndarray:
    """4 utf-8 bytes -> one id in 1..500 (hashed): exactly the index's `bytes:4` count."""
    raw = text.encode("utf-8")
    buf = np.frombuffer(raw + b"\0" * (-len(raw) % 4), dtype="<u4").astype(np.uint64)
    return 1 + (buf * np.uint64(2654435761) % np.uint64(1 << 32)) % np.uint64(500)


bytes4_ids.spec = "bytes:4"  # type: ignore[attr-defined]  # the identity the index recorded


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="processes without torchrun")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (global batches)")
    p.add_argument("--global-batch", type=int, default=8, help="samples per step")
    p.add_argument("--tokens-per-replica", type=int, default=2048, help="memory cap per replica")
    p.add_argument("--index", help="a length index (fcp index); default: sample data")
    p.add_argument("--out", default="out/train_example", help="where sample data is written")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of a replica")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages of a replica (1F1B)")
    p.add_argument("--sequence-parallel", action="store_true", help="megatron SP (needs TP > 1)")
    p.add_argument("--distributed-optimizer", action="store_true",
                   help="megatron DDP (overlapped buckets) + distributed optimizer")  # fmt: skip
    p.add_argument("--tokenizer", help="the tokenizer the index was counted with (tokenizer.json "
                   "or a directory); default: 4 bytes a token, the index's bytes:4")  # fmt: skip
    p.add_argument("--cost", default="cpu-small", help="cost model the planner uses: a profile "
                   "JSON, a shipped name (cpu-small) or MODEL@HARDWARE, qwen3-8b@h200")  # fmt: skip
    p.add_argument("--checkpoint", help="directory to save model, optimizer and loader state "
                   "in after the last step")  # fmt: skip
    p.add_argument("--resume", help="directory of a --checkpoint to continue from")
    args = p.parse_args(argv)
    if args.sequence_parallel and args.tp == 1:
        p.error("--sequence-parallel needs --tp > 1")
    if args.distributed_optimizer and (args.checkpoint or args.resume):
        p.error(
            "--checkpoint/--resume save torch optimizer state; the distributed optimizer "
            "needs megatron's sharded checkpoints, which this example does not write"
        )
    return args


def load_cost(spec: str) -> object:
    """--cost: a profile file or shipped name, else MODEL@HARDWARE of the analytic presets."""
    from fcp_data.planner import CostModel
    from fcp_data.profiles import resolve_cost

    if "@" in spec and not Path(spec).exists():
        model, _, hardware = spec.partition("@")
        return CostModel.from_model(model, hardware)
    return CostModel.load(resolve_cost(spec))


def load_tokenizer(spec: str | None) -> tuple[object, int | None, tuple[int, int, int]]:
    """(tokenizer, model vocabulary or None for the shape's, (eod, special, vision) ids).

    The index counted the tokenizer's own ids, never special tokens; the loader appends eod,
    and the three extra ids sit just above the tokenizer's vocabulary so that none collides
    with text. The vocabulary is rounded up to a multiple of 128 (megatron splits it over TP)."""
    if spec is None:
        return bytes4_ids, None, (EOD, SPECIAL, VISION)
    from fcp_data.readers.text import as_tokenizer

    tok = as_tokenizer(spec)
    fast = getattr(tok, "fast", None)
    inner = fast.tokenizer if fast is not None else tok.tokenizer
    size = inner.get_vocab_size() if hasattr(inner, "get_vocab_size") else len(inner)
    return tok, -(-(size + 3) // 128) * 128, (size, size + 1, size + 2)


def resume_mismatch(resume: str, procs: int) -> str | None:
    """Why a --resume directory cannot continue on `procs` processes (None when it can).

    Each rank saved its own model and optimizer shard (rank-NNNNN.pt), so another process count
    has files for ranks that do not exist or none for ranks that do; the loader's state alone
    would resume elastically, the shards would not."""
    folder = Path(resume)
    if not folder.is_dir():
        return f"--resume {resume}: no such checkpoint directory (written by --checkpoint)"
    saved = len(list(folder.glob("rank-*.pt")))
    if saved != procs:
        return (f"--resume {resume} was saved by {saved} processes, this run starts {procs}: "
                "resume with the replicas, --tp and --pp it was saved with (the model and "
                "optimizer files are per rank)")  # fmt: skip
    return None


def keys_digest(batch: list) -> str:
    """A short hash of the sample keys this rank's micro-batches of one global batch hold."""
    keys = ",".join(k for mb in batch for k in mb.keys)
    return hashlib.blake2b(keys.encode(), digest_size=6).hexdigest()


def sample_index(out: Path) -> None:
    """Sample shards (32 stdlib texts, 4 mp4 clips) and their length index under `out`."""
    from fcp_data.readers import build_index, make_shards

    shards = make_shards(out / "shards", text=32, video=4, samples_per_shard=16, time_scale=0.1)
    build_index([str(s) for s in shards], out / "index")


def build_model(args: argparse.Namespace, device: torch.device,
                vocab: int | None = None) -> torch.nn.Module:  # fmt: skip
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp.profiling import SHAPES
    from fcp_exec.megatron import fcp_gpt_spec, fcp_process_groups, keep_rotary_on_cpu

    s = SHAPES["cpu-small"]
    torch.manual_seed(0)  # the same initial weights on every replica
    config = TransformerConfig(
        num_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads,
        num_query_groups=s.kv_heads, kv_channels=s.head_dim, ffn_hidden_size=s.ffn,
        gated_linear_unit=True, normalization="RMSNorm", use_cpu_initialization=True,
        attention_dropout=0.0, hidden_dropout=0.0, tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp, sequence_parallel=args.sequence_parallel,
        pipeline_dtype=torch.float32, variable_seq_lengths=args.pp > 1,
        moe_token_dispatcher_type="alltoall",  # megatron 0.16 refuses variable lengths otherwise
        calculate_per_token_loss=True,  # the schedule must not divide fcp's loss again
    )  # fmt: skip
    model = GPTModel(config=config, transformer_layer_spec=fcp_gpt_spec(config),
                     vocab_size=vocab or s.vocab, max_sequence_length=1 << 16,
                     position_embedding_type="rope", pg_collection=fcp_process_groups(),
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())  # fmt: skip
    if device.type == "cpu":
        keep_rotary_on_cpu(model)
    return model.to(device)


def run_batch(model: torch.nn.Module, mbs: list, groups: object, args: argparse.Namespace,
              device: torch.device) -> torch.Tensor:  # fmt: skip
    """Forward and backward of one global batch's micro-batches (one per wave, in order).

    Every micro-batch runs, a placeholder too (a replica that sits a wave out): megatron's
    TP and PP collectives need every rank. Returns this rank's loss (0 off the last stage)."""
    from fcp_exec import cp_context
    from fcp_exec.megatron import packed_seq_params

    def forward(mb: object) -> torch.Tensor:
        with cp_context(mb.rank_plan, groups=groups):
            return model(mb.tokens[None], mb.position_ids[None], None, labels=mb.labels[None],
                         packed_seq_params=packed_seq_params(mb))  # fmt: skip

    mbs = [mb.to(device) for mb in mbs]
    if args.pp == 1:
        from fcp_exec.megatron_ddp import wave_sync

        loss = torch.zeros((), device=device)
        for mb in mbs:
            # megatron DDP: no_sync for every wave but the last (its buckets overlap the last)
            with wave_sync(model, mb) if args.distributed_optimizer else contextlib.nullcontext():
                wave_loss = (forward(mb)[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens
                wave_loss.backward()
            loss += wave_loss.detach()
        return loss
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(it: object, model: torch.nn.Module) -> tuple:
        mb = next(it)

        def loss_func(out: torch.Tensor) -> tuple:  # three values: the schedule keeps it as is
            wave_loss = (out[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens
            return wave_loss, torch.tensor(mb.num_loss_tokens), {"loss": wave_loss.detach()}

        return forward(mb), loss_func

    out = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(mbs), model=[model],
        num_microbatches=len(mbs), seq_length=max(mb.num_tokens for mb in mbs),
        micro_batch_size=1, forward_only=False,
    )  # fmt: skip
    return sum((d["loss"] for d in out), torch.zeros((), device=device))


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> list[dict]:
    from megatron.core import parallel_state

    from fcp_data import FCPDataLoader
    from fcp_data.loader import LoaderOptions
    from fcp_data.planner import Cluster, format_degrees
    from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients
    from fcp_exec.megatron import check_layout
    from fcp_exec.megatron_cpu import cuda_on_cpu
    from fcp_exec.megatron_ddp import finish_step

    ranks = ReplicaRanks(world_size=world, tensor_parallel=args.tp, pipeline_parallel=args.pp)
    replica = ranks.position(rank)[0]
    groups = CPGroupCache(ranks)
    tokenizer, vocab, (eod, special, vision) = load_tokenizer(args.tokenizer)
    model = build_model(args, device, vocab)
    config = model.config
    if args.distributed_optimizer:  # megatron reduces (a SUM: calculate_per_token_loss=True)
        from megatron.core.distributed import DistributedDataParallel as DDP
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from fcp_exec.megatron_cpu import cuda_on_cpu

        with cuda_on_cpu(cuda_type_names=True):  # megatron files parameters by CUDA type
            model = DDP(config, DistributedDataParallelConfig(
                overlap_grad_reduce=True, use_distributed_optimizer=True), model)  # fmt: skip
            optimizer = get_megatron_optimizer(
                # torch Adam's defaults, as the other path trains (megatron's own defaults are
                # weight decay 0.01 and gradient clipping at 1.0)
                OptimizerConfig(
                    optimizer="adam",
                    lr=args.lr,
                    weight_decay=0.0,
                    clip_grad=0.0,
                    use_distributed_optimizer=True,
                ),
                [model],
            )
        config.no_sync_func = model.no_sync  # PP: megatron's schedule syncs the last wave only
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    cluster = Cluster(ranks.num_replicas, tokens_per_replica=args.tokens_per_replica,
                      tensor_parallel=args.tp, pipeline_parallel=args.pp,
                      sequence_parallel=args.sequence_parallel,
                      devices_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)))  # fmt: skip
    check_layout(config, cluster, ranks)  # model, planner and ranks agree, or ConfigError
    loader = FCPDataLoader(
        args.index, cluster=cluster, cost=load_cost(args.cost),
        replica=replica, num_workers=1, global_batch_size=args.global_batch,
        tokenizer=tokenizer,
        options=LoaderOptions(eod_id=eod, special_token_id=special, vision_token_id=vision,
                              on_too_long="drop"),  # samples longer than the cluster holds
    )  # fmt: skip
    done = 0  # steps of earlier runs (--resume)
    if args.resume:
        why = resume_mismatch(args.resume, world)  # under torchrun started by hand
        if why is not None:
            raise SystemExit(why)
        state = torch.load(Path(args.resume) / f"rank-{rank:05d}.pt", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # exact: the next micro-batch it would yield
        done = state["steps"]
    # the loss is counted once per replica: on its last stage, TP rank 0
    counts_loss = parallel_state.is_pipeline_last_stage() and ranks.position(rank)[1] == 0
    records: list[dict] = []
    batch, t_step, epoch, wait = [], time.perf_counter(), loader.epoch, 0.0
    while len(records) < args.steps:  # epochs back to back (from the resumed one)
        loader.set_epoch(epoch)
        epoch += 1
        it = iter(loader)
        while True:
            t_wait = time.perf_counter()
            mb = next(it, None)  # blocked here = waiting for data
            wait += time.perf_counter() - t_wait
            if mb is None:
                break
            batch.append(mb)
            if not mb.is_last_wave:
                continue
            groups.prepare_batch(batch)  # every CP group of the batch, before any forward
            t0 = time.perf_counter()
            loss = run_batch(model, batch, groups, args, device)
            busy = time.perf_counter() - t0
            if args.distributed_optimizer:
                finish_step(model)  # finalize_model_grads: DDP's buckets, TP and PP sums
                with cuda_on_cpu(cuda_type_names=True):
                    optimizer.step()  # reduce-scattered gradients in, gathered weights out
                model.zero_grad_buffer()
                optimizer.zero_grad()
            else:
                all_reduce_gradients(model)  # SUM over the replicas' data-parallel group
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            trained = sum(mb.trained_tokens for mb in batch) if counts_loss else 0
            stats = torch.tensor([float(loss) if counts_loss else 0.0, trained, busy,
                                  time.perf_counter() - t_step, wait],
                                 dtype=torch.float64)  # exact token counts  # fmt: skip
            dist.all_reduce(stats[:2])  # the global per-token loss and the tokens trained
            dist.all_reduce(stats[2:], op=dist.ReduceOp.MAX)  # the slowest rank
            m = loader.metrics
            r = {"loss": float(stats[0]), "waves": m.num_waves, "predicted": m.predicted_time,
                 "tokens": mb.global_num_loss_tokens, "dropped": len(m.skipped),
                 "degrees": sorted(m.degrees, reverse=True), "measured": float(stats[2]),
                 "wall": float(stats[3]), "wait": float(stats[4]), "trained": int(stats[1]),
                 "placeholders": sum(b.is_placeholder for b in batch)}  # fmt: skip
            records.append(r)
            if rank == 0:
                print(
                    f"step {done + len(records)}: loss {r['loss']:.4f} | {r['tokens']} loss "
                    f"tokens, {r['trained']} tokens trained, {m.dropped_note()} | "
                    f"{r['waves']} wave(s) {format_degrees(r['degrees'])} | predicted "
                    f"{r['predicted']:.3f} s, measured {r['measured']:.3f} s | wall "
                    f"{r['wall']:.3f} s, {r['trained'] / r['wall']:,.0f} tokens/s, data wait "
                    f"{r['wait']:.3f} s | epoch {m.epoch} batch {m.batch_index}, keys "
                    f"{keys_digest(batch)}",
                    flush=True,
                )
            batch, t_step, wait = [], time.perf_counter(), 0.0
            if len(records) == args.steps:
                break
    groups.clear()
    if args.checkpoint:  # every rank its own shard of the model; the loader state is tiny
        out = Path(args.checkpoint)
        out.mkdir(parents=True, exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "loader": loader.state_dict(), "steps": done + len(records),
                 "world_size": world}  # fmt: skip
        tmp = out / f".rank-{rank:05d}.pt.partial"
        torch.save(state, tmp)
        os.replace(tmp, out / f"rank-{rank:05d}.pt")  # never a half-written checkpoint
        if rank == 0:
            (out / "loader.json").write_text(json.dumps(state["loader"], indent=1))
            print(f"saved model, optimizer and loader state after step {state['steps']} to "
                  f"{out}", flush=True)  # fmt: skip
    if rank == 0:  # which attention kernel ran, and why (measured when several could)
        for line in groups.runtime.kernels.report:
            print(line, flush=True)
    return records


def summary(records: list[dict], world: int) -> str:
    """The run's totals, counting only what trained (dropped samples are counted apart)."""
    pred, meas = sum(r["predicted"] for r in records), sum(r["measured"] for r in records)
    tokens, wall = sum(r["tokens"] for r in records), sum(r["wall"] for r in records)
    wait, trained = sum(r["wait"] for r in records), sum(r["trained"] for r in records)
    return (
        f"{len(records)} steps on {world} replicas: loss {records[0]['loss']:.4f} -> "
        f"{records[-1]['loss']:.4f}; forward+backward predicted {pred:.2f} s, measured "
        f"{meas:.2f} s ({meas / pred:.2f}x); {tokens / wall:,.0f} loss tokens/s; "
        f"{trained:,} tokens trained; {sum(r['dropped'] for r in records)} samples dropped "
        f"(named on the step lines); wall {wall:.2f} s, {trained / wall:,.0f} tokens/s, waited "
        f"{wait:.2f} s for data ({wait / wall:.0%} of the wall time)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" not in os.environ:  # not under torchrun: become it, on this host
        procs = args.replicas * args.tp * args.pp
        why = resume_mismatch(args.resume, procs) if args.resume else None
        if why is not None:  # one line, before any process starts
            print(f"train_megatron.py: error: {why}", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={procs}", __file__, *(argv or sys.argv[1:])]  # fmt: skip
        return subprocess.call(cmd, env={"OMP_NUM_THREADS": "1", **os.environ})
    # megatron warns once per process that TransformerEngine and Apex are absent (it falls
    # back to torch, which is what runs here) and logs GPTModel's deprecation: not this run's
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    logging.getLogger("megatron").setLevel(logging.ERROR)
    from megatron.core import parallel_state

    from fcp_exec.megatron_cpu import cuda_on_cpu  # megatron's SP/PP layers allocate on CUDA

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # processes sharing this host's cores
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_host))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))  # MASTER_ADDR/PORT
    # context-parallel size 1: fcp binds each wave's CP group; the DP group is every replica
    parallel_state.initialize_model_parallel(args.tp, args.pp)
    if args.index is None:
        if rank == 0:
            sample_index(Path(args.out))
        dist.barrier()
        args.index = str(Path(args.out) / "index")
    with cuda_on_cpu() if device.type == "cpu" else contextlib.nullcontext():
        records = train(args, rank, world, device)
    if rank == 0:
        print(summary(records, world // (args.tp * args.pp)), flush=True)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
