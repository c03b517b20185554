"""transformers decoders on fcp: ring attention as a registered attention implementation.

    from fcp_exec.hf import hf_attention_kwargs, register_attention
    register_attention()                                   # once per process: "fcp_ring"
    model.set_attn_implementation({"text_config": "fcp_ring"})   # VLM: decoder only
    # or AutoModelForCausalLM.from_config(cfg, attn_implementation="fcp_ring") for Qwen3/Llama
    with cp_context(mb.rank_plan, groups=cache) as cp:
        out = language_model(inputs_embeds=embeds[None], position_ids=positions,
                             **hf_attention_kwargs(mb, cp))

transformers dispatches every attention layer through its `AttentionInterface` registry on
`config._attn_implementation`; registering "fcp_ring" there runs an HF decoder (Llama, Qwen3,
Qwen2.5-VL's language model) on a zigzag THD shard with no change to model code. Like flash
attention's varlen path, the packed layout arrives as keyword arguments (`cu_seq_lens_q`,
`max_length_q`, ...) that the model forwards to each attention call; fcp adds the padded
offsets, the per-sequence causal flags and the binding (the attention runs `cp_attention`: the
ring, or the hybrid u x r all-to-all + ring the plan chose). The implementation is not in the mask
registry, so transformers builds no [T, T] mask (it would be wrong for a shard anyway).

Positions are the micro-batch's own, already rank-local: `mb.position_ids[None]` ([1, T]) for
1-D RoPE, `mb.mrope_position_ids[:, None]` ([3, 1, T]) for Qwen M-RoPE. The models apply them
token by token (cos/sin gathered per position), so nothing slices them again by CP rank.
"""

from __future__ import annotations

from typing import Any

import torch

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.attention import ring_attention
from fcp_exec.layout import ShardLayout
from fcp_exec.transport import cp_attention

__all__ = [
    "ATTN_IMPLEMENTATION",
    "fcp_ring_attention_forward",
    "hf_attention_kwargs",
    "hf_position_ids",
    "register_attention",
]

ATTN_IMPLEMENTATION = "fcp_ring"


def fcp_ring_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: q [1, H, T, D], k/v [1, H_kv, T, D] -> ([1, T, H, D], None).

    Needs the keyword arguments of `hf_attention_kwargs` (passed to the model's forward).
    """
    binding = kwargs.get("fcp_binding")
    ring = kwargs.get("fcp_ring")
    cu = kwargs.get("cu_seq_lens_q")
    if (binding is None and ring is None) or cu is None:
        raise ExecError(
            f"attn_implementation {ATTN_IMPLEMENTATION!r} needs the packed layout: call the model "
            "with **fcp_exec.hf.hf_attention_kwargs(micro_batch, binding) inside cp_context "
            "(no fcp_binding / cu_seq_lens_q keyword arguments arrived)"
        )
    if query.shape[0] != 1:
        raise ExecError(
            f"fcp ring attention takes one packed THD row (batch 1), got batch {query.shape[0]}"
        )
    if dropout:
        raise ConfigError(
            f"attention dropout {dropout}: fcp ring attention is exact and has no dropout; set "
            "config.attention_dropout = 0.0"
        )
    for name in ("sliding_window", "softcap", "s_aux"):  # what fcp's kernels do not compute
        if kwargs.get(name) is not None:
            raise ConfigError(
                f"{name}={kwargs[name]!r}: fcp ring attention computes exact full causal (or "
                "bidirectional) attention over each sequence, without sliding windows, logit "
                "soft-capping or attention sinks; turn it off in the model config "
                "(use_sliding_window=False / sliding_window=None, attn_logit_softcapping=None)"
                " or train this model without fcp_ring"
            )
    if attention_mask is not None:
        raise ExecError(
            "fcp ring attention got an attention mask; packed THD rows take none (leave "
            "attention_mask=None: sequences are separated by cu_seq_lens_q)"
        )
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # [T, H, D]
    cu_p, causal = kwargs["fcp_cu_seqlens_padded"], kwargs.get("fcp_causal", True)
    layout = kwargs.get("fcp_layout")  # built once per micro-batch: no host sync per layer
    if binding is not None:  # the bound transport: ring (u = 1) or hybrid u x r
        out = cp_attention(
            q, k, v, cu, cu_p, binding=binding, causal=causal, softmax_scale=scaling, layout=layout
        )
    else:  # an explicit ring from older callers (u = 1 by construction)
        out = ring_attention(
            q, k, v, cu, cu_p, ring=ring, causal=causal, softmax_scale=scaling, layout=layout
        )
    return out[None], None


def register_attention(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register fcp ring attention in transformers' AttentionInterface under `name` (idempotent)."""
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        from fcp_data.errors import MissingDependencyError

        raise MissingDependencyError(
            "fcp_exec.hf needs transformers >= 5: pip install 'transformers>=5'"
        ) from e
    AttentionInterface.register(name, fcp_ring_attention_forward)
    return name


def hf_attention_kwargs(mb: Any, binding: Any) -> dict[str, Any]:
    """Keyword arguments for an HF model's forward: the packed layout and the bound transport.

    mb: the MicroBatch; binding: what `cp_context` yielded (`fcp_binding`: the attention runs
    `cp_attention` on it, ring or hybrid u x r; `fcp_ring` is kept for u = 1 only). cu_seq_lens_*
    are the unsharded sequences' offsets, as transformers' flash-attention varlen path names them;
    `fcp_layout` is the micro-batch's `ShardLayout` from its host offsets, which every layer
    shares (its device schedule is built on the first layer), so no layer syncs the host.
    """
    if mb.is_empty:
        raise ExecError(
            "an empty micro-batch has nothing to run; build the loader with the default "
            "Cluster(idle='placeholder') so every replica runs every wave"
        )
    members = tuple(binding.members)
    if len(members) != mb.degree:
        raise ExecError(
            f"the bound group {members} has {len(members)} members but the micro-batch runs at "
            f"degree {mb.degree}; pass the binding of cp_context(mb.rank_plan, ...)"
        )
    cu = mb.cu_seqlens.to(torch.int32)
    return {
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": int(mb.max_seqlen),
        "max_length_k": int(mb.max_seqlen),
        "fcp_cu_seqlens_padded": mb.cu_seqlens_padded.to(torch.int32),
        "fcp_causal": tuple(bool(c) for c in mb.causal),
        "fcp_binding": binding,
        "fcp_layout": ShardLayout.of(mb),
        **({"fcp_ring": members} if binding.ulysses == 1 else {}),
    }


def hf_position_ids(mb: Any) -> torch.Tensor:
    """Rank-local positions in the shape HF decoders take: [3, 1, T] (M-RoPE) or [1, T]."""
    if mb.mrope_position_ids is not None:
        return mb.mrope_position_ids[:, None, :]
    return mb.position_ids[None, :]
