"""Vision-token rules by name: re-exported from `fcp_data.vision.families` (the registry).

Kept so that `from fcp_data.readers.rules import get_rule, RULE_NAMES` still works; the
registry (`fcp_data.vision.families.registry`) is the one place that maps a rule name to its
family.
"""

from __future__ import annotations

from ..vision.families import MAX_SETTING, RULE_NAMES, get_rule

__all__ = ["MAX_SETTING", "RULE_NAMES", "get_rule"]
