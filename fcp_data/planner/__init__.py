"""fcp_data.planner: lengths, a cluster and a cost model in; a frozen Plan out.

The planner is pure: rank, replica and world size are arguments, never read from the
environment, so every replica computes the same plan from the same lengths.
"""

from ..layout import padded_length
from .api import STRATEGIES, plan_global_batch
from .cluster import IDLE_POLICIES, Cluster
from .cost import CostModel
from .explain import format_degrees, why_one_degree
from .generators import DISTRIBUTIONS, generate_lengths
from .memory import MemoryBudget, ParallelLayout, derive_tokens_per_replica
from .plan import CPGroup, Plan, RankPlan, Wave, structure_digest
from .presets import DEVICES, MODELS, DeviceSpec, ModelSpec
from .simulate import Score, lower_bound_of, score_plan
from .vision_cost import VisionCost, VisionWork
from .vision_presets import ENCODERS, EncoderSpec

__all__ = [
    "DEVICES",
    "DISTRIBUTIONS",
    "ENCODERS",
    "IDLE_POLICIES",
    "MODELS",
    "STRATEGIES",
    "CPGroup",
    "Cluster",
    "CostModel",
    "DeviceSpec",
    "EncoderSpec",
    "MemoryBudget",
    "ModelSpec",
    "ParallelLayout",
    "Plan",
    "RankPlan",
    "Score",
    "VisionCost",
    "VisionWork",
    "Wave",
    "derive_tokens_per_replica",
    "format_degrees",
    "generate_lengths",
    "lower_bound_of",
    "padded_length",
    "plan_global_batch",
    "score_plan",
    "structure_digest",
    "why_one_degree",
]
