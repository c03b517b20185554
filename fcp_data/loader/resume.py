"""Checking a resume state before trusting it: field types and ranges, dataset and sampler.

A state is a few integers, so a wrong one is easy to make (a checkpoint from another run, a
hand-edited file) and, unchecked, silently resumes over other data: two datasets of the same
size give the same `num_samples`. The state therefore carries a fingerprint of the source (a
blake2b digest of every key and length, computed once per loader on first use: 1.4 s for 2M
keys of 20 characters on a loaded 2-core machine) and the sampler settings that change the
order; `resume_point` refuses any state that does not fit, naming the field, its value and
what this loader expects (`StateError`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, StateError
from .sampler import GlobalBatchSampler
from .types import LoaderState

__all__ = [
    "check_position",
    "check_source",
    "parse_state",
    "plan_settings",
    "resume_point",
    "sampler_settings",
    "source_fingerprint",
]

_INT_FIELDS = {  # field -> smallest allowed value
    "epoch": 0,
    "batch": 0,
    "wave": 0,
    "seed": 0,
    "global_batch_size": 1,
    "num_samples": 1,
    "num_replicas": 1,
}
_STR_FIELDS = ("source_fingerprint", "sampler", "plan")


def source_fingerprint(keys: Any, seqlens: Any) -> str:
    """Digest of every sample's key and planned length, in index order (32 hex digits).

    Keys are hashed as fixed-width UTF-32 of the longest key, so the same keys held in arrays
    of different widths (an index vs a scan of the same shards) give the same digest.
    """
    h = hashlib.blake2b(digest_size=16)
    k = np.asarray(keys)
    if k.dtype.kind != "U":
        k = np.asarray([str(x) for x in k])
    width = int(np.char.str_len(k).max()) if k.size else 0
    want = np.dtype(f"<U{max(width, 1)}")
    k = np.ascontiguousarray(k if k.dtype == want else k.astype(want))  # a copy only if needed
    lens = np.ascontiguousarray(np.asarray(seqlens).astype("<i8"))
    h.update(f"{k.size}:{width}:".encode())
    h.update(memoryview(k).cast("B"))
    h.update(memoryview(lens).cast("B"))
    return h.hexdigest()


def sampler_settings(sampler: Any) -> str:
    """The sampler settings that change which samples a batch holds, besides seed and size
    (every init field of the sampler dataclass but those: shuffle, drop_last, blend weights)."""
    skip = {"seed", "global_batch_size", "num_samples"}
    return ",".join(
        f"{f.name}={getattr(sampler, f.name)}"
        for f in dataclasses.fields(sampler)
        if f.init and f.name not in skip and not f.name.startswith("_")
    )


def plan_settings(*, strategy: str, planner: Any, cluster: Any, cost: Any, on_too_long: str) -> str:
    """What decides a global batch's plan besides its samples: strategy, planner, cluster
    (capacity, layout, idle policy) and cost model, as a readable head and a digest of all.

    Wave k of a batch is a set of sequences only under one plan: resumed mid-batch under
    another strategy or capacity, wave k holds other sequences, so some would be trained twice
    and others never. `resume_point` compares this string to decide.
    """
    name = (
        "fcp_data.planner.plan_global_batch"
        if planner is None
        else f"{getattr(planner, '__module__', '?')}.{getattr(planner, '__qualname__', planner)}"
    )
    whole = repr((strategy, name, cluster, cost, on_too_long)).encode()
    digest = hashlib.blake2b(whole, digest_size=8).hexdigest()
    return (
        f"strategy={strategy},tokens_per_replica={getattr(cluster, 'tokens_per_replica', '?')},"
        f"cost={getattr(cost, 'name', '?')},digest={digest}"
    )


def parse_state(state: Any) -> LoaderState:
    """A LoaderState from a mapping; every field checked for presence, type and range."""
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a mapping from state_dict(), got {type(state)}")
    missing = [f for f in _INT_FIELDS if f not in state]
    unknown = sorted(set(state) - set(_INT_FIELDS) - set(_STR_FIELDS))
    if missing or unknown:
        raise StateError(
            f"the loader state has missing fields {missing} / unknown fields {unknown}; "
            f"expected {sorted(LoaderState.__struct_fields__)} as written by state_dict()"
        )
    values: dict[str, Any] = {}
    for name, low in _INT_FIELDS.items():
        v = state[name]
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
            raise StateError(f"state[{name!r}]={v!r} is not an integer")
        if v < low:
            raise StateError(f"state[{name!r}]={v} must be >= {low}")
        values[name] = int(v)
    for name in _STR_FIELDS:
        v = state.get(name, "")
        if not isinstance(v, str):
            raise StateError(f"state[{name!r}]={v!r} must be a string (written by state_dict())")
        values[name] = v
    return LoaderState(**values)


def check_position(s: LoaderState, sampler: Any) -> None:
    """`batch` inside the saved epoch (under the saved batch size); `wave` 0 at its end."""
    try:
        saved = dataclasses.replace(
            sampler, global_batch_size=s.global_batch_size, seed=s.seed
        ).num_batches()
    except ConfigError:  # drop_last with fewer samples than the saved batch: no full batch
        saved = 0
    limit = getattr(sampler, "max_epoch", None)  # a Blend reaches far epochs slowly
    if limit is not None and s.epoch > limit:
        raise StateError(
            f"state epoch={s.epoch} is past {limit}, the last epoch this sampler reaches "
            f"({type(sampler).__name__}.max_epoch); the state is corrupt or from another run"
        )
    if s.batch > saved or (s.batch == saved and s.wave):
        raise StateError(
            f"state batch={s.batch}, wave={s.wave} is past the end of an epoch of {saved} "
            f"global batches ({s.num_samples} samples, global_batch_size="
            f"{s.global_batch_size}); the state is corrupt or from another run"
        )


def check_source(s: LoaderState, num_samples: int, fingerprint: str, settings: str) -> None:
    """The state's dataset and sampler settings must be this loader's."""
    if s.num_samples != num_samples:
        raise StateError(
            f"the state was saved over {s.num_samples} samples but the source holds "
            f"{num_samples}: resume needs the same index"
        )
    if s.source_fingerprint and s.source_fingerprint != fingerprint:
        raise StateError(
            f"the state was saved over another dataset of the same size (source fingerprint "
            f"{s.source_fingerprint} != this source's {fingerprint}: other keys or lengths); "
            "resume with the index the run was started with"
        )
    if s.sampler and s.sampler != settings:
        raise StateError(
            f"the state was saved with sampler settings {s.sampler!r} but this loader has "
            f"{settings!r}: the sample order would differ; use the run's LoaderOptions"
        )


def resume_point(
    state: Any,
    *,
    sampler: GlobalBatchSampler,
    num_replicas: int,
    fingerprint: str,
    num_waves: Callable[[GlobalBatchSampler, int, int], int],
    plan: str = "",
) -> tuple[GlobalBatchSampler, int, int, int]:
    """(sampler, epoch, batch, wave) to continue from `state`, every field checked first.

    An elastic resume (other replica count) restarts a half-done global batch at its first
    wave; another global batch size continues after the samples consumed (both warned). A
    state saved mid-batch under other planner settings (`plan`: strategy, capacity, cost model)
    also restarts that batch at its first wave, warned: its old wave k is not the new plan's. A
    seed in the state wins over the loader's. `num_waves(sampler, epoch, batch)` plans one batch.
    """
    s = parse_state(state)
    if not s.source_fingerprint or not s.sampler:
        warnings.warn(
            "the loader state carries no source fingerprint or sampler settings (saved by an "
            "older fcp): only the sample count can be checked",
            stacklevel=3,
        )
    check_source(s, sampler.num_samples, fingerprint, sampler_settings(sampler))
    check_position(s, sampler)
    batch, wave = s.batch, s.wave
    g = sampler.global_batch_size
    if s.global_batch_size != g:
        # at most the epoch's samples (a last short batch, or a state saved at the epoch's
        # end under a batch size past the sample count: 1 x 10^9 consumed from 5 samples put
        # the loader at batch 5 x 10^8 of 3, whose own state it then refused; found by the
        # fuzzer, tests/fuzz/corpus/resume_state)
        consumed = min(s.batch * s.global_batch_size, s.num_samples)
        batch, wave = min(consumed // g, sampler.num_batches()), 0
        warnings.warn(
            f"global_batch_size changed on resume ({s.global_batch_size} -> {g}): "
            f"continuing at batch {batch} of the new size ({consumed} samples were "
            f"consumed{'; ' + str(consumed % g) + ' are seen again' if consumed % g else ''})",
            stacklevel=3,
        )
    if s.num_replicas != num_replicas and wave:
        warnings.warn(
            f"resumed on {num_replicas} replicas (saved on {s.num_replicas}) "
            f"in the middle of a global batch (wave {wave}): the batch is re-planned and "
            "restarts at its first wave",
            stacklevel=3,
        )
        wave = 0
    if wave and s.plan and plan and s.plan != plan:
        warnings.warn(
            f"resumed in the middle of global batch {batch} (wave {wave}) under other planner "
            f"settings (saved {s.plan!r}, now {plan!r}): its waves hold other sequences now, so "
            "the batch restarts at its first wave and each of its samples is trained once; "
            "discard gradients accumulated since the last optimizer step",
            stacklevel=3,
        )
        wave = 0
    if s.seed != sampler.seed:
        sampler = dataclasses.replace(sampler, seed=s.seed)
    if wave:  # same cluster and batch size: the wave must exist in that batch's plan
        waves = num_waves(sampler, s.epoch, batch)
        if wave >= waves:
            raise StateError(
                f"state wave={wave} but global batch {batch} of epoch {s.epoch} has {waves} "
                "wave(s) on this cluster: the state is corrupt or from another cluster/cost "
                "model"
            )
    return sampler, s.epoch, batch, wave
