"""fcp_data.vision: what a vision-language model consumes for the tokens a replica holds.

Exact templates from the model's tokenizer (`SpecialTokenIds`, `template.render`), the pixel
payload of the encoder units a replica holds (`payload`), whole-sample M-RoPE ids sliced to the
replica (`positions`), and the options that select conventions (`VisionOptions`). The loader
uses it when `LoaderOptions.vision` is set; docs/vision-payload.md is the contract.
"""

from .options import FamilySpec, VisionOptions, family_spec
from .positions import mrope_positions, second_per_grid
from .template import MediaLayout, render
from .tokens import TOKEN_STRINGS, SpecialTokenIds, TokenizerText, family_of

__all__ = [
    "TOKEN_STRINGS",
    "FamilySpec",
    "MediaLayout",
    "SpecialTokenIds",
    "TokenizerText",
    "VisionOptions",
    "family_of",
    "family_spec",
    "mrope_positions",
    "render",
    "second_per_grid",
]
