"""Fuzz targets: every parser fcp owns, fed generated and mutated input, one oracle each.

A target is a hypothesis strategy for one input (bytes, or a JSON-able value, so that a found
case can be stored in `corpus/` and replayed) and a `check(value, workdir)` that runs the
parser the way a user's data reaches it and raises `Finding` when the contract breaks:

* the only exceptions allowed out are fcp's own (`FCPError`), plus the documented per-sample
  `ValueError` where the caller turns it into a counted skip (the chat and .npy rules);
* nothing is lost silently: a tar or JSON Lines sample of the unharmed input is returned, or
  named in a skip, or lies in a reported damaged region;
* nothing hangs: each check runs under an alarm (`guard`), a hang is a Finding too.

Inputs are built from valid documents (a webdataset tar, a megatron .idx, a real length index,
a saved plan, a loader's resume state) and then mutated byte- or field-wise: blind random
bytes would rarely get past the first magic number.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import shutil
import signal
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from fcp_data.errors import FCPError

__all__ = ["TARGETS", "Finding", "Target", "guard"]

HANG_S = 20.0  # seconds one check may take before it counts as a hang


class Finding(AssertionError):
    """The parser broke its contract on this input."""


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any, Path], None]
    kind: str  # "bytes" or "json": how a found input is stored in corpus/
    what: str  # the parser, in words


@contextlib.contextmanager
def guard(seconds: float = HANG_S) -> Iterator[None]:
    """Raise Finding in the main thread when the block runs past `seconds` (a hang)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hang(_sig: int, _frame: Any) -> None:
        raise Finding(f"hang: still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _allowed(fn: Callable[[], Any], *also: type[BaseException]) -> Any:
    """fn(); an exception that is neither an FCPError nor in `also` is a Finding."""
    try:
        return fn()
    except FCPError:
        return None
    except Finding:
        raise
    except also:
        return None
    except Exception as exc:  # the finding: a raw error escaping a parser
        raise Finding(f"{type(exc).__name__}: {exc}") from exc


# ---- mutations -----------------------------------------------------------------------------
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "zero", "cut", "garbage", "dup"]),
        st.integers(0, 1 << 20),
        st.integers(0, 255),
    ),
    max_size=4,
)


def mutate(data: bytes, ops: list[list[int] | tuple[Any, ...]]) -> bytes:
    """`data` with each op applied: flip a byte, zero a 512-byte block, cut, insert garbage,
    duplicate a block (positions taken modulo the current length)."""
    out = bytearray(data)
    for kind, pos, value in ops:
        if not out:
            break
        at = int(pos) % len(out)
        if kind == "flip":
            out[at] ^= int(value) or 1
        elif kind == "zero":
            start = at - at % 512
            out[start : start + 512] = bytes(len(out[start : start + 512]))
        elif kind == "cut":
            del out[at:]
        elif kind == "garbage":
            out[at:at] = bytes((int(value) * 7 + k * 13) % 256 for k in range(int(value) + 1))
        elif kind == "dup":
            start = at - at % 512
            out[start:start] = out[start : start + 512]
    return bytes(out)


# ---- tar headers and resync ----------------------------------------------------------------
_KEY = st.text("abcdefghij0123456789_-", min_size=1, max_size=12)
_EXT = st.sampled_from(["txt", "json", "cls", "npy", "txt.gz", "a.b"])
_SAMPLE = st.tuples(_KEY, st.dictionaries(_EXT, st.binary(max_size=700), min_size=1, max_size=3))
TAR_INPUT = st.fixed_dictionaries(
    {
        "samples": st.lists(_SAMPLE, min_size=1, max_size=6, unique_by=lambda s: s[0]),
        "format": st.sampled_from(["ustar", "pax", "gnu"]),
        "ops": _OPS,
    }
)


def _tar_bytes(value: dict[str, Any]) -> bytes:
    fmt = {"ustar": tarfile.USTAR_FORMAT, "pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt[value["format"]]) as t:
        for key, members in value["samples"]:
            for ext, data in sorted(members.items()):
                raw = bytes(data) if isinstance(data, (bytes, bytearray)) else bytes.fromhex(data)
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(raw)
                t.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def _jsonable_tar(value: dict[str, Any]) -> dict[str, Any]:
    """The tar input with member bytes as hex: what corpus/ stores."""
    return {
        **value,
        "samples": [
            [k, {e: (d.hex() if isinstance(d, (bytes, bytearray)) else d) for e, d in m.items()}]
            for k, m in value["samples"]
        ],
        "ops": [list(op) for op in value["ops"]],
    }


def _check_tar(value: dict[str, Any], work: Path) -> None:
    from fcp_data.readers.shards import BadMember, RawSample, iter_raw_samples

    intact = _tar_bytes(value)
    data = mutate(intact, value["ops"])
    path = work / "fuzz.tar"
    path.write_bytes(data)

    def walk() -> list[Any]:
        return list(iter_raw_samples(str(path), lambda _e: True, timeout_s=5.0))

    out = _allowed(walk)
    if out is None or any(op[0] in ("garbage", "dup") for op in value["ops"]):
        return  # inserted bytes move every offset after them: only the no-crash oracle holds
    if not any(data):
        return  # all zeros is an empty archive: no reader can tell what was there
    got = {r.key for r in out if isinstance(r, RawSample)}
    named = {r.key for r in out if isinstance(r, BadMember)}
    regions = []
    for r in out:
        if isinstance(r, BadMember) and r.key.startswith("(bytes "):
            a, b = r.key[7:-1].split("..")
            regions.append((int(a), float("inf") if b == "end" else int(b)))
    with tarfile.open(fileobj=io.BytesIO(intact)) as tf:
        heads = [(m.name, m.offset, m.size) for m in tf.getmembers()]
    want = {k for k, _ in value["samples"]}

    def zero_run(off: int) -> int:
        """Bytes of the run of zero blocks around the block at `off`."""
        a = b = off - off % 512
        while a >= 512 and not any(data[a - 512 : a]):
            a -= 512
        while b < len(data) and not any(data[b : b + 512]):
            b += 512
        return b - a

    def invisible(k: str) -> bool:
        """Every byte of `k` (headers and data) is zero now, inside a zero run of two blocks
        or more: what concatenated archives leave between them (read through by design),
        so such a sample cannot be told from nothing (one zero block alone is damage)."""
        mine = [(off, size) for n, off, size in heads if n.startswith(k + ".")]
        return all(
            not any(data[off : off + 512 + size]) and zero_run(off) >= 1024 for off, size in mine
        )

    lost = [
        k
        for k in want - got - named
        if not invisible(k)
        and not all(
            any(a <= off < b for a, b in regions) for n, off, _ in heads if n.startswith(k + ".")
        )
    ]
    renamed = got - want  # a flipped byte in a name (pax data has no checksum) moves a sample
    if len(lost) > len(renamed):
        raise Finding(f"samples lost without a record: {lost} (regions {regions})")


# ---- JSON Lines lines ----------------------------------------------------------------------
_LINE = st.one_of(
    st.builds(lambda t: json.dumps({"text": t}), st.text(max_size=40)),
    st.builds(json.dumps, st.recursive(st.none() | st.integers() | st.text(max_size=8),
                                       lambda c: st.lists(c, max_size=3)
                                       | st.dictionaries(st.text(max_size=5), c, max_size=3),
                                       max_leaves=6)),
    st.text(max_size=30),
    st.just(""),
    st.just("[" * 3000),
)  # fmt: skip
JSONL_INPUT = st.fixed_dictionaries(
    {
        "lines": st.lists(_LINE, max_size=8),
        "format": st.sampled_from(["jsonl", "jsonl.gz", "jsonl.zst"]),
        "end": st.sampled_from(["\n", "", "\r\n"]),
        "ops": _OPS,
    }
)


def _check_jsonl(value: dict[str, Any], work: Path) -> None:
    from fcp_data.readers.scan import ScanConfig, Scanner

    raw = (value["end"].join(value["lines"]) + value["end"]).encode("utf-8", "surrogatepass")
    fmt = value["format"]
    packed = raw
    if fmt == "jsonl.gz":
        packed = gzip.compress(raw)
    elif fmt == "jsonl.zst":
        try:
            import zstandard
        except ImportError:
            return
        packed = zstandard.ZstdCompressor().compress(raw)
    data = mutate(packed, value["ops"])
    path = work / f"fuzz.{fmt}"
    path.write_bytes(data)
    config = ScanConfig(stream_max_bytes=1 << 20, on_error="skip", max_consecutive_failures=1 << 20)

    def scan() -> tuple[list[Any], list[Any]]:
        with Scanner(config) as scanner:
            return list(scanner.scan(str(path))), list(scanner.log.skipped)

    out = _allowed(scan)
    if out is None or value["ops"]:
        return
    records, skipped = out  # unharmed input: every non-blank line is a record or a named skip
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    seen = {r.key for r in records} | {s.key for s in skipped}
    for n, line in enumerate(lines, start=1):
        if line.strip() and f"line {n}" not in seen:
            raise Finding(f"line {n} ({line[:40]!r}) is neither a record nor a skip")


# ---- the megatron .idx reader --------------------------------------------------------------
IDX_INPUT = st.fixed_dictionaries(
    {
        "docs": st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=4),
        "code": st.sampled_from([1, 2, 3, 4, 5, 8]),
        "ops": _OPS,
    }
)


def _idx_bytes(value: dict[str, Any]) -> tuple[bytes, int]:
    """A version-1 .idx of documents made of sequences (lengths), and its .bin's size."""
    from fcp_data.readers.sources.megatron import DTYPES, HEAD, MAGIC

    lengths = [n for doc in value["docs"] for n in doc]
    item = np.dtype(DTYPES[value["code"]]).itemsize
    bounds = [0]
    for doc in value["docs"]:
        bounds.append(bounds[-1] + len(doc))
    pointers = np.concatenate([[0], np.cumsum(lengths)])[:-1] * item if lengths else []
    body = (
        HEAD.pack(MAGIC, 1, value["code"], len(lengths), len(bounds))
        + np.asarray(lengths, "<i4").tobytes()
        + np.asarray(pointers, "<i8").tobytes()
        + np.asarray(bounds, "<i8").tobytes()
    )
    return body, int(sum(lengths)) * item


def _check_idx(value: dict[str, Any], work: Path) -> None:
    from fcp_data.readers.sources.megatron import read_idx

    body, bin_size = _idx_bytes(value)
    data = mutate(body, value["ops"])

    def parse() -> None:
        index = read_idx(data, "fuzz.idx")
        spans = list(index.spans())
        index.check_bin(bin_size, "fuzz.bin")
        if any(
            n < 0 or off < 0 or off + n * index.dtype.itemsize > bin_size for _, off, n in spans
        ):
            raise Finding(f"an accepted .idx addresses bytes outside its .bin: {spans}")

    _allowed(parse)


# ---- a real length index: its header and its arrays ----------------------------------------
def _template(work: Path) -> Path:
    """A small real index (and its shard) under `work`, built once per work folder."""
    from fcp_data.readers import build_index

    root = work / "template"
    if (root / "idx" / "header.json").is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with tarfile.open(root / "s.tar", "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(5):
            for ext, data in (("txt", b"words " * (i + 3)), ("cls", b"%d" % i)):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    build_index(str(root / "s.tar"), root / "idx")
    return root


def _json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _json_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _json_paths(v, (*prefix, i))
    return out


_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 64), 1 << 64), st.floats(allow_nan=False),
    st.text(max_size=12), st.just("../../etc/passwd"), st.just("pipe:touch PWNED"),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                              max_size=2),
)  # fmt: skip
_EDITS = st.lists(
    st.tuples(st.integers(0, 1 << 16), st.sampled_from(["set", "drop"]), _VALUE), max_size=3
)


def edit_json(doc: Any, edits: list[Any]) -> Any:
    """`doc` with each edit applied at a path chosen by index among all its paths."""
    doc = json.loads(json.dumps(doc))
    for pick, kind, value in edits:
        paths = [p for p in _json_paths(doc) if p]
        if not paths:
            break
        path = paths[int(pick) % len(paths)]
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if kind == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return doc


HEADER_INPUT = st.fixed_dictionaries({"edits": _EDITS, "ops": _OPS, "raw": st.booleans()})


def _fresh_index(work: Path) -> Path:
    root = _template(work)
    dst = work / "idx"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(root / "idx", dst)
    return dst


def _open_and_read(path: Path) -> None:
    from fcp_data.readers import LengthIndex

    index = LengthIndex.open(path)
    for i in range(len(index)):
        index.read(i)


def _check_header(value: dict[str, Any], work: Path) -> None:
    idx = _fresh_index(work)
    head = idx / "header.json"
    doc = json.loads(head.read_text())
    text = json.dumps(edit_json(doc, value["edits"])).encode()
    head.write_bytes(mutate(text, value["ops"]) if value["raw"] else text)
    _allowed(lambda: _open_and_read(idx))


ARRAYS = (
    "seqlens", "text_tokens", "keys", "shard", "member_start", "member_count", "member_ext",
    "member_offset", "member_size", "member_crc32", "modality", "causal",
)  # fmt: skip
ARRAY_INPUT = st.fixed_dictionaries({"array": st.sampled_from(ARRAYS), "ops": _OPS})


def _check_arrays(value: dict[str, Any], work: Path) -> None:
    idx = _fresh_index(work)
    path = idx / f"{value['array']}.npy"
    path.write_bytes(mutate(path.read_bytes(), value["ops"]))
    _allowed(lambda: _open_and_read(idx))


# ---- resume states -------------------------------------------------------------------------
STATE_INPUT = st.fixed_dictionaries(
    {
        "edits": st.lists(
            st.tuples(st.integers(0, 64), st.sampled_from(["set", "drop", "add"]), _VALUE),
            max_size=3,
        )
    }
)


@functools.lru_cache(maxsize=2)
def _resume_loader(work: str) -> tuple[Any, dict[str, Any]]:
    """A loader over the template index, and its state before any batch (where each input
    starts: the loader is built once, its position reset)."""
    from fcp_data.loader import FCPDataLoader
    from fcp_data.planner import Cluster, CostModel

    root = _template(Path(work))

    def tokenize(text: str) -> list[int]:
        return [1] * max(1, -(-len(text.encode()) // 4))

    tokenize.spec = "bytes:4"  # type: ignore[attr-defined]
    ld = FCPDataLoader(
        str(root / "idx"),
        cluster=Cluster(2, tokens_per_replica=64),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=0,
        global_batch_size=2,
        num_workers=0,
        tokenizer=tokenize,
    )
    return ld, dict(ld.state_dict())


def _check_state(value: dict[str, Any], work: Path) -> None:
    import warnings

    ld, start = _resume_loader(str(work))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld.load_state_dict(start)  # every input starts from the same state
    state: dict[str, Any] = dict(ld.state_dict())
    keys = sorted(state)
    for pick, kind, v in value["edits"]:
        key = keys[int(pick) % len(keys)]
        if kind == "drop":
            state.pop(key, None)
        elif kind == "add":
            state[f"x{pick}"] = v
        else:
            state[key] = v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _allowed(lambda: ld.load_state_dict(state))
        mine = dict(ld.state_dict())
        try:  # whatever was accepted, the loader's own state must load back
            ld.load_state_dict(mine)
        except FCPError as exc:
            raise Finding(f"the loader refuses its own state {mine} after {state}: {exc}") from exc


# ---- plan files ----------------------------------------------------------------------------
PLAN_INPUT = st.fixed_dictionaries(
    {"lengths": st.lists(st.integers(1, 300), min_size=1, max_size=6), "edits": _EDITS}
)


def _check_plan(value: dict[str, Any], work: Path) -> None:
    from fcp_data.planner import Cluster, CostModel, plan_global_batch
    from fcp_data.viewer.saved import plan_document, read_saved_plan

    cluster = Cluster(4, tokens_per_replica=256)
    cost = CostModel.from_model("qwen3-1.7b", "cpu")
    plan = plan_global_batch(np.asarray(value["lengths"]), cluster, cost, on_too_long="drop")
    doc = edit_json(json.loads(plan_document(plan, cost, cluster)), value["edits"])

    def load() -> None:
        saved = read_saved_plan(json.dumps(doc), "fuzz.json")
        p = saved.plan
        for w in range(p.num_waves):  # what the loader and the viewer ask of every replica
            for r in range(p.num_replicas):
                p.for_replica(r, w)

    _allowed(load)


# ---- CLI flags -----------------------------------------------------------------------------
_FLAG_VALUE = st.one_of(
    st.integers(-(1 << 70), 1 << 70).map(str), st.floats().map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "", " 5", "0x10", "٣", "1_000", "5" * 5000,
                     "--", "-1", "0", "True"]),
    st.text(max_size=6),
)  # fmt: skip
_INDEX_FLAGS = [
    "--text-special-tokens", "--max-consecutive-failures", "--probe-timeout",
    "--stream-timeout", "--stream-max-bytes", "--workers", "--text-field", "--rule-option",
    "--vision-rule", "--tokenizer",
]  # fmt: skip
_PLAN_FLAGS = [
    "--batch", "--replicas", "--tokens-per-replica", "--seed", "--batch-index", "--tp", "--pp",
    "--devices-per-node", "--memory-reserve", "--replicas-per-node", "--zero",
]  # fmt: skip
CLI_INPUT = st.fixed_dictionaries(
    {
        "command": st.sampled_from(["index", "plan", "simulate", "view"]),
        "flags": st.lists(st.tuples(st.integers(0, 63), _FLAG_VALUE), max_size=3),
    }
)


def _check_cli(value: dict[str, Any], work: Path) -> None:
    from fcp.cli import build_parser, main

    cmd = value["command"]
    names = _INDEX_FLAGS if cmd == "index" else _PLAN_FLAGS
    flags = [x for pick, v in value["flags"] for x in (names[pick % len(names)], f"={v}")]
    flags = [a + b for a, b in zip(flags[::2], flags[1::2])]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if cmd == "index":  # runs up to the shard expansion (a missing shard: exit 2)
                code = main(["index", str(work / "missing.tar"), "-o", str(work / "o"), *flags])
            else:  # parsing only: running a planning command is the planner's own test
                build_parser().parse_args([cmd, "--distribution", "github", *flags])
                code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:
            raise Finding(f"fcp {cmd} {flags}: {type(exc).__name__}: {exc}") from exc
    lines = [x for x in err.getvalue().splitlines() if x.strip()]
    if code not in (0, 2) or (code == 2 and len(lines) != 1):
        raise Finding(f"fcp {cmd} {flags}: exit {code}, stderr {lines[:4]}")


# ---- chat samples --------------------------------------------------------------------------
_TURN = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "gpt", "", 3, None])},
        optional={
            "content": st.one_of(st.text(max_size=20), st.integers(), st.none(),
                                 st.lists(st.text(max_size=3), max_size=2),
                                 st.just("<image> here")),
            "from": st.sampled_from(["human", "gpt", 7]),
            "value": st.text(max_size=8),
        },
    ),
    st.integers(), st.text(max_size=4), st.none(), st.lists(st.integers(), max_size=2),
)  # fmt: skip
CHAT_INPUT = st.fixed_dictionaries({"turns": st.lists(_TURN, max_size=4)})


def _check_chat(value: dict[str, Any], work: Path) -> None:
    from fcp_data.loader.encode import SampleEncoder
    from fcp_data.readers.scan import ScanConfig, Scanner
    from fcp_data.readers.shards import RawSample

    payload = json.dumps({"messages": value["turns"]}).encode()
    raw = RawSample(key="k", members={"json": (0, len(payload))}, payload={"json": payload})
    scanner = Scanner(ScanConfig(text_field="messages"))
    _allowed(lambda: scanner.record("fuzz.tar", raw), ValueError)  # ValueError: a counted skip

    def ids(text: str) -> list[int]:
        return [1] * max(1, -(-len(text.encode()) // 4))

    enc = SampleEncoder(tokenizer=ids, text_field="messages")
    _allowed(lambda: enc._chat({"json": payload}, 1), ValueError)  # the loader's bad sample


# ---- .npy members (pre-tokenized ids) ------------------------------------------------------
NPY_INPUT = st.fixed_dictionaries(
    {
        "ids": st.lists(st.integers(-(1 << 40), 1 << 40), max_size=6),
        "dtype": st.sampled_from(["<i4", "<i8", "<u2", ">i8", "<f4", "|b1", "<U3"]),
        "shape": st.sampled_from(["1d", "2d", "0d"]),
        "ops": _OPS,
    }
)


def _check_npy(value: dict[str, Any], work: Path) -> None:
    from fcp_data.loader.encode import SampleEncoder
    from fcp_data.readers.scan import ScanConfig, Scanner
    from fcp_data.readers.shards import RawSample

    ids = np.asarray(value["ids"], dtype=np.int64)
    with np.errstate(all="ignore"):
        arr = ids.astype(value["dtype"]) if value["dtype"] != "<U3" else ids.astype(str)
    if value["shape"] == "2d":
        arr = arr.reshape(1, -1)
    elif value["shape"] == "0d" and arr.size:
        arr = arr[:1].reshape(())
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    data = mutate(buf.getvalue(), value["ops"])
    raw = RawSample(key="k", members={"npy": (0, len(data))}, payload={"npy": data})
    scanner = Scanner(ScanConfig())
    _allowed(lambda: scanner.record("fuzz.tar", raw), ValueError)  # ValueError: a counted skip
    enc = SampleEncoder(tokenizer=None)
    _allowed(lambda: enc.text_ids({"npy": data}), ValueError)  # the loader's bad sample


# ---- in-memory batch fields ----------------------------------------------------------------
_SEQ = st.one_of(
    st.lists(st.integers(-5, 1 << 40), max_size=6), st.lists(st.floats(), max_size=3),
    st.text(max_size=3), st.none(), st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2),
    st.lists(st.booleans(), max_size=3),
)  # fmt: skip
INMEMORY_INPUT = st.fixed_dictionaries(
    {
        "sequences": st.lists(_SEQ, max_size=4),
        "loss_mask": st.one_of(st.none(), st.lists(_SEQ, max_size=4)),
        "causal": st.one_of(st.booleans(), st.lists(_VALUE, max_size=4), _VALUE),
        "keys": st.one_of(st.none(), st.lists(_VALUE, max_size=4)),
        "seq_field": st.one_of(st.none(), st.lists(_VALUE, max_size=4)),
    }
)


def _check_inmemory(value: dict[str, Any], work: Path) -> None:
    from fcp_data.inmemory import InMemoryBatch

    def build() -> Any:
        fields = {} if value["seq_field"] is None else {"reward": value["seq_field"]}
        return InMemoryBatch(
            value["sequences"],
            loss_mask=value["loss_mask"],
            causal=value["causal"],
            keys=value["keys"],
            sequence_fields=fields,
        )

    batch = _allowed(build)
    if batch is None:
        return
    lens = [len(t) for t in batch.tokens]
    if batch.seqlens.tolist() != lens or batch.causal.dtype != np.bool_ or min(lens) < 1:
        raise Finding(f"accepted a batch whose lengths or flags are wrong: {lens}")
    if len(batch.causal) != len(lens):
        raise Finding("causal flags do not match the sequences")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("tar", TAR_INPUT, _check_tar, "json", "tar headers and resync (iter_raw_samples)"),
        Target("jsonl", JSONL_INPUT, _check_jsonl, "json", "JSON Lines lines, .gz, .zst (scan)"),
        Target("megatron_idx", IDX_INPUT, _check_idx, "json", "megatron .idx (read_idx)"),
        Target("index_header", HEADER_INPUT, _check_header, "json", "index header.json (open)"),
        Target("index_arrays", ARRAY_INPUT, _check_arrays, "json", "index .npy arrays (open)"),
        Target("resume_state", STATE_INPUT, _check_state, "json", "resume states (loader)"),
        Target("plan_file", PLAN_INPUT, _check_plan, "json", "plan files (read_saved_plan)"),
        Target("cli_flags", CLI_INPUT, _check_cli, "json", "CLI flags (fcp index/plan/...)"),
        Target("chat", CHAT_INPUT, _check_chat, "json", "chat samples (scan, loader)"),
        Target("npy_member", NPY_INPUT, _check_npy, "json", ".npy id members (scan, loader)"),
        Target("inmemory", INMEMORY_INPUT, _check_inmemory, "json", "InMemoryBatch fields"),
    )
}


def to_json(name: str, value: Any) -> Any:
    """A drawn input as JSON (what corpus/ stores); `from_json` is its inverse."""
    if name == "tar":
        return _jsonable_tar(value)
    return json.loads(json.dumps(value, default=_no_json))


def from_json(name: str, doc: Any) -> Any:
    return doc


def _no_json(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not stored in the corpus")
