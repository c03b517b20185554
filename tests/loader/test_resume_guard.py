"""A state saved mid-batch and resumed under other planner settings trains every sample once.

Wave k of a global batch is a set of sequences only under one plan. Resumed under another
capacity or strategy, continuing at wave k would train the sequences the new plan puts in
waves >= k (some already trained) and never the ones it puts before k. The state therefore
records the planner settings; on a mismatch the half-done batch restarts at its first wave,
with a warning, and the epoch's completed batches hold every sample exactly once.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from loader_helpers import NUM_SAMPLES, ByteTokenizer, cluster, simple_planner
from test_loader_epoch import make_loaders

from fcp_data.loader import FCPDataLoader, LoaderOptions


def _static_loaders(index, cost, n: int) -> list[FCPDataLoader]:
    """make_loaders' loaders, planned under another strategy name."""
    return [
        FCPDataLoader(
            index,
            cluster=cluster(n, 1100),
            cost=cost,
            replica=r,
            global_batch_size=16,
            seed=3,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            strategy="static",
            options=LoaderOptions(planner=simple_planner),
        )
        for r in range(n)
    ]


def _mid_batch_cut(loaders: list) -> tuple[list, dict]:
    """Iterate every replica to the same point inside a multi-wave batch; (iterators, state)."""
    its = [iter(ld) for ld in loaders]
    for _ in range(60):
        for it in its:
            next(it)
        state = loaders[0].state_dict()
        if state["wave"] > 0 and state["batch"] > 0:
            assert all(ld.state_dict() == state for ld in loaders)
            return its, state
    pytest.fail("no cut inside a multi-wave global batch after batch 0: vacuous")


def _samples_per_batch(micro_batches) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for mb in micro_batches:
        out.setdefault(mb.batch_index, set()).update(mb.sample_ids)  # group members share ids
    return out


@pytest.mark.parametrize(
    "change", [{"tokens": 2200}, {"strategy": "static"}], ids=["capacity", "strategy"]
)
def test_mid_batch_state_under_other_planner_settings_restarts_the_batch(
    index, cost, change: dict
) -> None:
    first = make_loaders(index, cost, 4)
    _, state = _mid_batch_cut(first)
    cut_batch = state["batch"]
    done = {b: set(first[0].sampler.batch(0, b).tolist()) for b in range(cut_batch)}

    if "strategy" in change:
        resumed = _static_loaders(index, cost, 4)
    else:
        resumed = make_loaders(index, cost, 4, tokens=change["tokens"])
    assert resumed[0].state_dict()["plan"] != state["plan"]
    for ld in resumed:
        with pytest.warns(UserWarning, match=rf"middle of global batch {cut_batch} .*restarts"):
            ld.load_state_dict(state)
        now = ld.state_dict()
        assert (now["epoch"], now["batch"], now["wave"]) == (0, cut_batch, 0)
    micro = [mb for ld in resumed for mb in ld]
    assert min(mb.batch_index for mb in micro) == cut_batch
    assert 0 in {mb.wave for mb in micro if mb.batch_index == cut_batch}  # the batch's start

    after = _samples_per_batch(micro)
    trained = Counter(i for ids in itertools.chain(done.values(), after.values()) for i in ids)
    assert sorted(trained) == list(range(NUM_SAMPLES)), "some samples never trained"
    assert set(trained.values()) == {1}, "some samples trained twice"


def test_same_planner_settings_still_resume_at_the_wave(index, cost) -> None:
    first = make_loaders(index, cost, 4)
    its, state = _mid_batch_cut(first)
    rest = [mb.sample_ids for mb in its[0]]
    again = make_loaders(index, cost, 4)[0]
    again.load_state_dict(state)  # no warning: the same plan, the exact wave
    assert again.state_dict() == state
    assert [mb.sample_ids for mb in again] == rest


def test_old_state_without_plan_settings_is_accepted(index, cost) -> None:
    first = make_loaders(index, cost, 4)
    _, state = _mid_batch_cut(first)
    old = {k: v for k, v in state.items() if k != "plan"}
    again = make_loaders(index, cost, 4)[0]
    again.load_state_dict(old)
    assert again.state_dict() == state


@pytest.fixture(scope="module")
def blend_loader_factory(shards, tmp_path_factory, cost):
    """Loaders over a Blend of two real indexes of the shared text shards."""
    from fcp_data.loader import Blend
    from fcp_data.readers.build import build_index

    root = tmp_path_factory.mktemp("guard-blend")
    urls = shards[0]
    a = build_index(urls[:2], root / "a", counter=ByteTokenizer())
    b = build_index(urls[2:], root / "b", counter=ByteTokenizer())

    def make() -> FCPDataLoader:
        return FCPDataLoader(
            Blend([a, b], weights=[0.6, 0.4], batches_per_epoch=4),
            cluster=cluster(4, 1100),
            cost=cost,
            replica=0,
            global_batch_size=16,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            options=LoaderOptions(planner=simple_planner),
        )

    return make


@pytest.mark.parametrize(
    ("epoch", "message"),
    [
        (10**8, r"state epoch=100000000 is past 500000, the last epoch .*BlendSampler\.max_epoch"),
        (-1, r"state\['epoch'\]=-1 must be >= 0"),
        (2.0, r"state\['epoch'\]=2\.0 is not an integer"),
        ("3", r"state\['epoch'\]='3' is not an integer"),
    ],
)
def test_a_blend_state_with_an_unreachable_epoch_is_refused(
    blend_loader_factory, epoch: object, message: str
) -> None:
    from fcp_data.errors import StateError

    ld = blend_loader_factory()
    next(iter(ld))
    state = ld.state_dict()
    again = blend_loader_factory()
    with pytest.raises(StateError, match=message):
        again.load_state_dict({**state, "epoch": epoch})
    again.load_state_dict({**state, "epoch": 500_000, "batch": 0, "wave": 0})  # the limit
    assert again.state_dict()["epoch"] == 500_000  # is accepted (not drawn here: ~1 min)


def test_set_epoch_is_checked(blend_loader_factory) -> None:
    from fcp_data.errors import ConfigError

    ld = blend_loader_factory()
    for bad, message in [(1.5, "epoch=1.5 must be an integer"), (-2, "epoch=-2 must be an")]:
        with pytest.raises(ConfigError, match=message):
            ld.set_epoch(bad)
    with pytest.raises(ConfigError, match="epoch=100000000 is past 500000"):
        ld.set_epoch(10**8)
    ld.set_epoch(3)
    assert ld.state_dict()["epoch"] == 3
