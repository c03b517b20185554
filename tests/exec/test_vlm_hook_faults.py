"""encode_and_scatter on 2 real gloo processes: every fault that only one member sees (its
embeddings, its tower raising or returning the wrong type, a scatter map with -2, a repeat, a
text target, a shift, a missed pad, a malformed grid) raises the same named error on both."""

from __future__ import annotations

from ._dist import run_distributed
from ._vlm_hook_faults_job import faults_worker


def test_one_members_fault_raises_the_same_error_on_every_member() -> None:
    run_distributed(faults_worker, 2, timeout=180)
