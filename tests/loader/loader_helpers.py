"""Test helpers: a byte tokenizer, real text tar shards, a tar-offset index, a simple planner.

The shards hold real text (Python standard-library sources, a long-tailed code corpus) written
with webdataset's TarWriter; `TarIndex` reads one sample by seeking to its tar offsets, as the
readers' LengthIndex does. `simple_planner` builds valid Plans with mixed degrees and several
waves so the loader can be tested on its own; the real planner is used where it is available.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fcp_data.planner import Cluster, CPGroup, Plan, Wave, padded_length
from fcp_data.readers.errors import SkippedSample
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.scanned import ScanHeader

__all__ = [
    "NUM_SAMPLES",
    "ByteTokenizer",
    "TarIndex",
    "cluster",
    "reassemble",
    "simple_planner",
    "write_text_shards",
]


NUM_SAMPLES = 90
"""Samples in the shared text-shard fixture (conftest.shards)."""


def cluster(n: int, tokens: int = 1100) -> Cluster:
    """1100 tokens a replica: 3000-token samples need degree 3, short ones share a replica."""
    return Cluster(n, replicas_per_node=4, tokens_per_replica=tokens)


class ByteTokenizer:
    """utf-8 bytes as ids (+1, so 0 stays the pad id); exact and picklable."""

    spec = "test:bytes+1"

    def __call__(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")]


def stdlib_texts(n: int, seed: int, max_bytes: int) -> list[str]:
    """n texts cut from stdlib sources with long-tailed lengths (lognormal, 40..max_bytes)."""
    root = Path(os.__file__).parent
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > max_bytes)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        text = files[i % len(files)].read_text(encoding="utf-8", errors="replace")
        L = int(np.clip(rng.lognormal(6.0, 1.0), 40, max_bytes))
        start = int(rng.integers(0, max(1, len(text) - L)))
        out.append(text[start : start + L].encode("utf-8")[:L].decode("utf-8", "ignore") or "x")
    return out


def write_text_shards(
    root: Path,
    n: int,
    *,
    per_shard: int = 20,
    seed: int = 0,
    max_bytes: int = 3000,
    corrupt: Sequence[int] = (),
) -> tuple[list[str], dict[str, bytes]]:
    """Write n .txt samples (`corrupt` positions get invalid utf-8); return urls and bytes."""
    from webdataset import TarWriter

    texts = stdlib_texts(n, seed, max_bytes)
    data: dict[str, bytes] = {}
    urls = []
    for s in range(-(-n // per_shard)):
        url = str(root / f"text-{s:03d}.tar")
        urls.append(url)
        with TarWriter(url) as w:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                key = f"s{i:05d}"
                raw = texts[i].encode("utf-8")
                if i in corrupt:
                    raw = b"\xff\xfe" + raw[2:]
                data[key] = raw
                w.write({"__key__": key, "txt": raw})
    return urls, data


class TarIndex:
    """A minimal length index over text shards (a `SampleSource`): read(i) by tar offset."""

    def __init__(
        self,
        urls: Sequence[str],
        tokenizer: ByteTokenizer,
        *,
        full_every: int = 5,
        rule: dict[str, Any] | None = None,
        tokenizer_spec: str | None = None,
    ) -> None:
        self.header = ScanHeader(
            tokenizer=tokenizer.spec if tokenizer_spec is None else tokenizer_spec,
            rule=rule or {},
            scan=ScanConfig(),
        )
        self.skipped: list[SkippedSample] = []
        keys, lens, where = [], [], []
        for url in urls:
            with tarfile.open(url) as tf:
                for m in tf.getmembers():
                    key = m.name.split(".", 1)[0]
                    keys.append(key)
                    lens.append(m.size)  # byte tokenizer: one token per byte
                    where.append((url, m.offset_data, m.size))
        self.keys = np.array(keys)
        self.seqlens = np.array(lens, dtype=np.int64)
        self.causal = np.array([i % full_every != full_every - 1 for i in range(len(keys))])
        # text only: every token is text, no media, no template tokens
        self.text_tokens = self.seqlens.copy()
        zeros = np.zeros(len(keys), dtype=np.int64)
        self.modality = self.vision_tokens = self.special_tokens = zeros
        self.num_frames = self.width = self.height = zeros
        self.fps = np.zeros(len(keys))
        self.where = where
        self.reads: list[int] | None = None

    def read(self, i: int) -> dict[str, bytes]:
        url, off, size = self.where[i]
        if self.reads is not None:
            self.reads.append(i)
        with open(url, "rb") as f:
            f.seek(off)
            return {"txt": f.read(size)}


def simple_planner(
    seqlens, cluster, cost, *, causal=True, strategy="fcp", seed=0, on_too_long="raise"
) -> Plan:
    """Longest first, smallest degree that fits, short ones packed; waves fill the replicas."""
    n = len(seqlens)
    causal = np.broadcast_to(np.asarray(causal, dtype=bool), (n,))
    cap = cluster.tokens_per_replica
    N = cluster.num_replicas
    order = sorted(range(n), key=lambda i: (-int(seqlens[i]), i))
    groups: list[tuple[int, list[int]]] = []
    dropped = []
    for i in order:
        L = int(seqlens[i])
        d = next((d for d in range(1, N + 1) if padded_length(L, d) // d + 1 <= cap), None)
        if d is None:
            if on_too_long == "drop":
                dropped.append(i)
                continue
            raise ValueError(f"sequence {i} of {L} tokens does not fit {N} x {cap} tokens")
        for dg, ids in groups:
            used = sum(padded_length(int(seqlens[j]), dg) // dg + 1 for j in ids)
            if dg == d and used + padded_length(L, d) // d + 1 <= cap:
                ids.append(i)
                break
        else:
            groups.append((d, [i]))
    waves: list[list[CPGroup]] = [[]]
    free = 0
    for d, ids in groups:
        if free + d > N:
            waves.append([])
            free = 0
        waves[-1].append(
            CPGroup(
                replicas=tuple(range(free, free + d)),
                degree=d,
                sequence_ids=tuple(ids),
                seqlens=tuple(int(seqlens[j]) for j in ids),
                causal=tuple(bool(causal[j]) for j in ids),
                predicted_time=float(cost.group_time([seqlens[j] for j in ids], d)),
            )
        )
        free += d
    waves = [w for w in waves if w]
    t = sum(max(g.predicted_time for g in w) for w in waves)
    return Plan(
        num_replicas=N,
        waves=tuple(Wave(groups=tuple(w)) for w in waves),
        predicted_time=t,
        lower_bound=t / 2,
        strategy=strategy,
        winner="simple",
        dropped=tuple(sorted(dropped)),
    ).with_digest()


def reassemble(
    mbs: Sequence[Any],
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Per sample id: padded tokens, labels and a count of how often each position was seen."""
    toks: dict[int, np.ndarray] = {}
    labs: dict[int, np.ndarray] = {}
    seen: dict[int, np.ndarray] = {}
    for mb in mbs:
        lcu = mb.local_cu_seqlens_padded.numpy()
        gcu = mb.cu_seqlens_padded.numpy()
        for k, sid in enumerate(mb.sample_ids):
            P = int(gcu[k + 1] - gcu[k])
            if sid not in toks:
                toks[sid] = np.full(P, -1, dtype=np.int64)
                labs[sid] = np.full(P, -1, dtype=np.int64)
                seen[sid] = np.zeros(P, dtype=np.int64)
            a, b = int(lcu[k]), int(lcu[k + 1])
            pos = mb.position_ids[a:b].numpy()
            toks[sid][pos] = mb.tokens[a:b].numpy()
            labs[sid][pos] = mb.labels[a:b].numpy()
            seen[sid][pos] += 1
    return toks, labs, seen
