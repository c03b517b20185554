"""fcp.demo: the small megatron-core training job behind `fcp demo` and the examples.

    from fcp.demo import TrainConfig, launch
    report = launch(TrainConfig(replicas=2, steps=2, index="out/demo/index", baseline="static"))

or `python -m fcp.demo --help`. `parts` holds the tokenizer, the capped source, the model
and the loader; `train` the per-replica loop, the worker and the local launcher.
"""

from .parts import CappedSource, ChunkTokenizer, no_cp_planner
from .train import TrainConfig, TrainReport, launch, worker

__all__ = [
    "CappedSource",
    "ChunkTokenizer",
    "TrainConfig",
    "TrainReport",
    "launch",
    "no_cp_planner",
    "worker",
]
