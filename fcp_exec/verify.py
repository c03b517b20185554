"""Members of a ring check that they run the same plan and layout before any ring traffic.

Plans are made independently on every replica (docs/design.md). Members of a CP group that disagree
(another seed or index, different sequence lengths with the same total, different causal flags,
a different ring order, a different transport u: ring vs u x r all-to-all) would otherwise
exchange K/V and return silently wrong attention, or wait on each other until the process-group
timeout. `verify_ring` is the cheap check that
`cp_context` runs by default once per micro-batch: ONE all-gather of a fixed 9 x int64 row
(`RingFingerprint`) over the CP group itself, so it synchronises only replicas that the ring
synchronises anyway (never the world: that would make every wave a global barrier). Every
member gathers the same rows and takes the same decision, so a mismatch raises
`PlanMismatchError` on every member, naming the fields and the ranks that differ. Replicas
without a group and d = 1 rings do no collective at all. Measured (BENCHMARKS.md, gloo on CPU):
~0.1-0.3 ms per check, under 0.1% of one ring-attention layer's forward+backward at 8K tokens
per replica.

Members that disagree on who is in the ring gather on different groups and cannot see each
other's rows; the check then ends at `timeout_s` (gloo) with an error naming the ring instead
of waiting for the process-group timeout.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from fcp_data.errors import ExecError

if TYPE_CHECKING:  # the planner package costs ~2 s to import (numba); types only
    from fcp_data.planner.plan import RankPlan

__all__ = [
    "DEFAULT_VERIFY_TIMEOUT_S",
    "FINGERPRINT_FIELDS",
    "PlanMismatchError",
    "RingFingerprint",
    "ShapeMismatchError",
    "verify_block_shape",
    "verify_plan_digest",
    "verify_ring",
]

# A member may reach the check up to one micro-batch after its peers (a group starts when its
# members are free), so the limit is generous; it only has to beat the 30 min gloo default.
DEFAULT_VERIFY_TIMEOUT_S = 300.0

# Order of the int64 row; "version" lets a newer fcp refuse to compare with an older one.
FINGERPRINT_FIELDS = (
    "version",
    "plan digest",
    "wave",
    "degree",
    "ring order",
    "sequence lengths",
    "causal flags",
    "total tokens",
    "transport (ulysses)",
)
_VERSION = 2  # 2: the transport u joined the row
_HASHED = {"plan digest", "ring order", "sequence lengths", "causal flags"}


class PlanMismatchError(ExecError):
    """Ranks disagree on the plan; raised on every rank so that none of them hangs."""


def _hash64(values: Sequence[object] | str) -> int:
    text = values if isinstance(values, str) else ",".join(str(int(v)) for v in values)
    raw = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


@dataclass(frozen=True, slots=True)
class RingFingerprint:
    """What every member of one ring must agree on for one micro-batch.

    seqlens are the real lengths of the unsharded sequences (what cu_seqlens encodes), ring the
    global ranks in ring order (the zigzag chunk order), digest the plan's structure digest,
    ulysses the transport (1: ring; u > 1: u x r hybrid, `fcp_exec.ulysses`).
    """

    digest: str
    wave: int
    ring: tuple[int, ...]
    seqlens: tuple[int, ...]
    causal: tuple[bool, ...]
    ulysses: int = 1

    @classmethod
    def from_rank_plan(cls, rank_plan: RankPlan, ring: Sequence[int]) -> RingFingerprint:
        return cls(
            digest=rank_plan.digest,
            wave=int(rank_plan.wave),
            ring=tuple(int(r) for r in ring),
            seqlens=tuple(int(s) for s in rank_plan.seqlens),
            causal=tuple(bool(c) for c in rank_plan.causal),
            ulysses=int(getattr(rank_plan, "ulysses", 1)),
        )

    @classmethod
    def from_layout(
        cls,
        cu_seqlens: torch.Tensor | Sequence[int],
        ring: Sequence[int],
        causal: bool | Sequence[bool] = True,
        *,
        digest: str = "",
        wave: int = 0,
        ulysses: int = 1,
    ) -> RingFingerprint:
        """The fingerprint of ring_attention's actual inputs (for callers without a plan)."""
        raw = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens
        lens = tuple(int(b) - int(a) for a, b in itertools.pairwise(raw))
        flags = (bool(causal),) * len(lens) if isinstance(causal, bool) else tuple(causal)
        return cls(digest, int(wave), tuple(int(r) for r in ring), lens, flags, int(ulysses))

    def row(self) -> list[int]:
        """The int64 row the members all-gather, in FINGERPRINT_FIELDS order."""
        return [
            _VERSION,
            _hash64(self.digest),
            self.wave,
            len(self.ring),
            _hash64(self.ring),
            _hash64(self.seqlens),
            _hash64(self.causal),
            sum(self.seqlens),
            self.ulysses,
        ]

    def describe(self) -> str:
        lens = ", ".join(str(s) for s in self.seqlens[:8]) + (
            ", ..." if len(self.seqlens) > 8 else ""
        )
        flags = "".join("c" if c else "f" for c in self.causal[:16])
        return (
            f"wave {self.wave}, ring {self.ring}, seqlens ({lens}), causal {flags or '-'} "
            f"(c causal, f full), transport u={self.ulysses}, digest {self.digest[:12] or '-'}"
        )


def _device(group: dist.ProcessGroup | None) -> torch.device:
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    acc = torch.accelerator.current_accelerator()  # nccl / hccl need device tensors
    return torch.device("cpu") if acc is None else acc


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _differences(rows: list[list[int]], ranks: Sequence[int]) -> list[str]:
    """For every field that differs: which global ranks hold which value."""
    out = []
    for f, name in enumerate(FINGERPRINT_FIELDS):
        values: dict[int, list[int]] = {}
        for rank, row in zip(ranks, rows):
            values.setdefault(row[f], []).append(rank)
        if len(values) > 1:
            shown = "; ".join(
                _who(holders)
                + " hold "
                + (f"{v & (2**64 - 1):016x}"[:10] if name in _HASHED else str(v))
                for v, holders in values.items()
            )
            out.append(f"{name} differs ({shown})")
    return out


def verify_ring(
    fingerprint: RingFingerprint,
    *,
    group: dist.ProcessGroup | None,
    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
) -> None:
    """COLLECTIVE over the ring's process group: raise on every member if any row differs.

    group: the process group whose members are exactly the ring's global ranks (the CP group
    `CPGroupCache` holds). A ring of one member returns at once with no communication.
    """
    d = len(fingerprint.ring)
    if d <= 1:
        return
    if not dist.is_initialized():
        raise ExecError(
            f"a ring of {d} members needs torch.distributed; call init_process_group first"
        )
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    if sorted(ranks) != sorted(fingerprint.ring):
        raise PlanMismatchError(
            f"the process group holds global ranks {sorted(ranks)} but the ring is "
            f"{fingerprint.ring}; pass the CP group of this ring (CPGroupCache.get(ring))"
        )
    rows = _gather_rows(
        fingerprint.row(),
        d,
        group,
        timeout_s,
        f"the plan check of ring {fingerprint.ring}",
        "replicas disagree on the group's members (different plans), or a member failed. "
        f"This rank's plan: {fingerprint.describe()}",
    )
    diffs = _differences(rows, ranks)
    if diffs:
        raise PlanMismatchError(
            f"rank {dist.get_rank()}: members of ring {fingerprint.ring} disagree: "
            + "; ".join(diffs)
            + f". This rank's plan: {fingerprint.describe()}. Every replica must plan the same "
            "global batch from the same length index, seed and planner version, and pass the "
            "RankPlan of its own replica and wave"
        )


class ShapeMismatchError(PlanMismatchError):
    """Members of a CP group run attention blocks of different shapes (heads, head dim,
    dtype): raised on every member before the first all-to-all or ring transfer."""


def verify_block_shape(
    shape: tuple[int, int, int, str],
    members: Sequence[int],
    *,
    group: dist.ProcessGroup | None,
    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
) -> None:
    """COLLECTIVE over the CP group: raise `ShapeMismatchError` on every member unless all hold
    the same (heads, kv_heads, head_dim, dtype) for this layer's q/k/v.

    The plan check of `cp_context` cannot see the model; members that disagree here (another
    config, another TP size) would exchange buffers of different sizes: a raw transport error
    on one member and a hang on the other. One all-gather of 4 int64, once per group and block
    kind (the caller caches the agreement)."""
    heads, kv_heads, head_dim, dtype = shape
    if len(members) <= 1 or not dist.is_initialized():
        return
    row = [heads, kv_heads, head_dim, _hash64(dtype)]
    rows = _gather_rows(
        row, len(members), group, timeout_s, f"the block-shape check of CP group {tuple(members)}"
    )
    if any(r != rows[0] for r in rows):
        ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        told = "; ".join(f"rank {rk}: H={r[0]} H_kv={r[1]} D={r[2]}" for rk, r in zip(ranks, rows))
        raise ShapeMismatchError(
            f"rank {dist.get_rank()}: members of CP group {tuple(members)} run attention blocks "
            f"of different shapes ({told}; this rank: {dtype}): every member must run the same "
            "model with the same tensor-parallel size"
        )


def _gather_rows(
    row: list[int],
    size: int,
    group: dist.ProcessGroup | None,
    timeout_s: float,
    what: str,
    why: str = "a member failed or runs another group",
) -> list[list[int]]:
    """All-gather one int64 row per member, bounded by `timeout_s` (a missing member raises
    PlanMismatchError naming `what` and `why`)."""
    mine = torch.tensor(row, dtype=torch.int64, device=_device(group))
    gathered = [torch.empty_like(mine) for _ in range(size)]
    work = dist.all_gather(gathered, mine, group=group, async_op=True)
    assert work is not None
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise PlanMismatchError(
            f"rank {dist.get_rank()}: {what} did not complete within {timeout_s:g} s ({e}). "
            f"A member is not running this group now: {why}"
        ) from None
    return [[int(x) for x in t.tolist()] for t in gathered]


def verify_plan_digest(rank_plan: RankPlan, *, group: dist.ProcessGroup | None = None) -> None:
    """COLLECTIVE over `group` (default: the world): raise if any rank's (wave, digest) differs.

    A world-wide check (every replica, empty ones included) for debugging whole-job agreement;
    it synchronises all replicas, so `cp_context` uses the per-ring `verify_ring` instead.
    """
    if not dist.is_initialized():
        return
    mine = (rank_plan.wave, rank_plan.digest)
    gathered: list[tuple[int, str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    if any(g != gathered[0] for g in gathered):
        table = ", ".join(
            f"rank {r}: wave {g[0]} digest {g[1][:12]}"
            for r, g in enumerate(gathered)
            if g is not None
        )
        raise PlanMismatchError(
            f"ranks disagree on the plan ({table}); every replica must plan the same global "
            "batch from the same length index, seed and planner version"
        )
