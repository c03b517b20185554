"""fcp's loader as the Trainer's dataloader: one `FCPStep` per global batch, and its position.

The Trainer iterates a dataloader and checkpoints a step count; fcp's loader yields one
micro-batch per wave and resumes from a few integers. `FCPTrainLoader` groups the waves of a
global batch into one `FCPStep` (one optimizer step), and `save_loader_state` /
`load_loader_state` keep the loader's position beside each checkpoint the Trainer saves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.layout import ShardLayout

__all__ = [
    "LOADER_STATE_FILE",
    "FCPStep",
    "FCPTrainLoader",
    "load_loader_state",
    "real_token_mask",
    "save_loader_state",
]

LOADER_STATE_FILE = "fcp_loader.json"


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
    body = {
        "format": 1,
        "global_step": int(global_step),
        "tokens": int(tokens),
        "loader": loader.state_dict(),
    }
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
