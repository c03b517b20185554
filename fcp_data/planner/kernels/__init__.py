"""Compiled inner loops of the planner (numba, `cache=True`), one module per candidate family.

- `core`: a group's time T(G, d), the padded shard of one member, Stage 1 BFD, Stage 2 DP and
  a schedule's critical path (shared by every candidate);
- `lanes` / `lane_targets`: LPT dealing onto lanes, refinement, packing; the dual
  approximation that picks the lane degrees;
- `moldable`: moldable list scheduling and micro-batch compaction;
- `waves`: a schedule's waves and its critical path with idle slots priced (placeholder
  micro-batches) and optional barriers after every wave (`Cluster.idle`, `Cluster.sync_waves`).

Every kernel works on plain arrays: per-unit aggregates `att` (Σα1(1+η)s²), `lin` (Σα2 s +
vision), `comm` (Σα3 s), a per-unit minimum degree `dmin`, and `cost_params`, the cost model's
constants packed as [β1, β2, intra-node bandwidth, inter-node bandwidth, replicas per node,
β3, then (u, a2a bytes ratio, ring share) per head-parallel degree] (indices `BETA1`,
`BETA2`, `INTRA_NODE_BANDWIDTH`, `INTER_NODE_BANDWIDTH`). `allowed[d]` says whether degree d may
be used (all True for fcp, powers of two for the pow2 baseline). Memory is counted as the
layout contract's padded shard, `shard_tokens(s, d, unit)` with the cluster's pad unit (TP under
sequence parallel, else 1), against `cap` tokens. Windows of replicas are contiguous:
(start, degree).
"""

from .core import (
    BETA1,
    BETA2,
    BETA3,
    INF,
    INTER_NODE_BANDWIDTH,
    INTRA_NODE_BANDWIDTH,
    REPLICAS_PER_NODE,
    TRANSPORTS,
    bfd_pack,
    critical_path,
    dp_degrees,
    group_time,
    shard_tokens,
    window_transports,
)
from .lane_targets import lanes_for_target, smallest_lane_target
from .lanes import deal_lpt, pack_lanes, refine_moves, unit_lane_time
from .moldable import compact_windows, list_schedule
from .waves import group_waves, priced_critical_path

__all__ = [
    "BETA1",
    "BETA2",
    "BETA3",
    "INF",
    "INTER_NODE_BANDWIDTH",
    "INTRA_NODE_BANDWIDTH",
    "REPLICAS_PER_NODE",
    "TRANSPORTS",
    "bfd_pack",
    "compact_windows",
    "critical_path",
    "deal_lpt",
    "dp_degrees",
    "group_time",
    "group_waves",
    "lanes_for_target",
    "list_schedule",
    "pack_lanes",
    "priced_critical_path",
    "refine_moves",
    "shard_tokens",
    "smallest_lane_target",
    "unit_lane_time",
    "window_transports",
]
