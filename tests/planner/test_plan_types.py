import numpy as np
import pytest

from fcp_data.planner import Cluster, Plan, generate_lengths, plan_global_batch


@pytest.fixture(scope="module")
def plan(qwen8b) -> Plan:
    lens = generate_lengths("github", 96, seed=3)
    return plan_global_batch(
        lens, Cluster(12, replicas_per_node=4, tokens_per_replica=8192), qwen8b
    )


def test_json_and_msgpack_round_trip(plan):
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_msgpack(plan.to_msgpack()) == plan
    assert Plan.from_json(plan.to_json()).digest == plan.digest
    assert len(plan.digest) == 32


def test_digest_covers_structure_not_floats(plan):
    import msgspec

    w0 = plan.waves[0]
    g0 = w0.groups[0]
    retimed = msgspec.structs.replace(g0, predicted_time=g0.predicted_time * 1.5)
    other = msgspec.structs.replace(
        plan, waves=(msgspec.structs.replace(w0, groups=(retimed, *w0.groups[1:])), *plan.waves[1:])
    )
    assert other.with_digest().digest == plan.digest
    moved = msgspec.structs.replace(g0, sequence_ids=(*g0.sequence_ids[::-1], 10**6))
    other = msgspec.structs.replace(
        plan, waves=(msgspec.structs.replace(w0, groups=(moved, *w0.groups[1:])), *plan.waves[1:])
    )
    assert other.with_digest().digest != plan.digest


def test_for_replica_views(plan):
    seen = 0
    for w in range(plan.num_waves):
        for r in range(plan.num_replicas):
            rp = plan.for_replica(r, w)
            assert rp.wave == w and rp.num_waves == plan.num_waves and rp.digest == plan.digest
            if rp.is_empty:
                assert rp.degree == 0 and rp.sequence_ids == () and rp.index_in_group == -1
                assert all(r not in g.replicas for g in plan.waves[w].groups)
            else:
                seen += 1
                assert rp.group_replicas[rp.index_in_group] == r
                assert rp.degree == len(rp.group_replicas)
                assert sum(rp.seqlens) > 0
    assert seen > 0
    assert plan.rank_plans(0)[-1].is_last_wave
    with pytest.raises(ValueError, match=r"replica=12 is outside \[0, 12\)"):
        plan.for_replica(12, 0)
    with pytest.raises(ValueError, match="wave=-1"):
        plan.for_replica(0, -1)


def test_plan_records_candidates_and_winner(plan):
    assert plan.winner in plan.candidates
    assert plan.predicted_time == min(plan.candidates.values())
    assert any(k.startswith("static-balanced") for k in plan.candidates)
    assert any(k.startswith("paper") for k in plan.candidates)
    assert np.isclose(plan.ratio_to_bound, plan.predicted_time / plan.lower_bound)
