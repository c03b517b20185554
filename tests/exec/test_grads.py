"""all_reduce_gradients on 3 real gloo processes against a single-process reference.

The global batch's tokens are split unevenly over the replicas (one gets none and never runs
backward); each replica divides its per-token loss sum by the global token count. Summing the
replicas' gradients must then give exactly the single-process gradient of the per-token mean
(an average would be 3x too small). The model mixes float32 and float64 parameters, a frozen
one and a tied one, and a tiny bucket size forces several buckets per dtype.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fcp_data.errors import ConfigError
from fcp_exec.grads import _buckets, _params, all_reduce_gradients

from ._dist import run_distributed

TOKENS = 40
SPLIT = (0, 27, 40, 40)  # replica r holds tokens SPLIT[r]:SPLIT[r+1]; replica 2 holds none


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Linear(6, 8)
        self.scale = torch.nn.Parameter(torch.rand(8, dtype=torch.float64))
        self.frozen = torch.nn.Parameter(torch.ones(8), requires_grad=False)
        self.unused = torch.nn.Parameter(torch.ones(3))  # no token ever reaches it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.emb(x)) * self.scale.float() * self.frozen
        return h @ self.emb.weight  # the input weight reused as output head (tied)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(TOKENS, 6, generator=g), torch.randn(TOKENS, 6, generator=g)


def _loss(model: _Tiny, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).sum(-1).sum() / TOKENS  # per-token loss / global count


def _reference() -> dict[str, torch.Tensor]:
    model = _Tiny()
    x, y = _data()
    _loss(model, x, y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _grad_worker(rank: int, world: int) -> None:
    model = _Tiny()
    x, y = _data()
    lo, hi = SPLIT[rank], SPLIT[rank + 1]
    if hi > lo:  # a replica with no tokens runs no backward at all: every grad is None
        _loss(model, x[lo:hi], y[lo:hi]).backward()
    calls = all_reduce_gradients(model, bucket_bytes=64)
    assert calls >= 4, calls  # several buckets: one dtype never shares a bucket with another
    assert model.frozen.grad is None
    want = _reference()
    for name, p in model.named_parameters():
        if name == "frozen":
            continue
        expect = want.get(name, torch.zeros_like(p))
        assert p.grad is not None and p.grad.dtype == p.dtype, name
        torch.testing.assert_close(p.grad, expect, rtol=1e-5, atol=1e-7, msg=name)
    # a second batch on the same grads: the reduction is a plain sum, so it scales by world
    before = model.scale.grad.clone()
    all_reduce_gradients(model)
    torch.testing.assert_close(model.scale.grad, before * world)
    assert dist.get_world_size() == world


def test_sum_over_replicas_equals_single_process_gradient() -> None:
    run_distributed(_grad_worker, 3, timeout=240)


def test_buckets_split_by_dtype_and_size() -> None:
    a = torch.nn.Parameter(torch.zeros(10))  # 40 bytes
    b = torch.nn.Parameter(torch.zeros(10, dtype=torch.float64))  # 80 bytes
    c = torch.nn.Parameter(torch.zeros(10))
    d = torch.nn.Parameter(torch.zeros(30))  # 120 bytes: alone even over the cap
    buckets = _buckets(_params([a, b, a, c, d]), 100)  # a tied weight counts once
    assert [[id(p) for p in bk] for bk in buckets] == [[id(a), id(c)], [id(d)], [id(b)]]


def test_bad_bucket_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="bucket_bytes=0"):
        all_reduce_gradients(torch.nn.Linear(2, 2), bucket_bytes=0)
