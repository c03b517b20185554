"""Exact resume at several points, and elastic resume on another number of replicas."""

from __future__ import annotations

import itertools

import pytest
from test_loader_epoch import make_loaders


def key(mb) -> tuple:
    return (
        mb.epoch,
        mb.batch_index,
        mb.wave,
        mb.digest,
        mb.sample_ids,
        mb.tokens.tolist(),
        mb.position_ids.tolist(),
    )


def test_resume_at_several_points_equals_uninterrupted(index, cost) -> None:
    full = [key(mb) for mb in make_loaders(index, cost, 4)[1]]
    assert len(full) > 10
    mid_batch_cuts = 0
    for cut in (1, 2, 5, len(full) - 1):  # includes mid-global-batch cuts (waves > 1)
        first = make_loaders(index, cost, 4)[1]
        got = [key(mb) for mb in itertools.islice(first, cut)]
        state = first.state_dict()
        mid_batch_cuts += state["wave"] > 0
        assert set(state) >= {"epoch", "batch", "wave", "seed"}
        fingerprints = {"source_fingerprint", "sampler", "plan"}
        assert all(isinstance(v, int) for k, v in state.items() if k not in fingerprints)
        assert all(isinstance(state[k], str) and state[k] for k in fingerprints)
        second = make_loaders(index, cost, 4, seed=999)[1]  # seed comes from the state
        second.load_state_dict(state)
        got += [key(mb) for mb in second]
        assert got == full, f"resume after {cut} micro-batches diverged"
    assert mid_batch_cuts > 0, "no cut fell inside a multi-wave global batch: vacuous"


def test_resume_across_epochs_with_workers(index, cost) -> None:
    a = make_loaders(index, cost, 4, num_workers=2)[3]
    run = [key(mb) for mb in a] + [key(mb) for mb in a]  # two epochs, auto-advanced
    assert run[0][0] == 0 and run[-1][0] == 1
    b = make_loaders(index, cost, 4, num_workers=2)[3]
    head = [key(mb) for mb in itertools.islice(b, len(run) // 2 + 3)]
    c = make_loaders(index, cost, 4, num_workers=2)[3]
    c.load_state_dict(b.state_dict())
    assert head + [key(mb) for mb in c] == run


@pytest.mark.parametrize("new_n", [3, 6])
def test_elastic_resume_continues_with_same_samples(index, cost, new_n: int) -> None:
    def samples_by_batch(loaders) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for ld in loaders:
            for mb in ld:
                out.setdefault(mb.batch_index, []).extend(mb.sample_ids)
        return {b: sorted(set(v)) for b, v in out.items()}  # a group's members share ids

    reference = samples_by_batch(make_loaders(index, cost, 4))
    four = make_loaders(index, cost, 4)
    k = 2  # global batches done on 4 replicas; each replica yields the same micro-batch count
    for ld in four:
        it = iter(ld)
        while ld.state_dict()["batch"] < k:
            next(it)
    states = [ld.state_dict() for ld in four]
    assert len({tuple(sorted(s.items())) for s in states}) == 1  # replicas agree on the state
    resumed = make_loaders(index, cost, new_n)
    for ld in resumed:
        ld.load_state_dict(states[0])
    after = samples_by_batch(resumed)
    assert sorted(after) == [b for b in sorted(reference) if b >= k]
    for b, ids in after.items():
        assert ids == reference[b], f"batch {b} holds other samples after elastic resume"
        assert len(ids) == (16 if b < len(reference) - 1 else 90 - 16 * b)


def test_global_batch_size_change_warns(index, cost) -> None:
    a = make_loaders(index, cost, 4, gbs=16)[0]
    it = iter(a)
    while a.state_dict()["batch"] < 2:
        next(it)
    b = make_loaders(index, cost, 4, gbs=8)[0]
    with pytest.warns(UserWarning, match=r"global_batch_size changed on resume \(16 -> 8\)"):
        b.load_state_dict(a.state_dict())
    assert b.state_dict()["batch"] == 4  # 32 samples consumed = 4 batches of 8
