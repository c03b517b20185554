"""One colour per CP degree, the same in every picture (no per-picture colour scale).

Degrees 1-16 get fixed, distinct colours in light/dark pairs of hue (1 light blue, 2 blue,
3 light orange, 4 orange, ...), so d = 1 and d = 2 never look alike and a picture of 8 replicas
and one of 64 colour their degree-4 groups the same. Degrees above 16 (only on large clusters)
get a grey ramp, darker as log2(d) grows up to 1024; their bars carry the degree as a label.
"""

from __future__ import annotations

import math

from ..errors import ConfigError

__all__ = ["PALETTE", "degree_color", "text_color"]

PALETTE: dict[int, str] = {
    1: "#9ecae1",
    2: "#3182bd",
    3: "#fdae6b",
    4: "#e6550d",
    5: "#a1d99b",
    6: "#31a354",
    7: "#bcbddc",
    8: "#756bb1",
    9: "#f7b6d2",
    10: "#e377c2",
    11: "#dbdb8d",
    12: "#bcbd22",
    13: "#9edae5",
    14: "#17becf",
    15: "#c49c94",
    16: "#8c564b",
}


def _rgb(hex_color: str) -> tuple[float, float, float]:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) / 255 for i in (0, 2, 4))
    return (r, g, b)


def degree_color(degree: int) -> tuple[float, float, float]:
    """RGB in [0, 1] of a CP degree (any positive integer)."""
    d = int(degree)
    if d < 1:
        raise ConfigError(f"degree={degree} must be >= 1")
    if d in PALETTE:
        return _rgb(PALETTE[d])
    grey = 0.7 - 0.55 * min(1.0, (math.log2(d) - 4.0) / 6.0)  # 17 -> ~0.69, 1024 -> 0.15
    return (grey, grey, grey)


def text_color(rgb: tuple[float, float, float]) -> str:
    """Black on light fills, white on dark ones (relative luminance 0.5)."""
    lum = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return "black" if lum > 0.5 else "white"
