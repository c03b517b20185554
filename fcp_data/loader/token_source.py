"""The token store of a loader's source, when its length index has one.

Kept apart from `loader.source` so that the store is an add-on: a source without one (shards
scanned in memory, an index built without `--store-tokens`, a custom object) loads as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["open_token_store"]


def open_token_store(source: Any) -> Any:
    """The checked `TokenStore` beside `source`'s index directory, or None.

    Raises TokenStoreMismatchError (an IndexMismatchError naming the file) when the store does
    not match the index: another tokenizer, a truncated file, other lengths.
    """
    blend = getattr(source, "token_store", None)
    if callable(blend):  # a Blend: its sources' stores behind blend positions
        return blend()
    path = getattr(source, "path", None)
    if path is None or not hasattr(source, "header"):
        return None
    from ..readers.token_store import TokenStore

    if not TokenStore.exists(Path(path)):
        return None
    return TokenStore.open(path, index=source)
