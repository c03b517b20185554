"""Video decode work per CP member: decode the GOPs your chunks hold vs every member whole.

    python bench/media_decode.py                                 # 4 clips, d = 1..4, table + JSON
    python bench/media_decode.py --seconds 6 --degrees 2 4 --backends pyav -o out/x.json

For each clip (H.264 mp4 made with PyAV: GOP 250 and GOP 30, 320x240 and 640x360, --seconds at
--fps), the qwen2.5-vl rule samples its frames (qwen-vl-utils' indices, 2 fps) and a CP group of
degree d holds the video's tokens in zigzag chunks: member i holds chunks i and 2d-1-i, and
decodes the frames of every tubelet with a pad token in them. Measured per backend that loads,
side by side in one process, best of --repeats interleaved rounds (whole, member 0, member 1,
... per round, so a busy machine slows both sides alike):

* frames: frames decoded by the slowest member as a share of the video's frames (PyAV counts
  them; decord's are planned from its keyframe list), beside the bound 1/d + one GOP per held
  chunk (2 GOPs), and what one seek to the first held frame then decoding through the last
  (the previous decoder) costs that member: member 0 holds the first and the last chunk, so
  that is the whole video at every degree;
* seeks of the slowest member;
* pipeline: the same for the whole payload pipeline (decode, resize, normalise, patchify into
  the processor's rows): the slowest member's held tubelets vs every tubelet of the video;
* time: the slowest member's decode vs the baseline every member pays without this, decoding
  the whole video at all sampled indices with the same backend (what qwen-vl-utils does on
  every rank). Expected about the frame share plus the demux pass (about 1% of a decode).
"""

from __future__ import annotations

import io
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from _common import make_parser, out_path, write_json


def encode_clip(path: Path, width: int, height: int, frames: int, fps: int, gop: int) -> bytes:
    """An H.264 mp4 (preset veryfast, keyframe every `gop` frames, 2 B-frames) of moving
    noise over a gradient, written to `path`; its bytes."""
    import av

    rng = np.random.default_rng(width + gop)
    yy, xx = np.mgrid[0:height, 0:width]
    noise = rng.integers(0, 48, (height, width * 2, 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        s = out.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.codec_context.gop_size = gop
        s.options = {"preset": "veryfast", "crf": "26", "bf": "2", "keyint": str(gop),
                     "min-keyint": str(gop), "scenecut": "0"}  # fmt: skip
        for i in range(frames):
            shift = (3 * i) % width
            img = np.stack([(xx * (c + 1) + yy + 5 * i) % 208 for c in range(3)], -1)
            img = (img + noise[:, shift : shift + width]).astype(np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    data = buf.getvalue()
    path.write_bytes(data)
    return data


def held_frames(vt: Any, degree: int) -> list[list[list[int]]]:
    """Per member, per held chunk: the frames of the tubelets with a pad token in the chunk.

    A qwen2.5-vl video is <|vision_start|>, grid_t * h * w / 4 pads (h * w / 4 per tubelet of 2
    frames), <|vision_end|>; the whole sample is the video (no caption), padded to 2d chunks.
    """
    from fcp_data.collate import chunk_bounds, padded_seqlen

    if [p for p, _ in vt.parts] != ["vision_start", "video_pad", "vision_end"]:
        raise SystemExit(f"expected a qwen2.5-vl video template, got {vt.parts}")
    per = vt.grid[1] * vt.grid[2] // 4
    units = [(1 + u * per, 1 + (u + 1) * per) for u in range(vt.grid[0])]
    out = []
    for member in range(degree):
        chunks = []
        for a, b in chunk_bounds(padded_seqlen(vt.total, degree), degree, member):
            held = [u for u, (s, e) in enumerate(units) if max(s, a) < min(e, b)]
            chunks.append([vt.frame_indices[2 * u + j] for u in held for j in (0, 1)])
        out.append(chunks)
    return out


def one_seek_frames(wanted: list[int], keyframes: list[int]) -> int:
    """Frames the previous decoder decoded: seek once to the keyframe before the first wanted
    frame (from the start below frame 48), then decode through the last."""
    first = wanted[0]
    start = max([k for k in keyframes if k <= first], default=0) if first >= 48 else 0
    return wanted[-1] - start + 1


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pixels(data: bytes, wanted: list[int], vt: Any, backend: str) -> np.ndarray:
    """The whole payload pipeline of a member for frames `wanted` (whole tubelets): decode,
    resize to the rule's size, normalise (CLIP statistics), patchify into the processor's rows,
    the same code `fcp_data.vision.payload` runs (checked against transformers' processors)."""
    from fcp_data.vision import family_spec
    from fcp_data.vision.decode import decode_video_frames
    from fcp_data.vision.families.qwen import qwen_rows
    from fcp_data.vision.media import resize_frames
    from fcp_data.vision.pixels import normalize

    spec = family_spec("qwen2.5-vl")
    frames = resize_frames(decode_video_frames(data, wanted, backend=backend), vt.resized)
    x = normalize(frames, spec.mean, spec.std)
    x = x.reshape(len(wanted) // spec.temporal, spec.temporal, *x.shape[1:])
    return qwen_rows(x, patch=spec.patch, merge=spec.merge)


def measure(
    data: bytes, frames: int, gop: int, keys: list[int], vt: Any, backends: list[str], args: Any
) -> list[dict[str, Any]]:
    """One row per backend and degree for one clip (see the module docstring).

    Per round, per backend: the whole-video baseline, then every member of every degree, so
    backends and sides share the machine's load alike; the work is counted on the first round
    (it does not change), times are the best of the rounds.
    """
    from fcp_data.vision.decode import DecodeStats, decode_video_frames

    everything = sorted(set(vt.frame_indices))
    tubelets = list(vt.frame_indices)  # the peers' pipeline: every tubelet of the video
    groups = {d: [sorted({f for c in m for f in c}) for m in held_frames(vt, d)]
              for d in args.degrees}  # fmt: skip
    held = {d: [[f for c in m for f in c] for m in held_frames(vt, d)] for d in args.degrees}
    p_whole: dict[str, list[float]] = {b: [] for b in backends}
    p_member = {(b, d): [[] for _ in m] for b in backends for d, m in groups.items()}
    stats = {(b, d): [DecodeStats() for _ in m] for b in backends for d, m in groups.items()}
    t_whole: dict[str, list[float]] = {b: [] for b in backends}
    t_member = {(b, d): [[] for _ in m] for b in backends for d, m in groups.items()}
    for r in range(args.repeats):
        for b in backends:
            t_whole[b].append(timed(partial(decode_video_frames, data, everything, backend=b)))
            for d, members in groups.items():
                for i, wanted in enumerate(members):
                    s = stats[b, d][i] if r == 0 else None
                    call = partial(decode_video_frames, data, wanted, backend=b, stats=s)
                    t_member[b, d][i].append(timed(call))
            p_whole[b].append(timed(partial(pixels, data, tubelets, vt, b)))
            for d, members in held.items():
                for i, wanted in enumerate(members):
                    if wanted:
                        p_member[b, d][i].append(timed(partial(pixels, data, wanted, vt, b)))
            # the whole pipeline again after the members: the first call of a round pays
            # fresh pages for its ~100-400 MB of float arrays; best of both removes the order
            p_whole[b].append(timed(partial(pixels, data, tubelets, vt, b)))
            t_whole[b].append(timed(partial(decode_video_frames, data, everything, backend=b)))
    rows = []
    for b in backends:
        whole = min(t_whole[b])
        for d, members in groups.items():
            work = [s.frames_decoded for s in stats[b, d]]
            times = [min(t) for t in t_member[b, d]]
            most, slow = int(np.argmax(work)), int(np.argmax(times))
            pipe = max(min(t) for t in p_member[b, d] if t)
            rows.append({
                "backend": b, "frames": frames, "gop": gop, "degree": d,
                "max_frames": work[most], "work_ratio": work[most] / frames,
                "member_by_work": most, "bound": min(1.0, 1 / d + 2 * gop / frames),
                "one_seek_ratio": max(one_seek_frames(w, keys) for w in members) / frames,
                "seeks": stats[b, d][most].seeks, "estimated": stats[b, d][most].estimated,
                "whole_s": whole, "member_by_time": slow, "max_s": times[slow],
                "time_ratio": times[slow] / whole,
                "pipeline_whole_s": min(p_whole[b]), "pipeline_max_s": pipe,
                "pipeline_ratio": pipe / min(p_whole[b]),
            })  # fmt: skip
    return rows


def loads(backend: str) -> bool:
    from fcp_data.errors import MissingDependencyError
    from fcp_data.vision.decode import resolve_backend

    try:
        resolve_backend(backend)
    except MissingDependencyError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    p.add_argument("--seconds", type=float, default=40.0, help="clip length (default 40)")
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--gops", type=int, nargs="+", default=[250, 30])
    p.add_argument("--sizes", nargs="+", default=["320x240", "640x360"], help="WxH")
    p.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--backends", nargs="+", default=["pyav", "decord", "torchcodec"],
                   help="those that do not load are skipped")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="rounds; the best of each is kept")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.fps, args.gops, args.sizes = 2.0, 10, [10], ["64x48"]
        args.degrees, args.backends, args.repeats = [1, 2], ["pyav"], 1
    import av

    from fcp_data.vision import get_rule
    from fcp_data.vision.decode.gop import FrameTable

    rule = get_rule("qwen2.5-vl")
    tmp = Path(tempfile.mkdtemp(prefix="fcp-media-decode-"))
    frames = int(args.seconds * args.fps)
    backends = [b for b in args.backends if loads(b)]
    skipped = sorted(set(args.backends) - set(backends))
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for size in args.sizes:
        w, h = (int(x) for x in size.split("x"))
        for gop in args.gops:
            data = encode_clip(tmp / f"clip-{size}-g{gop}.mp4", w, h, frames, args.fps, gop)
            with av.open(io.BytesIO(data)) as c:
                packets = [(pk.pts, pk.is_keyframe) for pk in c.demux(video=0) if pk.size]
            table = FrameTable.from_packets(packets)
            assert table is not None and len(table) == frames
            keys = table.keyframes.tolist()
            vt = rule.video(num_frames=frames, fps=args.fps, height=h, width=w)
            for r in measure(data, frames, min(gop, frames), keys, vt, backends, args):
                rows.append({**r, "size": size, "sampled": len(vt.frame_indices)})
    print(
        f"qwen2.5-vl, {frames} frames ({args.seconds:g} s at {args.fps} fps), sampled "
        f"{rows[0]['sampled']} frames; slowest CP member vs every member decoding the whole "
        f"video (best of {args.repeats}); skipped (not loadable): {', '.join(skipped) or '-'}"
    )
    print()
    print("| backend | size | GOP | d | frames decoded (slowest) | bound 1/d+2 GOP | one seek "
          "| seeks | whole s | slowest s | time ratio | pipeline whole s | pipeline slowest s "
          "| pipeline ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        est = "*" if r["estimated"] else ""
        print(
            f"| {r['backend']} | {r['size']} | {r['gop']} | {r['degree']} | "
            f"{r['max_frames']}/{r['frames']} = {r['work_ratio']:.2f}{est} | {r['bound']:.2f} | "
            f"{r['one_seek_ratio']:.2f} | {r['seeks']}{est} | {r['whole_s']:.3f} | "
            f"{r['max_s']:.3f} | {r['time_ratio']:.2f} | {r['pipeline_whole_s']:.3f} | "
            f"{r['pipeline_max_s']:.3f} | {r['pipeline_ratio']:.2f} |"
        )
    print()
    print("* planned from the backend's keyframe list (it does not report its work)")
    print(f"total {time.perf_counter() - t0:.0f} s")
    payload = {"rows": rows, "args": vars(args), "skipped": skipped}
    write_json(out_path(args, "media_decode"), payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
