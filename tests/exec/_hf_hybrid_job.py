"""The text HF parity job under head-parallel transports: the loader's micro-batches of a plan
whose groups run the hybrid u x r (2 x 2 at d = 4, pure all-to-all at d = 2 and at d = 4 with
the 2 KV heads replicated to 4 members) beside a ring, through `cp_context(...,
wave_ulysses=mb.wave_ulysses)` and transformers' attention interface ("fcp_ring" dispatches on
the binding's transport)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._hf_text_job import LENGTHS, make_text_model
from ._vlm_job import load_tokenizer, token_loss

# per wave: (replicas, ulysses, sequences by length rank)
HYBRID_WAVES = (
    (((0, 1, 2, 3), 2, (0, 6)),),
    (((0, 1), 2, (1, 5)), ((2, 3), 1, (2,))),
    (((0, 1, 2, 3), 4, (3, 4)),),
)


def hybrid_planner(seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any) -> Any:
    from fcp_data.planner import CPGroup, Plan, Wave

    lens = np.asarray(seqlens, np.int64)
    order = [int(i) for i in np.argsort(-lens, kind="stable")]
    flags = np.broadcast_to(np.asarray(causal, bool), lens.shape)
    waves = []
    for wave in HYBRID_WAVES:
        groups = []
        for replicas, u, ranks in wave:
            ids = [order[r] for r in ranks]
            groups.append(
                CPGroup(
                    replicas=replicas, degree=len(replicas), sequence_ids=tuple(ids),
                    seqlens=tuple(int(lens[i]) for i in ids),
                    causal=tuple(bool(flags[i]) for i in ids), predicted_time=1.0, ulysses=u,
                )
            )  # fmt: skip
        waves.append(Wave(groups=tuple(groups)))
    return Plan(
        num_replicas=cluster.num_replicas, waves=tuple(waves), predicted_time=3.0,
        lower_bound=0.0, strategy="explicit", winner="explicit",
    ).with_digest()  # fmt: skip


def hybrid_worker(rank: int, world: int, index: str, tok_path: str, states: dict, out: str) -> None:
    import torch.distributed as dist

    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex
    from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients, cp_context
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids, register_attention

    loader = FCPDataLoader(
        LengthIndex.open(Path(index)),
        cluster=Cluster(world, tokens_per_replica=4096),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=rank,
        global_batch_size=len(LENGTHS),
        num_workers=0,
        tokenizer=load_tokenizer(Path(tok_path)),
        options=LoaderOptions(planner=hybrid_planner),
    )
    mbs = list(loader)
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    result: dict[str, Any] = {}
    for kind, state in states.items():
        model = make_text_model(kind, Path(state), attn=register_attention())
        loss_sum, transports = torch.zeros(()), []
        for mb in mbs:
            with cp_context(
                mb.rank_plan, groups=cache, wave_groups=mb.wave_groups,
                wave_ulysses=mb.wave_ulysses,
            ) as cp:  # fmt: skip
                if mb.is_empty:
                    continue
                logits = model(
                    input_ids=mb.tokens[None],
                    position_ids=hf_position_ids(mb),
                    **hf_attention_kwargs(mb, cp),
                ).logits[0]
                loss = token_loss(logits, mb.labels, mb.loss_mask) / mb.global_num_loss_tokens
                loss.backward()
                loss_sum += loss.detach()
                transports.append((cp.degree, cp.ulysses))
        all_reduce_gradients(model)
        dist.all_reduce(loss_sum)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        result[kind] = {"loss": float(loss_sum), "grads": grads, "transports": transports}
    # a cache prepared from bare replica tuples has no all-to-all blocks: the 2 x 2 group of
    # wave 0 raises the same LookupError on all four members (after the plan check), no hang
    bare = CPGroupCache(ReplicaRanks(world_size=world))
    try:
        with cp_context(mbs[0].rank_plan, groups=bare, wave_groups=mbs[0].wave_groups):
            pass
        raise AssertionError("a hybrid group ran without its all-to-all blocks")
    except LookupError as e:
        assert "wave_ulysses=mb.wave_ulysses" in str(e), e
    bare.clear()
    if rank == 0:
        torch.save(result, out)
