"""fcp inside megatron-core's model-parallel layouts, each against TP = PP = 1 without CP.

4 real gloo processes = 2 replicas of TP = 2 (sequence parallel off, then on), 1 replica of
TP = 4 under sequence parallel (the pad unit: 2d alone gives rows of 2 mod 4), then 2 replicas
of PP = 2 through megatron's 1F1B schedule with tied embeddings; in every case replica 0 sits
the last wave out (a placeholder micro-batch). Loss and every gradient within 1e-5 relative.
"""

from __future__ import annotations

from ._dist import run_distributed
from ._megatron_layout_job import layout_worker


def test_tensor_parallel_with_and_without_sequence_parallel() -> None:
    """TP = 4 with sequence parallel takes all 4 processes as one replica: its rows of odd-length
    sequences are multiples of 4 only because the layout pads chunks to the TP unit."""
    cases = [(2, 1, False, False), (2, 1, True, False), (4, 1, True, False)]
    run_distributed(layout_worker, 4, cases, timeout=500)


def test_pipeline_parallel_1f1b_with_tied_embeddings_and_an_idle_replica() -> None:
    run_distributed(layout_worker, 4, [(1, 2, False, True)], timeout=400)
