"""megatron-core integration: FCP core attention, a CP group that follows cp_context, RoPE on CPU.

Usage (megatron-core 0.19.2 tested; 0.16.1 kept working):

    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    model = GPTModel(config, spec, ..., pg_collection=fcp_process_groups())
    with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups):
        loss = model(mb.tokens, mb.position_ids, None, labels=mb.labels,
                     packed_seq_params=packed_seq_params(mb))

Why `fcp_process_groups`: megatron's Attention stores `pg_collection.cp` when the model is
built and its THD RoPE slices positions with `cp_group.size()` / `.rank()` in TE's zigzag
layout; with a group fixed at build time every micro-batch after the first would rotate with
the wrong positions. `ActiveCPGroup` answers size/rank from the group cp_context bound.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.attention import ring_attention
from fcp_exec.context import FCP_BINDING_ATTR
from fcp_exec.layout import ShardLayout
from fcp_exec.transport import cp_attention

if TYPE_CHECKING:
    from fcp_data.collate import MicroBatch

__all__ = [
    "ActiveCPGroup",
    "FCPCoreAttention",
    "FCPPackedSeqParams",
    "TorchNorm",
    "check_layout",
    "fcp_gpt_spec",
    "fcp_process_groups",
    "keep_rotary_on_cpu",
    "packed_seq_params",
]


class ActiveCPGroup:
    """Stands in for `pg_collection.cp`: size() and rank() of the CP group bound right now.

    rank() is the position in the *ring* (the zigzag chunk index the collator sharded by),
    read from the CP global ranks cp_context bound; a torch process group's own rank() is the
    position in sorted global-rank order, which differs for a ring like (3, 1).
    """

    def _group(self) -> torch.distributed.ProcessGroup:
        group = parallel_state.get_context_parallel_group(check_initialized=False)
        if group is None:
            raise ExecError(
                "no context-parallel group is bound: run the model inside "
                "fcp_exec.cp_context(rank_plan, groups=...) after initialize_model_parallel"
            )
        return group

    def size(self) -> int:
        return self._group().size()

    def rank(self) -> int:
        self._group()
        ring = parallel_state.get_context_parallel_global_ranks(check_initialized=False)
        return list(ring).index(torch.distributed.get_rank())


def fcp_process_groups() -> ProcessGroupCollection:
    """megatron's process groups with `cp` replaced by `ActiveCPGroup` (pass to GPTModel)."""
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    pgs.cp = ActiveCPGroup()
    return pgs


@dataclass
class FCPPackedSeqParams(PackedSeqParams):
    """PackedSeqParams plus one causal flag per sequence (mixed causal / bidirectional packs)
    and the micro-batch's `ShardLayout` (host offsets: no layer reads the device for them)."""

    causal: tuple[bool, ...] | None = None
    fcp_layout: ShardLayout | None = None


def packed_seq_params(
    mb: MicroBatch,
    cp_group: torch.distributed.ProcessGroup | ActiveCPGroup | None = None,
    *,
    host_offsets: bool = True,
) -> FCPPackedSeqParams:
    """megatron-core's PackedSeqParams (qkv_format "thd") for one fcp MicroBatch.

    cu_seqlens are those of the unsharded sequences (TE divides the padded offsets by the CP
    size itself); max_seqlen is the longest padded sequence; `causal` carries the per-sequence
    flags FCPCoreAttention needs for mixed causal / full packs, `fcp_layout` the micro-batch's
    layout (FCPCoreAttention builds nothing per layer). Pass the CP process group that
    `fcp_exec.cp_context` bound, or leave it None to let megatron-core use its own.

    host_offsets: the cu_seqlens tensors are the micro-batch's host copies (CPU int32), even
    after `mb.to("cuda")`: megatron-core's THD RoPE reads them with `.tolist()` in every layer,
    which on device tensors is a host sync per layer. FCPCoreAttention never reads them on the
    device. Pass False for an attention that needs them on the device (TransformerEngine's).
    """
    cu, cup = mb.cu_seqlens, mb.cu_seqlens_padded
    if host_offsets:
        host, host_padded = mb.host_offsets()
        cu = torch.tensor(host, dtype=torch.int32)
        cup = torch.tensor(host_padded, dtype=torch.int32)
    return FCPPackedSeqParams(
        causal=mb.causal,
        fcp_layout=ShardLayout.of(mb),
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cup,
        cu_seqlens_kv_padded=cup,
        max_seqlen_q=mb.max_seqlen,
        max_seqlen_kv=mb.max_seqlen,
        local_cp_size=max(mb.rank_plan.degree, 1),
        cp_group=cp_group,
    )


class TorchNorm:
    """torch LayerNorm / RMSNorm as a megatron norm module that also works under sequence parallel.

    megatron's fallback without Apex or Transformer Engine (`WrappedTorchNorm`) refuses
    `sequence_parallel=True`; the fused norms only differ by marking their parameters
    `sequence_parallel`, so that the TP sum of their partial gradients (each TP rank normalises
    1/TP of the tokens) finds them. This does the same on any device.
    """

    def __new__(
        cls,
        config: TransformerConfig,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ) -> torch.nn.Module:
        kind = getattr(config, "normalization", normalization)
        if kind == "RMSNorm":
            norm: torch.nn.Module = torch.nn.RMSNorm(hidden_size, eps=eps)
        elif kind == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        else:
            raise ConfigError(f"normalization={kind!r}: TorchNorm has LayerNorm and RMSNorm")
        for p in norm.parameters():
            p.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]
        return norm


def fcp_gpt_spec(config: TransformerConfig, *, vp_stage: int | None = None) -> Any:
    """GPTModel's `transformer_layer_spec` for this pipeline stage: megatron's local layer spec
    with FCPCoreAttention and `TorchNorm` (sequence-parallel capable) in every norm slot.

    With Transformer Engine, swap `core_attention` in TE's spec instead (same one line).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    spec = get_gpt_layer_local_spec(
        qk_layernorm=bool(config.qk_layernorm), normalization=config.normalization
    )
    sub = spec.submodules
    sub.self_attention.submodules.core_attention = FCPCoreAttention
    norms = (WrappedTorchNorm, *_fused_norms())
    for holder in (sub, sub.self_attention.submodules):
        for name in vars(holder):
            if any(getattr(holder, name) is norm for norm in norms):
                setattr(holder, name, TorchNorm)
    if vp_stage is not None:
        raise ConfigError(
            f"vp_stage={vp_stage}: fcp does not support virtual pipeline stages (see "
            "check_layout); build one stage per pipeline rank (vp_stage=None)"
        )
    layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[spec] * layers, layer_norm=TorchNorm)


def check_layout(config: TransformerConfig, cluster: Any, ranks: Any) -> None:
    """Refuse, before the first step, a megatron model, planner Cluster and ReplicaRanks that
    disagree on the parallel layout (ConfigError naming both sizes).

    Each mismatch would otherwise fail late or silently: a Cluster without sequence_parallel
    pads rows to 2d only and megatron's scatter asserts on most micro-batches at TP = 8; a
    Cluster with the wrong replica count plans rings over ranks that hold other shards;
    megatron initialised with context_parallel_size > 1 would shrink the data-parallel group
    fcp's gradient sum runs over.
    """
    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    pairs = [
        ("tensor_parallel", tp, cluster.tensor_parallel, ranks.tensor_parallel),
        ("pipeline_parallel", pp, cluster.pipeline_parallel, ranks.pipeline_parallel),
    ]
    for name, model_size, cluster_size, rank_size in pairs:
        if not model_size == cluster_size == rank_size:
            raise ConfigError(
                f"{name}: the model has {model_size}, Cluster(...{name}={cluster_size}) and "
                f"ReplicaRanks(...{name}={rank_size}); give all three the same size"
            )
    if bool(config.sequence_parallel) != bool(cluster.sequence_parallel):
        raise ConfigError(
            f"the model has sequence_parallel={config.sequence_parallel} but the Cluster "
            f"sequence_parallel={cluster.sequence_parallel}: rows must be padded to a multiple "
            f"of TP={tp} under sequence parallel; build the Cluster with the model's setting"
        )
    if cluster.num_replicas != ranks.num_replicas:
        raise ConfigError(
            f"Cluster(num_replicas={cluster.num_replicas}) but world_size={ranks.world_size} / "
            f"(TP={tp} x PP={pp}) = {ranks.num_replicas} replicas; plan for the replicas you run"
        )
    groups = config.num_query_groups or config.num_attention_heads
    for what, heads in (
        ("num_attention_heads", config.num_attention_heads),
        ("num_query_groups", groups),
    ):
        if heads % tp:
            raise ConfigError(
                f"TP={tp} does not divide {what}={heads}: every TP rank needs whole heads; "
                f"choose a TP size among the divisors of {heads}"
            )
    vpp = getattr(config, "virtual_pipeline_model_parallel_size", None)
    vpp_layers = getattr(config, "num_layers_per_virtual_pipeline_stage", None)
    if vpp not in (None, 1) or vpp_layers is not None:
        raise ConfigError(
            f"virtual pipeline stages (virtual_pipeline_model_parallel_size={vpp}, "
            f"num_layers_per_virtual_pipeline_stage={vpp_layers}) are not supported with fcp: "
            "under megatron's interleaved 1F1B schedule the gradients came out 3x off the "
            "single-process reference even without rings, and fcp's variable rows fail "
            "megatron's RoPE length check; train with plain 1F1B "
            "(virtual_pipeline_model_parallel_size=None)"
        )
    if getattr(config, "context_parallel_size", 1) != 1:
        raise ConfigError(
            f"context_parallel_size={config.context_parallel_size}: initialise megatron with "
            "context-parallel size 1; fcp binds each wave's CP group itself"
        )
    if parallel_state.model_parallel_is_initialized():
        state = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if state != (tp, pp):
            raise ConfigError(
                f"megatron's parallel_state was initialised with (TP, PP) = {state} but the "
                f"model config says ({tp}, {pp})"
            )


def _fused_norms() -> tuple[type, ...]:
    try:
        from megatron.core.fusions.fused_layer_norm import FusedLayerNorm
    except ImportError:
        return ()
    return (FusedLayerNorm,)


def _emb_without_device_move(self: RotaryEmbedding, max_seq_len: int, offset: int = 0) -> Any:
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if self.rotary_interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).reshape(freqs.shape[0], -1)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb[:, None, None, :]


def keep_rotary_on_cpu(model: torch.nn.Module) -> int:
    """Let megatron's RoPE run on CPU; returns how many RotaryEmbedding modules were patched.

    megatron-core 0.16 `RotaryEmbedding.get_emb` moves `inv_freq` to
    `torch.cuda.current_device()` on first use, which fails without CUDA. This replaces
    `get_emb` on each instance (not the class) with the same computation minus the move, and
    only when CUDA is unavailable; GPU runs are left untouched.
    """
    if torch.cuda.is_available():
        return 0
    patched = 0
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.get_emb = types.MethodType(_emb_without_device_move, module)  # type: ignore[method-assign]
            patched += 1
    return patched


class FCPCoreAttention(MegatronModule):
    """Drop-in `core_attention` for THD packed micro-batches: exact attention through the
    transport cp_context bound (`fcp_exec.cp_attention`: the ring, or the hybrid u x r, read
    from parallel_state's `_FCP_CP_BINDING`); d = 1 runs locally. Under TP the heads are the
    per-TP-rank heads, so u must divide them (checked before any collective)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ConfigError(
                f"attention_dropout={dropout}: FCP ring attention is exact and has no dropout; "
                "set TransformerConfig(attention_dropout=0.0)"
            )
        window = getattr(config, "window_size", None)
        if window is not None:
            raise ConfigError(
                f"window_size={window}: FCPCoreAttention computes exact full causal attention "
                "over each sequence, without a sliding window; set TransformerConfig("
                "window_size=None)"
            )
        self.attn_mask_type = attn_mask_type
        if softmax_scale is None:
            softmax_scale = config.softmax_scale
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(config.kv_channels)
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ConfigError(
                "FCPCoreAttention needs packed THD micro-batches: pass "
                "packed_seq_params=FCPPackedSeqParams(qkv_format='thd', cu_seqlens_q=..., "
                "cu_seqlens_q_padded=..., ...) to the model"
            )
        if attention_bias is not None:
            raise ConfigError("FCPCoreAttention does not support attention_bias (got a tensor)")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal: Any = None
        layout: ShardLayout | None = None
        if isinstance(packed_seq_params, FCPPackedSeqParams):
            causal = packed_seq_params.causal
            layout = packed_seq_params.fcp_layout
        if causal is None:
            causal = mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal)
        cu = packed_seq_params.cu_seqlens_q
        cu_padded = packed_seq_params.cu_seqlens_q_padded
        if cu_padded is None:
            cu_padded = cu
        ring = parallel_state.get_context_parallel_global_ranks()
        binding = getattr(parallel_state, FCP_BINDING_ATTR, None)
        if binding is not None and list(binding.members) == list(ring):
            out = cp_attention(  # what cp_context bound: ring or hybrid u x r
                query,
                key,
                value,
                cu,
                cu_padded,
                binding=binding,
                causal=causal,
                softmax_scale=self.softmax_scale,
                layout=layout,
            )
        else:  # CP groups set without cp_context: a ring over megatron's CP ranks
            out = ring_attention(
                query,
                key,
                value,
                cu,
                cu_padded,
                ring=ring,
                causal=causal,
                softmax_scale=self.softmax_scale,
                layout=layout,
                group=parallel_state.get_context_parallel_group(check_initialized=False),
            )
        return out.reshape(out.shape[0], -1)
