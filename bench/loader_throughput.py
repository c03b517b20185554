"""Tokens/s delivered by FCPDataLoader vs plain webdataset DataLoaders over the same corpus.

One run measures, on 1 replica and on N replicas (N = `--replicas`, 4 by default):

* plain: webdataset + torch DataLoader over the text shards, tokenizing each sample with the
  same tokenizer file FCP uses (a byte-level BPE trained on the corpus by the `tokenizers`
  library, the per-token cost a real LLM tokenizer has; `--tokenizer bytes` for utf-8 bytes);
* pre-tokenized: the same pipeline over tar shards of `.npy` ids written from the same
  tokenizer (no tokenizer at load time: the floor any loader pays to read and pack);
* FCP by default: an index built by `fcp index SHARDS --tokenizer bpe.json` with no other
  flag, which now writes the token store, loaded with `tokenizer="bpe.json"`;
* FCP --no-store: the same index without the store (every member of a degree-d CP group then
  tokenizes its group's whole sequences).

Every pipeline packs each global batch into one THD buffer with cu_seqlens and the same fields
(tokens, labels, loss mask, positions); FCP also plans the batch and zigzag-shards every
sequence over its CP group. N replicas run one after another in this process (each would have
its own CPUs in a job): plain DP gives replica r the shards r, r+N, ... and a batch of G/N; the
job's tokens/s = all tokens / the slowest replica's time, so FCP on N replicas over plain on N
is the per-replica ratio. "steady" leaves out worker start-up (time from the first batch on).
The load average (1 min) is read before and after and written with the date and command.

    .venv/bin/python bench/loader_throughput.py [--samples 400] [--workers 2] [--replicas 4] \
        [--quick] [-o out.json]
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import ByteTokenizer, console, make_parser, out_path, write_json

__all__ = ["main", "write_pretokenized"]


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
    """A text sample -> its ids + EOD (tokenized here, per sample: what a plain loader does)."""

    def __init__(self, tok: Any, eod: int) -> None:
        self.tok, self.eod = tok, eod

    def __call__(self, sample: dict[str, Any]) -> torch.Tensor:
        ids = np.asarray(self.tok(_text(sample)), dtype=np.int64)
        return torch.from_numpy(np.concatenate([ids, [self.eod]]))


class _IdsMap:
    """A pre-tokenized sample (`.npy` ids) -> its ids + EOD: no tokenizer at load time."""

    def __init__(self, eod: int) -> None:
        self.eod = eod

    def __call__(self, sample: dict[str, Any]) -> torch.Tensor:
        ids = np.load(io.BytesIO(sample["npy"]), allow_pickle=False).astype(np.int64)
        return torch.from_numpy(np.concatenate([ids, [self.eod]]))


def write_pretokenized(urls: list[str], tok: Any, out: Path) -> list[str]:
    """Tar shards of `.npy` ids (the tokenizer's, uint16), one per text shard, same samples."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for url in urls:
        path = out / Path(url).name
        with wds.TarWriter(str(path)) as w:
            for s in wds.WebDataset([url], shardshuffle=False, empty_check=False):
                ids = np.asarray(tok(_text(s)), dtype=np.uint16)
                w.write({"__key__": s["__key__"], "npy": ids})
        paths.append(str(path))
    return paths


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
    urls: list[str], gbs: int, workers: int, repeat: int, fn: Any
) -> tuple[int, float, float]:
    """(tokens, median epoch s, median steady s) of a webdataset pipeline mapping `fn`."""
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .map(fn)
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
    urls: list[str], n: int, gbs: int, workers: int, repeat: int, fn: Any
) -> dict[str, float]:
    """Plain data parallelism on n replicas: replica r reads shards r, r+n, ... (split_by_node)
    with a per-replica batch of gbs / n; the job waits for the slowest replica."""
    times, steady, total = [], [], 0
    for r in range(n):
        tokens, wall, st = run_plain(urls[r::n], max(1, gbs // n), workers, repeat, fn)
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
    store: bool = True,
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


def _row(name: str, r: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        "pipeline": name,
        **r,
        "ratio": r["tokens_per_s"] / base["tokens_per_s"],
        "steady_ratio": r["steady_tokens_per_s"] / base["steady_tokens_per_s"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = make_parser(__doc__)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="epochs timed; the median is kept")
    ap.add_argument(
        "--tokenizer",
        choices=["bpe", "bytes"],
        default="bpe",
        help="bpe: a byte-level BPE (tokenizers library, vocab 8192) trained on the corpus and "
        "saved as tokenizer.json, the cost a real LLM tokenizer has (default); bytes: utf-8 "
        "bytes as ids (near-free)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        # two shards of 16 samples: plain DP gives each of the 2 replicas one
        args.samples, args.global_batch, args.workers = 32, 8, 0
        args.replicas, args.repeat = 2, 1

    import webdataset as wds
    from rich.table import Table

    from fcp.cli import main as fcp
    from fcp_data.planner import CostModel
    from fcp_data.readers import LengthIndex, make_shards
    from fcp_data.readers.text import as_tokenizer

    con = console()
    load_before = os.getloadavg()[0]
    n = args.replicas
    with tempfile.TemporaryDirectory() as tmp:
        per_shard = 16 if args.quick else 64
        paths = make_shards(
            Path(tmp) / "shards", text=args.samples, seed=0, samples_per_shard=per_shard
        )
        urls = [str(p) for p in paths]
        if args.tokenizer == "bpe":
            texts = [_text(s) for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
            vocab = 512 if args.quick else 8192
            spec = str(train_bpe(texts, vocab, Path(tmp) / "tokenizer.json"))
        else:
            spec = ByteTokenizer.spec  # an object, not a file: indexed through build_index
        tok = as_tokenizer(spec) if args.tokenizer == "bpe" else ByteTokenizer()
        ids_urls = write_pretokenized(urls, tok, Path(tmp) / "ids")
        # the index a user gets from `fcp index SHARDS --tokenizer FILE`, and with --no-store
        default, nostore = Path(tmp) / "index", Path(tmp) / "index-nostore"
        if args.tokenizer == "bpe":
            for out, extra in ((default, []), (nostore, ["--no-store"])):
                argv_i = ["index", *urls, "-o", str(out), "--tokenizer", spec, *extra]
                assert fcp([*argv_i, "--workers", str(max(1, args.workers))]) == 0
        else:
            from fcp_data.readers import build_index
            from fcp_data.readers.text import CallableCounter

            counter = CallableCounter(tok, spec=ByteTokenizer.spec)
            build_index(urls, default, counter=counter, store_tokens=None)
            build_index(urls, nostore, counter=counter, store_tokens=False)
        cost = CostModel.from_model("qwen3-1.7b", "cpu")
        g, w, rep = args.global_batch, args.workers, args.repeat
        plain_tok, plain_s, plain_st = run_plain(urls, g, w, rep, _PlainMap(tok, eod=0))
        ids_tok, ids_s, ids_st = run_plain(ids_urls, g, w, rep, _IdsMap(eod=0))
        plain1 = {"tokens_per_s": plain_tok / plain_s, "steady_tokens_per_s": plain_tok / plain_st}
        ids1 = {"tokens_per_s": ids_tok / ids_s, "steady_tokens_per_s": ids_tok / ids_st}
        plain_n = run_plain_dp(urls, n, g, w, rep, _PlainMap(tok, eod=0))
        ids_n = run_plain_dp(ids_urls, n, g, w, rep, _IdsMap(eod=0))
        loader_tok: Any = spec if args.tokenizer == "bpe" else tok
        fcp_rows = {
            (name, k): run_fcp(
                LengthIndex.open(idx), k, g, w, cost, rep, loader_tok, store=name == "default"
            )
            for name, idx in (("default", default), ("no store", nostore))
            for k in (1, n)
        }
    load_after = os.getloadavg()[0]
    rows = []
    for k, plain, ids in ((1, plain1, ids1), (n, plain_n, ids_n)):
        for name in ("default", "no store"):
            r = fcp_rows[(name, k)]
            rows.append(
                {
                    **_row(f"FCP {name}, {k} replica(s)", r, plain),
                    "ratio_to_pretokenized": r["tokens_per_s"] / ids["tokens_per_s"],
                    "steady_ratio_to_pretokenized": r["steady_tokens_per_s"]
                    / ids["steady_tokens_per_s"],
                }
            )
    result = {
        "load_avg_1min": [load_before, load_after],
        "samples": args.samples,
        "global_batch": g,
        "workers": w,
        "repeat": rep,
        "replicas": n,
        "tokenizer": args.tokenizer,
        "tokens": plain_tok,
        "plain": {**plain1, "replicas": 1},
        "plain_dp": plain_n,
        "pretokenized": {**ids1, "replicas": 1},
        "pretokenized_dp": ids_n,
        "fcp": rows,
    }
    table = Table(
        title=f"loader throughput: {args.samples} stdlib-text samples, {plain_tok:,} tokens "
        f"({args.tokenizer}), global batch {g}, {w} workers, load {load_before:.1f}/"
        f"{load_after:.1f}"
    )
    for col in (
        "pipeline",
        "tokens/s",
        "x plain",
        "steady x plain",
        "x pre-tokenized",
        "steady x pre-tok.",
        "planning",
    ):
        table.add_column(col, justify="right" if col != "pipeline" else "left")
    for name, r in (
        ("plain (tokenizes), 1 replica", plain1),
        ("pre-tokenized, 1 replica", ids1),
        (f"plain DP (tokenizes), {n} replicas", plain_n),
        (f"pre-tokenized DP, {n} replicas", ids_n),
    ):
        table.add_row(name, f"{r['tokens_per_s']:,.0f}", "", "", "", "", "-")
    for r in rows:
        table.add_row(
            r["pipeline"],
            f"{r['tokens_per_s']:,.0f}",
            f"{r['ratio']:.2f}",
            f"{r['steady_ratio']:.2f}",
            f"{r['ratio_to_pretokenized']:.2f}",
            f"{r['steady_ratio_to_pretokenized']:.2f}",
            f"{100 * r['planning_share']:.1f}%",
        )
    con.print(table)
    write_json(out_path(args, "loader_throughput"), result, quick=args.quick)
    return result


if __name__ == "__main__":
    main()
