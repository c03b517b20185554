"""Suite-wide: the slowest files start first, so `pytest -n 2` never ends on one long job.

xdist's default `--dist load` hands tests out in collection order, one at a time while
workers ask for more; a multi-process job of 1-3 minutes collected last runs alone on one
worker at the end while the other idles. Listed files (the slowest measured on 2 cores, most
spawn gloo or torchrun processes) move to the front, in this order; every other test keeps its
place, and nothing is skipped or deselected.
"""

from __future__ import annotations

import pytest

SLOWEST_FIRST = (
    "tests/test_readme.py",
    "tests/e2e/test_train_example.py",
    "tests/e2e/test_e2e_viewer.py",
    "tests/exec/test_megatron_layouts.py",
    "tests/exec/test_vlm_parity.py",
    "tests/exec/test_ulysses.py",
    "tests/e2e/test_e2e_profile.py",
    "tests/exec/test_ring_attention.py",
    "tests/exec/test_hf_hybrid_parity.py",
    "tests/e2e/test_e2e_demo_train.py",
    "tests/vision/test_loader_vision.py",
    "tests/exec/test_vlm_megatron.py",
    "tests/exec/test_vlm_demo.py",
    "tests/exec/test_megatron_ddp.py",
    "tests/exec/test_megatron.py",
    "tests/e2e/test_train_fsdp_example.py",
    "tests/exec/test_hf_text_parity.py",
    "tests/exec/test_fsdp.py",
    "tests/e2e/test_train_resume.py",
    "tests/exec/test_hf_trainer.py",
    "tests/test_bench_quick.py",
    "tests/e2e/test_grpo_example.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
