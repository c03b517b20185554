"""fcp_data.planner: lengths, a cluster and a cost model in; a frozen Plan out.

The planner is pure: rank, replica and world size are arguments, never read from the
environment, so every replica computes the same plan from the same lengths.
"""

from .cluster import Cluster
from .cost import CostModel, padded_length
from .plan import CPGroup, Plan, RankPlan, Wave, structure_digest

__all__ = [
    "CPGroup",
    "Cluster",
    "CostModel",
    "Plan",
    "RankPlan",
    "Wave",
    "padded_length",
    "structure_digest",
]
