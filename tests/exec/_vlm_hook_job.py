"""2-process job for the vision hook alone: a member without vision tokens, a broken member."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

HIDDEN = 6


class Tower(torch.nn.Module):
    """Merges 4 patch rows into one token (Qwen's 2x2 merge) with a linear map."""

    def __init__(self, out: int = HIDDEN) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4 * 3, out)
        self.calls = 0

    def forward(self, px: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.proj(px.reshape(-1, 4 * 3))


def micro_batch(vision: bool) -> Any:
    """8 local tokens; with vision: one run (t=1, h=2, w=4) = 8 patch rows -> 2 merged rows."""
    tokens = torch.arange(8)
    if not vision:
        return SimpleNamespace(tokens=tokens, keys=("t0",), pixel_values=torch.zeros(0, 3),
                               grid_thw=torch.zeros(0, 3, dtype=torch.int64),
                               vision_runs=torch.zeros(0, 4, dtype=torch.int64),
                               vision_scatter=torch.zeros(0, dtype=torch.int64))  # fmt: skip
    return SimpleNamespace(
        tokens=tokens, keys=("v7",), pixel_values=torch.randn(8, 3),
        grid_thw=torch.tensor([[1, 2, 4]]), vision_runs=torch.tensor([[0, 2, 0, 1]]),
        vision_scatter=torch.tensor([5, -1]),
    )  # fmt: skip


def hook_worker(rank: int, world: int) -> None:
    from fcp_exec.vision import VisionScatterError, encode_and_scatter

    group = dist.new_group([0, 1])
    tower = Tower()
    embeds = torch.randn(8, HIDDEN, requires_grad=True)
    mb = micro_batch(vision=rank == 0)
    out = encode_and_scatter(tower, mb, embeds, group=group)
    if rank == 0:  # merged row 0 -> position 5; row 1 dropped (another owner's token)
        want = tower.proj(mb.pixel_values.reshape(-1, 12))[0]
        torch.testing.assert_close(out[5], want)
        keep = [i for i in range(8) if i != 5]
        assert torch.equal(out[keep], embeds[keep])
        out.sum().backward()
        assert embeds.grad[5].abs().sum() == 0 and tower.proj.weight.grad is not None
    else:  # no vision tokens: no tower call, embeddings unchanged
        assert tower.calls == 0 and out is embeds
    # one broken member (rank 0 drops a pixel row): both raise, naming the sample key
    bad = micro_batch(vision=rank == 0)
    if rank == 0:
        bad.pixel_values = bad.pixel_values[:-1]
    try:
        encode_and_scatter(tower, bad, embeds, group=group)
    except VisionScatterError as e:
        assert "sample v7" in str(e) and "pixel_values has 7 rows" in str(e), str(e)
    else:
        raise AssertionError("no error on a member of a group with a broken payload")
    # a tower returning the wrong hidden size, on the member with vision
    narrow = Tower(out=HIDDEN - 1)
    try:
        encode_and_scatter(narrow, micro_batch(vision=rank == 0), embeds, group=group)
    except VisionScatterError as e:
        assert f"hidden size {HIDDEN - 1}" in str(e) and "v7" in str(e), str(e)
    else:
        raise AssertionError("no error for a tower of the wrong hidden size")
