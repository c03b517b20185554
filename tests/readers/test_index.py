"""The length index against webdataset's own reading of the same real shards."""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from fcp.cli import main
from fcp_data.readers.build import build_index
from fcp_data.readers.errors import EmptyIndexError
from fcp_data.readers.length_index import LengthIndex, RuleMismatchError, StaleIndexError
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.text import CallableCounter


def _wds_samples(paths: list[Path]) -> list[dict]:
    ds = wds.WebDataset([str(p) for p in paths], shardshuffle=False)
    return list(ds)


def test_index_matches_webdataset_order_and_bytes(
    built_index: LengthIndex, shard_paths: list[Path], counts: dict[str, int]
) -> None:
    N_TEXT, N_VIDEO = counts["text"], counts["video"]
    ref = _wds_samples(shard_paths)
    assert len(built_index) == len(ref) == N_TEXT + N_VIDEO
    assert list(built_index.keys) == [s["__key__"] for s in ref]
    for i in (0, 5, 17, N_TEXT - 1, N_TEXT, len(ref) - 1):
        got = built_index.read(i)
        want = {k: v for k, v in ref[i].items() if not k.startswith("__")}
        assert got == want and got  # same members, same bytes, not empty


def test_seqlens_are_sums_and_dtypes(built_index: LengthIndex, counts: dict[str, int]) -> None:
    N_TEXT, N_VIDEO = counts["text"], counts["video"]
    idx = built_index
    assert idx.seqlens.dtype == np.int64 and idx.causal.dtype == np.bool_
    assert np.array_equal(idx.seqlens, idx.text_tokens + idx.vision_tokens + idx.special_tokens)
    text = idx.modality == 0
    assert text.sum() == N_TEXT and (idx.modality == 1).sum() == N_VIDEO
    assert (idx.vision_tokens[text] == 0).all() and (idx.vision_tokens[~text] > 0).all()
    assert (idx.text_tokens[~text] > 0).all()  # captions counted
    assert idx.causal.all()  # default: causal for text and video
    # text token counts follow the documented ratio: ceil(bytes / 4)
    for i in np.flatnonzero(text)[:10]:
        payload = idx.read(int(i))
        body = payload["txt"].decode() if "txt" in payload else None
        if body is not None:
            assert idx.text_tokens[i] == -(-len(body.encode()) // 4)
    # long-tailed: the stdlib corpus spans more than an order of magnitude
    assert idx.text_tokens[text].max() > 10 * idx.text_tokens[text].min()


def test_video_metadata_from_sidecar_or_probe_agree_with_truth(built_index: LengthIndex) -> None:
    import av

    idx = built_index
    vids = np.flatnonzero(idx.modality == 1)
    with_sidecar = 0
    for i in vids:
        members = idx.read(int(i))
        with_sidecar += "json" in members
        with av.open(io.BytesIO(members["mp4"])) as c:
            frames = list(c.decode(video=0))
        assert idx.num_frames[i] == len(frames)
        assert (idx.height[i], idx.width[i]) == (frames[0].height, frames[0].width)
    assert 0 < with_sidecar < len(vids)  # both paths exercised


def test_header_pickle_and_rule_check(built_index: LengthIndex) -> None:
    idx = built_index
    assert idx.header.rule["name"] == "qwen2.5-vl" and idx.header.tokenizer == "bytes:4"
    assert all(s.fingerprint for s in idx.header.shards)
    again = pickle.loads(pickle.dumps(idx))
    assert np.array_equal(again.seqlens, idx.seqlens)
    LengthIndex.open(idx.path, expect_rule="qwen2.5-vl")
    with pytest.raises(RuleMismatchError, match="qwen3-vl"):
        LengthIndex.open(idx.path, expect_rule="qwen3-vl")
    with pytest.raises(RuleMismatchError, match="bytes:4"):
        LengthIndex.open(idx.path, expect_tokenizer="hf:tok.json")
    with pytest.raises(IndexError):
        idx.read(len(idx))


def test_memory_mapped(built_index: LengthIndex) -> None:
    assert isinstance(built_index.seqlens, np.memmap)


def test_stale_shard_detected(shard_paths: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "shard.tar"
    shutil.copy(shard_paths[0], copy)
    idx = build_index([str(copy)], tmp_path / "idx")
    assert len(idx) == 16
    data = bytearray(copy.read_bytes())
    data[700] ^= 0xFF  # flip one byte inside the first member's data
    copy.write_bytes(bytes(data))
    with pytest.raises(StaleIndexError, match="changed"):
        LengthIndex.open(tmp_path / "idx")
    copy.unlink()
    with pytest.raises(StaleIndexError, match="missing"):
        LengthIndex.open(tmp_path / "idx")


def test_index_is_movable_with_its_shards(shard_paths: list[Path], tmp_path: Path) -> None:
    root = tmp_path / "a"
    root.mkdir()
    shutil.copy(shard_paths[0], root / "s.tar")
    build_index(str(root / "s.tar"), root / "idx")
    shutil.move(str(root), str(tmp_path / "b"))
    moved = LengthIndex.open(tmp_path / "b" / "idx")
    assert moved.read(0)


def test_callable_tokenizer_and_workers(shard_paths: list[Path], tmp_path: Path) -> None:
    counter = CallableCounter(str.split, spec="whitespace")
    text = [str(p) for p in shard_paths if p.name.startswith("text")]  # no probe children
    assert len(text) == 3
    one = build_index(text, tmp_path / "one", counter=counter)
    two = build_index(text, tmp_path / "two", counter=counter, workers=2)
    assert one.header.tokenizer == "whitespace"
    assert np.array_equal(one.seqlens, two.seqlens) and list(one.keys) == list(two.keys)
    body = one.read(0).get("txt")
    if body is not None:
        assert one.text_tokens[0] == len(body.decode().split())


def test_cli_index_full_attention_and_internvl(
    shard_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], counts: dict[str, int]
) -> None:
    N_TEXT, N_VIDEO = counts["text"], counts["video"]
    out = tmp_path / "cli_idx"
    rc = main(
        [
            "index",
            str(shard_dir / "text-{000000..000002}.tar"),
            str(shard_dir / "video-*.tar"),
            "-o",
            str(out),
            "--vision-rule",
            "internvl",
            "--rule-option",
            "num_frames=4",
            "--video-attention",
            "full",
        ]
    )
    assert rc == 0
    idx = LengthIndex.open(out, expect_rule="internvl")
    assert len(idx) == N_TEXT + N_VIDEO
    vids = idx.modality == 1
    assert (idx.vision_tokens[vids] == 4 * 256).all()
    assert not idx.causal[vids].any() and idx.causal[~vids].all()
    assert "52 samples" in capsys.readouterr().out


def test_cli_bad_spec_is_a_clean_error(tmp_path: Path) -> None:
    assert main(["index", str(tmp_path / "nope-{0..2}.tar"), "-o", str(tmp_path / "x")]) == 2


def test_open_non_index_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="fcp index"):
        LengthIndex.open(tmp_path)


def test_scan_config_round_trips_in_header(built_index: LengthIndex) -> None:
    assert built_index.header.scan == ScanConfig()


def test_decode_index_video_matches_planned_tokens(built_index: LengthIndex) -> None:
    from fcp_data.vision.decode import decode_index_video
    from fcp_data.vision.families import get_rule

    idx = built_index
    vids = np.flatnonzero(idx.modality == 1)
    rule = get_rule(idx.header.rule["name"])
    for i in vids[:3]:
        frames = decode_index_video(idx, int(i))
        t, h, w, c = frames.shape
        # Qwen: (T / 2 temporal groups) x (H/14 x W/14 patches) / (2x2 merge)
        assert idx.vision_tokens[i] == (t // 2) * (h // 14) * (w // 14) // 4
        assert c == 3 and t % 2 == 0
        vt = rule.video(
            num_frames=int(idx.num_frames[i]),
            fps=float(idx.fps[i]),
            height=int(idx.height[i]),
            width=int(idx.width[i]),
        )
        assert (h, w) == vt.resized
    with pytest.raises(ValueError, match="not video"):
        decode_index_video(idx, 0)


def test_build_refuses_to_replace_a_non_index_directory(
    shard_paths: list[Path], tmp_path: Path
) -> None:
    precious = tmp_path / "mydata"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a length index"):
        build_index(str(shard_paths[0]), precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    build_index(str(shard_paths[0]), tmp_path / "idx")
    again = build_index(str(shard_paths[1]), tmp_path / "idx")  # an old index is replaced
    assert LengthIndex.open(tmp_path / "idx").header.shards[0].url.endswith(shard_paths[1].name)
    assert again.shard_url(0).endswith(shard_paths[1].name)


def test_workers_with_many_video_shards(shard_paths: list[Path], tmp_path: Path) -> None:
    """Chunked pool scanning (probe children included) equals the serial scan."""
    copies = []
    for k in range(3):
        dst = tmp_path / f"v{k}.tar"
        dst.write_bytes(shard_paths[-1].read_bytes())
        copies.append(str(dst))
    serial = build_index([*copies, str(shard_paths[0])], tmp_path / "s")
    pooled = build_index([*copies, str(shard_paths[0])], tmp_path / "p", workers=2)
    assert np.array_equal(serial.seqlens, pooled.seqlens)
    assert [s.url for s in serial.header.shards] == [s.url for s in pooled.header.shards]
    assert (serial.modality == 1).sum() == 36


def test_empty_index_and_corrupt_header(tmp_path: Path) -> None:
    from webdataset import TarWriter

    shard = tmp_path / "e.tar"
    with TarWriter(str(shard)) as w:
        w.write({"__key__": "a", "txt": b""})
    with pytest.raises(EmptyIndexError, match=r"all 1 skipped .*'a': empty text"):
        build_index(str(shard), tmp_path / "idx")  # was written, exit 0
    assert not (tmp_path / "idx").exists()
    idx = build_index(str(shard), tmp_path / "idx", allow_empty=True)
    assert len(idx) == 0 and idx.seqlens.dtype == np.int64
    assert [s.key for s in idx.skipped] == ["a"]  # the index says why it is empty
    (tmp_path / "idx" / "header.json").write_text("{oops")
    with pytest.raises(StaleIndexError, match="not valid JSON"):
        LengthIndex.open(tmp_path / "idx")


def _corrupt(tmp_path: Path, shard: Path, name: str, edit) -> Path:
    """A real index over one real shard whose array `name` is rewritten by `edit`."""
    idx = tmp_path / "idx"
    build_index(str(shard), idx)
    path = idx / f"{name}.npy"
    out = edit(np.load(path))
    if out is not None:
        np.save(path, out)
    return idx


def _neg(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[3] = -5
    return a


def _past_shard(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[-1] += 10**6
    return a


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("seqlens", lambda a: a[:-1], r"seqlens\.npy has 15 rows but the header says 16 samples"),
        (
            "seqlens",
            lambda a: a.astype(np.int32),
            r"seqlens\.npy holds int32 .* expected a 1-D int64",
        ),
        ("text_tokens", _neg, r"text_tokens\.npy: 1 row\(s\) are negative \(first: row 3, key"),
        ("seqlens", lambda a: a + 1, r"seqlens\.npy: 16 row\(s\) differ from text \+ vision"),
        ("shard", lambda a: a + 7, r"shard\.npy: 16 row\(s\) name no shard of the 1 listed"),
        ("member_offset", _past_shard, r"member_offset\.npy: 1 member\(s\) end past their shard"),
        ("member_size", lambda a: a[:-2], r"member_size\.npy has 14 rows but the samples address"),
        ("member_start", lambda a: a[::-1].copy(), r"member_start\.npy: .* do not tile"),
    ],
)
def test_inconsistent_arrays_name_the_file(
    shard_paths: list[Path], tmp_path: Path, name: str, edit, message: str
) -> None:
    from fcp_data.errors import IndexMismatchError

    idx = _corrupt(tmp_path, shard_paths[0], name, edit)
    with pytest.raises(IndexMismatchError, match=message) as info:
        LengthIndex.open(idx)
    assert "rebuild the index" in str(info.value)


def test_truncated_or_missing_array_names_its_file(shard_paths: list[Path], tmp_path: Path) -> None:
    from fcp_data.errors import IndexMismatchError

    idx = _corrupt(tmp_path, shard_paths[0], "seqlens", lambda a: None)
    f = idx / "seqlens.npy"
    f.write_bytes(f.read_bytes()[:-40])  # cut mid-array, as a full disk or a killed copy does
    for verify in (True, False):  # workers reopen without verify: still caught, still named
        with pytest.raises(IndexMismatchError, match=r"seqlens\.npy is truncated or corrupt"):
            LengthIndex.open(idx, verify=verify)
    f.unlink()
    with pytest.raises(IndexMismatchError, match=r"seqlens\.npy is missing from the index"):
        LengthIndex.open(idx)
