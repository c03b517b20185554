"""fcp_data.planner: lengths, a cluster and a cost model in; a frozen Plan out.

The planner is pure: rank, replica and world size are arguments, never read from the
environment, so every replica computes the same plan from the same lengths.

This face is what the loader, the training side, the command line and users call: the entry
point (`plan_global_batch`, `STRATEGIES`), what it takes (Cluster, CostModel and its presets,
the memory model, VisionWork / VisionCost), what it returns (Plan, Wave, CPGroup, RankPlan) and
the tools around a plan (`score_plan`, `lower_bound_of`, `why_one_degree`, `generate_lengths`).
Inside, four rooms import downwards only:

    planner/      api (the entry point) -> assemble (winner -> Plan), plan, bounds, simulate,
                  explain, compare, generators, oracle
    strategies/   the candidate families (paper, lanes, moldable, fill, placement, baselines,
                  megatron_dynamic) and their table (`families.FAMILIES`, which STRATEGIES is)
    cost/         the cost model, cluster, memory, presets, transports, vision terms and the
                  priced batch every strategy reads (`problem.Problem`)
    kernels/      the numba-compiled inner loops
"""

from ..layout import padded_length
from .api import STRATEGIES, plan_global_batch
from .cost.cluster import IDLE_POLICIES, Cluster
from .cost.memory import MemoryBudget, ParallelLayout, derive_tokens_per_replica
from .cost.model import CostModel
from .cost.presets import DEVICES, MODELS, DeviceSpec, ModelSpec
from .cost.vision import VisionCost
from .cost.vision_presets import ENCODERS, EncoderSpec
from .cost.vision_work import VisionWork
from .explain import format_degrees, why_one_degree
from .generators import DISTRIBUTIONS, generate_lengths
from .plan import CPGroup, Plan, RankPlan, Wave
from .simulate import Score, lower_bound_of, score_plan

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
    "why_one_degree",
]
