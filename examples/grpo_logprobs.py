"""GRPO on an in-memory rollout batch with fcp: log-probs, clipped loss, gradients vs 1 process.

    python examples/grpo_logprobs.py                  # 3 gloo replicas on this host
    python examples/grpo_logprobs.py --replicas 4 --capacity 200

RL post-training holds its global batch in memory (rollouts), not in shards. This example takes
a synthetic GRPO batch (2 prompts x 4 sampled responses, response masks, rewards normalised
within each prompt's group into advantages), and on N spawned gloo processes, one per
replica:

1. plans it with `fcp_data.inmemory.shard_batch` (plan_global_batch; every replica gets the
   same plan with no collective) and runs the behaviour policy (the weights that sampled the
   rollouts) on each replica's zigzag shards without gradients: a tiny random transformers
   Qwen3 with fcp's ring attention ("fcp_ring"); its per-token log-probs are the old
   log-probs (verl's `compute_log_prob` pass);
2. puts them back in sample order with `fcp_exec.all_gather_sequences` (every replica gets
   every sequence), checks `fcp_exec.gather_sequences` (within CP groups) agrees bit for bit,
   and attaches them as a per-token field (`ShardedBatch.with_fields`: the same plan, no
   re-planning);
3. runs the current policy (the same weights moved by a few updates, here seeded noise, so
   ratios differ from 1 and the clip is exercised): the clipped policy-gradient loss per
   token, averaged over the batch's response tokens, backward, gradients summed with
   `fcp_exec.all_reduce_gradients`, and its log-probs gathered too.

The same models run the same steps in this process without fcp (sdpa, one whole sequence at a
time); both are printed with their largest differences. `main()` returns them (tests/e2e).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from typing import Any

import numpy as np
import torch

VOCAB = 512
CLIP = 0.2  # PPO/GRPO clip range: ratios outside [0.8, 1.2] stop pushing
# (prompt length, response lengths) per prompt group: one response long enough that a replica
# of `--capacity` tokens cannot hold it alone (a CP group of degree >= 2), short ones that
# leave replicas idle in some wave (placeholder micro-batches)
GROUPS = ((12, (3, 41, 150, 9)), (20, (70, 5, 24, 230)))


def make_rollouts(seed: int = 0) -> dict[str, Any]:
    """A synthetic GRPO batch: token ids (prompt + response), response masks and per-sequence
    advantages (rewards standardised within each prompt's group)."""
    rng = np.random.default_rng(seed)
    tokens, masks, rewards, group = [], [], [], []
    for g, (prompt_len, responses) in enumerate(GROUPS):
        prompt = rng.integers(1, VOCAB, size=prompt_len)
        for n in responses:
            tokens.append(np.concatenate([prompt, rng.integers(1, VOCAB, size=n)]))
            masks.append(np.r_[np.zeros(prompt_len, bool), np.ones(n, bool)])
            rewards.append(float(rng.uniform(0, 1)))
            group.append(g)
    r, gid = np.array(rewards), np.array(group)
    adv = np.zeros_like(r)
    for g in np.unique(gid):  # GRPO: reward standardised within the prompt's group
        sel = gid == g
        adv[sel] = (r[sel] - r[sel].mean()) / (r[sel].std() + 1e-6)
    return {"tokens": tokens, "response_mask": masks, "advantage": adv.astype(np.float32)}


def make_policies(seed: int = 0, step: float = 1.0) -> tuple[dict, dict]:
    """(behaviour, current) weights: random, and the same moved by `step` x each tensor's
    spread of seeded noise, a stand-in for a few optimizer steps: ratios of 0.65-1.5, 15% of
    the response tokens outside the clip range."""
    old = make_model().state_dict()
    gen = torch.Generator().manual_seed(seed + 1)
    new = {}
    for name, v in old.items():
        spread = float(v.std()) if v.numel() > 1 and float(v.std()) > 0 else 0.02
        new[name] = v + step * spread * torch.randn(v.shape, generator=gen)
    return old, new


def make_model(state: dict[str, torch.Tensor] | None = None, attn: str = "sdpa") -> Any:
    """A 2-layer Qwen3 (hidden 32, 4 heads, 2 KV heads), float32, random weights (seed 0)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=attn,
    )
    model = transformers.Qwen3ForCausalLM(cfg).float()
    if state is not None:
        model.load_state_dict(state)
    return model


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per row of [T, V] logits (a placeholder's targets are 0: masked later)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(1, targets.clamp(min=0)[:, None])[:, 0]


def clipped_loss(
    logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy-gradient loss -min(r A, clip(r) A), and where r is outside
    the clip range."""
    ratio = torch.exp(logp - old)
    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    return loss, (ratio - 1).abs() > CLIP


# ---- fcp: one process per replica ----------------------------------------------------------
def fcp_worker(
    rank: int, world: int, port: int, out: Any, rollouts: dict, states: tuple, capacity: int
) -> None:
    """One replica: plan and shard the batch, old log-probs (behaviour policy), gather, the
    clipped loss of the current policy, backward, gradient sum; rank 0 sends the results."""
    import torch.distributed as dist

    from fcp_data.inmemory import InMemoryBatch, shard_batch
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.profiles import shipped_profile
    from fcp_exec import (
        CPGroupCache,
        ReplicaRanks,
        all_gather_sequences,
        all_reduce_gradients,
        cp_context,
        gather_sequences,
    )
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids, register_attention

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=240),
    )
    batch = InMemoryBatch(
        rollouts["tokens"],
        loss_mask=rollouts["response_mask"],
        sequence_fields={"advantage": rollouts["advantage"]},
    )
    # the measured CPU profile prices the ring, so short sequences stay at degree 1
    cost = CostModel.load(shipped_profile("cpu-small"))
    sharded = shard_batch(batch, Cluster(world, tokens_per_replica=capacity), cost, replica=rank)
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    cache.prepare_plan(sharded.plan)  # every group of the batch, pinned (collective)
    attn = register_attention()
    behaviour, policy = (make_model(state, attn=attn) for state in states)

    def logprobs(model: Any, mb: Any, cp: Any) -> torch.Tensor:
        logits = model(
            input_ids=mb.tokens[None],
            position_ids=hf_position_ids(mb),
            use_cache=False,
            **hf_attention_kwargs(mb, cp),
        ).logits[0]
        return token_logprobs(logits, mb.next_tokens)  # every token, prompts too

    t0 = time.perf_counter()
    outputs: list[torch.Tensor | None] = []
    with torch.no_grad():  # 1. old log-probs; every micro-batch runs, placeholders too
        for mb in sharded.micro_batches:
            with cp_context(mb.rank_plan, groups=cache) as cp:
                outputs.append(None if mb.is_empty else logprobs(behaviour, mb, cp))
    old = all_gather_sequences(outputs, sharded, groups=cache)  # 2. in sample order
    own = gather_sequences(outputs, sharded, groups=cache)
    agree = torch.tensor(int(all(torch.equal(t, old[s]) for s, t in own.items())))
    sharded = sharded.with_fields({"old_logprobs": old})  # slot t: token t+1's old log-prob
    loss_sum, clipped = torch.zeros(()), torch.zeros(())
    new_outputs: list[torch.Tensor | None] = []
    for mb in sharded.micro_batches:  # 3. the current policy's clipped loss
        with cp_context(mb.rank_plan, groups=cache) as cp:
            if mb.is_empty:
                new_outputs.append(None)
                continue
            lp = logprobs(policy, mb, cp)
            per_token, was_clipped = clipped_loss(
                lp, mb.fields["old_logprobs"], mb.per_token("advantage")
            )
            loss = (per_token * mb.loss_mask).sum() / mb.global_num_loss_tokens
            loss.backward()
            loss_sum += loss.detach()
            clipped += (was_clipped * mb.loss_mask).sum()
            new_outputs.append(lp.detach())
    all_reduce_gradients(policy)  # a SUM over replicas: each loss is already its share
    new = all_gather_sequences(new_outputs, sharded, groups=cache)
    for t in (loss_sum, clipped):
        dist.all_reduce(t)
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, sharded.digest)
    if rank == 0:
        plan = sharded.plan
        out.put(
            {  # numpy, not tensors: torch would pass shared memory this process frees
                "old_logprobs": [t.numpy() for t in old],
                "logprobs": [t.numpy() for t in new],
                "loss": float(loss_sum),
                "clipped": int(clipped),
                "grads": {n: p.grad.numpy().copy() for n, p in policy.named_parameters()},
                "groups_agree": bool(agree),
                "digests": digests,
                "seconds": time.perf_counter() - t0,
                "waves": [[g.degree for g in w.groups] for w in plan.waves],
                "idle": sum(
                    plan.for_replica(r, w).is_empty
                    for r in range(world)
                    for w in range(plan.num_waves)
                ),
                "loss_tokens": sharded.global_num_loss_tokens,
            }
        )
    dist.barrier()
    dist.destroy_process_group()


# ---- the reference: one process, no fcp ------------------------------------------------------
def reference(rollouts: dict, states: tuple) -> dict[str, Any]:
    """The same steps with the plain models on each whole sequence (sdpa, no fcp)."""
    behaviour, policy = (make_model(state) for state in states)

    def logprobs(model: Any, ids: torch.Tensor) -> torch.Tensor:
        lp = torch.zeros(len(ids))  # token 0 has no prediction: 0, as fcp's gather fills it
        lp[1:] = token_logprobs(model(input_ids=ids[None]).logits[0, :-1], ids[1:])
        return lp

    ids = [torch.as_tensor(t, dtype=torch.int64) for t in rollouts["tokens"]]
    masks = [torch.as_tensor(m, dtype=torch.float32) for m in rollouts["response_mask"]]
    with torch.no_grad():
        old = [logprobs(behaviour, t) for t in ids]
    total = sum(float(m[1:].sum()) for m in masks)
    loss, new = torch.zeros(()), []
    for k, t in enumerate(ids):
        lp = logprobs(policy, t)
        adv = torch.tensor(rollouts["advantage"][k])
        per_token, _ = clipped_loss(lp[1:], old[k][1:], adv)
        loss = loss + (per_token * masks[k][1:]).sum()
        new.append(lp.detach())
    loss = loss / total
    loss.backward()
    return {
        "old_logprobs": old,
        "logprobs": new,
        "loss": float(loss.detach()),
        "grads": {n: p.grad.clone() for n, p in policy.named_parameters()},
    }


def compare(got: dict, ref: dict) -> dict[str, float]:
    """Largest differences: log-probs (absolute), loss and gradients (relative)."""
    lp = max(
        float((a - b).abs().max())
        for key in ("old_logprobs", "logprobs")
        for a, b in zip(got[key], ref[key])
    )
    loss = abs(got["loss"] - ref["loss"]) / abs(ref["loss"])
    grad = max(float((got["grads"][n] - g).norm() / g.norm()) for n, g in ref["grads"].items())
    return {"logprobs_abs": lp, "loss_rel": loss, "grads_rel": grad}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both, print them and their differences; returns {differences, "fcp", "reference"}."""
    from fcp.profiling.spawn import run_group

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=3, help="gloo processes, one per replica")
    p.add_argument("--capacity", type=int, default=224, help="tokens per replica")
    p.add_argument("--seed", type=int, default=0, help="of the rollouts and the policy update")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rollouts = make_rollouts(args.seed)
    states = make_policies(args.seed)
    got = run_group(
        fcp_worker,
        args.replicas,
        rollouts,
        states,
        args.capacity,
        timeout_s=300,
        what="the fcp replicas of grpo_logprobs",
    )
    for key in ("old_logprobs", "logprobs"):
        got[key] = [torch.from_numpy(a) for a in got[key]]
    got["grads"] = {n: torch.from_numpy(a) for n, a in got["grads"].items()}
    ref = reference(rollouts, states)
    diff = compare(got, ref)
    n_tok = sum(len(t) for t in rollouts["tokens"])
    same = len(set(got["digests"])) == 1
    print(
        f"plan: {args.replicas} replicas, {len(got['waves'])} waves, CP degrees per wave "
        f"{got['waves']}, placeholders {got['idle']}; digest {got['digests'][0][:12]}, the "
        f"same on every replica: {same}"
    )
    print(
        f"log-probs (old and current policy): {len(got['logprobs'])} sequences, {n_tok} "
        f"tokens; gathered within CP groups == all-gathered: {got['groups_agree']}; max "
        f"|fcp - reference| = {diff['logprobs_abs']:.2e}"
    )
    print(
        f"loss: fcp {got['loss']:.8f}, reference {ref['loss']:.8f} (relative difference "
        f"{diff['loss_rel']:.1e}); {got['clipped']} of {got['loss_tokens']} response tokens "
        f"with the ratio outside [{1 - CLIP}, {1 + CLIP}]"
    )
    print(
        f"gradients: {len(ref['grads'])} tensors, max relative difference "
        f"{diff['grads_rel']:.1e} (fcp {got['seconds']:.1f} s per replica)"
    )
    return {**diff, "fcp": got, "reference": ref}


if __name__ == "__main__":
    main()
