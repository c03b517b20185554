"""fcp_data: the data side of Flexible Context Parallelism.

Readers estimate token counts, the planner turns a global batch of lengths into a Plan, the
collator shards each replica's sequences. Import the subpackages you need; nothing is done at
import time.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
