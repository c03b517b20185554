"""`python -m fcp.demo.vlm`: a tiny Qwen2.5-VL-architecture model trained through fcp.

    python -m fcp.demo.vlm --replicas 4 --steps 3          # launches 4 local processes
    torchrun --nproc-per-node 4 -m fcp.demo.vlm --out out/vlm   # after a first prepare run

What `fcp demo` runs after the megatron job, and what examples/train_vlm.py shows. Data: the
demo's stdlib text and mp4 shards, indexed under the qwen2.5-vl rule with a byte-level BPE
tokenizer trained here (vocab 400 + Qwen's vision special tokens). Model: transformers'
`Qwen2_5_VLForConditionalGeneration`, randomly initialised (2 decoder layers, a 2-block ViT:
one window block, one full block), its decoder running fcp ring attention ("fcp_ring"). Per
micro-batch each replica encodes only the tubelets whose tokens it holds
(`fcp_exec.vision.encode_and_scatter`) and no collective moves vision embeddings; gradients are
summed over replicas. Per step rank 0 prints the plan, the tubelets each replica encoded beside
what encoding every held video whole on every member would cost, and the planner's predicted
time (language model, cpu-small profile) beside the measured forward + backward time, the
step's wall time, tokens/s and the time it waited for data; the run closes with a summary.
Your own data: `--index` (a qwen2.5-vl index) with `--tokenizer` (the tokenizer it was counted
with, holding Qwen's vision special tokens); `--cost` plans with your profile or a shipped name.
`--checkpoint DIR` saves model, optimizer and the loader's `state_dict()` after the last step,
`--resume DIR` continues from them with the batch an uninterrupted run would train next.
gloo on CPU; NCCL with --device cuda (one GPU per process by LOCAL_RANK; not run here).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

from fcp_data.errors import ConfigError, StateError

__all__ = ["main", "make_tokenizer", "prepare", "tiny_qwen25_vl"]

SPECIALS = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|image_pad|>"]


def make_tokenizer() -> Any:
    """A byte-level BPE (vocab 400, trained on stdlib text) plus Qwen's vision special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from fcp_data.readers.synth import stdlib_sources

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [p.read_text(errors="replace")[:4000] for p in stdlib_sources()[:40]]
    corpus += ["a 96x64 clip of 40 frames of moving gradients, number 3"] * 10
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def prepare(
    out: Path, *, text: int, video: int, seed: int, shards: list[str] | None = None
) -> tuple[Path, Path]:
    """Shards (the demo's, or `shards`), tok.json and the qwen2.5-vl length index under `out`."""
    from fcp_data.readers import build_index, make_shards
    from fcp_data.readers.scan import ScanConfig

    index, tok_path = out / "index", out / "tok.json"
    if index.exists() and tok_path.exists():
        return index, tok_path
    if shards is None:
        paths = make_shards(out / "shards", text=text, video=video, seed=seed)
        shards = [str(p) for p in paths]
    tok = make_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_path))
    cfg = ScanConfig(vision_rule="qwen2.5-vl", on_error="raise")
    build_index(shards, index, config=cfg, counter=tok)
    return index, tok_path


def tiny_qwen25_vl(tok: Any, seed: int) -> Any:
    """Qwen2.5-VL architecture at toy size (fp32), decoder on fcp ring attention."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from fcp_exec.hf import register_attention

    torch.manual_seed(seed)
    ids = {n: tok.token_to_id(n) for n in SPECIALS}
    missing = [n for n, i in ids.items() if i is None]
    if missing:
        raise ConfigError(f"the tokenizer has no {missing}: Qwen2.5-VL's vision tokens are needed")
    vocab = max(512, -(-tok.get_vocab_size() // 64) * 64)  # the sample tokenizer's: 512
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=vocab,
            max_position_embeddings=32768,
            rope_scaling={"type": "mrope", "mrope_section": [4, 2, 2]},
            bos_token_id=0,
            eos_token_id=0,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            tokens_per_second=2,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        vision_start_token_id=ids["<|vision_start|>"],
        video_token_id=ids["<|video_pad|>"],
        image_token_id=ids["<|image_pad|>"],
        bos_token_id=0,
        eos_token_id=0,
    )
    model = Qwen2_5_VLForConditionalGeneration(cfg).float()
    model.set_attn_implementation({"text_config": register_attention()})
    return model


def _step_line(step: int, loss: float, m: Any, rows: Any, measured: float) -> str:
    from fcp_data.planner import format_degrees  # the command line's degree notation

    mix = format_degrees(m.degrees)
    enc = " ".join(f"r{r}:{int(a)}/{int(b)}" for r, (a, b) in enumerate(rows.tolist()))
    return (
        f"step {step}: loss {loss:.4f} | {m.num_waves} wave(s) {mix} | tubelets encoded / "
        f"whole videos per replica {enc} | predicted {m.predicted_time:.3f} s, measured "
        f"{measured:.3f} s"
    )


def _summary(records: list[tuple[float, float, float, int]], world: int) -> str:
    """The closing line: steps, loss first -> last, wall time, tokens/s, time waiting for data."""
    wall = sum(r[1] for r in records)
    wait = sum(r[2] for r in records)
    tokens = sum(r[3] for r in records)
    return (
        f"{len(records)} steps on {world} replicas: loss {records[0][0]:.4f} -> "
        f"{records[-1][0]:.4f}; wall {wall:.2f} s, {tokens / wall:,.0f} tokens/s, waited "
        f"{wait:.2f} s for data ({wait / wall:.0%} of the wall time)"
    )


def train(args: argparse.Namespace) -> None:
    """One replica (RANK / WORLD_SIZE from the environment)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from tokenizers import Tokenizer

    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.profiles import resolve_cost
    from fcp_data.readers import LengthIndex
    from fcp_data.vision import VisionOptions, vision_work_from_index
    from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients, cp_context
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids
    from fcp_exec.vision import encode_and_scatter

    from .parts import CappedSource

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)
    tok = Tokenizer.from_file(args.tokenizer or str(Path(args.out) / "tok.json"))
    index = LengthIndex.open(args.index or Path(args.out) / "index")
    # a sample longer than the whole cluster holds cannot be planned: leave it out
    src = CappedSource(index, min(args.max_tokens, world * args.tokens_per_replica))
    units = vision_work_from_index(src).units  # whole-video tubelets per (kept) sample
    model = tiny_qwen25_vl(tok, args.seed).to(dev)
    lm, visual = model.model.language_model, model.model.visual
    pad_ids = (model.config.image_token_id, model.config.video_token_id)  # the hook checks them
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = FCPDataLoader(
        src,
        replica=rank,
        global_batch_size=args.global_batch,
        seed=args.seed,
        num_workers=0,
        cluster=Cluster(world, tokens_per_replica=args.tokens_per_replica),
        cost=CostModel.load(resolve_cost(args.cost)),
        tokenizer=tok,
        options=LoaderOptions(
            vision=VisionOptions(tokens_per_second=2), decode_backend=args.decode_backend
        ),
    )
    cache = CPGroupCache(ReplicaRanks(world_size=world), capacity=64)
    done = 0  # steps of the run --resume continues
    if args.resume:  # every replica holds the same weights: one file serves them all
        state = torch.load(Path(args.resume) / "vlm.pt", map_location=dev, weights_only=False)
        if state["world_size"] != world:
            raise StateError(
                f"--resume {args.resume} was saved by {state['world_size']} "
                f"replicas, this run has {world}"
            )
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # exact: the next micro-batch it would yield
        done = state["steps"]
    step, busy, loss_sum = done, 0.0, torch.zeros((), device=dev)
    enc = torch.zeros(2, dtype=torch.int64, device=dev)  # (tubelets encoded, whole videos)
    records: list[tuple[float, float, float, int]] = []  # (loss, wall, data wait, tokens)
    it, wait, t_step = iter(loader), 0.0, time.perf_counter()
    while True:
        t_wait = time.perf_counter()
        mb = next(it, None)  # blocked here = waiting for data
        wait += time.perf_counter() - t_wait
        if mb is None:
            break
        with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
            mb = mb.to(dev)
            t0 = time.perf_counter()
            embeds = encode_and_scatter(
                visual, mb, lm.embed_tokens(mb.tokens), group=cp.group, pad_ids=pad_ids
            )
            hidden = lm(
                inputs_embeds=embeds[None],
                position_ids=hf_position_ids(mb),
                **hf_attention_kwargs(mb, cp),
            ).last_hidden_state
            logits = model.lm_head(hidden)[0]
            ce = torch.nn.functional.cross_entropy(logits, mb.labels.clamp(min=0), reduction="none")
            loss = (ce * mb.loss_mask).sum() / mb.global_num_loss_tokens
            loss.backward()
            busy += time.perf_counter() - t0
            loss_sum += loss.detach()
            whole = int(np.sum(units[list(mb.sample_ids)]))
            enc += torch.tensor([mb.vision_units, whole], device=dev)
        if not mb.is_last_wave:
            continue
        all_reduce_gradients(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        dist.all_reduce(loss_sum)
        t = torch.tensor([busy, time.perf_counter() - t_step, wait], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest replica
        rows = [torch.zeros_like(enc) for _ in range(world)]
        dist.all_gather(rows, enc)
        m = loader.metrics
        records.append((float(loss_sum), float(t[1]), float(t[2]), m.num_tokens))
        if rank == 0:
            print(
                _step_line(step, float(loss_sum), m, torch.stack(rows).cpu(), float(t[0]))
                + f" | wall {float(t[1]):.3f} s, {m.num_tokens / float(t[1]):,.0f} tokens/s, "
                f"data wait {float(t[2]):.3f} s",
                flush=True,
            )
        busy, loss_sum = 0.0, torch.zeros((), device=dev)
        wait, t_step = 0.0, time.perf_counter()
        enc.zero_()
        if step - done == args.steps:
            break
    if rank == 0 and records:
        print(_summary(records, world), flush=True)
    if rank == 0 and args.checkpoint:
        out = Path(args.checkpoint)
        out.mkdir(parents=True, exist_ok=True)
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "loader": loader.state_dict(),
            "steps": step,
            "world_size": world,
        }
        torch.save(state, out / ".vlm.pt.partial")
        os.replace(out / ".vlm.pt.partial", out / "vlm.pt")  # never a half-written checkpoint
        print(f"saved model, optimizer and loader state after step {step} to {out}", flush=True)
    cache.clear()
    dist.destroy_process_group()


def parse(argv: list[str] | None) -> argparse.Namespace:
    from fcp_data.vision.decode import BACKENDS

    p = argparse.ArgumentParser(
        prog="python -m fcp.demo.vlm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--replicas", type=int, default=4, help="local processes (without torchrun)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--tokens-per-replica", type=int, default=1024)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="longer samples are left out (at most replicas x tokens per replica)",
    )
    p.add_argument("--text", type=int, default=24, help="text samples in the sample shards")
    p.add_argument("--video", type=int, default=8, help="mp4 clips in the sample shards")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/vlm", help="shards, tokenizer and index go here")
    p.add_argument("--index", help="your qwen2.5-vl length index (default: sample data in --out)")
    p.add_argument("--tokenizer", help="the tokenizer.json --index was counted with")
    p.add_argument("--cost", default="cpu-small", help="cost profile: a JSON or a shipped name")
    p.add_argument("--checkpoint", help="directory to save model, optimizer and loader state in")
    p.add_argument("--resume", help="directory of a --checkpoint to continue from")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--decode-backend",
        default="auto",
        choices=BACKENDS,
        help="video decoder of the loader (default: the fastest that loads)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="launcher deadline (seconds)")
    args = p.parse_args(argv)
    if (args.index is None) != (args.tokenizer is None):
        p.error("--index and --tokenizer go together: the index counts that tokenizer's ids")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        train(args)
        return 0
    import subprocess

    from fcp.profiling.spawn import free_port

    if args.index is None:
        prepare(Path(args.out), text=args.text, video=args.video, seed=args.seed)
    port, procs = free_port(), []
    for r in range(args.replicas):
        env = {
            **os.environ,
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "OMP_NUM_THREADS": "1",
            "WORLD_SIZE": str(args.replicas),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONWARNINGS": "ignore",
        }
        cmd = [
            sys.executable,
            "-m",
            "fcp.demo.vlm",
            *(argv if argv is not None else sys.argv[1:]),
        ]
        out = None if r == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(cmd, env=env, stdout=out))
    deadline, codes = time.monotonic() + args.timeout, []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(-9)
    for p in procs:
        if p.poll() is None:
            p.kill()
    if any(codes):
        print(f"vlm training processes exited with codes {codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
