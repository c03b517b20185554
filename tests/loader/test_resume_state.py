"""A resume state is checked field by field and refused when it belongs to another dataset."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from loader_helpers import NUM_SAMPLES, ByteTokenizer, TarIndex, write_text_shards
from test_loader_epoch import make_loaders

from fcp_data.errors import StateError
from fcp_data.loader.resume import source_fingerprint


@pytest.fixture()
def saved(index, cost) -> dict:
    """A real state from the middle of a multi-wave global batch."""
    ld = make_loaders(index, cost, 4)[0]
    it = iter(ld)
    for _ in range(40):
        next(it)
        if ld.state_dict()["wave"] > 0:
            return ld.state_dict()
    pytest.fail("no multi-wave global batch in the first 40 micro-batches: vacuous")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"wave": 99}, r"state wave=99 but global batch \d+ of epoch 0 has \d wave\(s\)"),
        ({"batch": 7, "wave": 0}, r"batch=7, wave=0 is past the end of an epoch of 6"),
        ({"batch": 6, "wave": 1}, r"batch=6, wave=1 is past the end"),
        ({"batch": 40}, r"batch=40, wave=\d+ is past the end"),
        ({"epoch": -1}, r"state\['epoch'\]=-1 must be >= 0"),
        ({"seed": -3}, r"state\['seed'\]=-3 must be >= 0"),
        ({"global_batch_size": 0}, r"state\['global_batch_size'\]=0 must be >= 1"),
        ({"wave": -1}, r"state\['wave'\]=-1 must be >= 0"),
        ({"batch": 1.5}, r"state\['batch'\]=1\.5 is not an integer"),
        ({"epoch": True}, r"state\['epoch'\]=True is not an integer"),
        ({"num_samples": "90"}, r"state\['num_samples'\]='90' is not an integer"),
        ({"num_samples": 89}, r"saved over 89 samples but the source holds 90"),
        ({"source_fingerprint": 7}, r"state\['source_fingerprint'\]=7 must be a string"),
        ({"cursor": 3}, r"unknown fields \['cursor'\]"),
    ],
)
def test_bad_fields_are_refused(index, cost, saved: dict, change: dict, message: str) -> None:
    ld = make_loaders(index, cost, 4)[0]
    with pytest.raises(StateError, match=message):
        ld.load_state_dict({**saved, **change})
    ld.load_state_dict(saved)  # the untouched state still loads


def test_missing_field_and_non_mapping(index, cost, saved: dict) -> None:
    ld = make_loaders(index, cost, 4)[0]
    with pytest.raises(StateError, match=r"missing fields \['wave'\]"):
        ld.load_state_dict({k: v for k, v in saved.items() if k != "wave"})
    with pytest.raises(StateError, match="a loader state is a mapping"):
        ld.load_state_dict([("epoch", 0)])


def test_another_dataset_of_the_same_size_is_refused(index, cost, saved: dict, tmp_path) -> None:
    urls, _ = write_text_shards(tmp_path, NUM_SAMPLES, per_shard=25, seed=8, max_bytes=3000)
    other = TarIndex(urls, ByteTokenizer())
    assert len(other.keys) == len(index.keys)  # same size, same keys, other lengths
    ld = make_loaders(other, cost, 4)[0]
    with pytest.raises(StateError, match="another dataset of the same size"):
        ld.load_state_dict(saved)


def test_other_sampler_settings_are_refused(index, cost, saved: dict) -> None:
    ld = make_loaders(index, cost, 4, shuffle=False)[0]
    with pytest.raises(StateError, match=r"sampler settings 'drop_last=False,shuffle=True'"):
        ld.load_state_dict(saved)


def test_old_state_without_fingerprints_warns_and_resumes(index, cost, saved: dict) -> None:
    old = {k: v for k, v in saved.items() if k not in ("source_fingerprint", "sampler")}
    full = list(itertools.islice(make_loaders(index, cost, 4)[0], 60))
    a, b = make_loaders(index, cost, 4)[0], make_loaders(index, cost, 4)[0]
    a.load_state_dict(saved)
    with pytest.warns(UserWarning, match="no source fingerprint"):
        b.load_state_dict(old)
    assert [mb.digest for mb in a] == [mb.digest for mb in b]
    assert full  # the reference run exists


def test_fingerprint_ignores_array_width_but_sees_keys_and_lengths() -> None:
    keys = np.array(["a1", "b22", "c"])
    lens = np.array([5, 6, 7])
    fp = source_fingerprint(keys, lens)
    assert fp == source_fingerprint(keys.astype("<U40"), lens.astype(np.int32))
    assert fp == source_fingerprint(["a1", "b22", "c"], [5, 6, 7])
    assert fp != source_fingerprint(np.array(["a1", "b22", "d"]), lens)
    assert fp != source_fingerprint(keys, np.array([5, 6, 8]))
    assert fp != source_fingerprint(keys[[1, 0, 2]], lens[[1, 0, 2]])  # order matters
