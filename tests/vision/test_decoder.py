"""The one video decoder: every CP member's frames equal a whole sequential decode's, bit for
bit, while it decodes only the GOPs its zigzag chunks hold; backends agree; bad input fails
the same way on each.

Clips are real H.264 mp4s made with PyAV, 64x48 and 120 frames at 10 fps (the qwen2.5-vl rule
samples 24 frames, 12 tubelets): a short GOP (30), a long GOP (one keyframe), B-frames, and a
variable frame rate (20-90 ms between frames). decord decodes these clips to exactly PyAV's
pixels (the same rgb24 conversion here), so both are compared with one PyAV reference.

torchcodec's PyPI wheel does not load on this machine (a CUDA build), so its adapter is tested
against a small fake `torchcodec` module injected in sys.modules: it implements only the calls
the adapter uses (`decoders.VideoDecoder(bytes, seek_mode=, device=)`, `.metadata.num_frames`,
`.get_frames_at(indices=)` returning a batch whose `.data` is uint8 NCHW, and the private
`_get_key_frame_indices`) on top of a sequential PyAV decode, and raises what torchcodec
raises (RuntimeError on a file that does not open or a frame that fails, IndexError past the
end).
"""

from __future__ import annotations

import ast
import io
import pickle
import subprocess
import sys
import types
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import fcp_data
from fcp_data.collate.zigzag import chunk_bounds, padded_seqlen
from fcp_data.errors import ConfigError, MissingDependencyError, SampleError
from fcp_data.vision.decode import (
    BACKENDS,
    DecodeStats,
    VideoDecodeError,
    decode_frames,
    decode_video_frames,
    resolve_backend,
)
from fcp_data.vision.decode.gop import FrameTable, Run, plan_runs
from fcp_data.vision.families import get_rule

W, H, N, FPS = 64, 48, 120, 10
CLIPS = {"short_gop": {"gop": 30}, "long_gop": {"gop": 250}, "bframes": {"gop": 30, "bf": 2},
         "vfr": {"gop": 30, "vfr": True}}  # fmt: skip


def _encode(gop: int, bf: int = 0, vfr: bool = False) -> bytes:
    """An H.264 mp4 of a moving gradient; `vfr`: frame gaps of 20-90 ms (time base 1/1000)."""
    import av

    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:H, 0:W]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        s = out.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.codec_context.gop_size = gop
        s.options = {"preset": "ultrafast", "crf": "30", "bf": str(bf), "keyint": str(gop),
                     "scenecut": "0"}  # fmt: skip
        if vfr:
            s.time_base = s.codec_context.time_base = Fraction(1, 1000)
        t = 0
        for i in range(N):
            img = np.stack([(xx * (c + 1) + yy + 9 * i) % 256 for c in range(3)], -1)
            frame = av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")
            if vfr:
                frame.pts, frame.time_base = t, Fraction(1, 1000)
                t += int(rng.choice([20, 50, 90]))
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


def _sequential(data: bytes) -> np.ndarray:
    """Every frame of one decode from the start: the numbering every path must reproduce."""
    import av

    with av.open(io.BytesIO(data)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _keyframes(data: bytes) -> list[int]:
    import av

    with av.open(io.BytesIO(data)) as c:
        packets = [(p.pts, p.is_keyframe) for p in c.demux(video=0) if p.size]
    table = FrameTable.from_packets(packets)
    assert table is not None
    return table.keyframes.tolist()


@pytest.fixture(scope="module")
def clips() -> dict[str, tuple[bytes, np.ndarray, int]]:
    """name -> (mp4 bytes, all frames, longest GOP in frames)."""
    out = {}
    for name, kw in CLIPS.items():
        data = _encode(**kw)
        keys = _keyframes(data)
        out[name] = (data, _sequential(data), int(np.diff([*keys, N]).max()))
    assert out["long_gop"][2] == N and out["short_gop"][2] == 30
    return out


def _held_chunks(frame_indices: tuple[int, ...], vt: Any, degree: int, member: int) -> list[list]:
    """Per held zigzag chunk, the frames of the tubelets whose tokens fall in it (the vision
    payload's held units: any pad token of the tubelet inside the chunk). A qwen2.5-vl video
    is <|vision_start|>, T*h*w/4 pads (h*w/4 per tubelet of 2 frames), <|vision_end|>."""
    assert [p for p, _ in vt.parts] == ["vision_start", "video_pad", "vision_end"]
    per = vt.grid[1] * vt.grid[2] // 4
    units = [(1 + u * per, 1 + (u + 1) * per) for u in range(vt.grid[0])]
    out = []
    for a, b in chunk_bounds(padded_seqlen(vt.total, degree), degree, member):
        held = [u for u, (s, e) in enumerate(units) if max(s, a) < min(e, b)]
        out.append([frame_indices[2 * u + j] for u in held for j in (0, 1)])
    return out


def _backend(name: str) -> str:
    if name == "decord":
        pytest.importorskip("decord")
    return name


@pytest.mark.parametrize("backend", ["pyav", "decord"])
@pytest.mark.parametrize("clip", list(CLIPS))
def test_every_member_gets_sequential_frames_and_decodes_only_its_gops(
    clips, clip: str, backend: str
) -> None:
    data, ref, gop = clips[clip]
    backend = _backend(backend)
    fps = _avg_fps(data) if clip == "vfr" else FPS
    vt = get_rule("qwen2.5-vl").video(num_frames=N, fps=fps, height=H, width=W)
    assert vt.frame_indices[0] == 0 and vt.frame_indices[-1] == N - 1
    for d in (2, 3, 4):
        for member in range(d):
            chunks = [c for c in _held_chunks(vt.frame_indices, vt, d, member) if c]
            wanted = [f for c in chunks for f in c]
            stats = DecodeStats()
            out = decode_video_frames(data, wanted, (H, W), backend=backend, stats=stats)
            assert np.array_equal(out, ref[wanted]), (clip, backend, d, member)
            bound = sum(max(c) - min(c) + 1 + gop for c in chunks)
            assert stats.frames_decoded <= bound, (clip, d, member, stats)
            assert stats.backend == backend and stats.estimated == (backend != "pyav")
            if clip == "short_gop" and member == 0:  # first + last chunk: not the whole video
                assert stats.frames_decoded < N and stats.seeks >= 1, (d, stats)


def _avg_fps(data: bytes) -> float:
    import av

    with av.open(io.BytesIO(data)) as c:
        return float(c.streams.video[0].average_rate)


def test_member_zero_decodes_a_share_not_the_whole_video(clips) -> None:
    """The motivating number: a single seek decodes 100% for member 0 of a degree-4 group
    (chunks 0 and 7); runs decode its two chunks plus the GOP before the last one."""
    data, _, _ = clips["short_gop"]
    vt = get_rule("qwen2.5-vl").video(num_frames=N, fps=FPS, height=H, width=W)
    chunks = _held_chunks(vt.frame_indices, vt, 4, 0)
    stats = DecodeStats()
    decode_video_frames(data, [f for c in chunks for f in c], backend="pyav", stats=stats)
    assert chunks[0][0] == 0 and chunks[1][-1] == N - 1
    assert stats.seeks == 1 and stats.frames_decoded == (chunks[0][-1] + 1) + (N - 90)


def test_plan_runs_continues_or_seeks_whichever_decodes_less() -> None:
    keys = [0, 30, 60, 90]
    assert plan_runs([0, 17, 102, 119], keys) == [
        Run(0, False, (0, 17)),
        Run(90, True, (102, 119)),
    ]
    assert plan_runs([29, 35], keys) == [Run(0, False, (29, 35))]  # keyframe 30 = next frame
    assert plan_runs([25, 35], keys) == [Run(0, False, (25,)), Run(30, True, (35,))]
    assert plan_runs([50], keys) == [Run(30, True, (50,))]
    assert plan_runs([5, 70], [0]) == [Run(0, False, (5, 70))]  # one GOP: never seeks
    assert plan_runs([3], [2]) == [Run(2, True, (3,))]
    assert plan_runs([1], [2]) == [Run(0, False, (1,))]  # before the first keyframe: from 0
    assert sum(r.decoded for r in plan_runs([0, 17, 102, 119], keys)) == 18 + 30


def test_frame_table_numbers_frames_by_sorted_pts() -> None:
    # decode order with B-frames: pts 0, 3000, 1000, 2000 -> frames 0, 3, 1, 2
    table = FrameTable.from_packets([(0, True), (3000, False), (1000, False), (2000, False)])
    assert table is not None and table.pts.tolist() == [0, 1000, 2000, 3000]
    assert table.keyframes.tolist() == [0] and table.index_of()[3000] == 3
    assert FrameTable.from_packets([(0, True), (None, False)]) is None  # no pts: from the start
    assert FrameTable.from_packets([(0, True), (0, False)]) is None  # one pts twice


def test_a_stream_without_pts_is_decoded_from_the_start() -> None:
    """A raw H.264 stream has no pts to number frames by: output order numbers them."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="h264") as out:
        s = out.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.codec_context.gop_size = 10
        for i in range(40):
            img = np.full((H, W, 3), 5 * i, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    data = buf.getvalue()
    stats = DecodeStats()
    out = decode_video_frames(data, [35, 5], backend="pyav", stats=stats)
    assert np.array_equal(out, _sequential(data)[[35, 5]])
    assert (stats.seeks, stats.frames_decoded) == (0, 36)
    with pytest.raises(VideoDecodeError, match="video has 40 decodable frames but frame 40"):
        decode_video_frames(data, [40], backend="pyav")


def test_repeats_and_order_are_the_callers(clips) -> None:
    data, ref, _ = clips["short_gop"]
    idx = [100, 3, 100, 64, 3]
    for backend in ("pyav", "decord"):
        out = decode_video_frames(data, idx, backend=_backend(backend))
        assert np.array_equal(out, ref[idx])


# ---- backends: choosing, missing, torchcodec through a fake -----------------------------------


def test_backend_names_and_devices_are_checked() -> None:
    assert BACKENDS == ("auto", "pyav", "decord", "torchcodec")
    with pytest.raises(ConfigError, match=r"'ffmpeg'; allowed: 'auto', 'pyav', 'decord'"):
        resolve_backend("ffmpeg")
    with pytest.raises(ConfigError, match=r"device 'cuda' with backend 'pyav'.*torchcodec"):
        resolve_backend("pyav", "cuda")
    with pytest.raises(ConfigError, match=r"device 'tpu'; allowed: 'cpu', 'cuda'"):
        resolve_backend("auto", "tpu")
    with pytest.raises(ConfigError, match="'ffmpeg'; allowed"):
        decode_frames(b"", [0], (8, 8), backend="ffmpeg")


def test_auto_picks_pyav_where_torchcodec_does_not_load(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchcodec", None)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    assert resolve_backend("auto") == "pyav"
    with pytest.raises(MissingDependencyError, match=r"'torchcodec'.*pip install torchcodec"):
        resolve_backend("auto", "cuda")  # only torchcodec decodes on CUDA
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingDependencyError, match=r"'av'.*pip install 'fcp\[video\]'"):
        resolve_backend("auto")  # decord is never picked by auto


@pytest.mark.parametrize(("backend", "module"), [("decord", "decord"), ("pyav", "av")])
def test_a_missing_backend_raises_on_every_path(clips, monkeypatch, backend, module) -> None:
    """Never a plain ImportError: the loader would count it as a bad sample and skip the
    whole video corpus one sample at a time."""
    data, _, _ = clips["short_gop"]
    monkeypatch.setitem(sys.modules, module, None)
    for call in (
        lambda: decode_video_frames(data, [0], backend=backend),
        lambda: decode_frames(data, [0], (H, W), backend=backend, key="k"),
    ):
        with pytest.raises(MissingDependencyError, match=rf"'{module}'.*fcp\[video\]") as e:
            call()
        assert isinstance(e.value, ConfigError)


def test_missing_pillow_is_a_missing_dependency(monkeypatch) -> None:
    from fcp_data.vision.media import load_image

    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(MissingDependencyError, match=r"'PIL'.*fcp\[video\]"):
        load_image(b"\x89PNG")


class _FakeBatch:
    def __init__(self, data: Any) -> None:
        self.data = data


class _FakeVideoDecoder:
    """torchcodec.decoders.VideoDecoder's calls the adapter uses, over PyAV (module doc);
    `devices` records the device of each decoder made (a fresh list per test)."""

    devices: ClassVar[list[str]]

    def __init__(self, source: bytes, *, seek_mode: str = "exact", device: str = "cpu") -> None:
        import av

        assert isinstance(source, bytes) and seek_mode == "exact"
        type(self).devices.append(device)
        try:
            with av.open(io.BytesIO(source)) as c:
                packets = [(p.pts, p.is_keyframe) for p in c.demux(video=0) if p.size]
        except (av.FFmpegError, IndexError) as exc:
            raise RuntimeError(f"Could not open input file: {exc}") from exc
        table = FrameTable.from_packets(packets)
        assert table is not None
        self._source, self._keys = source, table.keyframes.tolist()
        self.metadata = types.SimpleNamespace(num_frames=len(table))

    def _get_key_frame_indices(self) -> list[int]:
        return list(self._keys)

    def get_frames_at(self, indices: list[int]) -> _FakeBatch:
        import av
        import torch

        if max(indices) >= self.metadata.num_frames:
            raise IndexError(f"Index {max(indices)} is out of bounds")
        try:
            frames = _sequential(self._source)
        except av.FFmpegError as exc:
            raise RuntimeError(f"Could not receive frame from decoder: {exc}") from exc
        return _FakeBatch(torch.from_numpy(frames[indices]).permute(0, 3, 1, 2).contiguous())


@pytest.fixture
def fake_torchcodec(monkeypatch) -> type[_FakeVideoDecoder]:
    cls = type("VideoDecoder", (_FakeVideoDecoder,), {"devices": []})
    pkg = types.ModuleType("torchcodec")
    decoders = types.ModuleType("torchcodec.decoders")
    decoders.VideoDecoder = cls  # type: ignore[attr-defined]
    pkg.decoders = decoders  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchcodec", pkg)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)
    return cls


def test_torchcodec_adapter_through_a_fake(clips, fake_torchcodec) -> None:
    data, ref, _ = clips["bframes"]
    assert resolve_backend("auto") == "torchcodec"  # the first of AUTO_ORDER that loads
    assert resolve_backend("auto", "cuda:1") == "torchcodec"
    idx = [0, 17, 17, 102, 119]
    stats = DecodeStats()
    out = decode_video_frames(data, idx, (H, W), backend="torchcodec", device="cuda", stats=stats)
    assert out.dtype == np.uint8 and np.array_equal(out, ref[idx])
    assert fake_torchcodec.devices == ["cuda"]
    assert stats.estimated and (stats.frames_decoded, stats.seeks) == (18 + 30, 1)
    pixels = decode_frames(data, [5, 6], (H, W), backend="torchcodec")
    assert np.array_equal(pixels.numpy(), ref[[5, 6]])


# ---- bad input: one error type, the same messages on every backend ------------------------------

BAD_BACKENDS = ["pyav", "decord", "torchcodec"]


@pytest.fixture
def any_backend(request, monkeypatch) -> str:
    name = _backend(request.param)
    if name == "torchcodec":
        request.getfixturevalue("fake_torchcodec")
    return name


def _corrupt_frame(data: bytes, frame: int) -> bytes:
    """`data` with the packet of `frame` zeroed (an H.264 NAL of length 0 fails to decode)."""
    import av

    with av.open(io.BytesIO(data)) as c:
        packets = sorted((p.pts, p.pos, p.size) for p in c.demux(video=0) if p.size)
    _, pos, size = packets[frame]
    return data[:pos] + bytes(size) + data[pos + size :]


@pytest.mark.parametrize("any_backend", BAD_BACKENDS, indirect=True)
def test_bad_input_is_one_error_type_on_every_backend(clips, any_backend: str) -> None:
    data, _, _ = clips["short_gop"]
    b = any_backend
    with pytest.raises(VideoDecodeError, match=rf"decoding failed \({b}\).*does not open") as e:
        decode_video_frames(b"\x00garbage" * 100, [0], backend=b)
    assert e.value.kind == "open"
    with pytest.raises(VideoDecodeError) as e:
        decode_video_frames(data, [0, 119, 120, 130], backend=b)
    assert e.value.kind == "short" and str(e.value).startswith(
        "video has 120 decodable frames but frame 120 was asked for (2 of 4 requested frames "
        "missing, highest 130): the video decodes 120 frames but the index samples frame 120"
    )  # the same text on every backend: never the last frame repeated
    with pytest.raises(VideoDecodeError, match=r"decodes at 64x48.*index says 96x48.*stretched"):
        decode_video_frames(data, [3], (48, 96), backend=b)
    bad = _corrupt_frame(data, 70)  # inside the GOP of frames 60..89
    with pytest.raises(VideoDecodeError, match=r"decoding failed.*does not decode") as e:
        decode_video_frames(bad, [65, 75], backend=b)
    assert e.value.kind == "frame" and ("frame 70 does not decode" in str(e.value)) == (b == "pyav")
    again = pickle.loads(pickle.dumps(e.value))  # crosses DataLoader worker processes intact
    assert (type(again), again.kind, str(again)) == (VideoDecodeError, "frame", str(e.value))
    # the SampleError of the placeholder path names the sample, for every failure
    with pytest.raises(SampleError, match=r"s\.tar: sample 'v9'.*120 decodable frames"):
        decode_frames(data, [120], (H, W), backend=b, key="v9", shard="s.tar")


def test_a_corrupt_gop_fails_only_the_members_that_hold_it(clips) -> None:
    """pyav and decord seek past the damaged GOP; the frames after it are exactly right."""
    data, ref, _ = clips["short_gop"]
    bad = _corrupt_frame(data, 70)
    for backend in ("pyav", "decord"):
        out = decode_video_frames(bad, [10, 95, 110], backend=_backend(backend))
        assert np.array_equal(out, ref[[10, 95, 110]])
        with pytest.raises(VideoDecodeError):
            decode_video_frames(bad, [10, 80], backend=backend)


# ---- layering and import-time work -------------------------------------------------------------

NEW_MODULES = ["vision/decode", "vision/probe.py", "vision/media_meta.py", "optional.py"]
BELOW = ("fcp_data.readers", "fcp_data.loader", "fcp_data.collate")


def test_the_decoder_never_imports_readers_loader_or_collate() -> None:
    """Except for types (`if TYPE_CHECKING:`): vision sits below them (tests/test_layering.py
    checks the whole package; this pins the modules moved here from readers)."""
    root = Path(fcp_data.__file__).parent
    files = [root / m for m in NEW_MODULES if m.endswith(".py")]
    files += [p for m in NEW_MODULES if not m.endswith(".py") for p in (root / m).rglob("*.py")]
    bad = []
    for path in files:
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or id(node) in typing_only:
                continue
            target = _absolute(path, root, node)
            if target.startswith(BELOW):
                bad.append(f"{path}:{node.lineno} imports {target}")
    assert bad == []


def _absolute(path: Path, root: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = ["fcp_data", *path.relative_to(root).with_suffix("").parts]
    base = parts[: len(parts) - node.level]
    return ".".join([*base, node.module] if node.module else base)


def test_importing_the_decoder_loads_no_decoding_library() -> None:
    code = (
        "import sys, fcp_data.vision.decode, fcp_data.vision.media; "
        "print(sorted(m for m in ('av', 'decord', 'torchcodec', 'PIL') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_torchcodec_is_named_without_an_extra() -> None:
    from fcp_data import optional

    assert optional.EXTRAS["torchcodec"] is None
