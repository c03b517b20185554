"""Moved to `fcp_data.optional` (one `require` for every optional import); kept for old imports."""

from ..optional import EXTRAS, require

__all__ = ["EXTRAS", "require"]
