"""fcp_data: the data side of Flexible Context Parallelism.

Readers estimate token counts, the planner turns a global batch of lengths into a Plan, the
collator shards each replica's sequences, and `FCPDataLoader` ties them together
(`InMemoryBatch` / `shard_batch`: the same for a batch already in memory, such as RL rollouts,
docs/in-memory.md). Names are
resolved lazily (PEP 562): `import fcp_data` does no work and imports neither torch nor numba.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["FCPDataLoader", "InMemoryBatch", "LoaderOptions", "__version__", "shard_batch"]

_LAZY = {
    "FCPDataLoader": "fcp_data.loader",
    "LoaderOptions": "fcp_data.loader",
    "InMemoryBatch": "fcp_data.inmemory",
    "shard_batch": "fcp_data.inmemory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fcp_data' has no attribute {name!r}")
