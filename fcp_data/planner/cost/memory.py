"""Per-device memory of a parallel layout, and the tokens one replica can hold.

`tokens_per_replica` is the planner's memory limit: a CP group of degree d fits when every member
holds at most that many tokens (padding included). This module derives it instead of guessing
it: from the device's memory, the model's shape (`presets.MODELS`), the replica's layout (TP, PP,
sequence parallel, ZeRO stage over the N replicas, activation recompute) and a reserve. The full
derivation, with worked examples, is docs/memory.md; every term in brief (bytes, per device):

Model states, for the P_dev parameters one device holds (its 1/TP of its pipeline stage):
- bf16 weights 2 B, gradients 4 B (fp32 main grads, Megatron's default under bf16) or 2 B, Adam
  12 B (fp32 master weights + m + v): 18 B per parameter, 16 with bf16 gradients. Qwen3-8B on
  one device without sharding: 8.19e9 × 18 = 147 GB, more than an H200's 141 GB.
- ZeRO over the data-parallel domain, which in fcp is all N replicas (megatron-core's
  distributed optimizer shards over DP × CP, and fcp runs megatron with CP = 1 and every replica
  in DP): stage 1 divides the Adam states by N, stage 2 the gradients too, stage 3 (FSDP) the
  weights too, plus the gathered working set of `ZERO3_LAYERS_IN_FLIGHT` = 2 layers (the one
  computing and the one prefetched: bf16 weights and their unreduced gradients).

Activations per token of one micro-batch, per layer (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", Table 2, with the tensors of a SwiGLU,
GQA, dropout-free model and the s² attention scores that flash / ring attention never stores
left out):
- replicated across TP ranks (divided by TP only under sequence parallel): the inputs of the two
  norms and of the QKV and first MLP projections, 4 × 2h = 8h;
- split across TP ranks (always divided by TP): Q and the attention output 2 × 2·q_dim, K and V
  2 × 2·kv_dim, the fp32 log-sum-exp 4·heads, and the MLP's gate and up outputs and their
  product 3 × 2·ffn.
  With QK-norm (Qwen3) the norm's inputs, Q and K before it, 2·q_dim + 2·kv_dim, are split too.
  Llama3-70B: 65,536 B replicated + 209,152 B split = 274,688 B (33.5h); Qwen3-8B 32,768 +
  104,576 = 137,344 B (33.5h); a GPT-3 shape (ffn = 4h, GeLU, dropout masks) gives the paper's
  34h.
- selective recompute (megatron's core-attention recompute) saves only the s² scores, which
  flash and ring attention never keep: it costs the same bytes as none here.
- full recompute keeps each layer's input, 2h (/TP under sequence parallel), and rebuilds one
  layer at a time in the backward pass: plus one layer's activations once.
- the LM head: its input and the final norm's input 2 × 2h (replicated like the norms) and the
  fp32 logits of the vocab-parallel cross entropy, 4 × vocab / TP.

Pipeline parallelism (1F1B): every stage holds layers / PP layers; the first stage holds the
activations of PP micro-batches in flight (the warm-up forwards before its first backward), the
last stage one micro-batch plus the logits. Both stages are checked and the tighter one sets
`tokens_per_replica`. The first stage also holds the input embedding, the last the LM head
(untied; vocab × h each, both on the one stage when PP = 1).

What stays outside: the CUDA context, NCCL and cuBLAS workspaces, the allocator's fragmentation
and transient buffers (TP all-gathers, the gradient all-reduce buckets): that is what the reserve
is for, 10% of the device by default (14.1 GB of an H200).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from ...errors import ConfigError
from .presets import MODELS, ModelSpec, check_tensor_parallel

__all__ = [
    "DEFAULT_RESERVE",
    "RECOMPUTE",
    "ZERO_STAGES",
    "MemoryBudget",
    "ParallelLayout",
    "derive_tokens_per_replica",
    "replicas_per_node",
]

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
DEFAULT_RESERVE = 0.10
"""Share of device memory kept back for the CUDA context, workspaces and fragmentation."""

WEIGHT_BYTES = 2.0  # bf16 weights
GRAD_BYTES_FP32 = 4.0  # fp32 main gradients (accumulated and reduced in fp32)
GRAD_BYTES_BF16 = 2.0
ADAM_BYTES = 12.0  # fp32 master weights, first and second moments
ACTIVATION_BYTES = 2  # bf16 activations
LSE_BYTES = 4  # fp32 log-sum-exp per head per token kept by flash / ring attention
LOGIT_BYTES = 4  # fp32 logits per vocabulary entry in the cross entropy
ZERO3_LAYERS_IN_FLIGHT = 2  # gathered under ZeRO-3 / FSDP: the computing and the prefetched layer


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1")
    return value


@dataclass(kw_only=True, slots=True, frozen=True)
class ParallelLayout:
    """How one replica is laid out and trained (the flags of `fcp plan --tp ...`).

    tensor_parallel / pipeline_parallel: TP × PP devices per replica.
    sequence_parallel: megatron's sequence parallel (norm and dropout activations split over
        TP; sequences padded to a multiple of 2d × TP, `pad_unit`).
    zero_stage: 0 (plain data parallel), 1 (optimizer states sharded over the N replicas,
        megatron's distributed optimizer), 2 (and gradients), 3 (and weights: ZeRO-3 / FSDP).
    recompute: "none", "selective" (core attention) or "full" (every layer's input only).
    fp32_grads: 4-byte main gradients (megatron's default under bf16) instead of 2.
    micro_batches_in_flight: micro-batches the first pipeline stage holds; None: PP (1F1B).
    """

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 1
    recompute: str = "selective"
    fp32_grads: bool = True
    micro_batches_in_flight: int | None = None

    def __post_init__(self) -> None:
        _whole("tensor_parallel", self.tensor_parallel)
        _whole("pipeline_parallel", self.pipeline_parallel)
        for name in ("sequence_parallel", "fp32_grads"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise ConfigError(
                f"zero_stage={self.zero_stage!r} is not one of {ZERO_STAGES} (0: none, 1: "
                "optimizer states, 2: and gradients, 3: and weights / FSDP)"
            )
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"recompute={self.recompute!r} is not one of {RECOMPUTE}")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ConfigError(
                "sequence_parallel=True needs tensor_parallel > 1 (it splits activations over "
                "the TP ranks); give tensor_parallel or drop sequence_parallel"
            )
        if self.micro_batches_in_flight is not None:
            _whole("micro_batches_in_flight", self.micro_batches_in_flight)

    @property
    def devices(self) -> int:
        """Devices per replica: TP × PP."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def pad_unit(self) -> int:
        """TP under sequence parallel, else 1 (`fcp_data.layout.pad_unit`)."""
        return self.tensor_parallel if self.sequence_parallel else 1

    @property
    def in_flight(self) -> int:
        return (
            self.pipeline_parallel
            if self.micro_batches_in_flight is None
            else self.micro_batches_in_flight
        )

    def describe(self) -> str:
        """`TP=8 PP=1 SP ZeRO-1 recompute=selective`."""
        sp = " SP" if self.sequence_parallel else ""
        return (
            f"TP={self.tensor_parallel} PP={self.pipeline_parallel}{sp} ZeRO-{self.zero_stage} "
            f"recompute={self.recompute}"
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class MemoryBudget:
    """The derivation of `tokens_per_replica` for one layout (bytes per device).

    `stage` names the pipeline stage that binds ("only" when PP = 1, else "first" or "last");
    the byte fields are that stage's, `micro_batches` the micro-batches it holds in flight.
    `activation_bytes_per_token` is everything one token of a micro-batch costs on that device
    (its layers × micro-batches in flight, the LM head and logits where they live);
    `layer_bytes_per_token` is one layer of one micro-batch without recompute.
    """

    model: str
    layout: ParallelLayout
    num_replicas: int
    device_memory_bytes: float
    reserve_bytes: float
    stage: str
    layers_per_device: int
    micro_batches: int
    params_per_device: float
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    gathered_bytes: float
    layer_bytes_per_token: float
    logits_bytes_per_token: float
    activation_bytes_per_token: float
    tokens_per_replica: int

    @property
    def model_state_bytes(self) -> float:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes + self.gathered_bytes

    @property
    def usable_bytes(self) -> float:
        return self.device_memory_bytes - self.reserve_bytes

    @property
    def activation_bytes(self) -> float:
        """Bytes the derived tokens take: tokens_per_replica × activation_bytes_per_token."""
        return self.tokens_per_replica * self.activation_bytes_per_token

    def summary(self) -> str:
        """Two lines: the layout and model states, then activations and the derived tokens."""
        gb = 1e9
        states = (
            f"weights {self.weight_bytes / gb:.1f} + grads {self.grad_bytes / gb:.1f} + "
            f"Adam {self.optimizer_bytes / gb:.1f}"
        )
        if self.gathered_bytes:
            states += f" + gathered {self.gathered_bytes / gb:.1f}"
        where = "" if self.stage == "only" else f", {self.stage} pipeline stage"
        logits = (
            f", logits {self.logits_bytes_per_token / 1e3:.0f} KB"
            if self.logits_bytes_per_token
            else ""
        )
        return (
            f"memory: {self.model} {self.layout.describe()} over {self.num_replicas} replicas "
            f"on {self.device_memory_bytes / gb:.1f} GB (reserve {self.reserve_bytes / gb:.1f}): "
            f"model states {self.model_state_bytes / gb:.1f} GB/device ({states}{where})\n"
            f"memory: activations {self.activation_bytes_per_token / 1e6:.3f} MB/token "
            f"({self.layers_per_device} layers x {self.micro_batches} micro-batch(es){logits}) "
            f"-> tokens_per_replica={self.tokens_per_replica}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field (the layout as a dict) and the derived totals, for JSON reports."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layout"] = asdict(self.layout)
        out["model_state_bytes"] = self.model_state_bytes
        out["usable_bytes"] = self.usable_bytes
        return out


def _model(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    key = str(model).lower()
    if key not in MODELS:
        raise ConfigError(f"model {model!r} is not a preset; known: {', '.join(sorted(MODELS))}")
    return MODELS[key]


def _reserve_bytes(reserve: float, memory: float) -> float:
    ok = isinstance(reserve, (int, float)) and not isinstance(reserve, bool)
    if not ok or not math.isfinite(reserve) or reserve < 0:
        raise ConfigError(
            f"reserve={reserve!r} must be a fraction in [0, 1) of device memory (0.1 = 10%) or "
            "a number of bytes >= 1 (8e9)"
        )
    out = reserve * memory if reserve < 1 else float(reserve)
    if out >= memory:
        raise ConfigError(
            f"reserve={reserve!r} keeps back {out:.3g} B of the device's {memory:.3g} B: "
            "nothing is left; give a smaller reserve"
        )
    return out


def _layer_bytes(m: ModelSpec, layout: ParallelLayout) -> tuple[float, float]:
    """(replicated, TP-split) activation bytes of one layer per token, before any division."""
    h, hd = m.hidden, m.dim_head
    q_dim, kv_dim = m.heads * hd, m.kv_heads * hd
    replicated = 4 * ACTIVATION_BYTES * h  # 2 norm inputs, QKV input, first MLP input
    split = (
        2 * ACTIVATION_BYTES * q_dim  # Q, attention output (= output projection input)
        + 2 * ACTIVATION_BYTES * kv_dim  # K, V
        + LSE_BYTES * m.heads  # fp32 log-sum-exp
        + 3 * ACTIVATION_BYTES * m.ffn  # gate and up outputs, SwiGLU output (down-proj input)
    )
    if m.qk_norm:  # the per-head RMSNorm of Q and K keeps its inputs: Q and K before the norm
        split += ACTIVATION_BYTES * (q_dim + kv_dim)
    return float(replicated), float(split)


def _stage(
    m: ModelSpec,
    layout: ParallelLayout,
    num_replicas: int,
    *,
    embedding: bool,
    head: bool,
    in_flight: int,
) -> tuple[float, float, float, float, float, float, float]:
    """(params, weights, grads, Adam, gathered, layer bytes/token, activation bytes/token) of
    one device of a stage holding the embedding and / or the LM head."""
    tp = layout.tensor_parallel
    sp_div = tp if layout.sequence_parallel else 1
    hd = m.dim_head
    layer_params = m.hidden * hd * (2 * m.heads + 2 * m.kv_heads) + 3 * m.hidden * m.ffn
    layers = m.layers // layout.pipeline_parallel
    params = layers * layer_params + (embedding + head) * m.vocab * m.hidden
    if embedding and m.vision is not None:
        v = m.vision
        params += v.layers * (4 * v.hidden * v.hidden + 2 * v.hidden * v.ffn)
    params /= tp
    grad_b = GRAD_BYTES_FP32 if layout.fp32_grads else GRAD_BYTES_BF16
    n = num_replicas
    z = layout.zero_stage
    weights = WEIGHT_BYTES * params / (n if z >= 3 else 1)
    grads = grad_b * params / (n if z >= 2 else 1)
    adam = ADAM_BYTES * params / (n if z >= 1 else 1)
    gathered = 0.0
    if z >= 3 and n > 1:
        gathered = ZERO3_LAYERS_IN_FLIGHT * layer_params / tp * (WEIGHT_BYTES + grad_b)
    replicated, split = _layer_bytes(m, layout)
    layer = replicated / sp_div + split / tp
    if layout.recompute == "full":
        kept = layers * in_flight * ACTIVATION_BYTES * m.hidden / sp_div + layer
    else:  # "none" and "selective" keep the same tensors under flash / ring attention
        kept = layers * in_flight * layer
    logits = 0.0
    if head:
        logits = LOGIT_BYTES * m.vocab / tp
        kept += 2 * ACTIVATION_BYTES * m.hidden / sp_div + logits
    return params, weights, grads, adam, gathered, layer, kept


def derive_tokens_per_replica(
    model: str | ModelSpec,
    layout: ParallelLayout,
    device_memory_bytes: float,
    num_replicas: int,
    reserve: float = DEFAULT_RESERVE,
) -> MemoryBudget:
    """The tokens one replica holds under `layout`, with the breakdown (module docstring).

    `reserve`: a fraction of device memory in [0, 1) or bytes (>= 1) kept back. The token count
    is rounded down to a multiple of 2 × pad unit (shards are multiples of it, so nothing is
    lost). Raises ConfigError when TP does not split the heads, PP does not divide the layers,
    or the model states leave no room for one padded sequence.

    Llama3-70B on H200 at TP = 8 with sequence parallel, ZeRO-1 over 8 replicas: 66.1 GB of
    model states per device, 2.815 MB per token, 21,568 tokens per replica (8,174 without
    sequence parallel); Qwen3-8B at TP = 1, ZeRO-1 over 64: 50.7 GB, 5.569 MB per token,
    13,686 tokens (docs/memory.md).
    """
    m = _model(model)
    if not isinstance(layout, ParallelLayout):
        raise ConfigError(f"layout must be a ParallelLayout, got {type(layout).__name__}")
    n = _whole("num_replicas", num_replicas)
    ok = isinstance(device_memory_bytes, (int, float)) and not isinstance(device_memory_bytes, bool)
    if not ok or not math.isfinite(device_memory_bytes) or device_memory_bytes <= 0:
        raise ConfigError(
            f"device_memory_bytes={device_memory_bytes!r} must be a positive number of bytes "
            "(an H200 has 141e9)"
        )
    check_tensor_parallel(m, layout.tensor_parallel)
    pp = layout.pipeline_parallel
    if m.layers % pp:
        raise ConfigError(
            f"pipeline_parallel={pp} does not divide the {m.layers} layers of {m.name}: "
            f"megatron-core gives every stage the same number of layers; use a divisor of "
            f"{m.layers}"
        )
    memory = float(device_memory_bytes)
    reserve_b = _reserve_bytes(reserve, memory)
    usable = memory - reserve_b
    unit = 2 * layout.pad_unit
    stages = (
        [("only", True, True, layout.in_flight)]
        if pp == 1
        else [("first", True, False, layout.in_flight), ("last", False, True, 1)]
    )
    best: MemoryBudget | None = None
    for name, emb, head, flight in stages:
        params, w, g, a, gath, layer, per_token = _stage(
            m, layout, n, embedding=emb, head=head, in_flight=flight
        )
        states = w + g + a + gath
        free = usable - states
        tokens = int(free // per_token) // unit * unit if free > 0 else 0
        budget = MemoryBudget(
            model=m.name,
            layout=layout,
            num_replicas=n,
            device_memory_bytes=memory,
            reserve_bytes=reserve_b,
            stage=name,
            layers_per_device=m.layers // pp,
            micro_batches=flight,
            params_per_device=params,
            weight_bytes=w,
            grad_bytes=g,
            optimizer_bytes=a,
            gathered_bytes=gath,
            layer_bytes_per_token=layer,
            logits_bytes_per_token=LOGIT_BYTES * m.vocab / layout.tensor_parallel if head else 0.0,
            activation_bytes_per_token=per_token,
            tokens_per_replica=tokens,
        )
        if tokens < unit:
            stage = "" if name == "only" else f" on the {name} pipeline stage"
            raise ConfigError(
                f"{m.name} with {layout.describe()} over {n} replicas leaves no room for one "
                f"sequence: model states take {states:.4g} B per device{stage} of "
                f"{memory:.4g} B memory ({usable:.4g} B after the reserve), and a token needs "
                f"{per_token:.4g} B; raise --tp / --pp, shard more (--zero 1/2/3), recompute "
                "(--recompute full), or use devices with more memory"
            )
        if best is None or tokens < best.tokens_per_replica:
            best = budget
    assert best is not None
    return best


def replicas_per_node(
    devices_per_node: int, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """Replicas per node when each replica is TP × PP devices: 8 GPUs at TP = 8 -> 1, at TP = 2
    -> 4. A replica wider than a node (TP = 8, PP = 2 on 8 GPUs) counts as one per node: every
    ring hop between replicas then crosses nodes. Any other mismatch raises ConfigError."""
    dpn = _whole("devices_per_node", devices_per_node)
    per = _whole("tensor_parallel", tensor_parallel) * _whole(
        "pipeline_parallel", pipeline_parallel
    )
    if dpn % per == 0:
        return dpn // per
    if per % dpn == 0:
        return 1
    raise ConfigError(
        f"a replica of TP x PP = {tensor_parallel} x {pipeline_parallel} = {per} devices does not "
        f"tile nodes of {dpn} devices: TP x PP must divide the devices per node (or be a "
        "multiple of it)"
    )
