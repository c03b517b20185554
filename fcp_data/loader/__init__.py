"""The loader: sampler -> plan -> read -> pack, per global batch, inside DataLoader workers.

Modules, one job each: `dataloader` (the public `FCPDataLoader`), `options` (`LoaderOptions`
and argument checks), `sampler` (deterministic global batches of sample ids), `global_batch`
(plan one global batch, read this replica's samples, pack its micro-batches), `encode` (sample
members -> token ids and vision inputs), `prefetch` (batches built ahead in DataLoader workers),
`workers` (naming a dead or hung worker), `time_limit` (the per-sample time limit), `resume`
(checking a resume state), `source` (opening an index or shard specs), `types` (resume state,
metrics), `blend` (several sources mixed by weight), `token_source` (an index's token store),
`handoff` (one buffer per micro-batch out of workers).
"""

from .blend import Blend
from .dataloader import FCPDataLoader
from .options import LoaderOptions
from .types import BatchMetrics, LoaderState, SampleSource

__all__ = [
    "BatchMetrics",
    "Blend",
    "FCPDataLoader",
    "LoaderOptions",
    "LoaderState",
    "SampleSource",
]
