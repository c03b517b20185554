"""Model shapes the profiler measures: what sets the cost of one token and one token pair.

Only the shape matters for timing (weights are random): attention cost follows query heads x
head dim (KV heads add the GQA expansion), per-token cost follows the projections and the MLP.
Layers are identical, so the profiler times one layer and multiplies by `layers`; the LM head
is timed once. `cpu-small` is the model `examples/train_megatron.py` and `fcp demo` train and
the one whose measured profile ships in `fcp_data/profiles/cpu-small.json`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fcp_data.errors import ConfigError

__all__ = ["SHAPES", "ModelShape", "shape_from_name"]


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (SwiGLU MLP, GQA attention, untied LM head)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"ModelShape.{f}={v!r} must be an integer >= 1")
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}; GQA shares "
                "each KV head among heads/kv_heads query heads (e.g. --heads 8 --kv-heads 2)"
            )

    @property
    def params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.ffn
        return self.layers * per_layer + 2 * self.vocab * self.hidden

    def ring_bytes_per_token(self, bytes_per_element: int) -> float:
        """alpha3: bytes one token puts on the ring per micro-batch, all layers: K,V forward and
        backward in the activation dtype, dK,dV in fp32 (`planner.cost.model.ring_bytes_per_token`;
        with fp32 activations that is 3 passes of K,V)."""
        from fcp_data.planner.cost.model import ring_bytes_per_token  # the planner imports numba

        return float(
            ring_bytes_per_token(
                kv_heads=self.kv_heads,
                head_dim=self.head_dim,
                activation_bytes=bytes_per_element,
                layers=self.layers,
            )
        )


SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        # The CPU example model: ~0.4M parameters, 2 layers, a byte-level vocabulary.
        ModelShape(
            name="cpu-small",
            layers=2,
            hidden=128,
            heads=4,
            kv_heads=2,
            head_dim=32,
            ffn=384,
            vocab=512,
        ),
        ModelShape(
            name="cpu-medium",
            layers=4,
            hidden=256,
            heads=8,
            kv_heads=2,
            head_dim=32,
            ffn=768,
            vocab=4096,
        ),
    )
}


def shape_from_name(name: str) -> ModelShape:
    """A profiler preset, or a planner model preset (`qwen3-8b`, ...) turned into a shape."""
    key = name.lower()
    if key in SHAPES:
        return SHAPES[key]
    from fcp_data.planner import MODELS

    if key in MODELS:
        m = MODELS[key]
        return ModelShape(
            name=m.name,
            layers=m.layers,
            hidden=m.hidden,
            heads=m.heads,
            kv_heads=m.kv_heads,
            head_dim=m.dim_head,
            ffn=m.ffn,
            vocab=m.vocab,
        )
    raise ConfigError(
        f"unknown model shape {name!r}; known: {sorted(SHAPES)} and the planner presets "
        f"{sorted(MODELS)}, or give --layers/--hidden/--heads/--kv-heads/--head-dim/--ffn"
    )
