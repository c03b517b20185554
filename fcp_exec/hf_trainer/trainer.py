"""The trainer mixin: fcp's loader and fcp's training step inside a Trainer (see the package).

`with_fcp(base)` puts `FCPTrainerMixin` before a `transformers.Trainer` or `trl.SFTTrainer`
class: the train dataloader becomes fcp's, one `training_step` runs every wave of a global
batch inside `cp_context`, and each step is recorded (`FCPStepRecord`) and logged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.context import CPBinding, cp_context
from fcp_exec.groups import CPGroupCache, ReplicaRanks
from fcp_exec.hf import hf_attention_kwargs, hf_position_ids

from .checks import (
    DEEPSPEED_WHY,
    PARALLEL_WHY,
    attn_name,
    check_parallelism,
    check_trainer_args,
    fsdp_summing,
    is_fcp_attention,
)
from .data import (
    FCPStep,
    FCPTrainLoader,
    load_loader_state,
    real_token_mask,
    save_loader_state,
)

__all__ = ["FCPStepRecord", "FCPTrainerMixin", "FCPTrainerOptions", "with_fcp"]


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
        check_parallelism(getattr(acc, "parallelism_config", None))  # e.g. from a YAML
        if getattr(self, "is_deepspeed_enabled", False):
            raise ConfigError("DeepSpeed is enabled (accelerate's config): " + DEEPSPEED_WHY)
        if getattr(args, "n_gpu", 1) > 1:
            raise ConfigError(
                f"n_gpu={args.n_gpu}: one process sees several GPUs, so the Trainer would wrap "
                "the model in nn.DataParallel; launch one process per GPU (torchrun or "
                "accelerate launch)"
            )
        tp = int(self.get_tp_size()) if hasattr(self, "get_tp_size") else 1
        if tp > 1:
            raise ConfigError(f"tensor parallel size {tp}: " + PARALLEL_WHY["tp_size"])
        name = attn_name(self.model)
        if not is_fcp_attention(name):
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
        summing = fsdp_summing(self.model) if world > 1 else []
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
                save_loader_state(
                    trainer.fcp_loader, folder, state.global_step, trainer._fcp_tokens
                )

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
