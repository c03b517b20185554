"""megatron-core on 4 real gloo processes: cp_context binding, digest check, GPTModel parity."""

from __future__ import annotations

from ._dist import run_distributed
from ._megatron_job import megatron_worker


def test_cp_context_and_gpt_model_match_run_without_cp_on_4_processes() -> None:
    run_distributed(megatron_worker, 4, timeout=300)
