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
fcp_exec stays light). Modules: `data` (the loader as the Trainer's dataloader, its position
in checkpoints), `checks` (settings refused by name), `trainer` (the mixin and its step).
Tested: transformers 5.24, trl 1.16.0, accelerate 1.16.
"""

from .checks import check_trainer_args
from .data import (
    LOADER_STATE_FILE,
    FCPStep,
    FCPTrainLoader,
    load_loader_state,
    real_token_mask,
    save_loader_state,
)
from .trainer import FCPStepRecord, FCPTrainerMixin, FCPTrainerOptions, with_fcp

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
