"""Head-parallel (Ulysses) and hybrid u x r attention on 6 real gloo processes.

One spawned job (tests/exec/_ulysses_job.py, one spawn because 6 processes importing torch
cost most of the test's time) runs every factorisation of d = 2..6 against a float64 reference
(out, dq, dk, dv; varlen mixed causal/full packs; GQA split and replicated; bf16), checks the
bytes counted on the real all-to-all and ring sends against `fcp_exec.transport_bytes`, then
feeds bad inputs, each raising on every member it concerns with no hang. The rest runs in
this process.
"""

from __future__ import annotations

import pytest
import torch

from fcp_exec import CPBinding, a2a_bytes_per_token, local_token_index
from fcp_exec.transport_bytes import hybrid_ring_bytes_per_token, kv_heads_per_member
from fcp_exec.ulysses import block_token_index

from ._dist import run_distributed
from ._ulysses_job import ulysses_worker


def test_every_factorisation_is_exact_counts_its_bytes_and_bad_inputs_raise() -> None:
    """Exactness + bytes for u x r of d = 2..6, then the bad inputs (one 6-process job)."""
    run_distributed(ulysses_worker, 6, timeout=240)


def test_binding_ring_refuses_hybrid_and_splits_blocks() -> None:
    cp = CPBinding.of((5, 3, 1, 0, 2, 4), 4, ulysses=2)
    assert cp.a2a_ranks == (2, 4) and cp.ring_ranks == (5, 1, 2) and cp.ring_degree == 3
    with pytest.raises(RuntimeError, match=r"fcp_exec\.cp_attention"):
        _ = cp.ring
    assert CPBinding.of((3, 1), 0).ring == (3, 1)
    with pytest.raises(ValueError, match="does not divide the CP degree 6"):
        CPBinding.of(range(6), 0, ulysses=4)


def test_block_index_is_the_degree_r_zigzag_shard() -> None:
    """Block j's stacked shards, permuted, are exactly zigzag shard j of degree r."""
    cup = [0, 24, 36, 84]
    for u, r in ((2, 3), (3, 2), (6, 1), (1, 6)):
        d = u * r
        for j in range(r):
            stacked = torch.cat(
                [local_token_index(cup, d, j * u + m) for m in range(u)]
            )  # fmt: skip
            got = stacked[block_token_index(cup, d, u)]
            assert torch.equal(got, local_token_index(cup, r, j)), (u, r, j)


def test_bytes_formulas() -> None:
    # Llama-3-8B per replica (H=32, H_kv=8, D=128), bf16, u=2: (1/2) * 4 * 40 * 128 * 2
    assert a2a_bytes_per_token(heads=32, kv_heads=8, head_dim=128, ulysses=2) == 20480.0
    assert a2a_bytes_per_token(heads=32, kv_heads=8, head_dim=128, ulysses=1) == 0.0
    # replication: u=16 > H_kv=8 moves 16 K/V heads
    assert a2a_bytes_per_token(heads=32, kv_heads=8, head_dim=128, ulysses=16, layers=2) == (
        2 * 15 / 16 * 4 * (32 + 16) * 128 * 2
    )
    assert hybrid_ring_bytes_per_token(kv_heads=8, head_dim=128, ulysses=2, ring_degree=1) == 0
    assert hybrid_ring_bytes_per_token(kv_heads=8, head_dim=128, ulysses=2, ring_degree=3) == (
        2 * 2 * 8 * 128 * 8
    )
    assert kv_heads_per_member(8, 4) == 2 and kv_heads_per_member(2, 6) == 1
    with pytest.raises(ValueError, match="one must divide the other"):
        kv_heads_per_member(4, 6)
