"""Fine-tune a tiny Qwen3 on chats with TRL's SFTTrainer and fcp: packed, CP of any degree, CPU.

    python examples/sft_trainer.py                       # 2 replicas on this host (torchrun)
    python examples/sft_trainer.py --replicas 4 --steps 8
    python examples/sft_trainer.py --save-steps 2        # checkpoints (model, optimizer, loader)
    python examples/sft_trainer.py --resume              # from the last one, to --steps
    torchrun --nproc-per-node 8 examples/sft_trainer.py --index chat-index --tokenizer tok/ \
        --device cuda                                    # your chats (fcp index --text-field
                                                         # messages) on GPUs (not run here)

A plain SFTTrainer script with three statements changed and four import lines added, each
marked `# fcp` (docs/hf-trainer.md shows the two side by side): the model takes fcp's ring
attention, fcp's loader reads the index and plans every global batch (how many CP groups, the
degree of each, who sits a wave out), and `with_fcp(SFTTrainer)` runs each plan's waves as
one optimizer step. The Trainer keeps
everything else: the optimizer and schedule, DDP, logging, checkpoints.

Without --index, the first process writes a small corpus of our own (one conversation per
Python standard-library module: the user asks what the module is for, the assistant answers
with its docstring, a long-tailed mix of about 40 to 1,600 tokens), trains a byte-level BPE with
ChatML tokens on it (a chat template whose assistant turns are the loss), and indexes it: what
`fcp index out/sft/chats.jsonl -o out/sft/index --text-field messages --tokenizer
out/sft/tokenizer` does. The planner prices plans for the hardware of `--cost` (default
Qwen3-1.7B's shape on H200s: short chats at degree 1, the longest at degree 2 on 2 replicas;
`--cost cpu-small`, the shipped CPU profile, puts every chat at the full degree here), and
the training is exact whatever the plan. One process per replica; world size and rank come
from torchrun's environment, and without it the script starts torchrun on this host. Every
step prints the Trainer's log (loss, grad norm, fcp_loss_tokens, fcp_tokens, fcp_tokens_per_second,
fcp_degrees, TRL's per-token entropy and accuracy); the run closes with a summary.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MODULES = (
    "abc", "argparse", "base64", "bisect", "calendar", "collections", "colorsys", "csv",
    "dataclasses", "datetime", "difflib", "enum", "fnmatch", "fractions", "functools", "getopt",
    "glob", "heapq", "hmac", "html", "inspect", "io", "ipaddress", "itertools", "json",
    "keyword", "logging", "math", "operator", "pathlib", "pickle", "pprint", "queue", "random",
    "re", "sched", "secrets", "shlex", "shutil", "statistics", "string", "struct", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "tokenize", "typing", "uuid", "warnings",
    "weakref", "zipfile", "zlib",
)  # fmt: skip
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (  # ChatML; the assistant's turns (and the final end of text) are the loss
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n"
    "{% if loop.last %}{{ eos_token }}{% endif %}{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="processes without torchrun")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (global batches)")
    p.add_argument("--global-batch", type=int, default=16, help="chats per step")
    p.add_argument("--tokens-per-replica", type=int, default=1024, help="memory cap per replica")
    p.add_argument("--index", help="a length index of chats (fcp index --text-field messages)")
    p.add_argument("--tokenizer", help="the tokenizer directory the index was counted with")
    p.add_argument("--out", default="out/sft", help="sample data, checkpoints")
    p.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--cost",
        default="qwen3-1.7b@h200",
        help="cost model the planner uses: "
        "MODEL@HARDWARE (a preset), a shipped profile (cpu-small) or a profile JSON",
    )
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    return p.parse_args(argv)


def load_cost(spec: str) -> Any:
    """--cost: MODEL@HARDWARE of the analytic presets, else a profile file or shipped name."""
    from fcp_data.planner import CostModel
    from fcp_data.profiles import resolve_cost

    if "@" in spec and not Path(spec).exists():
        return CostModel.from_model(*spec.split("@", 1))
    return CostModel.load(resolve_cost(spec))


def stdlib_chats() -> list[dict[str, Any]]:
    """One conversation per module (its docstring as the answer), a second exchange on one of
    its functions for every third module: a small long-tailed corpus of our own."""
    chats = []
    for i, name in enumerate(MODULES):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        doc = (inspect.getdoc(module) or f"The {name} module.")[:9000]
        turns = [
            {"role": "system", "content": "You answer questions about Python's standard library."},
            {"role": "user", "content": f"What is the Python module {name} for?"},
            {"role": "assistant", "content": doc},
        ]
        funcs = [f for f, v in sorted(vars(module).items()) if inspect.isfunction(v)]
        if i % 3 == 0 and funcs and not funcs[0].startswith("_"):
            f = getattr(module, funcs[0])
            turns += [
                {"role": "user", "content": f"And {name}.{funcs[0]}?"},
                {"role": "assistant", "content": (inspect.getdoc(f) or "Undocumented.")[:2000]},
            ]
        chats.append({"messages": turns})
    return chats


def sample_data(out: Path) -> tuple[str, str]:
    """Chats, a BPE with ChatML tokens trained on them, and their length index under `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from fcp_data.readers import build_index
    from fcp_data.readers.scan import ScanConfig

    out.mkdir(parents=True, exist_ok=True)
    chats = stdlib_chats()
    (out / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    bpe.train_from_iterator((t["content"] for c in chats for t in c["messages"]), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=SPECIALS[0], pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out / "tokenizer")
    # = fcp index out/sft/chats.jsonl -o out/sft/index --text-field messages --tokenizer ...
    config = ScanConfig(text_field="messages", tokenizer=str(out / "tokenizer"))
    build_index(str(out / "chats.jsonl"), out / "index", config=config)
    return str(out / "index"), str(out / "tokenizer")


def train(args: argparse.Namespace) -> Any:
    import torch
    import transformers
    from trl import SFTConfig, SFTTrainer

    from fcp_data import FCPDataLoader, LoaderOptions  # fcp
    from fcp_data.planner import Cluster  # fcp (load_cost: the CostModel)
    from fcp_exec.hf import register_attention  # fcp
    from fcp_exec.hf_trainer import with_fcp  # fcp

    config = SFTConfig(
        output_dir=str(Path(args.out) / "run"),
        use_cpu=args.device == "cpu",
        ddp_backend="gloo" if args.device == "cpu" else None,
        max_steps=args.steps,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        assistant_only_loss=True,
        bf16=False,  # TRL's default is bf16; the CPU run stays in float32
        disable_tqdm=True,  # print every step's log
        report_to=[],
    )  # creating it joins the process group torchrun describes
    index, tok_dir = args.index, args.tokenizer
    if index is None:
        with config.main_process_first(desc="sample data"):  # rank 0 writes, then the others
            out = Path(args.out)
            if not (out / "index").is_dir():
                sample_data(out)
            index, tok_dir = str(out / "index"), str(out / "tokenizer")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(0)  # the same initial weights on every replica
    model = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=-(-len(tokenizer) // 64) * 64,
            max_position_embeddings=1 << 16, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            attn_implementation=register_attention(),  # fcp: ring attention ("fcp_ring")
        )
    )  # fmt: skip
    loader = FCPDataLoader(  # fcp: this replica's packed micro-batches, planned
        index,
        cluster=Cluster(config.world_size, tokens_per_replica=args.tokens_per_replica),
        cost=load_cost(args.cost),
        replica=config.process_index,
        global_batch_size=args.global_batch,
        tokenizer=tokenizer,
        num_workers=1,
        options=LoaderOptions(
            eod_id=tokenizer.eos_token_id, text_field="messages", on_too_long="drop"
        ),
    )
    trainer = with_fcp(SFTTrainer)(  # fcp: with_fcp(...) and fcp_loader=
        model=model, args=config, processing_class=tokenizer, fcp_loader=loader
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    return trainer


def summary(trainer: Any) -> str:
    h = trainer.fcp_history
    tokens, seconds = sum(r.tokens for r in h), sum(r.seconds for r in h)
    degrees = sorted({d for r in h for d in r.degrees}, reverse=True)
    return (
        f"{len(h)} steps on {trainer.args.world_size} replicas: loss {h[0].loss:.4f} -> "
        f"{h[-1].loss:.4f}; degrees used {degrees}; {sum(r.loss_tokens for r in h)} loss tokens "
        f"of {tokens} real tokens; {tokens / seconds:,.0f} tokens/s in forward and backward; "
        f"{sum(r.placeholders for r in h)} placeholder waves on replica 0"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" not in os.environ:  # not under torchrun: become it, on this host
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.replicas}", __file__, *(argv or sys.argv[1:])]  # fmt: skip
        return subprocess.call(cmd, env={"OMP_NUM_THREADS": "1", **os.environ})
    trainer = train(args)
    if trainer.is_world_process_zero() and trainer.fcp_history:
        print(summary(trainer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
