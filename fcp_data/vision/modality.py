"""What kind of sample a length-index row is: text, video or image, and its two numberings.

The index's `modality` column stores `Modality` values (text 0, video 1, image 2: the order in
which the scanner added them, and what every index on disk holds). transformers numbers token
types differently: `mm_token_type_ids` is text 0, image 1, video 2, and that spelling is what
`MediaLayout.kind` and column 1 of a micro-batch's `vision_runs` carry, because the training
side hands them to transformers' `get_rope_index` and vision towers as they are. Both
numberings, the names and the member extensions live here and nowhere else, so that a reader,
the loader and the vision payload cannot disagree about which code is a video (there were six
copies, in six modules, one of them in the other numbering).
"""

from __future__ import annotations

from enum import IntEnum

from ..errors import ConfigError

__all__ = ["IMAGE_EXTS", "MODALITIES", "VIDEO_EXTS", "Modality"]

# Member extensions, in the order the scanner tries them: a sample holding two video members is
# counted (and must be decoded) from the first listed, so the loader looks them up in this order.
VIDEO_EXTS = ("mp4", "mkv", "webm", "mov", "avi")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
MODALITIES = ("text", "video", "image")  # index code = position
_TOKEN_TYPES = (0, 2, 1)  # by index code: transformers' text 0, image 1, video 2


class Modality(IntEnum):
    """An index modality code (an int, so it compares and stores as the column's values)."""

    TEXT = 0
    VIDEO = 1
    IMAGE = 2

    @property
    def label(self) -> str:
        """ "text", "video" or "image": what `LengthIndex.modality_name` and messages say."""
        return MODALITIES[self.value]

    @property
    def exts(self) -> tuple[str, ...]:
        """Member extensions of this modality, in lookup order (() for text: it has several
        spellings, .txt / .json / .npy, decided by the scanner)."""
        return {Modality.VIDEO: VIDEO_EXTS, Modality.IMAGE: IMAGE_EXTS}.get(self, ())

    @property
    def token_type(self) -> int:
        """transformers' `mm_token_type_ids` code of this modality (text 0, image 1, video 2):
        `MediaLayout.kind` and the `vision_runs` kind column."""
        return _TOKEN_TYPES[self.value]

    @classmethod
    def of_token_type(cls, code: int) -> Modality:
        """The modality whose `token_type` is `code`; ValueError naming the allowed codes."""
        for m in cls:
            if m.token_type == int(code):
                return m
        raise ConfigError(f"token type {code!r} is not 0 (text), 1 (image) or 2 (video)")
