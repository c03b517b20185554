"""Helpers of the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["REPO", "image_colors"]

REPO = Path(__file__).resolve().parents[2]


def image_colors(path: Path) -> tuple[int, set[tuple[int, int, int]]]:
    """(pixels, distinct RGB colours) of a PNG."""
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    rgb = np.round(img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    return img.shape[0] * img.shape[1], {tuple(int(v) for v in c) for c in np.unique(rgb, axis=0)}
