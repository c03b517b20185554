"""Local process groups for gloo jobs: a free port and a spawned group with a hard deadline.

Benchmarks, the profiler, examples and tests start several processes on one host the same way;
the implementation lives on the data side (`fcp_data.profiling.spawn`, which the profiler needs
without importing the training side) and is re-exported here for training code.
"""

from __future__ import annotations

from fcp_data.profiling.spawn import free_port, run_group

__all__ = ["free_port", "run_group"]
