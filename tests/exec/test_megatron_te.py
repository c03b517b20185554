"""TransformerEngine attention on fcp's groups: 4 gloo processes against the TE stand-in."""

from __future__ import annotations

import pytest

from ._dist import run_distributed


def test_te_attention_on_fcp_groups_matches_one_process_and_refuses_unsorted_rings() -> None:
    pytest.importorskip("megatron.core")
    from ._megatron_te_job import te_worker

    run_distributed(te_worker, 4, timeout=300)


class _Binding:
    def __init__(self, members: tuple[int, ...], ulysses: int = 1) -> None:
        self.members, self.ulysses, self.degree = members, ulysses, len(members)
        self.group, self.a2a_group, self.ring_group = "cp", "a2a", "ring"


def test_te_cp_args_per_transport_and_refusals() -> None:
    """What TE is handed per micro-batch: p2p for a ring, a2a for u = d, [block, r-ring] with
    a2a+p2p for a hybrid, nothing at degree 1; an unsorted ring and heads an all-to-all cannot
    split are refused by name."""
    pytest.importorskip("megatron.core")
    from fcp_data.errors import ConfigError, ExecError
    from fcp_exec.megatron_te import te_cp_args

    assert te_cp_args(None, 8, 4) == (None, None, "p2p")
    assert te_cp_args(_Binding((5,)), 8, 4) == (None, None, "p2p")
    assert te_cp_args(_Binding((0, 2, 5)), 8, 4) == ("cp", [0, 2, 5], "p2p")
    assert te_cp_args(_Binding((0, 1, 2, 3), 4), 8, 4) == ("cp", [0, 1, 2, 3], "a2a")
    assert te_cp_args(_Binding((0, 1, 2, 3), 2), 8, 4) == (["a2a", "ring"], [0, 1, 2, 3],
                                                           "a2a+p2p")  # fmt: skip
    with pytest.raises(ExecError, match=r"\(3, 1\) is not in ascending rank order"):
        te_cp_args(_Binding((3, 1)), 8, 4)
    with pytest.raises(ConfigError, match=r"query groups \(2\) per TP rank divisible by 4"):
        te_cp_args(_Binding((0, 1, 2, 3), 4), 8, 2)


def test_te_layout_refusals_and_missing_te() -> None:
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp_data.errors import ConfigError, MissingDependencyError
    from fcp_exec.megatron_te import check_te_layout, fcp_te_spec

    base = dict(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2)
    check_te_layout(TransformerConfig(**base))
    with pytest.raises(ConfigError, match=r"window_size=\(64, 0\).*no sliding window"):
        check_te_layout(TransformerConfig(**base, window_size=(64, 0)))
    with pytest.raises(ConfigError, match=r"fp8='hybrid'.*no FP8 attention for THD"):
        check_te_layout(TransformerConfig(**base, fp8="hybrid", params_dtype=torch.bfloat16,
                                          bf16=True))  # fmt: skip

    class Cost:
        head_parallel = True

    odd = TransformerConfig(num_layers=1, hidden_size=24, num_attention_heads=3)
    with pytest.raises(ConfigError, match=r"head_parallel=True.*heads \(3\)"):
        check_te_layout(odd, Cost())
    from megatron.core.extensions import transformer_engine as mte

    if not mte.HAVE_TE:  # this machine: TE is not installed, so the spec is refused by name
        with pytest.raises(MissingDependencyError, match="needs TransformerEngine"):
            fcp_te_spec(TransformerConfig(**base))
