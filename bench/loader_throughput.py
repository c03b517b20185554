"""Tokens/s delivered by FCPDataLoader vs a plain webdataset DataLoader over the same shards.

Both pipelines read the same text shards (`make_shards`: Python stdlib sources, a long-tailed
code corpus), tokenize with the same byte-level tokenizer and use the same number of DataLoader
workers. The baseline packs each global batch into one THD buffer with cu_seqlens (what a plain
packed loader does); FCPDataLoader also plans the batch (fcp_data.planner), reads by tar offset
and zigzag-shards every sequence over its CP group.

Rows: one replica (it delivers every token), and N replicas run one after another in this
process (each would have its own CPUs in a job), each delivering its own share; the job's
tokens/s = all tokens / the slowest replica's time. FCP on one replica is compared with the
plain loader on one replica; FCP on N replicas with plain data parallelism on N replicas
(replica r reads shards r, r+N, ...). "steady" leaves out worker start-up (time from the first
batch on), which a long epoch amortises. Planning share = planner time / (planner + read +
collate time) inside the workers. Every FCP replica plans every global batch (no collective),
and every member of a degree-d CP group reads and tokenizes the group's whole sequences, so
per-replica work does not shrink by 1/N the way plain data parallelism's does. The "token
store" rows load from an index built with `store_tokens=True`: text ids were written once at
index time, and each replica slices only the zigzag chunks it holds (no tokenizer runs).

    .venv/bin/python bench/loader_throughput.py [--samples 600] [--workers 2] [--replicas 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["ByteTokenizer", "main"]


class ByteTokenizer:
    """utf-8 bytes + 1 as ids: exact, fast, picklable; the same in both pipelines."""

    spec = "bench:bytes+1"

    def __call__(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 1


def _text(sample: dict[str, Any]) -> str:
    if "txt" in sample:
        return sample["txt"].decode("utf-8")
    return json.loads(sample["json"])["text"]


def train_bpe(texts: list[str], vocab_size: int, path: Path) -> Path:
    """A byte-level BPE trained offline on the bench corpus (what a real LLM tokenizer does per
    token: pre-tokenize, merge), saved as tokenizer.json; both pipelines load this one file."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path


class _PlainMap:
    def __init__(self, tok: Any, eod: int) -> None:
        self.tok, self.eod = tok, eod

    def __call__(self, sample: dict[str, Any]) -> torch.Tensor:
        ids = self.tok(_text(sample))
        return torch.from_numpy(np.concatenate([ids, [self.eod]]))


def _pack(seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same fields FCPDataLoader delivers (tokens, labels, loss mask, positions, cu_seqlens)
    for one packed THD buffer, without CP sharding: what a plain packed loader has to build."""
    lens = [len(s) for s in seqs]
    tokens = torch.cat(seqs)
    labels = torch.cat([torch.cat([s[1:], torch.tensor([-100])]) for s in seqs])
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": (labels != -100).float(),
        "position_ids": torch.cat([torch.arange(n) for n in lens]),
        "cu_seqlens": torch.cumsum(torch.tensor([0, *lens]), 0).to(torch.int32),
    }


def _timed(sizes: Any) -> tuple[int, tuple[float, float]]:
    """(sum of sizes, (wall seconds, seconds after the first item arrived)): the second leaves
    out worker start-up, which a long training epoch amortises."""
    t0 = time.perf_counter()
    total, first = 0, None
    for n in sizes:
        if first is None:
            first = time.perf_counter()
        total += n
    t1 = time.perf_counter()
    return total, (t1 - t0, t1 - (first or t0))


def run_plain(
    urls: list[str], gbs: int, workers: int, repeat: int, tok: Any
) -> tuple[int, float, float]:
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .map(_PlainMap(tok, eod=0))
        .batched(gbs, collation_fn=_pack, partial=True)
    )
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=workers, prefetch_factor=2 if workers else None
    )
    for _ in zip(range(2), dl):  # warm-up: page cache, imports
        pass
    times, steady, tokens = [], [], 0
    for _ in range(repeat):
        tokens, s = _timed(int(b["tokens"].numel()) for b in dl)
        times.append(s[0])
        steady.append(s[1])
    return tokens, float(np.median(times)), float(np.median(steady))


def run_plain_dp(
    urls: list[str], n: int, gbs: int, workers: int, repeat: int, tok: Any
) -> dict[str, float]:
    """Plain data parallelism on n replicas: replica r reads shards r, r+n, ... (split_by_node)
    with a per-replica batch of gbs / n; the job waits for the slowest replica."""
    times, steady, total = [], [], 0
    for r in range(n):
        tokens, wall, st = run_plain(urls[r::n], max(1, gbs // n), workers, repeat, tok)
        total += tokens
        times.append(wall)
        steady.append(st)
    return {
        "replicas": n,
        "tokens": total,
        "slowest_s": max(times),
        "tokens_per_s": total / max(times),
        "steady_tokens_per_s": total / max(steady),
    }


def run_fcp(
    index: Any,
    n: int,
    gbs: int,
    workers: int,
    cost: Any,
    repeat: int,
    tok: Any,
    store: bool = False,
) -> dict[str, float]:
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster

    cap = int(index.seqlens.max()) // n + 2 * n + 64
    times, steady, real_tokens, plan_s, load_s, batches = [], [], 0, 0.0, 0.0, 0
    for r in range(n):
        ld = FCPDataLoader(
            index,
            cluster=Cluster(n, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=gbs,
            num_workers=workers,
            tokenizer=tok,
            options=LoaderOptions(shuffle=False, token_store=store),
        )
        for _ in zip(range(2), ld):  # warm-up epoch start (planner kernels, page cache)
            pass
        ld.metrics_history.clear()
        epoch_s, steady_s, tokens = [], [], 0
        for e in range(1, repeat + 1):
            ld.set_epoch(e)
            tokens, (wall, st) = _timed(int(mb.local_cu_seqlens[-1]) for mb in ld)
            epoch_s.append(wall)
            steady_s.append(st)
        real_tokens += tokens
        times.append(float(np.median(epoch_s)))
        steady.append(float(np.median(steady_s)))
        plan_s += sum(m.planning_s for m in ld.metrics_history)
        load_s += sum(m.load_s for m in ld.metrics_history)
        batches = len(ld.metrics_history) // repeat
    return {
        "replicas": n,
        "token_store": store,
        "tokens": real_tokens,
        "slowest_s": max(times),
        "sum_s": sum(times),
        "tokens_per_s": real_tokens / max(times),
        "steady_slowest_s": max(steady),
        "steady_tokens_per_s": real_tokens / max(steady),
        "planning_share": plan_s / max(plan_s + load_s, 1e-12),
        "planning_ms_per_batch": 1e3 * plan_s / max(n * batches * repeat, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="epochs timed; the median is kept")
    ap.add_argument(
        "--tokenizer",
        choices=["bytes", "bpe"],
        default="bytes",
        help="bytes: utf-8 bytes as ids (near-free); bpe: a byte-level BPE (tokenizers library, "
        "vocab 8192) trained on the corpus, the cost a real LLM tokenizer has",
    )
    ap.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "loader_throughput.json")
    )
    args = ap.parse_args(argv)

    import webdataset as wds
    from rich.console import Console
    from rich.table import Table

    from fcp_data.planner import CostModel
    from fcp_data.readers import build_index, make_shards
    from fcp_data.readers.text import CallableCounter

    console = Console(width=120)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_shards(Path(tmp) / "shards", text=args.samples, seed=0, samples_per_shard=64)
        urls = [str(p) for p in paths]
        if args.tokenizer == "bpe":
            from fcp_data.readers.text import as_tokenizer

            texts = [_text(s) for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
            tok: Any = as_tokenizer(train_bpe(texts, 8192, Path(tmp) / "bpe.json"))
            counter = CallableCounter(tok)
        else:
            tok = ByteTokenizer()
            counter = CallableCounter(tok, spec=ByteTokenizer.spec)
        index = build_index(urls, Path(tmp) / "index", counter=counter)
        stored = build_index(urls, Path(tmp) / "stored", counter=counter, store_tokens=True)
        cost = CostModel.from_model("qwen3-1.7b", "cpu")
        plain_tokens, plain_s, plain_steady = run_plain(
            urls, args.global_batch, args.workers, args.repeat, tok
        )
        dp = run_plain_dp(urls, args.replicas, args.global_batch, args.workers, args.repeat, tok)
        rows = [
            run_fcp(
                idx, n, args.global_batch, args.workers, cost, args.repeat, tok, store=idx is stored
            )
            for idx in (index, stored)
            for n in (1, args.replicas)
        ]
    plain_tps, plain_steady_tps = plain_tokens / plain_s, plain_tokens / plain_steady
    result = {
        "samples": args.samples,
        "global_batch": args.global_batch,
        "workers": args.workers,
        "repeat": args.repeat,
        "tokenizer": args.tokenizer,
        "command": "python bench/loader_throughput.py "
        + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "tokens": plain_tokens,
        "plain": {
            "seconds": plain_s,
            "tokens_per_s": plain_tps,
            "steady_seconds": plain_steady,
            "steady_tokens_per_s": plain_steady_tps,
        },
        "plain_dp": dp,
        "fcp": [
            {
                **r,
                "ratio_to_plain": r["tokens_per_s"] / base["tokens_per_s"],
                "steady_ratio_to_plain": r["steady_tokens_per_s"] / base["steady_tokens_per_s"],
            }
            for r, base in zip(
                rows,
                [{"tokens_per_s": plain_tps, "steady_tokens_per_s": plain_steady_tps}, dp] * 2,
            )
        ],
    }
    table = Table(
        title=f"loader throughput: {args.samples} stdlib-text samples, "
        f"{plain_tokens:,} tokens ({args.tokenizer}), global batch {args.global_batch}, "
        f"{args.workers} workers"
    )
    for col in (
        "pipeline",
        "epoch s",
        "tokens/s",
        "x plain",
        "steady x plain",
        "planning",
        "plan ms/batch",
    ):
        table.add_column(col, justify="right" if col != "pipeline" else "left")
    table.add_row(
        "plain, 1 replica", f"{plain_s:.2f}", f"{plain_tps:,.0f}", "1.00", "1.00", "-", "-"
    )
    table.add_row(
        f"plain DP, {dp['replicas']} replicas",
        f"{dp['slowest_s']:.2f}",
        f"{dp['tokens_per_s']:,.0f}",
        "1.00",
        "1.00",
        "-",
        "-",
    )
    for r in result["fcp"]:
        table.add_row(
            f"FCP{' + token store' if r['token_store'] else ''}, {r['replicas']} replica(s)",
            f"{r['slowest_s']:.2f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['ratio_to_plain']:.2f}",
            f"{r['steady_ratio_to_plain']:.2f}",
            f"{100 * r['planning_share']:.1f}%",
            f"{r['planning_ms_per_batch']:.1f}",
        )
    console.print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
