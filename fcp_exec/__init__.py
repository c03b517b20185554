"""fcp_exec: the training side of Flexible Context Parallelism (process groups, ring attention)."""

__all__: list[str] = []
