"""Layouts that cannot work are refused before the first step, naming the sizes (one process).

Each case would otherwise be a deadlock, a megatron assertion deep in a forward, or a silently
wrong gradient: world size not divisible by TP x PP, TP not dividing the heads, a model and a
planner Cluster that disagree (sequence parallel, replica count), megatron initialised with CP
> 1, a group cache that cannot hold one batch.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data.errors import ConfigError
from fcp_data.planner import Cluster
from fcp_exec import CPGroupCache, ReplicaRanks


def _config(**kw: object) -> object:
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                use_cpu_initialization=True)  # fmt: skip
    return TransformerConfig(**{**base, **kw})


def test_world_not_divisible_by_the_replica_size() -> None:
    with pytest.raises(ConfigError, match="world_size=6 is not a multiple of TP\\*PP=4\\*1"):
        ReplicaRanks(world_size=6, tensor_parallel=4)
    with pytest.raises(ConfigError, match="tensor_parallel=0"):
        ReplicaRanks(world_size=4, tensor_parallel=0)


@pytest.mark.parametrize(
    ("model", "cluster", "ranks", "match"),
    [
        ({"tensor_model_parallel_size": 2}, {"tensor_parallel": 1}, {"tensor_parallel": 2},
         "tensor_parallel: the model has 2, Cluster.*=1"),
        ({"tensor_model_parallel_size": 2, "sequence_parallel": True},
         {"tensor_parallel": 2}, {"tensor_parallel": 2}, "sequence_parallel=True but the Cluster"),
        ({"pipeline_model_parallel_size": 2, "pipeline_dtype": torch.float32},
         {"pipeline_parallel": 2},
         {"pipeline_parallel": 1}, "pipeline_parallel: the model has 2"),
        ({"tensor_model_parallel_size": 4, "num_query_groups": 2}, {"tensor_parallel": 4},
         {"tensor_parallel": 4}, "TP=4 does not divide num_query_groups=2"),
        ({"context_parallel_size": 2}, {}, {}, "context_parallel_size=2"),
    ],
)  # fmt: skip
def test_model_cluster_and_ranks_must_agree(model: dict, cluster: dict, ranks: dict,
                                            match: str) -> None:  # fmt: skip
    from fcp_exec.megatron import check_layout

    world = 8
    r = ReplicaRanks(world_size=world, **ranks)
    c = Cluster(r.num_replicas, tokens_per_replica=1024, devices_per_node=world, **cluster)
    with pytest.raises(ConfigError, match=match):
        check_layout(_config(**model), c, r)


def test_agreeing_layout_passes_and_replica_count_is_checked() -> None:
    from fcp_exec.megatron import check_layout

    r = ReplicaRanks(world_size=8, tensor_parallel=2)
    cfg = _config(tensor_model_parallel_size=2, sequence_parallel=True)
    check_layout(cfg, Cluster(4, tokens_per_replica=64, tensor_parallel=2, devices_per_node=8,
                              sequence_parallel=True), r)  # fmt: skip
    with pytest.raises(ConfigError, match="Cluster\\(num_replicas=8\\) but world_size=8"):
        check_layout(cfg, Cluster(8, tokens_per_replica=64, tensor_parallel=2, devices_per_node=8,
                                  sequence_parallel=True), r)  # fmt: skip


def test_explicit_cache_capacity_must_hold_one_batch() -> None:
    """Refused in prepare_plan before any group is created (no collective has started)."""
    from fcp_data.planner.plan import CPGroup, Plan, Wave

    ranks = ReplicaRanks(world_size=16, tensor_parallel=4)
    groups = tuple(CPGroup(replicas=(0, 1, 2), degree=3, sequence_ids=(0,), seqlens=(9,),
                           causal=(True,), predicted_time=0.0) for _ in range(1))  # fmt: skip
    plan = Plan(num_replicas=4, waves=(Wave(groups=groups),), predicted_time=0.0,
                lower_bound=0.0, strategy="t", winner="t")  # fmt: skip
    cache = CPGroupCache(ranks, capacity=4)
    assert cache.groups_needed(plan) == 5  # 4 CP rings (one per TP rank) + the TP x CP group
    with pytest.raises(ConfigError, match=r"needs 5 process groups.*capacity=4"):
        cache.prepare_plan(plan)
    assert cache.created == 0
    with pytest.raises(ConfigError, match="plan is for 4 replicas but the ranks hold 2"):
        CPGroupCache(ReplicaRanks(world_size=8, tensor_parallel=4)).prepare_plan(plan)


def test_virtual_pipeline_stages_are_refused_with_the_reason() -> None:
    """Interleaved 1F1B came out 3x off the reference: refused by check_layout and by
    fcp_gpt_spec(vp_stage=...) instead of silently training wrong (was: accepted)."""
    from fcp_exec.megatron import check_layout, fcp_gpt_spec

    r = ReplicaRanks(world_size=8, pipeline_parallel=2)
    c = Cluster(r.num_replicas, tokens_per_replica=64, pipeline_parallel=2, devices_per_node=8)
    plain = _config(num_layers=4, pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    check_layout(plain, c, r)  # plain 1F1B passes
    vpp = _config(num_layers=4, pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
                  virtual_pipeline_model_parallel_size=2)  # fmt: skip
    with pytest.raises(ConfigError, match=r"virtual_pipeline_model_parallel_size=2.*3x off"):
        check_layout(vpp, c, r)
    with pytest.raises(ConfigError, match="vp_stage=1: fcp does not support virtual pipeline"):
        fcp_gpt_spec(vpp, vp_stage=1)
