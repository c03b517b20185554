"""Vision test fixtures: one real tokenizer per session (byte-level BPE, offline)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vision_helpers import make_tokenizer


@pytest.fixture(scope="session")
def tok():
    return make_tokenizer()
