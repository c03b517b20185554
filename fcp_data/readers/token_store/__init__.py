"""Token store: every text sample's token ids, written once at index time, memory-mapped after.

The layout, its checks and the reader the loader uses live in `store`; the recorder and the
writer `build_index` uses live in `write`. This face is what the index build, the loader and
`fcp index` import.
"""

from __future__ import annotations

from .store import (
    FLAT_NAME,
    MAX_TOKEN_ID,
    OFFSETS_NAME,
    STORE_HEADER_NAME,
    StoredTokens,
    StoreHeader,
    TokenStore,
    TokenStoreCorruptError,
    TokenStoreMismatchError,
    check_ids,
    lengths_digest,
    narrowest_dtype,
    vocab_size_of,
)
from .write import TokenRecorder, pack_ids, storable, write_store

__all__ = [
    "FLAT_NAME",
    "MAX_TOKEN_ID",
    "OFFSETS_NAME",
    "STORE_HEADER_NAME",
    "StoreHeader",
    "StoredTokens",
    "TokenRecorder",
    "TokenStore",
    "TokenStoreCorruptError",
    "TokenStoreMismatchError",
    "check_ids",
    "lengths_digest",
    "narrowest_dtype",
    "pack_ids",
    "storable",
    "vocab_size_of",
    "write_store",
]
