"""The loader: sampler -> plan -> read -> pack, per global batch, inside DataLoader workers.

Modules, one job each: `dataloader` (the public `FCPDataLoader`), `options` (`LoaderOptions`
and argument checks), `sampler` (deterministic global batches of sample ids), `global_batch`
(plan one global batch, read this replica's samples, pack its micro-batches), `encode` (sample
members -> token ids and vision inputs), `prefetch` (batches built ahead in DataLoader workers),
`workers` (naming a dead or hung worker), `time_limit` (the per-sample time limit), `resume`
(checking a resume state), `source` (opening an index or shard specs), `types` (resume state,
metrics).
"""

from .dataloader import FCPDataLoader
from .options import LoaderOptions
from .types import BatchMetrics, LoaderState, SampleSource

__all__ = ["BatchMetrics", "FCPDataLoader", "LoaderOptions", "LoaderState", "SampleSource"]
