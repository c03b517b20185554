"""Length generators for the simulator: published means, assumed shapes (documented per entry).

Text lengths are Llama-tokenizer tokens per document; video lengths are clip seconds turned into
tokens by a vision rate (Qwen2-VL family: tokens per second of video at 2 fps after 2×2 merge —
640×360 → 299, 720p/1080p → 720 — plus a caption). The paper caps sequences at 128K and its
long-tail effect needs a tail, so text distributions splice a Pareto tail (alpha 1.6 above 8K, the
Olmo 3 long-document pool: counts fall ~0.33× per doubling) onto the log-normal body: the
samples the body puts above 8K (4.5% for GitHub, 0.4% Wikipedia, 0.07% C4) keep their share
but are redrawn from the Pareto, so the mass is continuous at 8K and only the shape changes.
Users can pass their own arrays anywhere lengths are taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["DISTRIBUTIONS", "LengthDistribution", "generate_lengths"]

MAX_LEN = 131_072
TAIL_START = 8192
TAIL_ALPHA = 1.6


@dataclass(kw_only=True, slots=True, frozen=True)
class LengthDistribution:
    name: str
    source: str
    draw: Callable[[np.random.Generator, int], np.ndarray]


Draw = Callable[[np.random.Generator, int], np.ndarray]


def _lognormal(mu: float, sigma: float, lo: int, hi: int, tail: bool = False) -> Draw:
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(mu, sigma, n)
        if tail:
            # Splice: the body's own mass above 8K keeps its weight but takes a Pareto(1.6) shape.
            pareto = TAIL_START * (1 + rng.pareto(TAIL_ALPHA, n))
            x = np.where(x > TAIL_START, pareto, x)
        return np.clip(np.round(x), lo, hi).astype(np.int64)

    return draw


def _video(
    seconds: Callable[[np.random.Generator, int], np.ndarray],
    tokens_per_second: np.ndarray,
    probs: np.ndarray,
) -> Draw:
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        sec = seconds(rng, n)
        rate = rng.choice(tokens_per_second, size=n, p=probs)
        caption = rng.integers(16, 128, n)
        return np.clip(np.round(sec * rate) + caption, 64, MAX_LEN).astype(np.int64)

    return draw


def _internvid_seconds(rng: np.random.Generator, n: int) -> np.ndarray:
    short = np.clip(rng.lognormal(np.log(4.5), 0.5, n), 1, 10)
    long = 10 + rng.lognormal(3.23, 1.0, n)
    return np.where(rng.random(n) < 0.85, short, long)


def _extreme(rng: np.random.Generator, n: int) -> np.ndarray:
    out = rng.integers(2048, 8193, n)
    out[0] = MAX_LEN
    return out.astype(np.int64)


_RATES = np.array([299.0, 720.0])  # 640×360 and 720p+ (qwen-vl-utils, Qwen2-VL family)

DISTRIBUTIONS: dict[str, LengthDistribution] = {
    p.name: p
    for p in (
        LengthDistribution(
            name="github",
            source="The Stack via Dolma v1.6: 1,957 tokens/file; log-normal sigma 1.5 (assumed), "
            "mu 6.45, Pareto(1.6) tail spliced above 8K, clip [8, 128K]",
            draw=_lognormal(6.45, 1.5, 8, MAX_LEN, tail=True),
        ),
        LengthDistribution(
            name="c4",
            source="C4 via Dolma: 544 tokens/doc; log-normal sigma 1.0 (assumed), mu 5.80, "
            "Pareto tail spliced above 8K, clip [32, 32K]",
            draw=_lognormal(5.80, 1.0, 32, 32_768, tail=True),
        ),
        LengthDistribution(
            name="wikipedia",
            source="Wikipedia via Dolma: 694 tokens/doc; sigma 1.2 from 2002 article statistics, "
            "mu 5.82, Pareto tail spliced above 8K, clip [16, 64K]",
            draw=_lognormal(5.82, 1.2, 16, 65_536, tail=True),
        ),
        LengthDistribution(
            name="msrvtt",
            source="MSR-VTT: 41.2 h / 10K clips = 14.8 s; log-normal(ln 14, 0.33) clip [5, 35] s "
            "(sigma assumed); 299 or 720 tokens/s",
            draw=_video(
                lambda r, n: np.clip(r.lognormal(np.log(14), 0.33, n), 5, 35),
                _RATES,
                np.array([0.5, 0.5]),
            ),
        ),
        LengthDistribution(
            name="internvid",
            source="InternVid: mean 11.7 s, 85% of clips 0-10 s; 85% log-normal(ln 4.5, 0.5) in "
            "[1, 10] s, 15% 10 + log-normal(3.23, 1.0) s; 85% 720p (720 tokens/s)",
            draw=_video(_internvid_seconds, _RATES, np.array([0.15, 0.85])),
        ),
        LengthDistribution(
            name="openvid",
            source="OpenVid-1M: >= 512×512, mean 7.2 s; log-normal(ln 6, 0.6) s; 720 tokens/s",
            draw=_video(
                lambda r, n: r.lognormal(np.log(6), 0.6, n), np.array([720.0]), np.array([1.0])
            ),
        ),
        LengthDistribution(
            name="longmix",
            source="ByteScale long-context mix: log-normal(6.17, 2.55), clip [16, 128K]",
            draw=_lognormal(6.17, 2.55, 16, MAX_LEN),
        ),
        LengthDistribution(
            name="extreme",
            source="the paper's extreme batch: one 128K sequence plus uniform 2-8K sequences",
            draw=_extreme,
        ),
    )
}


def generate_lengths(distribution: str, n: int, *, seed: int = 0) -> np.ndarray:
    """`n` token counts drawn from a named length distribution (deterministic given `seed`)."""
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(
            f"unknown length distribution {distribution!r}; known: {sorted(DISTRIBUTIONS)}"
        )
    if n < 1:
        raise ConfigError(f"n={n} must be >= 1")
    return DISTRIBUTIONS[distribution].draw(np.random.default_rng(seed), int(n))
