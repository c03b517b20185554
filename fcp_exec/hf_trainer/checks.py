"""Settings fcp's trainer cannot honour, refused by name before the first step.

Each check names the setting, the value allowed and the fix, so a refusal comes before
accelerate or TRL fail in their own words (docs/hf-trainer.md lists them).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from fcp_data.errors import ConfigError
from fcp_exec.hf import fcp_ring_attention_forward

__all__ = [
    "DEEPSPEED_WHY",
    "PARALLEL_WHY",
    "attn_name",
    "check_parallelism",
    "check_trainer_args",
    "fsdp_summing",
    "is_fcp_attention",
]


def _value(x: Any) -> Any:
    """An enum's value (TrainingArguments keeps strategies as enums), else x."""
    return getattr(x, "value", x)


def check_trainer_args(args: Any) -> None:
    """ConfigError for a TrainingArguments / SFTConfig setting fcp's trainer cannot honour.

    Called by the mixin before the Trainer is built (so the refusal comes before accelerate or
    TRL fail in their own words) and again after. Each message names the setting, the value
    allowed and the fix.
    """
    if args is None:
        return
    if getattr(args, "gradient_accumulation_steps", 1) != 1:
        raise ConfigError(
            f"gradient_accumulation_steps={args.gradient_accumulation_steps}: with fcp the "
            "plan's waves are the gradient accumulation (every global batch is one optimizer "
            "step, as many waves as its plan has); set gradient_accumulation_steps=1 and size "
            "the step with the loader's global_batch_size"
        )
    for name in ("padding_free", "packing"):
        if getattr(args, name, False):
            raise ConfigError(
                f"{name}=True: fcp's loader already packs each replica's sequences (THD, with "
                f"their own position ids and boundaries); set {name}=False (TRL's packing would "
                "need FlashAttention varlen and a single fixed layout)"
            )
    if getattr(args, "deepspeed", None):
        raise ConfigError(f"deepspeed={args.deepspeed!r}: " + DEEPSPEED_WHY)
    check_parallelism(getattr(args, "parallelism_config", None))
    if getattr(args, "label_smoothing_factor", 0.0):
        raise ConfigError(
            f"label_smoothing_factor={args.label_smoothing_factor}: fcp computes the loss per "
            "token over the plan's loss-token count; label smoothing is not part of it. Set "
            "label_smoothing_factor=0.0"
        )
    loss_type = getattr(args, "loss_type", "nll")
    if loss_type not in (None, "nll"):
        raise ConfigError(
            f"loss_type={loss_type!r}: fcp's step computes the negative log-likelihood per "
            "token over the plan's count; set loss_type='nll'"
        )
    strategy = _value(getattr(args, "eval_strategy", "no"))
    if strategy not in (None, "no"):
        raise ConfigError(
            f"eval_strategy={strategy!r}: the Trainer's evaluation runs padded rows without "
            "fcp's packed layout, which the 'fcp_ring' attention needs; set eval_strategy='no' "
            "and evaluate after training (set the model's attention back, e.g. "
            "model.set_attn_implementation('sdpa'))"
        )


DEEPSPEED_WHY = (
    "DeepSpeed runs its own gradient accumulation and reduction around the loss, which fcp's "
    "per-wave step bypasses; train with DDP or FSDP2 (transformers' DistributedConfig, or "
    "accelerate's FSDP2 on GPUs)"
)
PARALLEL_WHY = MappingProxyType(
    {
        "cp_size": "accelerate's context parallelism is one fixed degree over SDPA with every "
        "layer's mask forced causal, so packed documents would attend to the ones before them",
        "sp_size": "accelerate's sequence parallelism shards each batch a second time",
        "tp_size": "fcp's trainer scales the loss by the data-parallel size and binds no tensor-"
        "parallel groups (megatron-core's TP: docs/layouts/megatron.md)",
    }
)


def check_parallelism(pc: Any) -> None:
    """ConfigError for accelerate's CP, SP or TP (a ParallelismConfig; None: none)."""
    for name in ("cp_size", "sp_size", "tp_size"):
        size = getattr(pc, name, 1) or 1
        if size > 1:
            raise ConfigError(
                f"parallelism_config.{name}={size}: "
                + PARALLEL_WHY[name]
                + f"; keep {name}=1 (every process is a data-parallel replica to accelerate; "
                "fcp's loader sets the CP group of every micro-batch)"
            )


def attn_name(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None)


def is_fcp_attention(name: str | None) -> bool:
    if not name:
        return False
    from transformers import AttentionInterface

    try:
        return AttentionInterface()[name] is fcp_ring_attention_forward
    except KeyError:
        return False


def fsdp_summing(model: Any) -> list[str]:
    """Names of FSDP2 modules whose gradients are summed (divide factor 1): fcp's own rule."""
    out = []
    for name, module in model.named_modules():
        state_of = getattr(module, "_get_fsdp_state", None)
        if state_of is None:
            continue
        for group in getattr(state_of(), "_fsdp_param_groups", ()):
            if getattr(group, "gradient_divide_factor", None) == 1.0:
                out.append(name or "<root>")
                break
    return out
