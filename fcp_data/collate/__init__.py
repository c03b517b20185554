"""fcp_data.collate: zigzag sharding, THD packing and the MicroBatch a replica trains on."""

from .microbatch import MicroBatch, VisionInput
from .pack import IGNORE_INDEX, PackedShard, pack_shard, shifted_labels
from .zigzag import chunk_bounds, padded_seqlen, shard_indices, shard_sequence, unshard_sequence

__all__ = [
    "IGNORE_INDEX",
    "MicroBatch",
    "PackedShard",
    "VisionInput",
    "chunk_bounds",
    "pack_shard",
    "padded_seqlen",
    "shard_indices",
    "shard_sequence",
    "shifted_labels",
    "unshard_sequence",
]
