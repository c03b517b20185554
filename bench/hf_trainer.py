"""fcp under TRL's SFTTrainer against TRL's own packing, side by side in one run, on CPU.

    .venv/bin/python bench/hf_trainer.py            # ~3 min on 2 CPU cores
    .venv/bin/python bench/hf_trainer.py --quick    # seconds: a tiny model, 2 steps a mode
Writes bench/results/hf_trainer.json (or -o) and prints two tables.

Measured (one process, float32, one thread by default: on a 2-core box shared with other
work, two OpenMP threads made every step up to 10x slower and the figures noise; a
1-process gloo group so fcp's per-wave path runs as under torchrun): a Qwen3 of 4 layers x
256 trained on a long-tailed text mix (c4's length profile clipped to 16..2,048 tokens, ids of
4 bytes a token, exactly as `fcp index` counted them), three ways, alternating in rounds so
that all see the same machine:

- `trl-bfd`: the plain `trl.SFTTrainer` with TRL's `bfd` packing (padding-free rows of
  `max_length` tokens, one row a step) and no CP, sdpa attention (transformers builds each
  pack's block-diagonal mask from the restarting position ids);
- `fcp-trainer`: `with_fcp(SFTTrainer)` with fcp's loader (one replica: every sequence at
  degree 1, packed THD, fcp's ring attention at degree 1 = its CPU varlen kernel);
- `fcp-loop`: the same loader, model and kernel in a plain loop without any Trainer (the
  README's loop, with what the Trainer does by default too: fused AdamW, gradient clipping at
  1.0): what the integration itself adds is `fcp-trainer` against it. TRL's default
  activation checkpointing is off in both TRL runs, as in the loop (it recomputes each
  layer's forward: about 1.3x the step here).

Each step's wall time is measured from one step's end to the next (data, forward, backward,
optimizer, the Trainer's logging), the first steps of each run left out as warm-up; the figure
is real tokens (no padding) per second, median over the rounds. The issue's goal: the
integration within 5% of TRL's packed step at degree 1.

Predicted (the cost model, no hardware): the mixed-degree plan fcp makes against static CP
(one degree for all, the smallest that fits the longest sequence) for Qwen3-8B on 64 H200s
(8 per node, 16K tokens per replica), global batches of 512 drawn from the length profiles
of the planner's quality grid; the mean and worst ratio of predicted step times.
"""

from __future__ import annotations

import datetime
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import make_parser, out_path, write_json

EOD = 501
MODES = ("trl-bfd", "fcp-trainer", "fcp-loop")
PREDICTED_PROFILES = ("c4", "wikipedia", "github", "longmix")


def bytes4_ids(text: str) -> np.ndarray:
    """4 utf-8 bytes -> one id in 1..500: exactly the index's default `bytes:4` count."""
    raw = text.encode("utf-8")
    buf = np.frombuffer(raw + b"\0" * (-len(raw) % 4), dtype="<u4").astype(np.uint64)
    return (1 + (buf * np.uint64(2654435761) % np.uint64(1 << 32)) % np.uint64(500)).astype(
        np.int64
    )


bytes4_ids.spec = "bytes:4"  # type: ignore[attr-defined]


def corpus(tmp: Path, n: int, max_len: int) -> tuple[str, list[list[int]]]:
    """`n` text samples of c4's long-tailed lengths (16..max_len tokens) in a tar, their index,
    and the same documents as ids + EOD (what TRL gets)."""
    from webdataset import TarWriter

    from fcp_data.planner import generate_lengths
    from fcp_data.readers import build_index

    lens = np.clip(generate_lengths("c4", n, seed=0), 16, max_len)
    rng = np.random.default_rng(0)
    docs, url = [], str(tmp / "corpus.tar")
    with TarWriter(url) as w:
        for i, n_tok in enumerate(lens.tolist()):
            text = "".join(chr(c) for c in rng.integers(97, 123, 4 * int(n_tok)))
            w.write({"__key__": f"s{i:05d}", "txt": text.encode()})
            docs.append([*bytes4_ids(text).tolist(), EOD])
    build_index(url, tmp / "index")
    return str(tmp / "index"), docs


def make_model(shape: dict[str, int]) -> Any:
    import transformers

    from fcp_exec.hf import register_attention

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=512, max_position_embeddings=1 << 15, eos_token_id=EOD, pad_token_id=0,
        **shape,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    model = transformers.Qwen3ForCausalLM(cfg).float()
    return model, register_attention()


def tokenizer() -> Any:
    """A transformers tokenizer over the ids 0..511 (TRL wants one; the ids are ours)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(512)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="0", eos_token=str(EOD))


def step_clock(stamps: list[float]) -> Any:
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stamps.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stamps.append(time.perf_counter())

    return Clock()


def sft_config(out: Path, steps: int, **kw: Any) -> Any:
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(out), use_cpu=True, max_steps=steps, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, bf16=False,
        dataloader_num_workers=0, gradient_checkpointing=False, **kw,
    )  # fmt: skip


def loader(index: str, cfg: dict[str, Any]) -> Any:
    from fcp_data import FCPDataLoader
    from fcp_data.loader import LoaderOptions
    from fcp_data.planner import Cluster, CostModel

    return FCPDataLoader(
        index,
        cluster=Cluster(1, tokens_per_replica=cfg["tokens"]),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=0,
        global_batch_size=cfg["global_batch"],
        num_workers=1,
        tokenizer=bytes4_ids,
        options=LoaderOptions(eod_id=EOD, on_too_long="drop"),
    )


def run_trl(docs: list[list[int]], cfg: dict[str, Any], out: Path) -> tuple[list, list]:
    import datasets
    from trl import SFTTrainer

    model, _ = make_model(cfg["shape"])
    stamps: list[float] = []
    config = sft_config(out, cfg["steps"], packing=True, packing_strategy="bfd",
                        max_length=cfg["tokens"], per_device_train_batch_size=1)  # fmt: skip
    trainer = SFTTrainer(
        model=model, args=config, processing_class=tokenizer(),
        train_dataset=datasets.Dataset.from_dict({"input_ids": docs}),
        callbacks=[step_clock(stamps)],
    )  # fmt: skip
    trainer.train()
    seen = [r["num_tokens"] for r in trainer.state.log_history if "num_tokens" in r]
    tokens = [b - a for a, b in zip([0, *seen], seen)]
    return tokens, [b - a for a, b in itertools.pairwise(stamps)]


def run_fcp_trainer(index: str, cfg: dict[str, Any], out: Path) -> tuple[list, list]:
    from trl import SFTTrainer

    from fcp_exec.hf_trainer import with_fcp

    model, attn = make_model(cfg["shape"])
    model.set_attn_implementation(attn)
    stamps: list[float] = []
    trainer = with_fcp(SFTTrainer)(
        model=model, args=sft_config(out, cfg["steps"]), processing_class=tokenizer(),
        fcp_loader=loader(index, cfg), callbacks=[step_clock(stamps)],
    )  # fmt: skip
    trainer.train()
    walls = [b - a for a, b in itertools.pairwise(stamps)]
    return [r.tokens for r in trainer.fcp_history], walls


def run_fcp_loop(index: str, cfg: dict[str, Any], out: Path) -> tuple[list, list]:
    import torch.distributed as dist

    import fcp_exec
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids
    from fcp_exec.hf_trainer import real_token_mask

    model, attn = make_model(cfg["shape"])
    model.set_attn_implementation(attn)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # the Trainer's
    groups = fcp_exec.CPGroupCache(fcp_exec.ReplicaRanks(world_size=dist.get_world_size()))
    tokens, walls, step_tokens, t = [], [], 0, time.perf_counter()
    for mb in loader(index, cfg):
        with fcp_exec.cp_context(mb.rank_plan, groups=groups, wave_groups=mb.wave_groups) as cp:
            logits = model(input_ids=mb.tokens[None], position_ids=hf_position_ids(mb),
                           use_cache=False, **hf_attention_kwargs(mb, cp)).logits[0]  # fmt: skip
            ce = torch.nn.functional.cross_entropy(
                logits.float(), mb.labels.clamp(min=0), reduction="none"
            )
            ((ce * mb.loss_mask).sum() / mb.global_num_loss_tokens).backward()
        step_tokens += int(real_token_mask(mb).sum())
        if mb.is_last_wave:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the Trainer's default
            optimizer.step()
            optimizer.zero_grad()
            now = time.perf_counter()
            tokens.append(step_tokens)
            walls.append(now - t)
            step_tokens, t = 0, now
            if len(tokens) == cfg["steps"]:
                break
    return tokens, walls


def measured(cfg: dict[str, Any], index: str, docs: list[list[int]], tmp: Path) -> dict:
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(cfg["rounds"]):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            out = tmp / f"{mode}-{r}"
            if mode == "trl-bfd":
                tokens, walls = run_trl(docs, cfg, out)
            elif mode == "fcp-trainer":
                tokens, walls = run_fcp_trainer(index, cfg, out)
            else:
                tokens, walls = run_fcp_loop(index, cfg, out)
            w = cfg["warmup"]
            tok, sec = sum(tokens[w:]), sum(walls[w:])
            runs[mode].append({"tokens": tok, "seconds": sec, "tokens_per_s": tok / sec,
                               "steps": len(walls) - w})  # fmt: skip
            print(f"  round {r} {mode:12s} {tok / sec:9.0f} tokens/s over {len(walls) - w} "
                  f"steps ({tok} tokens)", flush=True)  # fmt: skip
    return {
        m: {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in v), "runs": v}
        for m, v in runs.items()
    }


def predicted(batches: int) -> dict[str, Any]:
    from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch

    cost = CostModel.from_model("qwen3-8b", "h200")
    cluster = Cluster(64, replicas_per_node=8, tokens_per_replica=16384)
    rows = {}
    for profile in PREDICTED_PROFILES:
        ratios, degrees = [], set()
        for seed in range(batches):
            lens = generate_lengths(profile, 512, seed=seed)
            fcp = plan_global_batch(lens, cluster, cost, on_too_long="drop")
            static = plan_global_batch(lens, cluster, cost, strategy="static", on_too_long="drop")
            ratios.append(static.predicted_time / fcp.predicted_time)
            degrees |= set(int(d) for d in fcp.degrees)
        rows[profile] = {"mean": float(np.mean(ratios)), "worst": float(min(ratios)),
                         "best": float(max(ratios)), "fcp_degrees": sorted(degrees)}  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    from fcp.profiling.spawn import free_port

    p = make_parser(__doc__)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see above)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}  # fmt: skip
    cfg: dict[str, Any] = {"shape": shape, "tokens": 4096, "global_batch": 8, "steps": 7,
                           "warmup": 2, "rounds": 3, "samples": 600, "max_len": 2048,
                           "predicted_batches": 8}  # fmt: skip
    if args.quick:
        cfg |= {"shape": {**shape, "hidden_size": 64, "intermediate_size": 128,
                          "num_hidden_layers": 1, "head_dim": 16},
                "tokens": 512, "global_batch": 2, "steps": 2, "warmup": 1, "rounds": 1,
                "samples": 32, "max_len": 256, "predicted_batches": 1}  # fmt: skip
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(minutes=5))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        index, docs = corpus(tmp, cfg["samples"], cfg["max_len"])
        print(f"{len(docs)} documents, {sum(map(len, docs))} tokens; {cfg['rounds']} round(s) "
              f"of {cfg['steps']} steps ({cfg['warmup']} warm-up) per mode, "
              f"{torch.get_num_threads()} thread(s)", flush=True)  # fmt: skip
        meas = measured(cfg, index, docs, tmp)
    dist.destroy_process_group()
    pred = predicted(cfg["predicted_batches"])
    base = meas["trl-bfd"]["tokens_per_s"]
    loop = meas["fcp-loop"]["tokens_per_s"]
    print("\nmeasured on CPU, degree 1 (real tokens per second, median of rounds)")
    print(f"{'mode':14s} {'tokens/s':>10s} {'vs trl-bfd':>11s} {'vs fcp-loop':>12s}")
    for mode in MODES:
        v = meas[mode]["tokens_per_s"]
        print(f"{mode:14s} {v:10.0f} {v / base:10.3f}x {v / loop:11.3f}x")
    print("\npredicted (cost model): static CP step time / fcp's, Qwen3-8B, 64 H200, 16K/replica")
    print(f"{'profile':10s} {'mean':>7s} {'worst':>7s} {'best':>7s}  fcp degrees")
    for prof, row in pred.items():
        print(f"{prof:10s} {row['mean']:6.2f}x {row['worst']:6.2f}x {row['best']:6.2f}x  "
              f"{row['fcp_degrees']}")  # fmt: skip
    import transformers
    import trl

    result = {
        "config": cfg, "measured": meas, "predicted": pred,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__, "python": sys.version.split()[0]},
    }  # fmt: skip
    write_json(out_path(args, "hf_trainer"), result, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
