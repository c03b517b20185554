"""Per-token outputs back in sample order: the collective half of fcp_data.inmemory.

After a step on an in-memory batch (`fcp_data.inmemory.shard_batch`) each replica holds, per
micro-batch, an output for every slot of its zigzag shard: log-probs, values, entropies,
per-token losses. RL needs them per original sequence (old log-probs for the next update,
values for GAE, ...). Two functions put them back, both the exact inverse of the sharding
(`fcp_data.collate.unshard.unshard_group`), padding dropped, one tensor [L, ...] per sequence:

- `gather_sequences`: within each CP group. The members of a group all-gather their shards
  on the group's own process group (the one `cp_context` bound; degree 1 needs none), so the
  result, `{batch index: tensor}` for every sequence of every group this replica belongs to,
  is on **every member of that group**. Bytes: each member receives (d-1) shards, its own
  group's tokens only.
- `all_gather_sequences`: every sequence on **every replica**, a list in sample order (None
  for a dropped sequence). One all-gather over the replicas' data-parallel domain of each
  replica's outputs of all its waves, padded to the largest replica's count (every replica
  knows every count from the plan, so no size is exchanged): N x max tokens per replica
  (for 64 replicas of 16K tokens and float32 log-probs, 4 MiB received per replica).

Both first run one 13 x int64 all-gather over the data-parallel domain (the world at TP =
PP = 1, else `CPGroupCache.data_parallel_group()`): every replica states its plan digest and
whether its outputs fit its micro-batches (count, first dimension = local tokens, one dtype
and trailing shape), so a wrong output raises `GatherError` on every replica, naming the
ranks and the problem, instead of leaving a peer waiting in its group's all-gather. So both are
COLLECTIVE over that domain: every replica calls them, those that sat every wave out included.
`gather_sequences(check=False)` skips it (then only the CP groups communicate, and a bad output
raises on its own rank). Results are detached copies (no autograd through the gather), on the
outputs' device; NCCL needs device tensors. Under TP x PP, call them on every rank that holds
the outputs (the last pipeline stage for log-probs): the groups used are those of this rank's
(TP rank, PP stage), as everywhere in fcp_exec.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

from fcp_data.errors import ExecError

if TYPE_CHECKING:  # the planner package costs ~2 s to import (numba); types only
    from fcp_data.inmemory import ShardedBatch
    from fcp_exec.groups import CPGroupCache

__all__ = ["GatherError", "all_gather_sequences", "gather_sequences"]

Alignment = Literal["label", "token"]

_VERSION = 1
_MAX_TRAILING = 6  # per-token outputs of up to 6 more dimensions (top-k: 1)
# dtype codes of the header row (index + 1; 0: this replica has no output to describe)
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
)


class GatherError(ExecError):
    """Per-token outputs that do not fit the micro-batches, or replicas that disagree on the
    plan or on the outputs' dtype and shape; raised on every replica of the check."""


def _hash64(text: str) -> int:
    raw = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def _inspect(
    outputs: Sequence[torch.Tensor | None], sharded: ShardedBatch
) -> tuple[str | None, torch.dtype | None, tuple[int, ...] | None]:
    """(problem, dtype, trailing shape) of this replica's outputs; no collective, no raise."""
    mbs = sharded.micro_batches
    if isinstance(outputs, torch.Tensor) or len(outputs) != len(mbs):
        got = "one tensor" if isinstance(outputs, torch.Tensor) else f"{len(outputs)} outputs"
        return (
            f"got {got} for {len(mbs)} micro-batches: pass a list with one output per "
            "micro-batch, in order (None, or the model's output, for a wave this replica sits "
            "out)",
            None,
            None,
        )
    dtype: torch.dtype | None = None
    trailing: tuple[int, ...] | None = None
    for w, (mb, out) in enumerate(zip(mbs, outputs)):
        if mb.rank_plan.is_empty:
            continue  # a placeholder's (or empty wave's) output carries no sequence
        where = f"wave {w} (sequences {list(mb.rank_plan.sequence_ids)})"
        if not isinstance(out, torch.Tensor):
            return f"the output of {where} is {type(out).__name__}, not a tensor", None, None
        if out.ndim < 1 or out.shape[0] != mb.num_tokens:
            return (
                f"the output of {where} has shape {tuple(out.shape)}: its micro-batch holds "
                f"{mb.num_tokens} local tokens, so the output needs [{mb.num_tokens}, ...] (one "
                "row per slot of mb.tokens, padding included: logits[0] of the [1, T] row, not "
                "a masked selection)",
                None,
                None,
            )
        if len(out.shape) - 1 > _MAX_TRAILING or out.dtype not in _DTYPES:
            return (
                f"the output of {where} has shape {tuple(out.shape)} and dtype {out.dtype}: at "
                f"most {_MAX_TRAILING} dimensions after the token one, dtype one of "
                f"{[str(d) for d in _DTYPES]}",
                None,
                None,
            )
        if dtype is not None and (out.dtype != dtype or tuple(out.shape[1:]) != trailing):
            return (
                f"the output of {where} has dtype {out.dtype} and per-token shape "
                f"{tuple(out.shape[1:])} but an earlier wave's has {dtype} and {trailing}",
                None,
                None,
            )
        dtype, trailing = out.dtype, tuple(int(s) for s in out.shape[1:])
    return None, dtype, trailing


def _device(
    outputs: Sequence[torch.Tensor | None], group: dist.ProcessGroup | None
) -> torch.device:
    for out in outputs if not isinstance(outputs, torch.Tensor) else ():
        if isinstance(out, torch.Tensor):
            return out.device
    if not dist.is_initialized() or dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    acc = torch.accelerator.current_accelerator()  # nccl / hccl need device tensors
    return torch.device("cpu") if acc is None else acc


def _row(
    sharded: ShardedBatch,
    problem: str | None,
    dtype: torch.dtype | None,
    trailing: tuple[int, ...] | None,
) -> list[int]:
    dims = list(trailing or ()) + [-1] * (_MAX_TRAILING - len(trailing or ()))
    code = 0 if dtype is None else _DTYPES.index(dtype) + 1
    ndim = -1 if trailing is None else len(trailing)
    return [
        _VERSION,
        _hash64(sharded.digest),
        int(problem is not None),
        code,
        ndim,
        *dims,
        sharded.replica,
        len(sharded.micro_batches),
    ]


def _agree(
    outputs: Sequence[torch.Tensor | None],
    sharded: ShardedBatch,
    group: dist.ProcessGroup | None,
) -> tuple[torch.dtype | None, tuple[int, ...] | None]:
    """The header all-gather: raise on every rank unless all outputs fit and all agree.
    Returns the outputs' dtype and trailing shape (None when no replica has an output)."""
    problem, dtype, trailing = _inspect(outputs, sharded)
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        if problem is not None:
            raise GatherError(f"replica {sharded.replica}: {problem}")
        return dtype, trailing
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    mine = torch.tensor(
        _row(sharded, problem, dtype, trailing), dtype=torch.int64, device=_device(outputs, group)
    )
    rows_t = [torch.empty_like(mine) for _ in ranks]
    dist.all_gather(rows_t, mine, group=group)
    rows = [[int(x) for x in r.tolist()] for r in rows_t]
    me = dist.get_rank()
    bad = [r for r, row in zip(ranks, rows) if row[2]]
    if bad:
        own = f" This rank: {problem}." if problem is not None else ""
        raise GatherError(
            f"rank {me}: the per-token outputs of ranks {bad} do not fit their micro-batches; "
            f"no rank gathered (each of those ranks names its problem).{own}"
        )
    digests = {row[1] for row in rows}
    if len(digests) > 1 or len({row[0] for row in rows}) > 1:
        table = ", ".join(f"rank {r}: {row[1] & (2**64 - 1):016x}" for r, row in zip(ranks, rows))
        raise GatherError(
            f"rank {me}: replicas gather with different plans (digest hash per rank: {table}); "
            "every replica must shard the same InMemoryBatch with the same cluster, cost "
            "model, strategy and seed"
        )
    shapes = {tuple(row[3 : 5 + _MAX_TRAILING]) for row in rows if row[3] != 0}
    if len(shapes) > 1:
        table = "; ".join(
            f"rank {r}: {_DTYPES[row[3] - 1]} {tuple(row[5 : 5 + row[4]])}"
            for r, row in zip(ranks, rows)
            if row[3] != 0
        )
        raise GatherError(
            f"rank {me}: replicas' outputs differ in dtype or per-token shape ({table}); every "
            "replica must return the same kind of output"
        )
    if not shapes:
        return None, None
    code, ndim, *dims = next(iter(shapes))
    return _DTYPES[code - 1], tuple(dims[:ndim])


def _check_replica(sharded: ShardedBatch, groups: CPGroupCache | None) -> None:
    if not dist.is_initialized():
        return
    rank = dist.get_rank()
    replica = groups.ranks.position(rank)[0] if groups is not None else rank
    if replica != sharded.replica:
        raise GatherError(
            f"global rank {rank} is replica {replica} but holds the ShardedBatch of replica "
            f"{sharded.replica}; build it with shard_batch(..., replica={replica})"
        )


def gather_sequences(
    outputs: Sequence[torch.Tensor | None],
    sharded: ShardedBatch,
    *,
    groups: CPGroupCache,
    align: Alignment = "label",
    fill: float = 0.0,
    check: bool = True,
) -> dict[int, torch.Tensor]:
    """This replica's sequences, whole, from every member of their CP groups.

    outputs: one tensor per micro-batch of `sharded` ([local tokens, ...]: a per-slot output
    such as token log-probs), None (or anything) for a wave this replica sits out. groups: the
    CPGroupCache the step used; the CP groups of the plan must exist in it (they do right after
    the step; `groups.prepare_plan(sharded.plan)` on every rank before it pins them all).
    align: "label" when slot t's output belongs to token t+1 (log-probs of the labels: value k
    of the result is token k's, value 0 is `fill`), "token" when it belongs to token t.

    Returns {batch index: [L, ...]} for every sequence of every group this replica is in, the
    same on every member of the group. COLLECTIVE: one header all-gather over the data-parallel
    domain (unless check=False), then per wave one all-gather on this replica's CP group (d > 1).
    """
    from fcp_data.collate.unshard import unshard_group

    _check_replica(sharded, groups)
    if check:
        _agree(outputs, sharded, groups.data_parallel_group())
    else:
        problem, _, _ = _inspect(outputs, sharded)
        if problem is not None:
            raise GatherError(f"replica {sharded.replica}: {problem}")
    rank = dist.get_rank() if dist.is_initialized() else 0
    result: dict[int, torch.Tensor] = {}
    for mb, out in zip(sharded.micro_batches, outputs):
        rp = mb.rank_plan
        if rp.is_empty:
            continue
        assert out is not None  # checked by _inspect
        local = out.detach().contiguous()
        if rp.degree == 1:
            bufs = [local]
        else:
            if not dist.is_initialized():
                raise GatherError(f"a degree-{rp.degree} group needs torch.distributed")
            ring = groups.ranks.ring(rp.group_replicas, rank)
            try:
                pg = groups.get(ring)
            except LookupError as e:  # every rank's cache misses alike: nobody waits
                raise GatherError(
                    f"{e}; gather right after the step, or call groups.prepare_plan("
                    "sharded.plan) on every rank first"
                ) from None
            gathered = [torch.empty_like(local) for _ in ring]
            dist.all_gather(gathered, local, group=pg)
            order = dist.get_process_group_ranks(pg)  # group rank j -> global rank
            bufs = [gathered[order.index(r)] for r in ring]
        seqs = unshard_group(
            bufs, rp.seqlens, degree=rp.degree, unit=sharded.unit, align=align, fill=fill
        )
        result.update(zip(rp.sequence_ids, seqs))
    return result


def all_gather_sequences(
    outputs: Sequence[torch.Tensor | None],
    sharded: ShardedBatch,
    *,
    groups: CPGroupCache | None = None,
    group: dist.ProcessGroup | None = None,
    align: Alignment = "label",
    fill: float = 0.0,
) -> list[torch.Tensor | None]:
    """Every sequence of the batch, whole, on every replica: a list in sample order.

    outputs, align, fill: as in `gather_sequences`. The domain is `group` if given (its members
    must be the replicas, in replica order), else `groups.data_parallel_group()` (the world at
    TP = PP = 1, which is also the default without `groups`). Dropped sequences are None.
    COLLECTIVE over that domain: one header all-gather and one all-gather of every replica's
    outputs (all waves, padded to the largest replica's token count from the plan).
    """
    from fcp_data.collate.unshard import local_num_tokens, unshard_replicas

    _check_replica(sharded, groups)
    if group is None and groups is not None:
        group = groups.data_parallel_group()
    plan, n_rep, unit = sharded.plan, sharded.plan.num_replicas, sharded.unit
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world != n_rep:
        raise GatherError(
            f"the gather domain has {world} ranks but the plan {n_rep} replicas: under TP x PP "
            "pass groups= (the CPGroupCache) or group= (the replicas' data-parallel group)"
        )
    dtype, trailing = _agree(outputs, sharded, group)
    if dtype is None or trailing is None:  # no replica holds a sequence: all were dropped
        return [None] * len(sharded.batch)
    sizes = [
        [local_num_tokens(plan.for_replica(r, w), unit) for w in range(plan.num_waves)]
        for r in range(n_rep)
    ]
    most = max(sum(s) for s in sizes)
    device = _device(outputs, group)
    mine = torch.zeros((most, *trailing), dtype=dtype, device=device)
    o = 0
    for mb, out in zip(sharded.micro_batches, outputs):
        if not mb.rank_plan.is_empty:
            assert out is not None  # checked by _agree
            mine[o : o + mb.num_tokens] = out.detach()
            o += mb.num_tokens
    if world > 1:
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine, group=group)
        ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        position = groups.ranks.position if groups is not None else (lambda g: (g, 0, 0))
        by_replica = {position(g)[0]: t for g, t in zip(ranks, gathered)}
    else:
        by_replica = {sharded.replica: mine}
    starts = [[sum(s[:w]) for w in range(len(s))] for s in sizes]

    def part(r: int, w: int) -> torch.Tensor:
        return by_replica[r][starts[r][w] : starts[r][w] + sizes[r][w]]

    return unshard_replicas(
        plan, part, num_sequences=len(sharded.batch), unit=unit, align=align, fill=fill
    )
