"""Exhaustive optimum on tiny instances under the same cost model and plan space.

The oracle enumerates every partition of the sequences into micro-batches, every order and
every contiguous window (start, degree) of each micro-batch, each group starting as soon as its
window is free: the whole space fcp's plans live in. fcp can never beat it (that would mean the
scorer or the oracle is wrong) and must come close to it.
"""

import numpy as np
import pytest

from fcp_data.planner import Cluster, plan_global_batch
from fcp_data.planner.oracle import exhaustive_optimum

CASES = [
    # (lengths, replicas, replicas per node, tokens per replica)
    ([6000, 1500, 900, 300], 3, 3, 4096),
    ([9000, 4000, 700], 3, 2, 4096),
    ([3000, 3000, 3000, 200], 2, 2, 4096),
    ([12000, 500, 500, 500], 3, 3, 4096),
    ([2000, 1800, 1700, 1600], 3, 1, 2048),
    ([7000, 6500, 300, 200], 4, 2, 4096),
]


@pytest.mark.parametrize("lens,n,rpn,cap", CASES)
def test_fcp_against_the_exhaustive_optimum(lens, n, rpn, cap, qwen8b):
    lens = np.array(lens)
    cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap)
    opt = exhaustive_optimum(lens, cluster, qwen8b)
    plan = plan_global_batch(lens, cluster, qwen8b)
    assert plan.predicted_time >= opt * (1 - 1e-9), "fcp beat the exhaustive optimum"
    assert plan.lower_bound <= opt * (1 + 1e-9), "the lower bound exceeds the optimum"
    assert plan.predicted_time <= opt * 1.10, (plan.predicted_time / opt, plan.winner)


def test_oracle_refuses_big_inputs(qwen8b):
    with pytest.raises(ValueError, match="tiny batches"):
        exhaustive_optimum(np.ones(9, int), Cluster(2, tokens_per_replica=10), qwen8b)
