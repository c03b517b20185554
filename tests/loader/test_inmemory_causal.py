"""`InMemoryBatch(causal=...)` takes flags, never truthiness.

Was: `np.asarray(causal, dtype=bool)` read `["no", "yes"]` as [True, True] (any non-empty
string is true), 0.0 and 1.0 as flags, None as False. Every replica validates the batch, so a
bad value is the same BatchInputError everywhere, naming the value and the sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcp_data.inmemory import BatchInputError, InMemoryBatch

SEQS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]


@pytest.mark.parametrize(
    "causal, where",
    [
        (["no", "yes", "no"], "causal[0] is 'no'"),
        ("yes", "causal is 'yes'"),
        ([True, 0.0, 1], "causal[1] is 0.0"),
        ([True, None, False], "causal[1] is None"),
        (None, "causal is None"),
        ([True, 2, False], "causal[1] is 2"),
        (np.array([1.0, 0.0, 1.0]), "causal[0] is 1.0"),
    ],
)
def test_values_that_are_not_flags_are_refused(causal: object, where: str) -> None:
    with pytest.raises(BatchInputError, match="a causal flag is True / False") as err:
        InMemoryBatch(SEQS, causal=causal)
    assert where in str(err.value) and err.value.field == "causal"


@pytest.mark.parametrize(
    "causal, want",
    [
        (True, [True, True, True]),
        (False, [False, False, False]),
        ([True, False, True], [True, False, True]),
        ([1, 0, 1], [True, False, True]),
        (np.array([True, False, False]), [True, False, False]),
        (np.bool_(False), [False, False, False]),
        (torch.tensor([0, 1, 1]), [False, True, True]),
        (torch.tensor(True), [True, True, True]),
    ],
)
def test_flags_are_read_as_given(causal: object, want: list[bool]) -> None:
    assert InMemoryBatch(SEQS, causal=causal).causal.tolist() == want


def test_a_wrong_count_of_flags_still_names_the_count() -> None:
    with pytest.raises(BatchInputError, match="causal has 2 flags for 3 sequences"):
        InMemoryBatch(SEQS, causal=[True, False])
