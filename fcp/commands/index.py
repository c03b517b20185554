"""`fcp index SHARDS... -o INDEX`: build a length index (see fcp_data.readers)."""

from __future__ import annotations

import argparse

from fcp_data.errors import ConfigError
from fcp_data.vision.families import RULE_NAMES

from ._args import int_in, non_empty, seconds

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "index",
        help="scan shards (tar, JSONL, Parquet, HF datasets, megatron) and write a length index",
        description=(
            "Scan text/video/image WebDataset shards (paths, globs, brace patterns like "
            "'shard-{000..099}.tar', pipe:CMD) in parallel and write a memory-mapped length "
            "index: per-sample token counts (vision tokens included), attention kind and tar "
            "member offsets, plus a header with the rule, tokenizer and shard fingerprints. "
            "JSON Lines (.jsonl, .jsonl.gz, .jsonl.zst), Parquet, HF datasets save_to_disk "
            "directories and megatron .bin/.idx pairs are indexed too, and a directory is "
            "expanded to its files (docs/formats.md)."
        ),
    )
    p.add_argument("shards", nargs="+", help="shard specs")
    p.add_argument("-o", "--output", required=True, help="index directory to write")
    p.add_argument(
        "--vision-rule",
        default="qwen2.5-vl",
        choices=RULE_NAMES,
        help="vision-token rule (default: qwen2.5-vl, qwen-vl-utils defaults)",
    )
    p.add_argument(
        "--rule-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a rule setting, e.g. num_frames=8 (internvl); repeatable",
    )
    p.add_argument(
        "--tokenizer",
        default="bytes:4",
        help="the model's tokenizer: a local tokenizer.json or a directory with tokenizer files "
        "(needs `tokenizers`; transformers for a directory without tokenizer.json), "
        "py:module:callable, or bytes:R (an estimate: R utf-8 bytes per token; default bytes:4)",
    )
    p.add_argument(
        "--text-field",
        type=non_empty,
        default="text",
        help="text field of .json samples and JSON Lines lines, column of Parquet / HF datasets "
        "(a list of {role, content} turns is a chat sample, e.g. --text-field messages)",
    )
    p.add_argument(
        "--text-special-tokens",
        type=int_in(0, 1 << 20),
        default=1,
        help="end-of-document tokens counted (and appended by the loader) per sample; 0 for "
        "megatron .bin/.idx written with --append-eod, whose ids end in EOD already (default 1)",
    )
    p.add_argument(
        "--video-attention",
        choices=["causal", "full"],
        default="causal",
        help="attention kind recorded for video/image samples (default causal)",
    )
    p.add_argument(
        "--on-error",
        choices=["skip", "raise"],
        default="skip",
        help="skip and record bad samples, or stop at the first (default skip)",
    )
    p.add_argument(
        "--max-consecutive-failures",
        type=int_in(1),
        default=100,
        help="raise after this many bad samples in a row (default 100)",
    )
    p.add_argument(
        "--probe-backend",
        choices=["auto", "decord", "pyav"],
        default="auto",
        help="video probe when a sample has no sidecar (auto: decord, else PyAV)",
    )
    p.add_argument(
        "--probe-timeout",
        type=seconds(),
        default=20.0,
        help="seconds before a video probe is abandoned (default 20)",
    )
    p.add_argument(
        "--stream-timeout",
        type=seconds(),
        default=60.0,
        help="seconds a pipe: command or FIFO may produce nothing before its shard is "
        "abandoned and counted (default 60)",
    )
    p.add_argument(
        "--stream-max-bytes",
        type=int_in(1 << 20, 1 << 50),
        default=16 << 30,
        help="bytes one pipe: command or FIFO may produce before its shard is abandoned and "
        "counted (its members are held in memory; default 16 GiB)",
    )
    p.add_argument(
        "--workers",
        type=int_in(1, 256, why="processes; each holds a tokenizer and a probe child"),
        default=1,
        help="scanning processes (default 1, at most 256)",
    )
    store = p.add_mutually_exclusive_group()
    store.add_argument(
        "--store-tokens",
        action="store_true",
        help="require the token store (the default with a tokenizer file or py: ids) and keep "
        "pre-tokenized .npy ids in it too; refused with a bytes:R estimate",
    )
    store.add_argument(
        "--no-store",
        action="store_true",
        help="do not write the token store that --tokenizer FILE writes by default (every "
        "text sample's ids, tokenized once here, so loader replicas slice the zigzag chunks "
        "they hold instead of tokenizing whole sequences; its disk cost is printed)",
    )
    p.set_defaults(func=run)


def _value(text: str) -> object:
    import msgspec

    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fcp_data.readers.build import build_index
    from fcp_data.readers.scan import ScanConfig

    overrides: dict[str, object] = {}
    for item in args.rule_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--rule-option {item!r} must be KEY=VALUE, e.g. num_frames=8")
        overrides[key] = _value(value)
    causal = args.video_attention == "causal"
    config = ScanConfig(
        vision_rule=args.vision_rule,
        rule_overrides=overrides,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        text_special_tokens=args.text_special_tokens,
        video_causal=causal,
        image_causal=causal,
        probe_backend=args.probe_backend,
        probe_timeout_s=args.probe_timeout,
        stream_timeout_s=args.stream_timeout,
        stream_max_bytes=args.stream_max_bytes,
        on_error=args.on_error,
        max_consecutive_failures=args.max_consecutive_failures,
    )
    index = build_index(
        args.shards,
        args.output,
        config=config,
        workers=args.workers,
        progress=True,
        store_tokens=True if args.store_tokens else False if args.no_store else None,
    )
    console = Console()
    seq = index.seqlens
    files = index.header.skipped_files
    console.print(
        f"[bold]{args.output}[/]: {len(index)} samples from {len(index.header.shards)} shards, "
        f"{int(seq.sum()):,} tokens (max {int(seq.max()) if len(seq) else 0:,}), "
        f"{len(index.skipped)} skipped"
        + (f", {len(files)} files that are not data skipped" if files else "")
        + f"; {_store_line(index, args)}",
        soft_wrap=True,
    )
    for s in index.skipped[:10]:
        console.print(f"  skipped {s.shard}: {s.key}: {s.reason}", soft_wrap=True)
    for f in files[:10]:
        console.print(f"  not data: {f.path} ({f.reason})", soft_wrap=True)
    return 0


def _store_line(index: object, args: argparse.Namespace) -> str:
    """The token store's part of the summary: its disk cost, or why there is none."""
    from pathlib import Path

    from fcp_data.progress import human_bytes
    from fcp_data.readers.token_store import FLAT_NAME, OFFSETS_NAME, TokenStore

    out = Path(args.output)
    if TokenStore.exists(out):
        size = sum((out / n).stat().st_size for n in (FLAT_NAME, OFFSETS_NAME))
        head = TokenStore.open(out).header
        per = f"{head.num_tokens:,} ids as {head.dtype.lstrip('<|')}"
        return f"token store {human_bytes(size)} on disk ({per}; --no-store to skip it)"
    if args.no_store:
        return "no token store (--no-store): loader replicas tokenize whole sequences"
    spec = str(getattr(getattr(index, "header", None), "tokenizer", ""))
    if spec.startswith("bytes:"):
        return f"no token store ({spec} is an estimate: the loader computes its ids)"
    return "no token store (no text the loader would tokenize, or a tokenizer of counts)"
