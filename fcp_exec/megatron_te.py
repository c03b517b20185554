"""TransformerEngine attention on fcp's groups, for megatron-core users who keep TE.

`fcp_gpt_spec` builds on megatron's local spec: no TE linears, no fused attention (cuDNN, FA3),
no FP8, no CUDA graphs. This module keeps TE's layer spec and its `TEDotProductAttention`, and
hands TE the CP group of each micro-batch, which TE's attention takes per call
(`DotProductAttention.set_context_parallel_group(group, global_ranks, stream, comm_type)`; TE's
ring has no power-of-two rule):

    spec = fcp_te_spec(config)            # TE's GPT layer spec, FCPTEDotProductAttention inside
    model = GPTModel(config, spec, ..., pg_collection=fcp_process_groups())
    check_te_layout(config, cost)         # settings TE cannot run under fcp, refused by name
    with cp_context(mb.rank_plan, groups=cache, wave_groups=..., wave_ulysses=...):
        model(..., packed_seq_params=te_packed_seq_params(mb))

Per micro-batch `FCPTEDotProductAttention` reads the binding `cp_context` published and sets:
- u = 1 (a ring): the CP group, `cp_comm_type="p2p"`;
- u = d (all-to-all over heads): the CP group, "a2a";
- 1 < u < d (fcp's hybrid u x r): `[a2a block group, r-ring group]`, "a2a+p2p" (TE's
  hierarchical CP: consecutive members form the all-to-all groups, as fcp's blocks are);
- degree 1 (and a placeholder): no group;
and restores the previous group after the call (TE's backward keeps the group it ran with).

Chunk order. TE numbers the zigzag chunks of a member by its rank *inside the group*, i.e. in
sorted global-rank order (`get_distributed_rank(cp_group)`); fcp's collator shards by position in
the plan's ring. fcp's planner emits every ring in ascending replica order (so ascending global
ranks at every TP / PP position) and the two agree; a ring that is not ascending (a hand-made
plan) is refused before the first step, naming it, since TE would silently attend the wrong
chunks. A TE stream for CP exists only when megatron built the model with CP > 1, which fcp never
does; it is created on first use.

What TE cannot run under fcp, refused by `check_te_layout` before the first step: a sliding
window (TE's p2p / a2a+p2p CP have none), FP8 attention (TE has no FP8 attention for THD under
CP), head counts an all-to-all block cannot split; and per micro-batch, packs with bidirectional
sequences (TE runs the layer's one mask type, causal for a GPT, on every sequence). TE is not
installed on the CPU machines fcp is tested on: the plumbing is tested against a stand-in that
follows TE's documented contract (tests/exec/_te_standin.py), and the device suite has a TE case
for a GPU box that has TE.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.extensions.transformer_engine import TEDotProductAttention

from fcp_data.errors import ConfigError, ExecError, MissingDependencyError
from fcp_exec.context import FCP_BINDING_ATTR
from fcp_exec.megatron import FCPPackedSeqParams, packed_seq_params

__all__ = [
    "FCPTEDotProductAttention",
    "check_te_layout",
    "fcp_te_spec",
    "te_cp_args",
    "te_packed_seq_params",
]


def te_cp_args(binding: Any, heads: int, kv_heads: int) -> tuple[Any, list[int] | None, str]:
    """(cp_group, cp_global_ranks, cp_comm_type) for TE from what cp_context bound.

    ExecError for a ring TE would read in another chunk order (not ascending); ConfigError when
    an all-to-all block cannot split the heads (checked on every member alike: same model)."""
    if binding is None or binding.degree == 1:
        return None, None, "p2p"
    members = list(binding.members)
    if members != sorted(members):
        raise ExecError(
            f"CP group {tuple(members)} is not in ascending rank order: TransformerEngine reads "
            "a member's zigzag chunks by its rank inside the group (sorted order), fcp's "
            "collator shards by ring position, so TE would attend the wrong chunks. fcp's "
            "planner emits ascending rings; a hand-made plan must too"
        )
    u = int(binding.ulysses)
    if u > 1 and (heads % u or kv_heads % u):
        raise ConfigError(
            f"TE's all-to-all CP over {u} members needs the heads ({heads}) and query groups "
            f"({kv_heads}) per TP rank divisible by {u}; plan this model with "
            "CostModel(head_parallel=False) or a u that divides both"
        )
    if u == 1:
        return binding.group, members, "p2p"
    if u == binding.degree:
        return binding.group, members, "a2a"
    return [binding.a2a_group, binding.ring_group], members, "a2a+p2p"


class FCPTEDotProductAttention(TEDotProductAttention):
    """megatron's `TEDotProductAttention` that binds the CP group of each fcp micro-batch
    (module doc). Pass `te_packed_seq_params(mb)`; megatron's own per-call switch
    (`packed_seq_params.cp_group`) stays unused."""

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ExecError(
                "FCPTEDotProductAttention needs fcp's packed THD micro-batches: pass "
                "packed_seq_params=te_packed_seq_params(micro_batch)"
            )
        causal = getattr(packed_seq_params, "causal", None)
        if causal is not None and not all(causal):
            raise ExecError(
                f"a micro-batch holds bidirectional sequences (causal flags {causal}): "
                "TransformerEngine runs the layer's one mask type (causal for a GPT) on every "
                "sequence; run such packs with FCPCoreAttention (fcp_gpt_spec)"
            )
        cu = packed_seq_params.cu_seqlens_q
        if cu is not None and cu.device != query.device:
            raise ExecError(
                f"cu_seqlens are on {cu.device}, the query on {query.device}: TE reads them on "
                "the device; build them with te_packed_seq_params(mb) after mb.to(device)"
            )
        binding = getattr(parallel_state, FCP_BINDING_ATTR, None)
        group, ranks, comm_type = te_cp_args(binding, query.shape[-2], key.shape[-2])
        stream = None
        if group is not None and torch.cuda.is_available():
            if TEDotProductAttention.cp_stream is None:  # built only when CP > 1 at init
                TEDotProductAttention.cp_stream = torch.cuda.Stream()
            stream = TEDotProductAttention.cp_stream
        saved = (
            getattr(self, "cp_group", None),
            getattr(self, "cp_global_ranks", None),
            getattr(self, "cp_stream", None),
            getattr(self, "cp_comm_type", "p2p"),
        )
        base = super(TEDotProductAttention, self)  # TE's DotProductAttention
        base.set_context_parallel_group(group, ranks, stream, comm_type)
        try:
            return super().forward(
                query,
                key,
                value,
                attention_mask,
                attn_mask_type,
                attention_bias,
                packed_seq_params,
                **kwargs,
            )
        finally:
            base.set_context_parallel_group(*saved)


def te_packed_seq_params(mb: Any) -> FCPPackedSeqParams:
    """PackedSeqParams for `FCPTEDotProductAttention`: offsets on the micro-batch's device (TE
    reads them there), no `cp_group` / `local_cp_size` (the binding supplies the group)."""
    params = packed_seq_params(mb, host_offsets=False)
    params.cp_group = None
    params.local_cp_size = None
    return params


def check_te_layout(config: Any, cost: Any = None) -> None:
    """ConfigError, before the first step, for TE settings fcp's micro-batches cannot run."""
    window = getattr(config, "window_size", None)
    if window is not None:
        raise ConfigError(
            f"window_size={window}: TransformerEngine's p2p and a2a+p2p context parallelism "
            "have no sliding window; set TransformerConfig(window_size=None)"
        )
    fp8 = getattr(config, "fp8", None)
    if fp8:
        raise ConfigError(
            f"fp8={fp8!r}: TransformerEngine has no FP8 attention for THD inputs under context "
            "parallelism; keep FP8 off for attention (fp8=None, or fp8_dot_product_attention "
            "off) when training with fcp"
        )
    if getattr(config, "context_parallel_size", 1) != 1:
        raise ConfigError(
            f"context_parallel_size={config.context_parallel_size}: initialise megatron with "
            "context-parallel size 1; fcp binds each micro-batch's CP group itself"
        )
    if cost is not None and getattr(cost, "head_parallel", False):
        heads = config.num_attention_heads // config.tensor_model_parallel_size
        groups = (config.num_query_groups or config.num_attention_heads) // (
            config.tensor_model_parallel_size
        )
        if heads % 2 or groups % 2:
            raise ConfigError(
                f"CostModel(head_parallel=True) plans all-to-all transports, which TE runs only "
                f"when every block size divides the heads ({heads}) and query groups ({groups}) "
                "per TP rank; plan with head_parallel=False"
            )


def fcp_te_spec(config: Any, **kwargs: Any) -> Any:
    """megatron's TransformerEngine GPT layer spec with `FCPTEDotProductAttention` as its core
    attention (needs TransformerEngine). Keyword arguments go to
    `get_gpt_layer_with_transformer_engine_spec` (qk_layernorm, ...)."""
    from megatron.core.extensions import transformer_engine as mte
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
    )

    if not getattr(mte, "HAVE_TE", False):
        raise MissingDependencyError(
            "fcp_te_spec needs TransformerEngine (pip install transformer-engine[pytorch], "
            "matching your CUDA); without it use fcp_exec.megatron.fcp_gpt_spec"
        )
    spec = get_gpt_layer_with_transformer_engine_spec(**kwargs)
    spec.submodules.self_attention.submodules.core_attention = FCPTEDotProductAttention
    return spec
