"""2-process job: a fault on one member only (rank 0) raises the same named error on both."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from ._vlm_hook_job import HIDDEN, Tower

PAD = 99  # the vision pad id of these micro-batches


def good_mb() -> Any:
    """8 tokens, pads at 4 and 5; one run (t=1, h=2, w=4): 2 merged rows -> positions 4, 5."""
    return SimpleNamespace(
        tokens=torch.tensor([0, 1, 2, 3, PAD, PAD, 6, 7]), keys=("v7",),
        pixel_values=torch.randn(8, 3), grid_thw=torch.tensor([[1, 2, 4]]),
        vision_runs=torch.tensor([[0, 2, 0, 1]]), vision_scatter=torch.tensor([4, 5]),
    )  # fmt: skip


class Raising(Tower):
    def forward(self, px: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory (simulated)")


class Wrapped(Tower):
    def forward(self, px: torch.Tensor, grid_thw: torch.Tensor) -> Any:
        return {"features": super().forward(px, grid_thw)}


def _case(name: str) -> tuple[Any, Any, torch.Tensor, str]:
    """(tower, micro-batch, embeds, expected text) of rank 0's fault `name`."""
    mb, tower, embeds = good_mb(), Tower(), torch.randn(8, HIDDEN)
    if name == "embeds":
        embeds, want = torch.randn(7, HIDDEN), "embeds has shape (7, 6)"
    elif name == "tower raises":
        tower, want = Raising(), "the vision tower raised RuntimeError: CUDA out of memory"
    elif name == "tower type":
        tower, want = Wrapped(), "returned dict"
    elif name == "minus two":
        mb.vision_scatter, want = torch.tensor([4, -2]), "vision_scatter[1] = -2"
    elif name == "repeat":
        mb.vision_scatter, want = torch.tensor([5, 5]), "writes local position 5 2 times"
    elif name == "text target":
        mb.vision_scatter, want = torch.tensor([4, 6]), "to local position 6, token id 6"
    elif name == "shifted":
        mb.vision_scatter, want = torch.tensor([5, 6]), "would overwrite a non-vision"
    elif name == "missing pad":
        mb.vision_scatter, want = torch.tensor([4, -1]), "holds 2 tokens of vision id 99"
    elif name == "malformed grid":
        mb.grid_thw, want = torch.tensor([1, 2, 4]), "malformed vision payload"
    elif name == "unique text target":  # the only row of its kind, on a text id present once:
        mb = _single_row_on(6)  # nothing to infer the pad from; the model's pad ids catch it
        want = "token id 6, which is not one of the model's vision pad ids [99]"
    else:
        raise AssertionError(name)
    return tower, mb, embeds, want


CASES = ("embeds", "tower raises", "tower type", "minus two", "repeat", "text target",
         "shifted", "missing pad", "malformed grid", "unique text target")  # fmt: skip


def _single_row_on(position: int) -> Any:
    """One run of one merged row (t=1, h=2, w=2) sent to `position`."""
    return SimpleNamespace(
        tokens=torch.tensor([0, 1, 2, 3, PAD, PAD, 6, 7]), keys=("v7",),
        pixel_values=torch.randn(4, 3), grid_thw=torch.tensor([[1, 2, 2]]),
        vision_runs=torch.tensor([[0, 1, 0, 1]]), vision_scatter=torch.tensor([position]),
    )  # fmt: skip


def faults_worker(rank: int, world: int) -> None:
    from fcp_exec.vision import VisionScatterError, encode_and_scatter

    group = dist.new_group([0, 1])
    out = encode_and_scatter(Tower(), good_mb(), torch.randn(8, HIDDEN), group=group,
                             pad_ids=(PAD,))  # fmt: skip
    assert out.shape == (8, HIDDEN)  # the good payload passes every check
    # without the model's pad ids a lone row on a text id present once cannot be told apart
    encode_and_scatter(Tower(), _single_row_on(6), torch.randn(8, HIDDEN), group=None)
    for name in CASES:
        tower, mb, embeds, want = _case(name)
        if rank != 0:  # the peer is healthy: it must raise the same error, not wait
            tower, mb, embeds = Tower(), good_mb(), torch.randn(8, HIDDEN)
        pads = (PAD,) if name == "unique text target" else None  # the others: inferred
        try:
            encode_and_scatter(tower, mb, embeds, group=group, pad_ids=pads)
        except VisionScatterError as e:
            text = str(e)
            assert "rank 0:" in text and want in text and "v7" in text, (name, text)
            assert "rank 1:" not in text, (name, text)
        else:
            raise AssertionError(f"{name}: no error on rank {rank}")
        # both members still agree afterwards (nobody is left inside a collective)
        flag = torch.tensor([rank])
        dist.all_reduce(flag, group=group)
        assert int(flag) == 1
