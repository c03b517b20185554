"""Plans are bit-for-bit identical across processes (every replica plans on its own)."""

import multiprocessing as mp

from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch


def _plan_bytes(seed: int, queue) -> None:
    lens = generate_lengths("internvid", 300, seed=seed)
    cost = CostModel.from_model("qwen3-vl-8b", "ascend-910c")
    plan = plan_global_batch(
        lens, Cluster(32, replicas_per_node=16, tokens_per_replica=16384), cost
    )
    queue.put(plan.to_msgpack())


def test_two_processes_make_the_same_plan():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_plan_bytes, args=(7, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0] == got[1]
    here = plan_global_batch(
        generate_lengths("internvid", 300, seed=7),
        Cluster(32, replicas_per_node=16, tokens_per_replica=16384),
        CostModel.from_model("qwen3-vl-8b", "ascend-910c"),
    )
    assert here.to_msgpack() == got[0]
