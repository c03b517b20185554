"""`VideoDecodeError`: one error type, one message per failure, whatever the backend.

Every backend raises exactly these four failures, built here so the text does not depend on
which library decoded the video:

* the video does not open (not a video, a damaged container, no video stream);
* a frame fails to decode (a corrupt GOP);
* fewer decodable frames than the highest index asked for (a sidecar or header that
  over-reports; decord#54): never padded by repeating the last frame, because the index's token
  count and every replica's positions were computed from the promised count;
* frames of another size than the index's (height, width): the rule's resize, grid and token
  count were computed for that size, so the video would load stretched.

`VideoDecodeError` is a ValueError and not a ConfigError: the loader's `_bad`
(fcp_data.loader.global_batch) turns it into a counted skip naming the sample's key under
`on_error="skip"`, or a SampleReadError under "raise". A missing backend is the setup's fault
and raises MissingDependencyError (a ConfigError) instead, which always stops the run.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import FCPError

__all__ = [
    "VideoDecodeError",
    "frame_failed",
    "not_opening",
    "size_changes",
    "size_mismatch",
    "size_mismatch_message",
    "too_few_frames",
]

_DROP = "re-encode it or drop the sample (on_error='skip' counts it)"


class VideoDecodeError(FCPError, ValueError):
    """A video that cannot give the frames asked for; `kind` says which failure.

    kind: "open" (does not open), "frame" (a frame fails to decode), "short" (fewer decodable
    frames than the highest index asked for), "size" (frames of another size than expected).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.kind, str(self))  # survives DataLoader worker pickling


def not_opening(backend: str, exc: BaseException | str) -> VideoDecodeError:
    """The container does not open (or has no video stream)."""
    why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return VideoDecodeError(
        "open",
        f"video decoding failed ({backend}): the video does not open ({why}); it is not a "
        f"video or its container is damaged: {_DROP}",
    )


def frame_failed(
    backend: str,
    exc: BaseException,
    *,
    frame: int | None,
    decoded_before: int | None,
    wanted: Sequence[int] = (),
) -> VideoDecodeError:
    """A frame fails to decode. `frame` None: the backend does not say which one of `wanted`."""
    if frame is not None:
        what = f"frame {frame} does not decode"
    elif wanted:
        what = f"a frame up to frame {max(wanted)} does not decode"
    else:
        what = "a frame does not decode"
    before = "" if decoded_before is None else f"; {decoded_before} frames decoded before it"
    return VideoDecodeError(
        "frame",
        f"video decoding failed ({backend}): {what} ({type(exc).__name__}: {exc}){before}; "
        f"the file is corrupt: {_DROP}",
    )


def too_few_frames(decodable: int, wanted: Sequence[int]) -> VideoDecodeError:
    """`decodable` frames exist but `wanted` (sorted, unique) asks for more."""
    missing = [i for i in wanted if i >= decodable]
    return VideoDecodeError(
        "short",
        f"video has {decodable} decodable frames but frame {missing[0]} was asked for "
        f"({len(missing)} of {len(wanted)} requested frames missing, highest {wanted[-1]}): "
        f"the video decodes {decodable} frames but the index samples frame {missing[0]}, so its "
        "metadata over-reports frames (frames are never repeated to fill the gap); re-probe it "
        "(rebuild the index without a sidecar num_frames, or fix the sidecar)",
    )


def size_mismatch_message(
    height: int, width: int, expect: tuple[int, int] | None, what: str
) -> str | None:
    """The error text when media decodes at (height, width) but the index says `expect`.

    None when the sizes agree or `expect` is unknown (None or a 0 side). Shared by images
    (fcp_data.vision.media.check_media_size) and video frames so both read the same.
    """
    if expect is None or not all(expect):
        return None
    if (int(height), int(width)) == (int(expect[0]), int(expect[1])):
        return None
    return (
        f"the {what} decodes at {width}x{height} (width x height) but the index says "
        f"{expect[1]}x{expect[0]}: its tokens and resize were computed for the wrong size "
        "and it would load stretched; fix the sidecar's width/height or re-index"
    )


def size_mismatch(height: int, width: int, expect: tuple[int, int]) -> VideoDecodeError:
    """Video frames of another size than the index's `expect` (height, width)."""
    message = size_mismatch_message(height, width, expect, "video")
    assert message is not None
    return VideoDecodeError("size", message)


def size_changes(first: tuple[int, int], frame: int, size: tuple[int, int]) -> VideoDecodeError:
    """Frames of one video at two sizes (H.264 may change resolution at an IDR frame)."""
    return VideoDecodeError(
        "size",
        f"the video changes size mid-stream: frame {frame} decodes at {size[1]}x{size[0]} but "
        f"the first frame asked for at {first[1]}x{first[0]} (width x height); its tokens "
        "assume one size and it would load stretched: re-encode it at one size",
    )
