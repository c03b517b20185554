"""In-memory global batches: plan a batch you already hold, shard it per replica, put outputs back.

RL post-training (GRPO, PPO, ...) holds its global batch in memory: rollouts of prompt +
response token ids with per-token masks, advantages and log-probs. This package is the loader's
front end for such a batch; it reads no shard and talks to no process:

    batch = InMemoryBatch(token_ids, loss_mask=response_masks,
                          fields={"old_logprobs": old}, sequence_fields={"advantage": adv})
    sharded = shard_batch(batch, cluster, cost, replica=rank)   # plan_global_batch, then pack
    for mb in sharded.micro_batches:                             # one MicroBatch per wave
        ...  # the loader's layout: cp_context, fcp_exec.hf / megatron work unchanged
        mb.fields["old_logprobs"]                                # sharded like mb.labels

and after the step `fcp_exec.gather_sequences` / `fcp_exec.all_gather_sequences` turn per-token
outputs (log-probs, values, entropies) back into one tensor per original sequence, with
`fcp_data.collate.unshard` (`unshard_group`, `unshard_replicas`) as their pure arithmetic.

**The plan.** `shard_batch` calls `plan_global_batch` on the batch's lengths, so every replica
that holds the same batch gets the same plan and digest with no collective (the planner is
pure), exactly as every DataLoader worker of `FCPDataLoader` does. Micro-batches follow the
loader bit for bit: zigzag shards packed THD (`fcp_data.collate.pack_shard`), a placeholder
(or an empty micro-batch under `Cluster(idle="empty")`) for a wave the replica sits out,
`wave_groups` / `wave_ulysses`, and `global_num_loss_tokens` counted from the plan.

**Alignment.** Every per-token input is *token-aligned*: value k belongs to token k of its
sequence, the same length as the token ids. `loss_mask` says which tokens are predicted
(the response): as in the loader, slot t of a micro-batch predicts token t+1 (`labels[t]`), so
`mb.loss_mask[t]` is the mask of token t+1 and a sequence contributes the masked tokens of
positions 1..L-1. Per-token `fields` are shifted the same way by default ("label" alignment):
`mb.fields[name][t]` is the value of token t+1, next to the model's output for it (an old
log-prob next to the new one, an advantage next to its ratio). Names in `token_aligned` are not
shifted: slot t holds the value of token t (inputs of the forward, such as token-type ids).
Padding and the last real slot of a label-aligned field hold 0 (False), always under loss mask
0. Gathering inverts both: a label-aligned output comes back as L values with value k the
output for token k (k = 0, which nothing predicts, is `fill`). `labels` is `ignore_index`
outside the loss mask, as in the loader; `mb.next_tokens` is the token each slot predicts
everywhere, to score prompts too.

Modules: `batch` (the batch and its validation), `shard` (the plan and the micro-batches).
"""

from .batch import BatchInputError, InMemoryBatch
from .shard import InMemoryMicroBatch, ShardedBatch, shard_batch

__all__ = [
    "BatchInputError",
    "InMemoryBatch",
    "InMemoryMicroBatch",
    "ShardedBatch",
    "shard_batch",
]
