"""How the loader builds real vision-language micro-batches (`LoaderOptions.vision`).

Defaults follow each family's published processors and fine-tuning code:

* `tokens_per_second` 2: Qwen2.5-VL's fine-tuning code (rope2d.py) and NeMo's provider; the
  transformers vision-config class default is 4, so set it to your checkpoint's config value.
* `second_per_grid` "measured": 2 / sample_fps with sample_fps = sampled / total * fps, what
  qwen-vl-utils passes to the processor; "constant" is temporal_patch_size / processor fps
  (Qwen's fine-tuning data processor), 1.0 s at the default 2 fps.
* `next_text` "auto": what the installed transformers' `get_rope_index` computes, found by
  running it once per process on a probe video (fcp_data.vision.rope_check; 5.24 gives
  "spatial", 4.x "max+1") and stated in one log line; "max+1" (Qwen's fine-tuning code: one
  past the video's largest id) or "spatial" (start + max(h, w)) are used as given, with one
  warning when transformers computes the other.
* `mean`/`std` None: the rule's `FamilySpec` statistics (fcp_data.vision.families): CLIP's for
  Qwen2/2.5-VL, 0.5 for Qwen3-VL, ImageNet's for InternVL.
* `loss_on_template` False: labels that would predict template or vision tokens are ignored
  (loss on text only); True keeps template text (timestamps, frame labels) in the loss.
* `chat` False: a caption field holding a conversation (fcp_data.vision.chat) is encoded only
  when True; the loss is then on the turns whose role is in `chat_loss_roles` (assistant), and
  the global loss count reads each media sample's small .json member (not its media).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .families import FamilySpec, family_spec
from .tokens import SpecialTokenIds

__all__ = ["FamilySpec", "VisionOptions", "family_spec"]  # the spec names: re-exports


@dataclass(kw_only=True, slots=True)
class VisionOptions:
    """Settings of the real-template, pixel-payload and M-RoPE path (see module docstring)."""

    token_ids: SpecialTokenIds | None = None
    tokens_per_second: float = 2.0
    second_per_grid: Literal["measured", "constant"] = "measured"
    processor_fps: float = 2.0
    next_text: Literal["auto", "max+1", "spatial"] = "auto"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    loss_on_template: bool = False
    chat: bool = False
    chat_loss_roles: tuple[str, ...] = ("assistant",)
    payload: bool = True
