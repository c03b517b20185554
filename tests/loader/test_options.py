"""Every option is checked where it is given: ConfigError naming the value and what is allowed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from loader_helpers import cluster, simple_planner

from fcp_data.errors import ConfigError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel, plan_global_batch


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"on_error": "skp"}, r"on_error='skp'; allowed: 'raise', 'skip'"),
        ({"on_too_long": "truncate"}, r"on_too_long='truncate'; allowed: 'raise', 'drop'"),
        ({"timeout_s": -1}, r"timeout_s=-1 must be a finite number of seconds >= 0"),
        ({"timeout_s": math.inf}, r"timeout_s=inf must be a finite number"),
        ({"timeout_s": "60"}, r"timeout_s='60' must be"),
        ({"sample_timeout_s": -0.5}, r"sample_timeout_s=-0.5 must be"),
        ({"sample_timeout_s": True}, r"sample_timeout_s=True must be"),
        ({"pad_id": -1}, r"pad_id=-1 must be an integer >= 0 \(a token id\)"),
        ({"eod_id": 2.5}, r"eod_id=2.5 must be an integer >= 0"),
        (
            {"decode_backend": "ffmpeg"},
            r"decode_backend='ffmpeg'; allowed: 'auto', 'pyav', 'decord'",
        ),
        ({"multiprocessing_context": "thread"}, r"multiprocessing_context='thread'; allowed"),
        ({"metrics_history": 0}, r"metrics_history=0 must be an integer >= 1"),
        ({"shuffle": "yes"}, r"shuffle='yes' must be True or False"),
        ({"text_field": ""}, r"text_field='' must be a non-empty string"),
        ({"planner": "fcp"}, r"planner='fcp' must be a callable or None"),
    ],
)
def test_loader_options_refuse_bad_values(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LoaderOptions(**kw)


def test_loader_options_defaults_are_finite() -> None:
    o = LoaderOptions()
    assert 0 < o.timeout_s < math.inf and 0 < o.sample_timeout_s < o.timeout_s
    assert LoaderOptions(timeout_s=0, sample_timeout_s=0).timeout_s == 0  # 0 = documented "off"


def make(index, cost, **kw) -> FCPDataLoader:
    args = {
        "cluster": cluster(4),
        "cost": cost,
        "replica": 0,
        "global_batch_size": 16,
        "num_workers": 0,
    }
    args.update(kw)
    return FCPDataLoader(index, **args)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"replica": 1.5}, r"replica=1\.5 is outside \[0, 4\) or not an integer"),
        ({"replica": 1.0}, r"replica=1\.0 is outside"),
        ({"replica": True}, r"replica=True is outside"),
        ({"replica": "1"}, r"replica='1' is outside"),
        ({"global_batch_size": 16.0}, r"global_batch_size=16\.0 must be an integer >= 1"),
        ({"global_batch_size": 0}, r"global_batch_size=0 must be an integer >= 1"),
        ({"seed": -1}, r"seed=-1 must be an integer >= 0"),
        ({"num_workers": -2}, r"num_workers=-2 must be an integer >= 0"),
        ({"num_workers": 1.5}, r"num_workers=1\.5 must be an integer"),
        ({"prefetch_factor": 0}, r"prefetch_factor=0 must be an integer >= 1"),
        ({"strategy": "best"}, r"strategy='best' is not one of \('fcp'"),
        ({"cluster": 4}, r"cluster= must be a fcp_data.planner.Cluster"),
        ({"options": {"on_error": "skip"}}, r"must be a LoaderOptions"),
    ],
)
def test_loader_arguments_refused_at_construction(index, cost, kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(index, cost, **kw)


def test_numpy_integers_are_accepted(index, cost) -> None:
    ld = make(index, cost, replica=np.int64(3), global_batch_size=np.int32(8), seed=np.uint8(2))
    assert ld.replica == 3 and isinstance(ld.replica, int)
    # a custom planner may accept its own strategy names: passed through unchecked
    custom = LoaderOptions(planner=simple_planner)
    assert make(index, cost, strategy="mine", options=custom).num_batches > 0


def test_planner_entry_and_cluster_refuse_bad_values(cost) -> None:
    with pytest.raises(ConfigError, match=r"strategy='fastest' is not one of"):
        plan_global_batch([10, 20], cluster(2), cost, strategy="fastest")
    with pytest.raises(ConfigError, match=r"on_too_long='cut' is not one of"):
        plan_global_batch([10, 20], cluster(2), cost, on_too_long="cut")
    for bad, message in [
        (lambda: Cluster(1.5, tokens_per_replica=10), r"num_replicas=1\.5 must be an integer"),
        (lambda: Cluster(True, tokens_per_replica=10), r"num_replicas=True must be an integer"),
        (lambda: Cluster(4, replicas_per_node=2.5, tokens_per_replica=10), r"replicas_per_node"),
        (lambda: Cluster(4, tokens_per_replica=99.9), r"tokens_per_replica=99\.9 must be"),
        (lambda: Cluster(4, tokens_per_replica=0), r"tokens_per_replica=0 must be >= 1"),
        (lambda: Cluster(4, memory_bytes=-1.0), r"memory_bytes=-1\.0 must be a positive"),
        (lambda: Cluster(4, memory_bytes=True), r"memory_bytes=True must be a positive"),
        (lambda: CostModel(alpha1=True, alpha2=1e-3), r"CostModel.alpha1=True must be a finite"),
        (lambda: CostModel(alpha1=1e-9, alpha2=-1.0), r"CostModel.alpha2=-1\.0 must be"),
        (lambda: CostModel(alpha1=1e-9, alpha2=0.0, name=3), r"CostModel.name=3 must be a str"),
    ]:
        with pytest.raises(ConfigError, match=message):
            bad()
