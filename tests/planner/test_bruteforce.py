"""Exhaustive optimum on tiny instances under the same cost model and plan space.

The oracle enumerates every partition of the sequences into micro-batches, every order and
every contiguous window (start, degree) of each micro-batch, each group starting as soon as its
window is free: the whole space fcp's plans live in. fcp can never beat it (that would mean the
scorer or the oracle is wrong) and must come close to it.
"""

import itertools
import math

import numpy as np
import pytest

from fcp_data.planner import Cluster, CostModel, plan_global_batch


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]
        yield [[first], *part]


def optimum(lens, cluster: Cluster, cost: CostModel) -> float:
    n, rpn, cap = cluster.num_replicas, cluster.replicas_per_node, cost.capacity_tokens(cluster)
    best = math.inf
    for part in set_partitions(list(range(len(lens)))):
        options = []
        for block in part:
            opts = []
            for d in range(1, n + 1):
                local = sum(s if d == 1 else -(-s // (2 * d)) * 2 for s in lens[block])
                if local > cap:
                    continue
                for s0 in range(0, n - d + 1):
                    t = cost.group_time(lens[block], d, inter_node=s0 // rpn != (s0 + d - 1) // rpn)
                    opts.append((s0, d, t))
            if not opts:
                break
            options.append(opts)
        else:
            for perm in itertools.permutations(range(len(part))):
                for choice in itertools.product(*(options[i] for i in perm)):
                    free = [0.0] * n
                    for s0, d, t in choice:
                        end = max(free[s0 : s0 + d]) + t
                        free[s0 : s0 + d] = [end] * d
                        if end >= best:
                            break
                    best = min(best, max(free))
    return best


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
    opt = optimum(lens, cluster, qwen8b)
    plan = plan_global_batch(lens, cluster, qwen8b)
    assert plan.predicted_time >= opt * (1 - 1e-9), "fcp beat the exhaustive optimum"
    assert plan.lower_bound <= opt * (1 + 1e-9), "the lower bound exceeds the optimum"
    assert plan.predicted_time <= opt * 1.10, (plan.predicted_time / opt, plan.winner)
