"""The zigzag ring as varlen kernel calls: built once per micro-batch on the host, moved once.

`step_blocks` (fcp_exec.layout) says which real rows attend which real keys at each ring step.
A GPU cannot afford one kernel call per sequence (10-20 µs of launch and Python each, 40
sequences at degree 1 is 80 calls per layer), so this module turns the blocks of a step into
at most two varlen calls over the whole packed buffer, the way ring-flash-attention's zigzag
varlen and TransformerEngine's THD context parallelism do:

- step 0 (the member's own KV): one causal call, segments = the sequences' local regions;
- src < me: all local queries against the front half (chunk src) of every sequence's KV:
  one call, K/V rows gathered with one index (`half_index0`), segments (2c, c);
- src > me: the back half of the local queries (chunk 2d-1-me) against all KV: one call, Q
  rows gathered with one index (`half_index1`), segments (c, 2c).

Padding needs no gather. It is a suffix of each sequence, so a member that holds any real row
of a sequence holds only real keys of the chunks its causal blocks read (chunk src < chunk me;
chunks src, 2d-1-src < chunk 2d-1-me), and on the diagonal a real row only sees earlier, real
keys. Padding rows do take part (they attend finite keys, so their out and LSE are finite) and
are cleaned once per layer: their output is zeroed and their saved LSE set to +inf, so every
backward call weighs them exp(s - inf) = 0 and they add exactly 0 to every gradient, whatever
the upstream gradient (flash-attn's own convention for rows without keys; no copy of dout).
Full-attention sequences (rare: mixed packs) need real-key selection: their segments take only
real rows and real keys, through the same gathers; one step then runs a causal and a full call
at step 0, and one call later (causal-front/back and full segments are all unmasked and go in
one call).

A call's rows are `None` (the whole buffer), a `slice` (a contiguous range: a view, no copy; a
single sequence's halves) or an int64 index tensor. Every index and offset of a micro-batch
is written into two host buffers and copied to the device in two transfers (from pinned
memory on CUDA, without a host sync); every layer, forward and backward, reuses them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fcp_data import layout as contract
from fcp_exec.kernels.base import Segments

__all__ = ["Call", "RingSchedule", "Rows", "build_schedule", "host_segments"]

Rows = slice | torch.Tensor | None


@dataclass(frozen=True, slots=True)
class Call:
    """One varlen kernel call of a ring step: Q rows of this member, K/V rows of the held KV."""

    q_rows: Rows
    k_rows: Rows
    seg: Segments
    causal: bool


@dataclass(frozen=True, slots=True)
class RingSchedule:
    """Every kernel call member `index` of a degree-`degree` ring makes, per step.

    steps[s] are the calls of step s (the KV of member (index - s) mod degree); identical calls
    are one object, so the backward gathers a call's Q-side tensors once for all its steps.
    `pad_rows` are the local padding rows (zeroed output, +inf LSE: no gradient)."""

    degree: int
    index: int
    num_tokens: int
    steps: tuple[tuple[Call, ...], ...]
    pad_rows: torch.Tensor | None
    host_buffers: tuple[torch.Tensor, ...]  # kept alive until the non-blocking copies finish

    @property
    def calls_per_step(self) -> tuple[int, ...]:
        return tuple(len(s) for s in self.steps)


# (q_start, q_len, k_start, k_len) in local rows of the queries / the held KV
_Piece = tuple[int, int, int, int]


def host_segments(
    seqlens: Sequence[int],
    padded: Sequence[int],
    causal: Sequence[bool],
    degree: int,
    me: int,
    src: int,
) -> list[tuple[bool, list[_Piece]]]:
    """The pieces of step (me, src) grouped into calls: [(kernel causal flag, pieces)].

    Pure integer arithmetic (the hypothesis tests compare it with `step_blocks`)."""
    chunks = contract.num_chunks(degree)
    mine, theirs = contract.chunk_ids(degree, me), contract.chunk_ids(degree, src)
    diag: list[_Piece] = []
    flat: list[_Piece] = []
    off = 0
    for n, p, c in zip(seqlens, padded, causal, strict=True):
        h = p // chunks
        if h:
            if c:
                if src == me:
                    diag.append((off, 2 * h, off, 2 * h))
                elif src < me:
                    flat.append((off, 2 * h, off, h))
                else:
                    flat.append((off + h, h, off, 2 * h))
            else:  # full attention: real rows against real keys only
                rq = sum(max(0, min(h, n - i * h)) for i in mine)
                rk = sum(max(0, min(h, n - i * h)) for i in theirs)
                if rq and rk:
                    flat.append((off, rq, off, rk))
        off += 2 * h
    return [(flag, pieces) for flag, pieces in ((True, diag), (False, flat)) if pieces]


def _ranges(starts_lens: list[tuple[int, int]], total: int) -> tuple[Rows, list[int]]:
    """The rows of consecutive (start, len) ranges: None / slice / index list; and cu."""
    cu = [0]
    for _, n in starts_lens:
        cu.append(cu[-1] + n)
    first = starts_lens[0][0]
    contiguous = all(a + n == b for (a, n), (b, _) in itertools.pairwise(starts_lens))
    if contiguous:
        end = first + cu[-1]
        return (None if first == 0 and end == total else slice(first, end)), cu
    idx: list[int] = []
    for a, n in starts_lens:
        idx.extend(range(a, a + n))
    return torch.tensor(idx, dtype=torch.int64), cu  # type: ignore[return-value]


def _move(
    i32: list[list[int]], i64: list[torch.Tensor], device: torch.device
) -> tuple[list[torch.Tensor], list[torch.Tensor], tuple[torch.Tensor, ...]]:
    """Two host buffers (int32 offsets, int64 rows) -> device views, one copy each, pinned and
    non-blocking on CUDA (no host sync); on CPU the host tensors themselves."""
    pin = device.type == "cuda"
    hosts = (
        torch.tensor([x for part in i32 for x in part], dtype=torch.int32),
        torch.cat(i64) if i64 else torch.zeros(0, dtype=torch.int64),
    )
    if pin:
        hosts = tuple(h.pin_memory() for h in hosts)
    views: list[list[torch.Tensor]] = []
    for host, lens in zip(hosts, ([len(p) for p in i32], [len(t) for t in i64])):
        dev = host if device.type == "cpu" else host.to(device, non_blocking=pin)
        views.append(list(dev.split(lens)) if lens else [])
    return views[0], views[1], hosts


def _put(rows: Rows | torch.Tensor, i64: list[torch.Tensor]) -> Rows | int:
    if isinstance(rows, torch.Tensor):
        i64.append(rows)
        return len(i64) - 1
    return rows


def build_schedule(
    seqlens: Sequence[int],
    padded: Sequence[int],
    causal: Sequence[bool],
    degree: int,
    index: int,
    device: torch.device | str,
) -> RingSchedule:
    """The RingSchedule of member `index` (host work O(degree x sequences), two copies)."""
    device = torch.device(device)
    total = sum(padded) // degree
    i32: list[list[int]] = []
    i64: list[torch.Tensor] = []
    specs: list[tuple[bool, Rows | int, Rows | int, int, int]] = []
    host: list[tuple[tuple[int, ...], tuple[int, ...], int, int]] = []
    memo: dict[tuple[bool, tuple[_Piece, ...]], int] = {}
    steps_ids: list[list[int]] = []
    for step in range(degree):
        src = (index - step) % degree
        ids: list[int] = []
        for flag, pieces in host_segments(seqlens, padded, causal, degree, index, src):
            key = (flag, tuple(pieces))
            if key not in memo:
                q_rows, cu_q = _ranges([(a, n) for a, n, _, _ in pieces], total)
                k_rows, cu_k = _ranges([(a, n) for _, _, a, n in pieces], total)
                i32 += [cu_q, cu_k]
                specs.append(
                    (flag, _put(q_rows, i64), _put(k_rows, i64), len(i32) - 2, len(i32) - 1)
                )
                host.append(
                    (
                        tuple(cu_q),
                        tuple(cu_k),
                        max(n for _, n, _, _ in pieces),
                        max(n for _, _, _, n in pieces),
                    )
                )
                memo[key] = len(specs) - 1
            ids.append(memo[key])
        steps_ids.append(ids)
    pads = _pad_rows(seqlens, padded, degree, index)
    pad_at = _put(pads, i64) if pads is not None else None
    dev32, dev64, hosts = _move(i32, i64, device)

    def rows(r: Rows | int) -> Rows:
        return dev64[r] if isinstance(r, int) else r

    calls = [
        Call(
            q_rows=rows(qi),
            k_rows=rows(ki),
            seg=Segments(cu_q=dev32[a], cu_k=dev32[b], max_q=mq, max_k=mk, host_q=hq, host_k=hk),
            causal=flag,
        )
        for (flag, qi, ki, a, b), (hq, hk, mq, mk) in zip(specs, host)
    ]
    return RingSchedule(
        degree=degree,
        index=index,
        num_tokens=total,
        steps=tuple(tuple(calls[i] for i in ids) for ids in steps_ids),
        pad_rows=dev64[pad_at] if isinstance(pad_at, int) else None,
        host_buffers=hosts,
    )


def _pad_rows(
    seqlens: Sequence[int], padded: Sequence[int], degree: int, index: int
) -> torch.Tensor | None:
    """Local rows of member `index` that hold padding (None when there are none)."""
    chunks = contract.num_chunks(degree)
    rows: list[int] = []
    off = 0
    for n, p in zip(seqlens, padded, strict=True):
        h = p // chunks
        for k, i in enumerate(contract.chunk_ids(degree, index)):
            real = max(0, min(h, n - i * h))
            start = off + k * h
            rows.extend(range(start + real, start + h))
        off += 2 * h
    return torch.tensor(rows, dtype=torch.int64) if rows else None
