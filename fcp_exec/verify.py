"""Debug-mode check that every rank runs the same plan: one all-gather of digests.

Plans are made independently on every replica (docs/design.md); a replica that planned from a
different length index or seed would join different rings and hang in the first P2P. One
all-gather of (wave, digest) per micro-batch turns that hang into an error naming the ranks.
It costs one small collective over the world (~0.1-1 ms), hence debug mode only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist

from fcp_data.errors import ExecError

if TYPE_CHECKING:  # the planner package costs ~2 s to import (numba); types only
    from fcp_data.planner.plan import RankPlan

__all__ = ["PlanMismatchError", "verify_plan_digest"]


class PlanMismatchError(ExecError):
    """Ranks disagree on the plan; raised on every rank so that none of them hangs."""


def verify_plan_digest(rank_plan: RankPlan, *, group: dist.ProcessGroup | None = None) -> None:
    """COLLECTIVE over `group` (default: world): raise if any rank's (wave, digest) differs."""
    if not dist.is_initialized():
        return
    mine = (rank_plan.wave, rank_plan.digest)
    gathered: list[tuple[int, str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    if any(g != gathered[0] for g in gathered):
        table = ", ".join(f"rank {r}: wave {g[0]} digest {g[1][:12]}" for r, g in
                          enumerate(gathered) if g is not None)  # fmt: skip
        raise PlanMismatchError(
            f"ranks disagree on the plan ({table}); every replica must plan the same global "
            "batch from the same length index, seed and planner version"
        )
