"""fcp under the Hugging Face Trainer and TRL's SFTTrainer: packed sequences, CP of any degree.

    from fcp_exec.hf_trainer import with_fcp
    FCPSFTTrainer = with_fcp(trl.SFTTrainer)            # or transformers.Trainer, or a subclass
    trainer = FCPSFTTrainer(model=model, args=config, processing_class=tokenizer,
                            fcp_loader=loader)          # an FCPDataLoader for this replica
    trainer.train()                                     # resume_from_checkpoint=... works too

The model takes fcp's ring attention (`attn_implementation=fcp_exec.hf.register_attention()`),
the loader plans every global batch (CP groups of any degree, an idle replica's placeholder),
and this mixin turns the Trainer's step into fcp's:

- The train dataloader is fcp's, one item per global batch (`FCPStep`: this replica's waves).
  It does not go through `accelerator.prepare`, which would shard it a second time.
- One `training_step` runs every wave, placeholders included (DDP's and FSDP's collectives, and
  the one metrics all-reduce per step, meet on every rank), each inside `cp_context` with
  fcp's position ids and the packed layout as keyword arguments. The plan's waves are the
  gradient accumulation: DDP syncs only in the last wave, and `gradient_accumulation_steps`
  must stay 1.
- The loss is the sum of token losses over the plan's `global_num_loss_tokens` (the same number
  on every replica, exact for any mix of degrees), multiplied by the N data-parallel processes
  because DDP and FSDP average gradients over them (HF's own convention for
  `average_tokens_across_devices`). The Trainer averages the returned losses over processes,
  so what it logs is the global per-token mean: never per wave, never counting padding. On 4
  processes forgetting the factor makes every gradient (and the logged loss) 4x too small;
  applying fcp's own FSDP "sum" rule on top makes every gradient 4x too large while the logged
  loss looks right. The first is a planted bug the tests catch, the second is refused
  (tests/exec/test_hf_trainer.py).
- Resume: every checkpoint the Trainer saves also holds the loader's position
  (`fcp_loader.json`), and `train(resume_from_checkpoint=...)` restores it; the Trainer's own
  batch skipping, which would skip a second time, is turned off (`ignore_data_skip`).
- Logged per step: the Trainer's loss and grad norm, plus `fcp_loss_tokens` (tokens that
  trained), `fcp_tokens` (real tokens, no padding, no placeholder), `fcp_tokens_per_second`
  (those over the step's forward and backward time), `fcp_degrees` and `fcp_waves`. Under
  TRL, `entropy`, `mean_token_accuracy` and `num_tokens` are computed per token over the whole
  step (TRL's own, run per wave, would average over waves and count padded and placeholder
  positions as tokens).

Settings that cannot work are refused by name before the first step (`check_trainer_args`,
then the trainer's own state): accelerate's context or sequence parallelism (`cp_size`,
`sp_size` > 1: one fixed degree over SDPA with every mask forced causal), tensor parallelism,
TRL's `packing` / `padding_free` (fcp packs), an attention implementation that is not fcp's,
`gradient_accumulation_steps` > 1, DeepSpeed, a custom `compute_loss_func`, label smoothing,
TRL's `loss_type="dft"`, evaluation during training, a loader built for another replica or
world size, `Cluster(idle="empty")`, and FSDP modules already told to sum.

transformers, accelerate and TRL are imported only when a trainer is built (importing
fcp_exec stays light). Tested: transformers 5.24, trl 1.16.0, accelerate 1.16.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.context import CPBinding, cp_context
from fcp_exec.groups import CPGroupCache, ReplicaRanks
from fcp_exec.hf import fcp_ring_attention_forward, hf_attention_kwargs, hf_position_ids
from fcp_exec.layout import ShardLayout

__all__ = [
    "LOADER_STATE_FILE",
    "FCPStep",
    "FCPStepRecord",
    "FCPTrainLoader",
    "FCPTrainerMixin",
    "FCPTrainerOptions",
    "check_trainer_args",
    "load_loader_state",
    "real_token_mask",
    "save_loader_state",
    "with_fcp",
]

LOADER_STATE_FILE = "fcp_loader.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class FCPTrainerOptions:
    """What the trainer mixin does besides the step itself.

    verify_plan: `cp_context`'s check that the members of a ring hold the same plan (one small
    all-gather per group and wave, ~0.1-0.3 ms on gloo); off only when another check covers it.
    token_metrics: TRL's `entropy` and `mean_token_accuracy`, computed per token over the step
    (one extra softmax over each wave's logits); None: on when the trainer keeps TRL's metrics.
    """

    verify_plan: bool = True
    token_metrics: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.verify_plan, bool):
            raise ConfigError(f"verify_plan={self.verify_plan!r} must be True or False")
        if self.token_metrics is not None and not isinstance(self.token_metrics, bool):
            raise ConfigError(f"token_metrics={self.token_metrics!r} must be True, False or None")


@dataclass(frozen=True, kw_only=True, slots=True)
class FCPStepRecord:
    """One optimizer step as it trained, the same on every replica (`trainer.fcp_history`).

    loss: the global per-token mean; loss_tokens: tokens the loss was taken on (all replicas);
    tokens: real tokens trained (no padding, no placeholder); seconds: this replica's forward
    and backward time of the step; placeholders: this replica's placeholder waves.
    """

    step: int
    epoch: int
    batch: int
    loss: float
    loss_tokens: int
    tokens: int
    waves: int
    degrees: tuple[int, ...]
    placeholders: int
    seconds: float


def real_token_mask(mb: Any) -> torch.Tensor:
    """Bool [T]: the positions of `mb` that hold real tokens (not padding, not a placeholder).

    A sequence of length L at degree d is padded at its end to 2d equal chunks and member i
    holds chunks i and 2d-1-i, so the real tokens of each held chunk are a prefix of it.
    """
    mask = torch.zeros(int(mb.tokens.numel()), dtype=torch.bool)
    if mb.is_placeholder or mb.is_empty:
        return mask
    layout = ShardLayout.of(mb)
    d, i = layout.degree, int(mb.rank_plan.index_in_group)
    for j, start in enumerate(layout.local_offsets):
        chunk = layout.padded[j] // (2 * d)
        for k, held in enumerate((i, 2 * d - 1 - i)):
            a = start + k * chunk
            mask[a : a + layout.real_in_chunk(j, held)] = True
    return mask


@dataclass(frozen=True, slots=True)
class FCPStep(Mapping):
    """One global batch as the Trainer sees it: this replica's micro-batches, one per wave.

    As a mapping it holds `input_ids` (this replica's real tokens, [1, n]) and `attention_mask`
    (ones), so the Trainer's token count (`include_num_input_tokens_seen`) and FLOP estimate
    count what trained here, never padding or a placeholder; no `labels` key, so the Trainer
    counts no items of its own.
    """

    micro_batches: tuple[Any, ...]
    metrics: Any = None  # the loader's BatchMetrics of this global batch
    input_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    @classmethod
    def of(cls, micro_batches: tuple[Any, ...], metrics: Any = None) -> FCPStep:
        real = [mb.tokens[real_token_mask(mb)] for mb in micro_batches]
        ids = torch.cat(real) if real else torch.zeros(0, dtype=torch.long)
        return cls(micro_batches, metrics, ids)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key == "input_ids":
            return self.input_ids[None]
        if key == "attention_mask":
            return torch.ones_like(self.input_ids)[None]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("input_ids", "attention_mask"))

    def __len__(self) -> int:
        return 2


class FCPTrainLoader:
    """The Trainer's train dataloader: fcp's loader, one `FCPStep` per global batch.

    `len()` is the loader's global batches per epoch (one optimizer step each), `set_epoch`
    reaches the loader (a no-op inside the epoch a resumed loader is in). No `dataset`: nothing
    for accelerate to shard.
    """

    dataset = None

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return int(self.loader.num_batches)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(int(epoch))

    def __iter__(self) -> Iterator[FCPStep]:
        state = self.loader.state_dict()
        if state.get("wave", 0):
            raise ExecError(
                f"the loader stands at wave {state['wave']} of global batch {state['batch']}: a "
                "Trainer step runs whole global batches; restore a state saved between steps "
                "(the trainer's checkpoints save one)"
            )
        waves: list[Any] = []
        for mb in self.loader:
            waves.append(mb)
            if mb.is_last_wave:
                yield FCPStep.of(tuple(waves), self.loader.metrics)
                waves = []
        if waves:
            raise ExecError(
                f"the loader ended inside a global batch ({len(waves)} waves without the last)"
            )


def save_loader_state(
    loader: Any, checkpoint: str | Path, global_step: int, tokens: int = 0
) -> Path:
    """Write the loader's position (and the real tokens trained so far) next to a Trainer
    checkpoint, atomically; returns the path."""
    path = Path(checkpoint) / LOADER_STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LOADER_STATE_FILE}.partial")
    body = {"format": 1, "global_step": int(global_step), "tokens": int(tokens),
            "loader": loader.state_dict()}  # fmt: skip
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)
    return path


def load_loader_state(loader: Any, checkpoint: str | Path) -> dict[str, int]:
    """Restore the loader's position saved with `checkpoint`; returns its `global_step` and
    the real `tokens` trained up to it.

    ConfigError when the checkpoint holds no loader state (the Trainer would otherwise start
    the data from the first batch again, or skip batches a second time) or when it belongs to
    another step than the checkpoint's own trainer state.
    """
    path = Path(checkpoint) / LOADER_STATE_FILE
    if not path.is_file():
        raise ConfigError(
            f"resume_from_checkpoint={str(checkpoint)!r} holds no {LOADER_STATE_FILE}: it was "
            "not saved by an fcp trainer, so where fcp's loader stood is unknown. Resume from "
            "a checkpoint an fcp trainer saved, or start without resume_from_checkpoint"
        )
    body = json.loads(path.read_text())
    step = int(body["global_step"])
    trainer_state = Path(checkpoint) / "trainer_state.json"
    if trainer_state.is_file():
        saved = int(json.loads(trainer_state.read_text()).get("global_step", step))
        if saved != step:
            raise ConfigError(
                f"{path} is the loader's position after step {step} but the checkpoint's "
                f"trainer_state.json is at step {saved}; the checkpoint was assembled from two "
                "runs: resume from one saved whole"
            )
    loader.load_state_dict(body["loader"])
    return {"global_step": step, "tokens": int(body.get("tokens", 0))}


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
        raise ConfigError(f"deepspeed={args.deepspeed!r}: " + _DEEPSPEED_WHY)
    _check_parallelism(getattr(args, "parallelism_config", None))
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


_DEEPSPEED_WHY = (
    "DeepSpeed runs its own gradient accumulation and reduction around the loss, which fcp's "
    "per-wave step bypasses; train with DDP or FSDP2 (transformers' DistributedConfig, or "
    "accelerate's FSDP2 on GPUs)"
)
_PARALLEL_WHY = MappingProxyType(
    {
        "cp_size": "accelerate's context parallelism is one fixed degree over SDPA with every "
        "layer's mask forced causal, so packed documents would attend to the ones before them",
        "sp_size": "accelerate's sequence parallelism shards each batch a second time",
        "tp_size": "fcp's trainer scales the loss by the data-parallel size and binds no tensor-"
        "parallel groups (megatron-core's TP: docs/layouts/megatron.md)",
    }
)


def _check_parallelism(pc: Any) -> None:
    """ConfigError for accelerate's CP, SP or TP (a ParallelismConfig; None: none)."""
    for name in ("cp_size", "sp_size", "tp_size"):
        size = getattr(pc, name, 1) or 1
        if size > 1:
            raise ConfigError(
                f"parallelism_config.{name}={size}: "
                + _PARALLEL_WHY[name]
                + f"; keep {name}=1 (every process is a data-parallel replica to accelerate; "
                "fcp's loader sets the CP group of every micro-batch)"
            )


def _attn_name(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None)


def _is_fcp_attention(name: str | None) -> bool:
    if not name:
        return False
    from transformers import AttentionInterface

    try:
        return AttentionInterface()[name] is fcp_ring_attention_forward
    except KeyError:
        return False


def _fsdp_summing(model: Any) -> list[str]:
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


def _standin_dataset() -> Any:
    """A one-row dataset for TRL's checks when fcp's loader is the data (TRL requires one)."""
    import datasets

    turns = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    return datasets.Dataset.from_dict({"messages": [turns], "input_ids": [[0, 0]]})


def _is_trl_sft(cls: type) -> bool:
    return any(c.__name__ == "SFTTrainer" and c.__module__.startswith("trl") for c in cls.__mro__)


class FCPTrainerMixin:
    """Put before `transformers.Trainer` or `trl.SFTTrainer`: fcp's loader and training step.

    Extra keyword arguments: `fcp_loader` (this replica's `FCPDataLoader`, built with
    `replica=` this process's rank and the world size's `Cluster`), `fcp_options`
    (`FCPTrainerOptions`), `fcp_groups` (a `CPGroupCache`; default one over the world,
    created at the first step). `train_dataset` may be left out (TRL gets a one-row stand-in
    for its checks, not prepared; the data is the loader's). Override `fcp_model_inputs` to
    add model inputs (a vision payload) and `fcp_loss_scale` for another gradient reduction.
    """

    fcp_loader: Any
    fcp_options: FCPTrainerOptions
    fcp_groups: CPGroupCache | None
    fcp_history: list[FCPStepRecord]

    def __init__(
        self,
        *args: Any,
        fcp_loader: Any,
        fcp_options: FCPTrainerOptions | None = None,
        fcp_groups: CPGroupCache | None = None,
        **kwargs: Any,
    ) -> None:
        options = FCPTrainerOptions() if fcp_options is None else fcp_options
        if not isinstance(options, FCPTrainerOptions):
            raise ConfigError(f"fcp_options={options!r} must be an FCPTrainerOptions")
        for name in ("state_dict", "load_state_dict", "set_epoch", "num_batches", "cluster"):
            if not hasattr(fcp_loader, name):
                raise ConfigError(
                    f"fcp_loader={type(fcp_loader).__name__} has no {name!r}: pass this "
                    "replica's fcp_data.FCPDataLoader"
                )
        if getattr(fcp_loader.cluster, "idle", "placeholder") == "empty":
            raise ConfigError(
                "the loader's Cluster(idle='empty') gives a replica that sits a wave out no "
                "tokens to run, so it would skip DDP's and FSDP's collectives of that wave and "
                "the others would wait for it; build the Cluster with idle='placeholder' (the "
                "default) or 'fill'"
            )
        targs = kwargs.get("args", args[1] if len(args) > 1 else None)
        check_trainer_args(targs)
        if kwargs.get("compute_loss_func") is not None:
            raise ConfigError(
                "compute_loss_func=...: fcp's step computes the loss itself (token losses over "
                "the plan's global loss-token count); leave compute_loss_func=None"
            )
        if kwargs.get("train_dataset") is None and len(args) < 4 and _is_trl_sft(type(self)):
            kwargs["train_dataset"] = _standin_dataset()
            if hasattr(targs, "dataset_kwargs"):  # nothing for TRL to tokenize or pack
                targs.dataset_kwargs = {
                    **(targs.dataset_kwargs or {}),
                    "skip_prepare_dataset": True,
                }
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.fcp_loader = fcp_loader
        self.fcp_options = options
        self.fcp_groups = fcp_groups
        self.fcp_history = []
        self._fcp_pending: list[FCPStepRecord] = []
        self._fcp_tokens = 0  # real tokens trained, across resumes
        self._fcp_check_trainer()
        self.args.ignore_data_skip = True  # the loader resumes itself (LOADER_STATE_FILE)
        self.add_callback(_fcp_callback(self))

    # ---- checks ---------------------------------------------------------------------------
    def _fcp_check_trainer(self) -> None:
        """The settings only the built trainer knows (accelerate's, the model's, the world's)."""
        args = self.args
        check_trainer_args(args)
        acc = self.accelerator
        _check_parallelism(getattr(acc, "parallelism_config", None))  # e.g. from a YAML
        if getattr(self, "is_deepspeed_enabled", False):
            raise ConfigError("DeepSpeed is enabled (accelerate's config): " + _DEEPSPEED_WHY)
        if getattr(args, "n_gpu", 1) > 1:
            raise ConfigError(
                f"n_gpu={args.n_gpu}: one process sees several GPUs, so the Trainer would wrap "
                "the model in nn.DataParallel; launch one process per GPU (torchrun or "
                "accelerate launch)"
            )
        tp = int(self.get_tp_size()) if hasattr(self, "get_tp_size") else 1
        if tp > 1:
            raise ConfigError(f"tensor parallel size {tp}: " + _PARALLEL_WHY["tp_size"])
        name = _attn_name(self.model)
        if not _is_fcp_attention(name):
            raise ConfigError(
                f"attn_implementation={name!r}: fcp's micro-batches are packed zigzag shards "
                "that only fcp's ring attention reads; build the model with "
                "attn_implementation=fcp_exec.hf.register_attention() (for a vision-language "
                "model: model.set_attn_implementation({'text_config': 'fcp_ring'}))"
            )
        world, rank = int(acc.num_processes), int(acc.process_index)
        cluster, replica = self.fcp_loader.cluster, getattr(self.fcp_loader, "replica", rank)
        if cluster.num_replicas != world or replica != rank:
            raise ConfigError(
                f"the loader is replica {replica} of {cluster.num_replicas} but this process "
                f"is {rank} of {world} data-parallel processes; build it with "
                f"Cluster({world}, ...) and replica={rank} (one replica per process)"
            )
        summing = _fsdp_summing(self.model) if world > 1 else []
        if summing:
            raise ConfigError(
                f"FSDP modules {summing[:3]} sum gradients (divide factor 1, "
                "fcp_exec.fsdp.fsdp_sum_gradients); the trainer already multiplies the loss "
                f"by the {world} processes FSDP averages over, so the step would be {world}x "
                "too large. Leave FSDP's default reduction (do not call fsdp_sum_gradients or "
                "fully_shard_for_fcp on a model the Trainer trains)"
            )
        roles = tuple(getattr(getattr(self.fcp_loader, "options", None), "chat_loss_roles", ()))
        if getattr(args, "assistant_only_loss", False) and roles != ("assistant",):
            raise ConfigError(
                f"assistant_only_loss=True but the loader trains chat roles {roles}; fcp's "
                "loader decides the loss roles (LoaderOptions.chat_loss_roles): set "
                "chat_loss_roles=('assistant',) or assistant_only_loss=False"
            )

    # ---- data -----------------------------------------------------------------------------
    def get_train_dataloader(self) -> FCPTrainLoader:
        """fcp's loader, one item per global batch, not prepared (re-sharded) by accelerate."""
        return FCPTrainLoader(self.fcp_loader)

    def train(self, resume_from_checkpoint: str | bool | None = None, *a: Any, **kw: Any) -> Any:
        """The Trainer's train(); a checkpoint also restores fcp's loader (LOADER_STATE_FILE)."""
        path = resume_from_checkpoint
        if path is True:
            from transformers.trainer_utils import get_last_checkpoint

            path = get_last_checkpoint(self.args.output_dir)
            if path is None:
                raise ConfigError(
                    f"resume_from_checkpoint=True but {self.args.output_dir} holds no "
                    "checkpoint-* directory; pass a path or start without resuming"
                )
        if path:
            self._fcp_tokens = load_loader_state(self.fcp_loader, path)["tokens"]
            if self._fcp_token_metrics():
                self._total_train_tokens = self._fcp_tokens  # TRL's num_tokens goes on
        return super().train(path or None, *a, **kw)  # type: ignore[misc]

    def floating_point_ops(self, inputs: Mapping[str, Any]) -> int:
        """6 x real tokens trained here x parameters (embeddings excluded): no padding."""
        model = self.model
        if "input_ids" not in inputs or not hasattr(model, "num_parameters"):
            return 0
        params = int(model.num_parameters(exclude_embeddings=True))
        return 6 * int(inputs["input_ids"].numel()) * params

    # ---- the step -------------------------------------------------------------------------
    def fcp_loss_scale(self) -> float:
        """What the per-wave loss is multiplied by: the N processes DDP and FSDP average
        gradients over (their mean of N shares times N is the shares' sum)."""
        return float(self.accelerator.num_processes)

    def fcp_model_inputs(self, mb: Any, binding: Any) -> dict[str, Any]:
        """The model's keyword arguments for one micro-batch: ids, fcp's (rank-local, whole-
        sequence) position ids, the packed layout and the bound ring."""
        return {
            "input_ids": mb.tokens[None],
            "position_ids": hf_position_ids(mb),
            "use_cache": False,
            **hf_attention_kwargs(mb, binding),
        }

    def _fcp_cache(self) -> CPGroupCache:
        if self.fcp_groups is None:
            world = dist.get_world_size() if dist.is_initialized() else 1
            self.fcp_groups = CPGroupCache(ReplicaRanks(world_size=world))
        return self.fcp_groups

    def _fcp_bind(self, mb: Any, cache: CPGroupCache) -> contextlib.AbstractContextManager:
        """`cp_context` for the micro-batch; one process without torch.distributed (a single
        replica: every group is degree 1) binds itself, with no group to create."""
        if dist.is_initialized():
            return cp_context(
                mb.rank_plan,
                groups=cache,
                wave_groups=mb.wave_groups,
                wave_ulysses=mb.wave_ulysses or None,
                verify=self.fcp_options.verify_plan,
            )
        binding = CPBinding.of((0,), 0, rank_plan=mb.rank_plan, runtime=cache.runtime)
        return contextlib.nullcontext(binding)

    def _fcp_token_metrics(self) -> bool:
        on = self.fcp_options.token_metrics
        if on is None:
            metrics = getattr(self, "_metrics", None)
            on = isinstance(metrics, dict) and "train" in metrics
        return bool(on)

    def training_step(
        self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """Every wave of one global batch: forward, loss over the plan's count, backward."""
        if not isinstance(inputs, FCPStep):
            raise ExecError(
                f"training_step got {type(inputs).__name__}, not an FCPStep: the train "
                "dataloader must be the mixin's (do not override get_train_dataloader)"
            )
        t0 = time.perf_counter()
        device = self.args.device
        model.train()
        if callable(getattr(self.optimizer, "train", None)):
            self.optimizer.train()
        cache, scale = self._fcp_cache(), self.fcp_loss_scale()
        metrics = self._fcp_token_metrics()
        stats = torch.zeros(5, dtype=torch.float64)  # loss, loss tokens, tokens, entropy, top-1
        total = torch.zeros((), device=device)
        offload = getattr(self, "maybe_activation_offload_context", contextlib.nullcontext())
        n = len(inputs.micro_batches)
        for w, mb in enumerate(inputs.micro_batches):
            stats[2] += float(real_token_mask(mb).sum())
            sync = contextlib.nullcontext()
            if w < n - 1 and isinstance(model, torch.nn.parallel.DistributedDataParallel):
                sync = model.no_sync()  # DDP reduces once, in the last wave
            with self._fcp_bind(mb, cache) as cp, sync, offload:
                mb = mb.to(device)
                with self.compute_loss_context_manager():
                    logits = model(**self.fcp_model_inputs(mb, cp)).logits[0].float()
                    labels, mask = mb.labels.clamp(min=0), mb.loss_mask.to(logits.dtype)
                    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
                    token_sum = (ce * mask).sum()
                    loss = token_sum * (scale / max(int(mb.global_num_loss_tokens), 1))
                self.accelerator.backward(loss)
            total += loss.detach()
            stats[0] += float(token_sum.detach())
            stats[1] += float(mask.sum())
            if metrics:
                with torch.no_grad():
                    logp = torch.log_softmax(logits.detach(), dim=-1)
                    entropy = -(logp.exp() * logp).sum(-1)
                    top1 = (logits.detach().argmax(-1) == labels).to(mask.dtype)
                    stats[3] += float((entropy * mask).sum())
                    stats[4] += float((top1 * mask).sum())
        seconds = time.perf_counter() - t0
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stats)  # every rank, placeholders too: one small collective a step
        self._fcp_record(inputs, stats, seconds, metrics)
        return total

    def _fcp_record(self, step: FCPStep, stats: torch.Tensor, seconds: float, trl: bool) -> None:
        m = step.metrics
        loss_tokens = round(float(stats[1]))
        rec = FCPStepRecord(
            step=int(self.state.global_step) + 1,
            epoch=int(getattr(m, "epoch", 0)),
            batch=int(getattr(m, "batch_index", 0)),
            loss=float(stats[0]) / max(loss_tokens, 1),
            loss_tokens=loss_tokens,
            tokens=round(float(stats[2])),
            waves=len(step.micro_batches),
            degrees=tuple(int(d) for d in getattr(m, "degrees", ())),
            placeholders=sum(int(mb.is_placeholder) for mb in step.micro_batches),
            seconds=seconds,
        )
        self.fcp_history.append(rec)
        self._fcp_pending.append(rec)
        self._fcp_tokens += rec.tokens
        if trl:  # TRL's metrics, per token over the whole step (TRL's own: per wave)
            train = self._metrics["train"]  # type: ignore[attr-defined]
            train["entropy"].append(float(stats[3]) / max(loss_tokens, 1))
            train["mean_token_accuracy"].append(float(stats[4]) / max(loss_tokens, 1))
            self._total_train_tokens = self._fcp_tokens
            train["num_tokens"] = [self._fcp_tokens]

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """The Trainer's log, plus what fcp trained since the last one (loss tokens, real
        tokens, tokens/s, the degrees used, waves per step)."""
        pending = self._fcp_pending
        if pending and "loss" in logs:
            tokens, seconds = sum(r.tokens for r in pending), sum(r.seconds for r in pending)
            degrees = sorted({d for r in pending for d in r.degrees}, reverse=True)
            logs["fcp_loss_tokens"] = sum(r.loss_tokens for r in pending)
            logs["fcp_tokens"] = tokens
            logs["fcp_tokens_per_second"] = round(tokens / seconds, 1) if seconds > 0 else 0.0
            logs["fcp_degrees"] = ",".join(str(d) for d in degrees)
            logs["fcp_waves"] = max(r.waves for r in pending)
            pending.clear()
        super().log(logs, start_time)  # type: ignore[misc]


def _fcp_callback(trainer: Any) -> Any:
    """A TrainerCallback that writes the loader's position into every checkpoint the Trainer
    saves, and sets the state's epoch from the loader's (the Trainer's own count restarts
    inside an epoch after a resume, its batch skipping being off)."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class FCPLoaderCheckpoint(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if trainer.fcp_history:
                rec, n = trainer.fcp_history[-1], max(int(trainer.fcp_loader.num_batches), 1)
                state.epoch = rec.epoch + (rec.batch + 1) / n

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:  # the same few integers on every replica
                folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
                save_loader_state(trainer.fcp_loader, folder, state.global_step,
                                  trainer._fcp_tokens)  # fmt: skip

    return FCPLoaderCheckpoint()


def with_fcp(base: type) -> type:
    """`base` (transformers.Trainer, trl.SFTTrainer, or a subclass) with fcp's loader and step:
    a new class `FCP<base>` whose constructor also takes `fcp_loader=`."""
    if not isinstance(base, type) or not callable(getattr(base, "training_step", None)):
        raise ConfigError(
            f"with_fcp({base!r}): pass a Trainer class (transformers.Trainer, trl.SFTTrainer "
            "or a subclass of them)"
        )
    if issubclass(base, FCPTrainerMixin):
        return base
    return type(f"FCP{base.__name__}", (FCPTrainerMixin, base), {"__module__": __name__})
