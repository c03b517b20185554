"""Model families: one registry maps every rule name to one family module and spec; the specs'
constants are the transformers processors' and configs' defaults; nothing else decides.

The oracle for the constants is transformers itself (class defaults of its Qwen2-VL / Qwen3-VL
processors and InternVL configs), read at test time, not numbers typed here.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

import fcp_data
from fcp_data.errors import ConfigError
from fcp_data.vision import SpecialTokenIds, family_of, family_spec, get_rule, rule_spec
from fcp_data.vision.families import (
    FAMILIES,
    NUM_IMAGE_TOKEN,
    RULE_NAMES,
    TOKEN_STRINGS,
    UnknownRuleError,
    VisionTokens,
    family_tokens,
    internvl,
    qwen,
    spec_of_family,
)
from fcp_data.vision.modality import IMAGE_EXTS, MODALITIES, VIDEO_EXTS, Modality

MODULES = (qwen, internvl)


@pytest.mark.parametrize("name", RULE_NAMES)
def test_every_rule_name_resolves_to_one_family_module_and_spec(name: str) -> None:
    owners = [m for m in MODULES if name in m.RULE_NAMES]
    assert len(owners) == 1, (name, owners)
    (module,) = owners
    spec = family_spec(name)
    assert family_of(name) == module.FAMILY == spec.family
    assert spec.rule == name and spec in module.SPECS
    rule = get_rule(name)
    assert rule.name == name and rule_spec(rule) == spec  # the built rule names the same spec
    assert spec.token_strings() == dict(TOKEN_STRINGS[spec.family]) == family_tokens(spec.family)
    assert spec_of_family(spec.family).family == spec.family
    assert pickle.loads(pickle.dumps(spec)) == spec  # specs travel to DataLoader workers
    hash(spec)


def test_rule_names_are_the_family_modules_in_order() -> None:
    assert tuple(n for m in MODULES for n in m.RULE_NAMES) == RULE_NAMES
    assert len(set(RULE_NAMES)) == len(RULE_NAMES)
    assert tuple(m.FAMILY for m in MODULES) == FAMILIES
    for m in MODULES:
        assert tuple(s.rule for s in m.SPECS) == m.RULE_NAMES


@pytest.mark.parametrize(
    "ask",
    [
        lambda n: get_rule(n),
        lambda n: family_spec(n),
        lambda n: family_of(n),
        lambda n: SpecialTokenIds.from_tokenizer(object(), n),
    ],
)
def test_an_unknown_rule_is_one_error_listing_the_names(ask) -> None:
    with pytest.raises(UnknownRuleError) as err:
        ask("llava-1.5")
    assert isinstance(err.value, ConfigError) and isinstance(err.value, ValueError)
    assert "'llava-1.5'" in str(err.value)
    assert all(n in str(err.value) for n in RULE_NAMES), str(err.value)


def test_an_unknown_family_names_the_families() -> None:
    for ask in (family_tokens, spec_of_family):
        with pytest.raises(UnknownRuleError, match="qwen, internvl"):
            ask("llava")
    with pytest.raises(ConfigError, match="qwen, internvl"):
        SpecialTokenIds(family="llava", ids={})


def test_the_patch_size_follows_the_rule_unless_given() -> None:
    assert family_spec("qwen3-vl").patch == get_rule("qwen3-vl").config.patch_size == 16
    assert family_spec("qwen2.5-vl").patch == get_rule("qwen2.5-vl").config.patch_size == 14
    assert family_spec("qwen2-vl", patch_size=16).patch == 16
    assert rule_spec(get_rule("qwen2-vl", patch_size=16)).patch == 16
    with pytest.raises(ValueError, match="14"):
        family_spec("internvl", patch_size=16)


def test_qwen2_and_qwen25_specs_are_qwen2vl_processor_defaults() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil as Processor,  # Qwen2-VL and Qwen2.5-VL checkpoints' class
    )

    for name in ("qwen2-vl", "qwen2.5-vl"):
        spec = family_spec(name)
        assert list(spec.mean) == list(Processor.image_mean)
        assert list(spec.std) == list(Processor.image_std)
        assert spec.patch == Processor.patch_size
        assert spec.merge == Processor.merge_size
        assert spec.temporal == Processor.temporal_patch_size
        assert spec.empty_pixels(3 * spec.temporal * spec.patch**2) == (0, 1176)


def test_qwen3_spec_is_qwen3vl_video_processor_defaults() -> None:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
        Qwen3VLVideoProcessor as Processor,
    )

    spec = family_spec("qwen3-vl")
    assert list(spec.mean) == list(Processor.image_mean)
    assert list(spec.std) == list(Processor.image_std)
    assert spec.patch == Processor.patch_size
    assert spec.merge == Processor.merge_size
    assert spec.temporal == Processor.temporal_patch_size


def test_internvl_spec_is_internvl_config_defaults() -> None:
    """Tile side, patch and pixel shuffle from InternVL's transformers configs; 256 tokens per
    tile from its processor's default `image_seq_length`."""
    import inspect

    from transformers import InternVLConfig, InternVLVisionConfig
    from transformers.models.internvl.processing_internvl import InternVLProcessor
    from transformers.utils.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    vision, spec = InternVLVisionConfig(), family_spec("internvl")
    assert (spec.tile, spec.tile) == tuple(vision.image_size)
    assert (spec.patch, spec.patch) == tuple(vision.patch_size)
    assert spec.merge == round(1 / InternVLConfig().downsample_ratio)
    seq = inspect.signature(InternVLProcessor.__init__).parameters["image_seq_length"].default
    tile = VisionTokens(vision=3 * seq, special=2, frame_indices=(), resized=(0, 0), grid=(3, 1, 1))
    assert spec.unit_tokens(tile) == seq == NUM_IMAGE_TOKEN
    side = vision.image_size[0] // vision.patch_size[0]
    assert spec.unit_patches(tile) == side * side and spec.grid_row(tile, 2) == (2, side, side)
    assert spec.empty_pixels(0) == (0, 3, *vision.image_size)
    # transformers' InternVL image processor class defaults to CLIP statistics; InternVL's own
    # build_transform (what its checkpoints were trained with) uses ImageNet's
    assert list(spec.mean) == list(IMAGENET_DEFAULT_MEAN)
    assert list(spec.std) == list(IMAGENET_DEFAULT_STD)


def test_modality_codes_names_exts_and_token_types() -> None:
    assert [int(m) for m in Modality] == [0, 1, 2]
    assert tuple(m.label for m in Modality) == MODALITIES == ("text", "video", "image")
    assert Modality.VIDEO.exts is VIDEO_EXTS and Modality.IMAGE.exts is IMAGE_EXTS
    assert Modality.TEXT.exts == ()
    # transformers' mm_token_type_ids: text 0, image 1, video 2
    assert [m.token_type for m in (Modality.TEXT, Modality.IMAGE, Modality.VIDEO)] == [0, 1, 2]
    assert all(Modality.of_token_type(m.token_type) is m for m in Modality)
    with pytest.raises(ValueError, match="token type 3"):
        Modality.of_token_type(3)
    from fcp_data.readers import scan

    assert scan.VIDEO_EXTS is VIDEO_EXTS and scan.MODALITIES is MODALITIES  # one definition


def _literal_checks(path: Path) -> list[str]:
    """`x == "<rule or family name>"` (or != / in (...) of them) and `.startswith("qwen...")`."""
    names = set(RULE_NAMES) | set(FAMILIES)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts: list[object] = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                consts += [e.value for e in elts if isinstance(e, ast.Constant)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
        ):
            consts += [a.value for a in node.args if isinstance(a, ast.Constant)]
        if any(c in names for c in consts):
            out.append(f"{path}:{node.lineno}")
    return out


def test_no_module_outside_the_families_compares_family_names(tmp_path: Path) -> None:
    """`== "qwen"` / `== "internvl"` / startswith("qwen") switches live in the registry or a
    FamilySpec method, so a new family is one module, not a hunt through the package."""
    root = Path(fcp_data.__file__).parent
    home = root / "vision" / "families"
    hits = [
        hit
        for path in sorted(root.rglob("*.py"))
        if home not in path.parents
        for hit in _literal_checks(path)
    ]
    assert hits == []
    planted = tmp_path / "planted.py"  # the walk finds such checks where there are some
    planted.write_text(
        "def f(s, family, rule):\n"
        '    a = family == "internvl" or s.startswith("qwen")\n'
        '    return a, rule in ("qwen2-vl", "qwen2.5-vl"), rule != "x"\n'
    )
    assert len(_literal_checks(planted)) == 3


def _modality_definitions(path: Path) -> list[str]:
    """Module-level assignments of modality codes or member-extension tables."""
    names = {"TEXT", "VIDEO", "IMAGE", "VIDEO_EXTS", "IMAGE_EXTS", "MODALITIES"}
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                if any(isinstance(e, ast.Name) and e.id in names for e in elts):
                    out.append(f"{path}:{node.lineno}")
    return out


def test_modality_codes_are_defined_once(tmp_path: Path) -> None:
    """Codes, names and extensions are assigned in fcp_data.vision.modality only."""
    root = Path(fcp_data.__file__).parent
    home = root / "vision" / "modality.py"
    hits = [h for p in sorted(root.rglob("*.py")) if p != home for h in _modality_definitions(p)]
    assert hits == []
    assert len(_modality_definitions(home)) == 3  # VIDEO_EXTS, IMAGE_EXTS, MODALITIES
    planted = tmp_path / "planted.py"
    planted.write_text('TEXT, VIDEO, IMAGE = 0, 1, 2\nIMAGE_EXTS = ("png",)\nX = 1\n')
    assert len(_modality_definitions(planted)) == 2


def test_importing_the_vision_package_loads_no_torch_pyav_or_pillow() -> None:
    """Readers import `fcp_data.vision` for the families and chat format; an index build must
    not pay torch's import (seconds) for it."""
    import subprocess
    import sys

    code = (
        "import sys, fcp_data.vision, fcp_data.vision.families, fcp_data.readers.scan\n"
        "print(sorted(m for m in ('torch', 'av', 'PIL', 'numba', 'transformers') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
