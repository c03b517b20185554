"""Train a tiny transformers Qwen3 with fcp under FSDP2 (fully_shard) or HSDP.

    python examples/train_fsdp.py                          # 2 replicas on this host (torchrun)
    python examples/train_fsdp.py --replicas 4 --hsdp      # 2-D mesh: 2 replicate x 2 shard
    torchrun --nproc-per-node 8 examples/train_fsdp.py --hsdp --shard-size 8 --device cuda
    python examples/train_fsdp.py --index out/index --tokenizer out/tokenizer.json \
        --cost my-profile.json --checkpoint ckpt            # your data, tokenizer and profile
    python examples/train_fsdp.py --index out/index --tokenizer out/tokenizer.json \
        --resume ckpt --checkpoint ckpt                     # continue where ckpt stopped

One process per replica; world size, rank and rendezvous come from torchrun's environment, and
without it the script starts torchrun on this host. Attention is fcp's ring attention
registered in transformers as "fcp_ring"; every decoder layer and the root are fully_shard-ed
(`fcp_exec.fsdp.fully_shard_for_fcp`), which also makes FSDP SUM gradients over the replicas:
the loss is divided by the global batch's loss-token count, so FSDP's default mean would
shrink every step by the number of ranks. Layers are activation-checkpointed (transformers'
own, which FSDP2's hooks stay outside of). Every micro-batch runs, the placeholder of a replica
that sits a wave out included: FSDP all-gathers each layer in the forward, so a rank that
skipped one would leave the others waiting. Without --index, rank 0 writes and indexes text
shards (ids: 4 utf-8 bytes to a token, exactly the index's default `bytes:4` count);
`--tokenizer` (the tokenizer.json or directory your index was counted with) replaces that and
sizes the vocabulary; `--cost` plans with your profile, a shipped name or MODEL@HARDWARE.
Every step prints its loss, loss tokens, the tokens it trained (samples dropped as too long
for the cluster are counted and named on the line, not counted as trained), its plan, wall
time, trained tokens/s and the time it waited for data; the run closes with a summary of the
same counts. `--checkpoint DIR` saves the sharded model and optimizer
(torch.distributed.checkpoint) and the loader's `state_dict()` after the last step;
`--resume DIR` loads them and continues with exactly the batch an uninterrupted run would have
trained next (same world size: another one is refused in one line naming both). CPU/gloo;
`--device cuda` (NCCL, one GPU per process by LOCAL_RANK) was not run on hardware here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

EOD = 501  # text ids are 1..500, 0 pads


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
    p.add_argument("--hsdp", action="store_true", help="2-D mesh: replicate x shard")
    p.add_argument("--shard-size", type=int, default=2, help="ranks per shard group (--hsdp)")
    p.add_argument("--index", help="a length index (fcp index); default: sample data")
    p.add_argument("--out", default="out/train_fsdp", help="where sample data is written")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per replica")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--tokenizer", help="the tokenizer the index was counted with (tokenizer.json "
                   "or a directory); default: 4 bytes a token, the index's bytes:4")  # fmt: skip
    p.add_argument("--cost", default="cpu-small", help="cost model the planner uses: a profile "
                   "JSON, a shipped name (cpu-small) or MODEL@HARDWARE, qwen3-8b@h200")  # fmt: skip
    p.add_argument("--checkpoint", help="directory to save model, optimizer and loader state "
                   "in after the last step")  # fmt: skip
    p.add_argument("--resume", help="directory of a --checkpoint to continue from")
    return p.parse_args(argv)


def load_cost(spec: str) -> object:
    """--cost: a profile file or shipped name, else MODEL@HARDWARE of the analytic presets."""
    from fcp_data.planner import CostModel
    from fcp_data.profiles import resolve_cost

    if "@" in spec and not Path(spec).exists():
        model, _, hardware = spec.partition("@")
        return CostModel.from_model(model, hardware)
    return CostModel.load(resolve_cost(spec))


def load_tokenizer(spec: str | None) -> tuple[object, int, int]:
    """(tokenizer, model vocabulary, eod id) for --tokenizer: eod sits just above the
    tokenizer's own ids (the index never counts special tokens; the loader appends eod)."""
    if spec is None:
        return bytes4_ids, 512, EOD
    from fcp_data.readers.text import as_tokenizer

    tok = as_tokenizer(spec)
    fast = getattr(tok, "fast", None)
    inner = fast.tokenizer if fast is not None else tok.tokenizer
    size = inner.get_vocab_size() if hasattr(inner, "get_vocab_size") else len(inner)
    return tok, -(-(size + 1) // 64) * 64, size


def resume_mismatch(resume: str, world: int) -> str | None:
    """Why a --resume directory cannot continue on `world` processes (None when it can): the
    sharded model and optimizer were saved for the world size loader.json records."""
    meta = Path(resume) / "loader.json"
    if not meta.is_file():
        return f"--resume {resume}: no {meta} (a directory written by --checkpoint)"
    saved = json.loads(meta.read_text())["world_size"]
    if saved != world:
        return (f"--resume {resume} was saved by {saved} processes, this run starts {world}: "
                f"resume with --replicas {saved} (the sharded model and optimizer are laid out "
                "for that many)")  # fmt: skip
    return None


def checkpoint_states(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The sharded model and optimizer states (DTensors) as torch.distributed.checkpoint
    saves and loads them: every rank writes and reads only its own shards."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def sample_index(out: Path) -> None:
    """32 stdlib text samples in two shards and their length index under `out`."""
    from fcp_data.readers import build_index, make_shards

    shards = make_shards(out / "shards", text=32, samples_per_shard=16)
    build_index([str(s) for s in shards], out / "index")


def build_mesh(args: argparse.Namespace, world: int, device: torch.device) -> Any:
    """1-D mesh over every rank (FSDP), or (world / shard-size, shard-size) for HSDP."""
    from torch.distributed.device_mesh import init_device_mesh

    from fcp_data.errors import ConfigError

    if not args.hsdp:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    if args.shard_size < 1 or world % args.shard_size:
        raise ConfigError(
            f"--shard-size {args.shard_size} does not divide the {world} ranks; HSDP needs "
            "replicate x shard = world size (pick a divisor, e.g. the GPUs of one node)"
        )
    shape = (world // args.shard_size, args.shard_size)
    return init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))


def build_model(mesh: Any, device: torch.device, vocab: int = 512) -> torch.nn.Module:
    """A 2-layer Qwen3 (hidden 64), fcp ring attention, checkpointed and fully_shard-ed."""
    import transformers

    from fcp_exec.fsdp import fully_shard_for_fcp
    from fcp_exec.hf import register_attention

    torch.manual_seed(0)  # the same initial weights on every replica
    config = transformers.Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=vocab, max_position_embeddings=1 << 16,
        bos_token_id=0, eos_token_id=EOD, attn_implementation=register_attention(),
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).float().to(device)
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return fully_shard_for_fcp(model, layers=model.model.layers, mesh=mesh)


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> list[dict]:
    from fcp_data import FCPDataLoader
    from fcp_data.loader import LoaderOptions
    from fcp_data.planner import Cluster, format_degrees
    from fcp_exec import CPGroupCache, ReplicaRanks, cp_context
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids

    groups = CPGroupCache(ReplicaRanks(world_size=world))
    tokenizer, vocab, eod = load_tokenizer(args.tokenizer)
    model = build_model(build_mesh(args, world, device), device, vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = FCPDataLoader(
        args.index, cluster=Cluster(world, tokens_per_replica=args.tokens_per_replica),
        cost=load_cost(args.cost), replica=rank, num_workers=args.workers,
        global_batch_size=args.global_batch, tokenizer=tokenizer,
        options=LoaderOptions(eod_id=eod, on_too_long="drop"),  # Cluster: idle="placeholder"
    )  # fmt: skip
    done = 0  # steps of earlier runs (--resume)
    if args.resume:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        why = resume_mismatch(args.resume, world)  # under torchrun started by hand
        if why is not None:
            raise SystemExit(why)
        meta = json.loads((Path(args.resume) / "loader.json").read_text())
        states = checkpoint_states(model, optimizer)
        dcp.load(states, checkpoint_id=str(Path(args.resume) / "model"))
        set_state_dict(model, optimizer, model_state_dict=states["model"],
                       optim_state_dict=states["optimizer"])  # fmt: skip
        loader.load_state_dict(meta["loader"])  # exact: the next micro-batch it would yield
        done = meta["steps"]
    records: list[dict] = []
    loss, idle, t_step, epoch = torch.zeros((), device=device), 0, time.perf_counter(), loader.epoch
    wait, trained = 0.0, 0
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
            with cp_context(mb.rank_plan, groups=groups, wave_groups=mb.wave_groups) as cp:
                mb = mb.to(device)  # every micro-batch runs: FSDP gathers layers in forward
                logits = model(
                    input_ids=mb.tokens[None],
                    position_ids=hf_position_ids(mb),
                    use_cache=False,
                    **hf_attention_kwargs(mb, cp),
                ).logits[0]
                ce = torch.nn.functional.cross_entropy(
                    logits.float(), mb.labels.clamp(min=0), reduction="none"
                )
                wave_loss = (ce * mb.loss_mask).sum() / mb.global_num_loss_tokens
                wave_loss.backward()  # FSDP reduce-scatters here, as a SUM over replicas
                loss, idle = loss + wave_loss.detach(), idle + int(mb.is_placeholder)
                trained += mb.trained_tokens
            if not mb.is_last_wave:
                continue
            optimizer.step()  # the gradients are already summed: no all_reduce_gradients
            optimizer.zero_grad(set_to_none=True)
            stats = torch.tensor([float(loss), idle, trained, time.perf_counter() - t_step,
                                  wait], dtype=torch.float64, device=device)  # fmt: skip
            dist.all_reduce(stats[:3])  # the global per-token loss, placeholders, tokens trained
            dist.all_reduce(stats[3:], op=dist.ReduceOp.MAX)  # the slowest replica
            m = loader.metrics
            r = {"loss": float(stats[0]), "idle": int(stats[1]), "waves": m.num_waves,
                 "tokens": mb.global_num_loss_tokens, "dropped": len(m.skipped),
                 "degrees": sorted(m.degrees, reverse=True), "wall": float(stats[3]),
                 "wait": float(stats[4]), "trained": int(stats[2])}  # fmt: skip
            records.append(r)
            if rank == 0:
                print(
                    f"step {done + len(records)}: loss {r['loss']:.4f} | {r['tokens']} loss "
                    f"tokens, {r['trained']} tokens trained, {m.dropped_note()} | "
                    f"{r['waves']} wave(s) {format_degrees(r['degrees'])}, {r['idle']} "
                    f"placeholder micro-batch(es) | {r['wall']:.3f} s, "
                    f"{r['trained'] / r['wall']:,.0f} tokens/s, data wait {r['wait']:.3f} s "
                    f"| epoch {m.epoch} batch {m.batch_index}",
                    flush=True,
                )
            loss, idle, t_step, wait = torch.zeros((), device=device), 0, time.perf_counter(), 0.0
            trained = 0
            if len(records) == args.steps:
                break
    groups.clear()
    if args.checkpoint:
        import torch.distributed.checkpoint as dcp

        out = Path(args.checkpoint)
        dcp.save(checkpoint_states(model, optimizer), checkpoint_id=str(out / "model"))
        if rank == 0:  # the loader state is the same on every replica: a few integers
            meta = {"loader": loader.state_dict(), "steps": done + len(records),
                    "world_size": world}  # fmt: skip
            tmp = out / ".loader.json.partial"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, out / "loader.json")
            print(f"saved model, optimizer and loader state after step {meta['steps']} to "
                  f"{out}", flush=True)  # fmt: skip
    if rank == 0:  # which attention kernel ran, and why (measured when several could)
        for line in groups.runtime.kernels.report:
            print(line, flush=True)
    return records


def summary(records: list[dict], world: int, layout: str) -> str:
    """The run's totals, counting only what trained (dropped samples are counted apart)."""
    tokens, wall = sum(r["tokens"] for r in records), sum(r["wall"] for r in records)
    wait, trained = sum(r["wait"] for r in records), sum(r["trained"] for r in records)
    return (
        f"{len(records)} steps on {world} replicas ({layout}): loss {records[0]['loss']:.4f} -> "
        f"{records[-1]['loss']:.4f}; {tokens / wall:,.0f} loss tokens/s; "
        f"{sum(r['idle'] for r in records)} placeholder micro-batches; {trained:,} tokens "
        f"trained; {sum(r['dropped'] for r in records)} samples dropped (named on the step "
        f"lines); wall {wall:.2f} s, {trained / wall:,.0f} tokens/s, waited {wait:.2f} s for "
        f"data ({wait / wall:.0%} of the wall time)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" not in os.environ:  # not under torchrun: become it, on this host
        why = resume_mismatch(args.resume, args.replicas) if args.resume else None
        if why is not None:  # one line, before any process starts
            print(f"train_fsdp.py: error: {why}", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.replicas}", __file__, *(argv or sys.argv[1:])]  # fmt: skip
        return subprocess.call(cmd, env={"OMP_NUM_THREADS": "1", **os.environ})
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # processes sharing this host's cores
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_host))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))  # MASTER_ADDR/PORT
    if args.index is None:
        if rank == 0:
            sample_index(Path(args.out))
        dist.barrier()
        args.index = str(Path(args.out) / "index")
    records = train(args, rank, world, device)
    layout = f"HSDP {world // args.shard_size}x{args.shard_size}" if args.hsdp else "FSDP"
    if rank == 0:
        print(summary(records, world, layout), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
