"""Idefics3 and SmolVLM (``model_type: idefics3`` / ``smolvlm``, ``Idefics3ForConditionalGeneration`` /
``SmolVLMForConditionalGeneration``).

transformers 5.24 ``models/idefics3/modeling_idefics3.py``: ``Idefics3Model`` holds ``vision_model``
(``Idefics3VisionTransformer``: SigLIP's layers over variable-resolution patches), ``connector``
(``Idefics3Connector``: ``pixel_shuffle`` folds each ``scale_factor`` x ``scale_factor`` square of patches into one
token of d x scale^2 features, then ``modality_projection.proj``, ``Linear(d x scale^2, d_text, bias=False)``) and
``text_model`` (``AutoModel.from_config(text_config)``, a Llama); ``lm_head`` is tied to the text embeddings only
with the outer ``tie_word_embeddings`` (False by default).  ``models/smolvlm/modular_smolvlm.py`` builds SmolVLM
from the same classes (``SmolVLMModel(Idefics3Model)``, ``SmolVLMVisionTransformer(Idefics3VisionTransformer)``,
``SmolVLMConfig(Idefics3Config)``, the same image processor and prompt), so one adapter serves both.

The tower (``Idefics3VisionTransformer``): ``embeddings.patch_embedding`` (``Conv2d(3, d, patch, stride=patch)``,
biased), ``embeddings.position_embedding`` (``Embedding((image_size // patch)^2, d)``), ``encoder.layers``
(``Idefics3EncoderLayer``, SigLIP's: biased q/k/v/out_proj, fc1 -> gelu_pytorch_tanh -> fc2, two LayerNorms) and
``post_layernorm``; no pooling head.  Sub-configs given as dicts are built with their classes' defaults
(``Idefics3VisionConfig``: 1152 wide, 12 layers, 224 pixels, patch 32; ``LlamaConfig``); both are required.

Images (``image_processing_idefics3.py``, ``get_number_of_image_patches``): with ``do_image_splitting`` (the
default) an image is rescaled so that its longest side is ``size.longest_edge`` (a square: exactly that, whatever
its size), each side rounded up to a multiple of ``max_image_size.longest_edge``, and cut into rows x cols tiles of
that size, with the whole image at that size besides (rows x cols + 1 tower passes; one pass when a single tile
holds it).  Every tile is full, so the tower's padding mask is all ones and SDPA runs without it
(``masking_utils._ignore_bidirectional_mask_sdpa``).  ``Idefics3Processor._get_num_multimodal_tokens``: each tile
is ``<fake_token_around_image><row_r_col_c>`` + ``image_seq_len`` ``<image>`` tokens, each row ends in a newline,
and the whole image is ``<fake_token_around_image><global-img>`` + ``image_seq_len`` + ``<fake_token_around_image>``
after one more newline: seq + 3 + rows x (cols x (seq + 2) + 1) tokens, with ``image_seq_len`` =
(image_size // patch)^2 / scale^2.  ``size`` and ``max_image_size`` are in ``preprocessor_config.json``, which
vramplan does not read: they are taken as the image processor's defaults relative to the tower (4 x and 1 x
``vision_config.image_size``: ``Idefics3ImageProcessor``'s 4 x 364 and 364), and the two newlines before the whole
image as one token (the Llama 3 and SmolLM2 tokenizers merge "\\n\\n"), stated in the report.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, held_tower_states, non_null
from vramplan.spec.families.gemma3 import siglip_tower, tower_layer_spec
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.families.llava import llava_text_config
from vramplan.spec.model import ModelSpec, VisionSpec

__all__ = ["IDEFICS3", "SMOLVLM", "idefics3_grid"]

PREFIX = "vision_model"
# Idefics3VisionConfig's defaults (configuration_idefics3.py); SmolVLMVisionConfig's are the same
_VISION: dict[str, Any] = {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12,
                           "num_attention_heads": 16, "num_channels": 3, "image_size": 224, "patch_size": 32,
                           "hidden_act": "gelu_pytorch_tanh", "vision_use_head": False}
# Idefics3ImageProcessor's size.longest_edge over its max_image_size.longest_edge (4 x 364 and 364)
_RESIZE_TILES = 4
_MAX_IMAGE_SIZE = 4096  # image_processing_idefics3.py MAX_IMAGE_SIZE, "4k resolution as absolute maximum"


def idefics3_grid(height: int, width: int, longest_edge: int, tile: int) -> tuple[int, int]:
    """(rows, cols) of tiles of a height x width image, as ``get_number_of_image_patches`` (transformers 5.24
    ``image_processing_pil_idefics3.py``) computes them: ``_resize_output_size_rescale_to_max_len`` (the longest side
    to ``longest_edge``, the other kept in proportion and made even), ``_resize_output_size_scale_below_upper_bound``
    (``MAX_IMAGE_SIZE`` 4096), each side rounded up to a multiple of ``tile``; (0, 0) when one tile holds it."""
    aspect = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / aspect)
        height += height % 2
    else:
        height, width = longest_edge, int(longest_edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > _MAX_IMAGE_SIZE:
        width, height = _MAX_IMAGE_SIZE, int(_MAX_IMAGE_SIZE / aspect)
    elif height > width and height > _MAX_IMAGE_SIZE:
        height, width = _MAX_IMAGE_SIZE, int(_MAX_IMAGE_SIZE * aspect)
    resized_h = math.ceil(max(height, 1) / tile) * tile
    resized_w = math.ceil(max(width, 1) / tile) * tile
    if resized_h > tile or resized_w > tile:
        return math.ceil(resized_h / tile), math.ceil(resized_w / tile)
    return 0, 0


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    tc = llava_text_config({k: v for k, v in cfg.items() if k != "tie_word_embeddings"})
    # the outer flag ties lm_head (modeling_utils.py get_expanded_tied_weights_keys reads the top model's config;
    # Idefics3Config's default False)
    tc["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    kind = str(tc["model_type"])
    text = LLAMA_FAMILIES[kind].build(tc, kind, name)
    vc = {**_VISION, **non_null(cfg["vision_config"]), "vision_use_head": False}
    p = Params()
    t = siglip_tower(p, vc, PREFIX)
    scale = int(cfg.get("scale_factor", 2))
    per_side = t["image"] // t["patch"]
    # pixel_shuffle views each tile's side of patches as side / scale groups: a side scale does not divide fails
    # in the forward (Idefics3Config's own defaults, 224 / 32 = 7 patches a side at scale 2, build but cannot run
    # an image)
    refused = (f"pixel_shuffle cannot fold {per_side} patches a side by scale_factor {scale} (Idefics3Connector's "
               "view fails in the forward)") if per_side % scale else ""
    p.vision_linear("connector.modality_projection.proj", t["d"] * scale * scale, text.hidden_size, bias=False)
    seq = t["patches"] // (scale * scale)
    # a square image of any size: its side rescaled to longest_edge
    rows, cols = idefics3_grid(t["image"], t["image"], _RESIZE_TILES * t["image"], t["image"])
    tiles = rows * cols + 1 if rows else 1
    tokens = seq + 3 + rows * (cols * (seq + 2) + 1)
    act = str(vc["hidden_act"])
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=tiles * t["patches"], tokens_per_image=tokens, hidden_act=act,
                        source="transformers 5.24 Idefics3ImageProcessor.get_number_of_image_patches (tiles of "
                               "max_image_size and the whole image) and Idefics3Processor._get_num_multimodal_tokens",
                        param_prefixes=("vision_model.", "connector."), tower=tower_layer_spec(t, act, name),
                        num_channels=t["channels"], merge_size=scale, fixed_tiles=tiles, images_refused=refused,
                        # post_layernorm, then modality_projection.proj saves its input: the pixel-shuffled norm
                        # output in the compute dtype, d x scale^2 per token = d per patch
                        head_saved_per_patch=(("norm", 1), ("compute", t["d"])),
                        notes=(_assumed(t["image"]),), linears=tuple(p.vision_linears),
                        # Idefics3VisionTransformer.forward binds the embeddings' output through the encoder's layers
                        kept_hidden_states=held_tower_states(t["layers"]))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision)


def _assumed(image: int) -> str:
    return (f"the processor's size.longest_edge and max_image_size (preprocessor_config.json, not read) are taken as "
            f"{_RESIZE_TILES} x and 1 x vision_config.image_size ({_RESIZE_TILES * image} and {image}), and the two "
            "newlines before the whole image as one token")


IDEFICS3 = Family(build, "modeling_idefics3.py", required=(("vision_config",), ("text_config",)),
                  text_model_type="llama")
SMOLVLM = Family(build, "modeling_smolvlm.py", required=(("vision_config",), ("text_config",)),
                 text_model_type="llama")
