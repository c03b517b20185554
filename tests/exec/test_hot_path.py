"""The attention hot path as a GPU runs it, checked on CPU with `meta` tensors and counts.

- the varlen schedule against the definition of attention (hypothesis): every real query row
  sees exactly its real keys once per ring step set, never a padding key, and every segment a
  kernel gets has keys for its rows;
- kernel calls per ring step: one forward and one backward per step for causal packs whatever
  the number of sequences (a counting kernel), and the op count of a layer does not grow with
  the number of sequences;
- no host sync inside a layer: whole forward + backward of ring and hybrid attention, and of a
  tiny transformers model, on `meta` tensors through the CUDA kernel's own calls (a `.item()`,
  `.tolist()` or `.cpu()` of device data raises there); no GQA expansion (no op writes K/V at
  H heads);
- the communication stream's choreography, against a fake stream API.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from fcp_data import layout as contract
from fcp_exec.attention import _RingAttention
from fcp_exec.kernels import AttentionKernel, CpuFlashKernel, Segments, TorchFlashKernel
from fcp_exec.layout import ShardLayout, local_token_index
from fcp_exec.ring import RingComm
from fcp_exec.schedule import Call, build_schedule
from fcp_exec.ulysses import hybrid_attention

# ---------------------------------------------------------------------------------------------
# the schedule against the definition of attention


def _rows(rows: Any, total: int) -> list[int]:
    if rows is None:
        return list(range(total))
    if isinstance(rows, slice):
        return list(range(rows.start, rows.stop))
    return [int(x) for x in rows.tolist()]


def _pairs(call: Call, total: int) -> list[tuple[int, int]]:
    """Every (local q row, held k row) the call computes."""
    qs, ks = _rows(call.q_rows, total), _rows(call.k_rows, total)
    hq, hk = call.seg.host_q, call.seg.host_k
    assert len(qs) == hq[-1] and len(ks) == hk[-1], "rows and offsets disagree"
    out = []
    for i in range(call.seg.count):
        qa, qb, ka, kb = hq[i], hq[i + 1], hk[i], hk[i + 1]
        assert (qb > qa) == (kb > ka), "a segment with queries and no keys (or the reverse)"
        if call.causal:
            assert qb - qa == kb - ka, "a causal segment that is not square"
        for a in range(qa, qb):
            for b in range(ka, kb):
                if not call.causal or b - ka <= a - qa:
                    out.append((qs[a], ks[b]))
    return out


def _global(cu_padded: list[int], degree: int, index: int) -> list[int]:
    return local_token_index(cu_padded, degree, index).tolist()


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(0, 30), min_size=1, max_size=5),
    degree=st.integers(1, 5),
    flags=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_schedule_computes_exactly_attention(lens: list[int], degree: int, flags: list[bool]):
    """Over a member's d steps, each real query row meets each key it attends exactly once, and
    no real row ever meets a padding key (rows of padding may meet anything: they are cleaned)."""
    causal = flags[: len(lens)]
    chunks = contract.num_chunks(degree)
    padded = [max(chunks, -(-n // chunks) * chunks) for n in lens]
    cup = [0]
    for p in padded:
        cup.append(cup[-1] + p)
    seq_of, pos_of = [], []
    for j, p in enumerate(padded):
        seq_of += [j] * p
        pos_of += list(range(p))
    total = cup[-1] // degree
    for me in range(degree):
        sched = build_schedule(lens, padded, causal, degree, me, "cpu")
        mine = _global(cup, degree, me)
        seen: Counter[tuple[int, int]] = Counter()
        for step, calls in enumerate(sched.steps):
            src = (me - step) % degree
            theirs = _global(cup, degree, src)
            for call in calls:
                for a, b in _pairs(call, total):
                    seen[(mine[a], theirs[b])] += 1
        for (gq, gk), count in seen.items():
            j, i, i2 = seq_of[gq], pos_of[gq], pos_of[gk]
            if i >= lens[j]:
                continue  # a padding row
            assert seq_of[gk] == j, "a real row attends another sequence"
            assert i2 < lens[j], "a real row attends a padding key"
            assert not causal[j] or i2 <= i, "a causal row attends a later key"
            assert count == 1, "a pair computed twice"
        want = {
            (mine[a], g)
            for a in range(total)
            for g in range(cup[-1])
            if seq_of[g] == seq_of[mine[a]]
            and pos_of[mine[a]] < lens[seq_of[g]]
            and pos_of[g] < lens[seq_of[g]]
            and (not causal[seq_of[g]] or pos_of[g] <= pos_of[mine[a]])
        }
        assert want <= set(seen), "a real pair never computed"
        if all(causal):
            assert sched.calls_per_step == (1,) * degree  # one call per step, any pack


# ---------------------------------------------------------------------------------------------
# counting: kernel calls per step and ops per layer


class _Counting:
    """Wraps a kernel: counts calls and checks K/V arrive with H_kv heads (no expansion)."""

    def __init__(self, inner: AttentionKernel, kv_heads: int) -> None:
        self.inner, self.kv_heads = inner, kv_heads
        self.name = f"counting-{inner.name}"
        self.calls: Counter[str] = Counter()

    def check(self, **kw: Any) -> None:
        self.inner.check(**kw)

    def forward(self, q, k, v, seg, *, causal, scale):  # type: ignore[no-untyped-def]
        assert k.shape[1] == self.kv_heads and v.shape[1] == self.kv_heads
        self.calls["fwd"] += 1
        return self.inner.forward(q, k, v, seg, causal=causal, scale=scale)

    def backward(self, dout, q, k, v, out, lse, seg, *, causal, scale):  # type: ignore[no-untyped-def]
        assert k.shape[1] == self.kv_heads
        self.calls["bwd"] += 1
        return self.inner.backward(dout, q, k, v, out, lse, seg, causal=causal, scale=scale)


class _LoopComm:
    """A ring of `size` whose transfers deliver a fresh buffer at once (meta tensors carry
    no data): the schedule of member `index` runs all its steps in one process."""

    def __init__(self, size: int, index: int) -> None:
        self.size, self.index = size, index
        self.exchanges = 0

    def exchange(self, send: torch.Tensor, *, tag: int, recv: Any = None) -> torch.Tensor:
        self.exchanges += 1
        return torch.empty_like(send)

    def wait(self, tag: int) -> None:
        pass


class _OpCounter(TorchDispatchMode):
    """Counts aten ops that launch work (not views); fails on anything that would read device
    data back to the host."""

    FORBIDDEN = ("_local_scalar_dense", "item", "nonzero")

    def __init__(self, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.heads, self.kv_heads = heads, kv_heads
        self.expanded = 0  # bytes written by materialised broadcasts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        assert name not in self.FORBIDDEN, f"host sync: aten.{name}"
        if name in ("_to_copy", "copy_"):
            dev = (kwargs or {}).get("device")
            assert dev is None or torch.device(dev).type != "cpu", "a device tensor copied out"
        out = func(*args, **(kwargs or {}))
        ret = func._schema.returns
        if ret and ret[0].alias_info is not None and not ret[0].alias_info.is_write:
            return out  # views launch nothing: counted are the ops that do
        self.ops[name] += 1
        # materialising a broadcast (an input with a stride-0 dim of size > 1) is how a GQA
        # expansion (repeat_interleave, expand + contiguous) reaches the dispatcher
        if any(
            isinstance(a, torch.Tensor)
            and any(st == 0 and sz > 1 for st, sz in zip(a.stride(), a.shape))
            for a in args
        ):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.expanded += sum(t.numel() * t.element_size() for t in outs
                                 if isinstance(t, torch.Tensor))  # fmt: skip
        return out


def _layer(
    lens: list[int], degree: int, index: int, *, heads: int = 32, kv_heads: int = 8,
    dim: int = 128,
) -> tuple[Counter[str], _Counting, Counter[str]]:  # fmt: skip
    """One layer's attention fwd + bwd of member `index` on meta tensors (Llama-3-8B shapes)."""
    chunks = contract.num_chunks(degree)
    padded = [-(-n // chunks) * chunks for n in lens]
    cup = [0]
    for p in padded:
        cup.append(cup[-1] + p)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    layout = ShardLayout.build(cu, cup, degree, True)
    sched = layout.schedule(index, "meta")
    t = layout.num_local_tokens
    opts = {"device": "meta", "dtype": torch.bfloat16, "requires_grad": True}
    q = torch.empty(t, heads, dim, **opts)
    k, v = (torch.empty(t, kv_heads, dim, **opts) for _ in range(2))
    kern = _Counting(TorchFlashKernel(), kv_heads)
    comm = _LoopComm(degree, index)
    with _OpCounter(heads, kv_heads) as counter:
        out = _RingAttention.apply(q, k, v, sched, comm, kern, 1 / math.sqrt(dim))
        out.backward(torch.empty_like(out))
    assert q.grad is not None and k.grad is not None and k.grad.shape == k.shape
    assert counter.expanded == 0, f"{counter.expanded} bytes of expanded K/V"
    return counter.ops, kern, Counter({"steps": degree})


A = [410] * 39 + [16384 - 410 * 39]  # 16K tokens in 40 short sequences, degree 1
B = [8192] * 4  # degree 2
C = [65536]  # degree 8


@pytest.mark.parametrize(
    ("name", "lens", "degree", "indices"),
    [("A", A, 1, [0]), ("B", B, 2, [0, 1]), ("C", C, 8, [0, 3, 7])],
)
def test_one_kernel_call_per_ring_step(name: str, lens: list[int], degree: int,
                                       indices: list[int]) -> None:  # fmt: skip
    for index in indices:
        ops, kern, _ = _layer(lens, degree, index)
        assert kern.calls == Counter({"fwd": degree, "bwd": degree}), (name, index, kern.calls)
        gathers = ops["index_select"]
        # forward: K/V front half (src < me) or Q back half + out/lse (src > me) per step;
        # backward: the same K/V gathers, and the Q side once per distinct call
        assert gathers <= 4 * degree, (name, index, ops)
        if degree == 1:  # the fast path: no accumulator, no merge
            assert set(ops) <= {"_flash_attention_forward", "_flash_attention_backward",
                                "zeros", "empty", "index_fill", "index_fill_", "detach",
                                "_to_copy", "ones_like", "empty_like", "contiguous",
                                "alias", "view"}, ops  # fmt: skip


def test_the_expansion_detector_sees_a_gqa_expansion() -> None:
    """Guard against a vacuous 'no GQA expansion': the counter catches repeat_interleave and
    expand + contiguous, the two ways K/V were expanded."""
    k = torch.empty(64, 8, 128, device="meta", dtype=torch.bfloat16)
    for expand in (lambda x: x.repeat_interleave(4, dim=1),
                   lambda x: x[:, :, None].expand(64, 8, 4, 128).reshape(64, 32, 128)):  # fmt: skip
        with _OpCounter(32, 8) as counter:
            expand(k)
        assert counter.expanded == 64 * 32 * 128 * 2


def test_layer_ops_do_not_grow_with_the_number_of_sequences() -> None:
    """The same tokens as 1, 8 and 40 sequences (no padding at d = 1, 2): 8 and 40 issue the
    same ops; one sequence takes its halves as views where several need index gathers (at most
    four per step: K/V front half, Q back half, and the merge's out/LSE rows). Padding adds
    exactly two (zeroed output rows, +inf LSE rows)."""
    ops: dict[tuple[int, int], int] = {}
    for lens in ([16384], [2048] * 8, [408] * 39 + [472]):
        for degree in (1, 2):
            counted, kern, _ = _layer(lens, degree, degree - 1)
            assert kern.calls["fwd"] == degree
            ops[degree, len(lens)] = sum(counted.values())
    for degree in (1, 2):
        assert ops[degree, 8] == ops[degree, 40], ops
        assert ops[degree, 1] <= ops[degree, 8] <= ops[degree, 1] + 4 * (degree - 1), ops
    padded_ops, _, _ = _layer([407] * 39 + [511], 1, 0)
    assert sum(padded_ops.values()) == ops[1, 40] + 2


# ---------------------------------------------------------------------------------------------
# meta: hybrid attention (all-to-all + ring), and a tiny transformers model


class _LoopA2A:
    """An all-to-all block of u members that hands back a fresh buffer (meta: no data)."""

    def __init__(self, size: int, index: int) -> None:
        self.size, self.index = size, index

    def exchange(self, send: torch.Tensor) -> torch.Tensor:
        assert send.shape[0] == self.size
        return torch.empty_like(send)


@pytest.mark.parametrize("u", [2, 8])  # hybrid 2 x 4; pure Ulysses (a ring of one)
def test_hybrid_attention_on_meta_without_host_sync(u: int) -> None:
    heads, kv_heads, dim, d = 32, 8, 128, 8
    lens = [9000, 3000, 700]
    chunks = contract.num_chunks(d)
    padded = [-(-n // chunks) * chunks for n in lens]
    cu, cup = [0, 9000, 12000, 12700], [0, *torch.tensor(padded).cumsum(0).tolist()]
    layout = ShardLayout.build(cu, cup, d, True)
    t = layout.num_local_tokens
    opts = {"device": "meta", "dtype": torch.bfloat16, "requires_grad": True}
    q = torch.empty(t, heads, dim, **opts)
    k, v = (torch.empty(t, kv_heads, dim, **opts) for _ in range(2))
    kern = _Counting(TorchFlashKernel(), max(kv_heads // u, 1))
    ring = _LoopComm(d // u, 1 % (d // u))
    with _OpCounter(heads, kv_heads) as counter:
        for _ in range(2):  # two layers: the second reuses every index the first built
            out = hybrid_attention(q, k, v, layout=layout, a2a=_LoopA2A(u, 1), ring=ring,  # type: ignore[arg-type]
                                   scale=0.1, kernel=kern)  # fmt: skip
            out.backward(torch.empty_like(out))
    assert out.shape == q.shape and k.grad is not None
    assert kern.calls == Counter({"fwd": 2 * (d // u), "bwd": 2 * (d // u)})
    assert counter.expanded == 0


def test_tiny_transformers_model_on_meta_without_host_sync() -> None:
    """A Qwen3 decoder with attn_implementation="fcp_ring" on meta tensors: the whole forward
    and backward through the CUDA kernel's calls, layout from the micro-batch's host offsets."""
    transformers = pytest.importorskip("transformers")
    from fcp_exec import CPBinding
    from fcp_exec.hf import hf_attention_kwargs, register_attention

    register_attention()
    cfg = transformers.Qwen3Config(
        vocab_size=64, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        attn_implementation="fcp_ring", torch_dtype=torch.bfloat16,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    mb = _micro_batch([37, 101, 6])  # host offsets kept, tensors moved to meta
    binding = CPBinding.of((0,), 0)
    kern = _Counting(TorchFlashKernel(), 2)
    kwargs = hf_attention_kwargs(mb, binding)
    layout = kwargs["fcp_layout"]
    layout.cached(("kernels"), lambda: _Fixed(kern))
    with _OpCounter(4, 2):
        out = model(input_ids=mb.tokens[None], position_ids=mb.position_ids[None], **kwargs)
        out.logits.float().sum().backward()
    assert kern.calls == Counter({"fwd": 2, "bwd": 2})  # one call per layer, 3 sequences


class _Fixed:
    """A KernelChoice that always answers one kernel."""

    def __init__(self, kern: Any) -> None:
        self.kern = kern

    def get(self, *shape: Any) -> Any:
        return self.kern


def _micro_batch(lens: list[int]) -> Any:
    from fcp_data.collate.microbatch import MicroBatch

    padded = [n + n % 2 for n in lens]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    cup = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()], dtype=torch.int32)
    t = int(cup[-1])
    plan = _RankPlan()
    mb = MicroBatch(
        tokens=torch.zeros(t, dtype=torch.long), labels=torch.zeros(t, dtype=torch.long),
        loss_mask=torch.ones(t), position_ids=torch.arange(t), cu_seqlens=cu,
        cu_seqlens_padded=cup, local_cu_seqlens=cu, local_cu_seqlens_padded=cup,
        max_seqlen=max(padded), local_max_seqlen=max(padded), sample_ids=tuple(range(len(lens))),
        keys=tuple(map(str, range(len(lens)))), causal=(True,) * len(lens),
        rank_plan=plan, global_num_loss_tokens=t,  # type: ignore[arg-type]
    )  # fmt: skip
    return mb.to("meta")


class _RankPlan:
    degree = 1
    is_empty = False
    ulysses = 1


# ---------------------------------------------------------------------------------------------
# the communication stream


class _Event:
    def __init__(self, log: list[str], name: str, clock: list[float]) -> None:
        self.log, self.name, self.clock, self.t = log, name, clock, None

    def record(self, stream: Any) -> None:
        self.t = self.clock[0]
        self.log.append(f"record {self.name} on {stream.name}")

    def elapsed_time(self, other: _Event) -> float:
        return (other.t - self.t) * 1e3


class _Stream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _Stream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, event: _Event) -> None:
        self.log.append(f"{self.name} waits for event {event.name}")


class _Api:
    """What RingComm uses of torch.cuda: current_stream, stream(), Event."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.clock = [0.0]
        self.compute = _Stream("compute", self.log)
        self.current = self.compute
        self.names = iter(["posted", "done", "needed"] * 4)

    def current_stream(self, device: Any = None) -> _Stream:
        return self.current

    def stream(self, s: _Stream) -> Any:
        api = self

        class _Ctx:
            def __enter__(self) -> None:
                api.current = s
                api.log.append(f"enter {s.name}")

            def __exit__(self, *a: Any) -> None:
                api.current = api.compute
                api.log.append(f"exit {s.name}")

        return _Ctx()

    def Event(self, enable_timing: bool = False) -> _Event:
        return _Event(self.log, next(self.names), self.clock)


class _Work:
    def __init__(self, api: _Api) -> None:
        self.api = api

    def wait(self) -> None:
        self.api.log.append(f"work.wait on {self.api.current.name}")
        self.api.clock[0] += 0.003  # the transfer takes 3 ms on the comm stream


def test_ring_transfers_run_on_the_comm_stream_without_host_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = _Api()
    comm_stream = _Stream("comm", api.log)
    comm = RingComm([0], stream=comm_stream, stream_api=api, timing=True)  # type: ignore[arg-type]

    def post(send: torch.Tensor, buf: torch.Tensor, tag: int) -> list[_Work]:
        api.log.append(f"post on {api.current.name}")
        return [_Work(api)]

    monkeypatch.setattr(comm, "_post", post)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)
    buf = comm.exchange(torch.zeros(4), tag=17)
    api.clock[0] += 0.001  # the compute stream reaches the wait 1 ms after the transfer ends
    comm.wait(17)
    assert buf.shape == (4,)
    assert api.log == [
        "comm waits for compute",  # the send buffer was written on the compute stream
        "enter comm",
        "record posted on comm",
        "post on comm",
        "work.wait on comm",  # the comm stream, not the host, waits for the transfer
        "record done on comm",
        "exit comm",
        "record needed on compute",
        "compute waits for event done",  # the compute stream waits on the device
    ]
    ov = comm.overlap()
    assert ov.transfers == 1 and ov.transfer_s == pytest.approx(0.003)
    assert ov.exposed_s == 0.0 and ov.hidden_share == 1.0


def test_cpu_kernel_d1_fast_path_equals_reference() -> None:
    """The d = 1 fast path (one causal call, no accumulator) keeps padding rows at 0."""
    from fcp_exec import ring_attention

    g = torch.Generator().manual_seed(0)
    lens, padded = [5, 12, 1], [6, 12, 2]
    cu, cup = [0, 5, 17, 18], [0, 6, 18, 20]
    q, do = (torch.randn(20, 4, 8, generator=g) for _ in range(2))
    k, v = (torch.randn(20, 2, 8, generator=g) for _ in range(2))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = ring_attention(q, k, v, cu, cup, ring=[0], kernel=CpuFlashKernel())
    out.backward(do)
    for a, n in zip(cup[:-1], lens):
        seg = Segments.of([0, n], [0, n])
        want, _ = CpuFlashKernel().forward(q[a : a + n].detach(), k[a : a + n].detach(),
                                          v[a : a + n].detach(), seg, causal=True,
                                          scale=8**-0.5)  # fmt: skip
        torch.testing.assert_close(out[a : a + n], want)
    pads = [5, 19]
    assert (out[pads] == 0).all() and (q.grad[pads] == 0).all() and (k.grad[pads] == 0).all()
    assert padded == [cup[i + 1] - cup[i] for i in range(len(lens))]


# ---------------------------------------------------------------------------------------------
# bad input: refused before the first step, by name


def test_settings_no_kernel_computes_are_refused_by_name() -> None:
    """A sliding window, logit soft-capping or attention sinks would be silently ignored by an
    exact full-attention kernel: the transformers hook refuses each by name."""
    from fcp_data.errors import ConfigError
    from fcp_exec import CPBinding
    from fcp_exec.hf import fcp_ring_attention_forward

    q = torch.zeros(1, 4, 6, 8)
    kv = torch.zeros(1, 2, 6, 8)
    base = {"fcp_binding": CPBinding.of((0,), 0), "cu_seq_lens_q": torch.tensor([0, 6]),
            "fcp_cu_seqlens_padded": torch.tensor([0, 6])}  # fmt: skip
    out, _ = fcp_ring_attention_forward(None, q, kv, kv, None, **base)  # type: ignore[arg-type]
    assert out.shape == (1, 6, 4, 8)
    for name, value in (("sliding_window", 4096), ("softcap", 50.0), ("s_aux", torch.zeros(4))):
        with pytest.raises(ConfigError, match=f"{name}=.*sliding_window=None"):
            fcp_ring_attention_forward(None, q, kv, kv, None, **base, **{name: value})  # type: ignore[arg-type]


def test_a_kernel_that_cannot_run_the_blocks_is_refused_before_any_step() -> None:
    """fp32 blocks given to a bf16-only kernel: KernelUnsupportedError naming the kernel and
    the alternative, raised before the ring exchanges anything."""
    from fcp_exec import ring_attention
    from fcp_exec.kernels import KernelUnsupportedError

    q = torch.empty(8, 4, 8, device="meta")
    k = torch.empty(8, 2, 8, device="meta")
    with pytest.raises(KernelUnsupportedError, match=r"'torch-flash' runs fp16/bf16.*TorchMath"):
        ring_attention(q, k, k, [0, 8], [0, 8], ring=[0], kernel=TorchFlashKernel())


def test_megatron_gpt_model_on_meta_without_host_sync() -> None:
    """megatron-core's GPTModel with FCPCoreAttention, forward and backward on `meta` (one
    gloo process for megatron's parallel state)."""
    pytest.importorskip("megatron.core")
    from ._dist import run_distributed
    from ._megatron_meta_job import megatron_meta_worker

    run_distributed(megatron_meta_worker, 1, timeout=240)


def test_megatron_sliding_window_is_refused_by_name() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp_exec.megatron import FCPCoreAttention

    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                            window_size=(128, 0), attention_dropout=0.0)  # fmt: skip
    with pytest.raises(ValueError, match=r"window_size=\(128, 0\).*window_size=None"):
        FCPCoreAttention(cfg, 1, AttnMaskType.causal, "self")
