"""The gather job: 3 gloo processes, an explicit plan with a reversed degree-2 ring, a degree-1
group and an idle wave; good outputs gathered both ways, then three kinds of bad outputs and a
replica that planned another batch."""

from __future__ import annotations

from typing import Any

import torch

LENS = (37, 12, 5, 23)


def plan_for(lens: tuple[int, ...]) -> Any:
    """Wave 0: replicas (2, 0) run sequences 0 and 2 at degree 2 (ring order 2, 0), replica 1
    runs 1; wave 1: replicas (1, 2) run 3, replica 0 sits it out (a placeholder)."""
    from fcp_data.planner import CPGroup, Plan, Wave

    def group(replicas: tuple[int, ...], ids: tuple[int, ...]) -> CPGroup:
        return CPGroup(
            replicas=replicas,
            degree=len(replicas),
            sequence_ids=ids,
            seqlens=tuple(lens[i] for i in ids),
            causal=(True,) * len(ids),
            predicted_time=1.0,
        )

    waves = (
        Wave(groups=(group((2, 0), (0, 2)), group((1,), (1,)))),
        Wave(groups=(group((1, 2), (3,)),)),
    )
    return Plan(
        num_replicas=3,
        waves=waves,
        predicted_time=2.0,
        lower_bound=0.0,
        strategy="explicit",
        winner="explicit",
    ).with_digest()


def values(k: int, n: int) -> torch.Tensor:
    """Per-token values of sequence k: [n, 2], distinct everywhere."""
    base = torch.arange(n, dtype=torch.float64) + 1000 * (k + 1)
    return torch.stack([base, -base], dim=1)


def gather_worker(rank: int, world: int, out: str) -> None:
    from dataclasses import replace

    import msgspec

    from fcp_data.inmemory import InMemoryBatch, shard_batch
    from fcp_data.planner import Cluster, CostModel
    from fcp_exec import CPGroupCache, ReplicaRanks
    from fcp_exec.gather import GatherError, all_gather_sequences, gather_sequences

    plan = plan_for(LENS)
    batch = InMemoryBatch(
        [torch.arange(1, n + 1) for n in LENS],
        fields={"v": [values(k, n) for k, n in enumerate(LENS)]},
    )
    sharded = shard_batch(
        batch,
        Cluster(world, tokens_per_replica=4096),
        CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=rank,
        planner=lambda *a, **k: plan,
    )
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    cache.prepare_plan(sharded.plan)
    outs = [None if mb.rank_plan.is_empty else mb.fields["v"] for mb in sharded.micro_batches]
    result: dict[str, Any] = {
        "group": gather_sequences(outs, sharded, groups=cache),
        "all": all_gather_sequences(outs, sharded, groups=cache),
        "tokens": all_gather_sequences(
            [mb.tokens for mb in sharded.micro_batches], sharded, align="token"
        ),
        "errors": {},
    }
    wrong_rows = [o if o is None or rank != 1 else o[:-1] for o in outs]
    wrong_kind = [o if o is None or rank != 2 else o[:, :1] for o in outs]
    wrong_count = outs[:1] if rank == 0 else outs
    # rank 2 planned "another" batch: same groups, a barrier after wave 1 (another digest)
    other = msgspec.structs.replace(
        plan, waves=(plan.waves[0], msgspec.structs.replace(plan.waves[1], barrier=True))
    ).with_digest()
    sharded_as = replace(sharded, plan=other) if rank == 2 else sharded
    cases = (
        ("rows", wrong_rows, sharded),
        ("kind", wrong_kind, sharded),
        ("count", wrong_count, sharded),
        ("plan", outs, sharded_as),
    )
    for name, bad, held in cases:
        for fn in (gather_sequences, all_gather_sequences):
            try:
                fn(bad, held, groups=cache)
            except GatherError as e:
                result["errors"][f"{name}/{fn.__name__}"] = str(e)
    torch.save(result, f"{out}.{rank}")
