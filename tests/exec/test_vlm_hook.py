"""encode_and_scatter on 2 real gloo processes: exact scatter, a member without vision tokens
calls no tower, and a broken payload or tower raises on both members (nobody hangs)."""

from __future__ import annotations

from ._dist import run_distributed
from ._vlm_hook_job import hook_worker


def test_scatter_empty_member_and_errors_on_every_member() -> None:
    run_distributed(hook_worker, 2, timeout=120)
