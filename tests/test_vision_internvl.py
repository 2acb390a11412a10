"""InternVL, transformers' native port (spec/families/internvl.py): parameters by hand and against transformers'
module on the meta device, the tiles against GotOcr2's image processor, the image tokens, the tower's saved
tensors and the projector by hand, quantization of the tower."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meta_build import assert_equals_meta_module
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid, image_tokens
from vramplan.spec.vision_quant import tower_quantized_linears

# An InternVL3-1B-hf shape written from InternVLConfig's and InternVLVisionConfig's docstrings (transformers 5.24
# configuration_internvl.py: "a similar configuration to that of InternVL3-1B", OpenGVLab/InternVL3-1B-hf) with
# InternViT-300M's biased q/k/v and a Qwen2.5-0.5B-shaped language model; not a catalog row (no published
# config.json was read from a cited source here)
TEXT: dict[str, Any] = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151674,
                        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}
VISION: dict[str, Any] = {"model_type": "internvl_vision", "hidden_size": 1024, "intermediate_size": 4096,
                          "num_hidden_layers": 24, "num_attention_heads": 16, "attention_bias": True,
                          "use_qk_norm": False, "hidden_act": "gelu", "norm_type": "layer_norm",
                          "image_size": [448, 448], "patch_size": [14, 14], "use_mean_pooling": True}
CFG: dict[str, Any] = {"architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl",
                       "downsample_ratio": 0.5, "image_seq_length": 256, "projector_hidden_act": "gelu",
                       "vision_feature_layer": -1, "vision_feature_select_strategy": "default",
                       "tie_word_embeddings": False, "text_config": TEXT, "vision_config": VISION}
TILED = {**CFG, "dynamic_image_size": True, "min_dynamic_patch": 1, "max_dynamic_patch": 12}
# every optional tower tensor: q/k RMSNorms, RMSNorm layers, the final layernorm, the mask token; no q/k/v bias
ODD = {"model_type": "internvl", "tie_word_embeddings": True,
       "text_config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},
       "vision_config": {"use_qk_norm": True, "norm_type": "rms_norm", "use_mean_pooling": False,
                         "use_mask_token": True, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                         "num_attention_heads": 4}}


def _doc(task: str = "train", model: dict[str, Any] | None = None, **section: Any) -> dict[str, Any]:
    return {"model": model or CFG, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_tower_and_projector_by_hand() -> None:
    m = model_from_config(CFG, name="internvl3-1b")
    # InternViT-300M, d = 1024, i = 4096, 24 layers, 448 / 14 = 32 patches a side:
    #   cls_token 1024; patch projection 1024 x 3 x 14^2 + 1024 = 603,136; positions (1024 + 1) x 1024 = 1,049,600
    #   per layer: q/k/v 3 x (1024^2 + 1024) = 3,148,800; projection_layer 1,049,600; fc1 4096 x 1024 + 4096 =
    #     4,198,400; fc2 4,195,328; layernorm_before/after 4 x 1024; lambda_1/2 2 x 1024 -> 12,598,272 x 24
    tower = 1024 + 603_136 + 1_049_600 + 24 * 12_598_272
    # projector: layer_norm 2 x 4096; linear_1 4096 x 896 + 896 = 3,670,912; linear_2 896^2 + 896 = 803,712
    projector = 2 * 4096 + 3_670_912 + 803_712
    assert m.vision_parameters == tower + projector == 308_495_104
    assert m.vision is not None and (m.vision.tokens_per_image, m.vision.patches_per_image) == (258, 1024)


NO_TIE_KEY = {k: v for k, v in CFG.items() if k != "tie_word_embeddings"}  # InternVLConfig's default: tied


@pytest.mark.parametrize("cfg", [CFG, ODD, NO_TIE_KEY], ids=["internvl3-1b-shape", "optional-tensors", "tie-default"])
def test_count_and_names_equal_transformers_module_on_the_meta_device(cfg: dict[str, Any]) -> None:
    spec = model_from_config(cfg, name="ivl")
    assert_equals_meta_module(spec, cfg)


@pytest.mark.parametrize("side", [100, 448, 633, 634, 950, 951, 3000])
def test_tiles_equal_gotocr2s_image_processor(side: int) -> None:
    pytest.importorskip("torch")
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    processor = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, crop_to_patches=True, min_patches=1,
                                         max_patches=12)
    tiles = processor.get_number_of_image_patches(side, side)
    v = model_from_config(TILED, name="ivl").vision
    assert v is not None
    # InternVLProcessor._get_num_multimodal_tokens: 2 + 256 x tiles
    assert image_grid(v, side) == (1024 * tiles, 2 + 256 * tiles)


def test_image_tokens_by_hand() -> None:
    v = model_from_config(TILED, name="ivl").vision
    assert v is not None
    # a square image: the 2 x 2 grid once its area exceeds half of it (634^2 > 0.5 x 448^2 x 4), 3 x 3 past
    # 0.5 x 448^2 x 9 (951^2); a thumbnail besides; not given: the largest grid, 9 tiles + thumbnail
    assert image_grid(v, 633) == (1024, 258)
    assert image_grid(v, 634) == (5 * 1024, 2 + 5 * 256)
    assert image_grid(v, None) == (10 * 1024, 2 + 10 * 256) == (10_240, 2_562)
    # without dynamic_image_size: one 448 tile, whatever the size (and said)
    r = resolve(_doc("inference", prompt_len=1024, images_per_sample=2, image_size=2000))
    assert image_tokens(r.scenario, r.model) == 2 * 258
    assert any("one 448-pixel tile" in a for a in r.assumptions)


def test_tower_activations_by_hand() -> None:
    from vramplan.analytic.terms import bytes_of
    from vramplan.analytic.train import train_step

    r = resolve(_doc(micro_batch_size=1, seq_len=2048, images_per_sample=1))
    # per tower token and layer, bf16-mixed (fp32 residual stream), SDPA flash, d = 1024, i = 4096, 16 heads:
    #   layernorm_before fp32 input 4 x 1024 + mean/rstd 8 = 4,104; q/k/v's bf16 input casts 3 x 2 x 1024 = 6,144;
    #   flash q, k, v, output 4 x 2 x 1024 = 8,192; logsumexp 4 x 16 = 64; layernorm_after 4,104; fc1's input cast
    #   2,048; GELU's input 2 x 4096 = 8,192; fc2's input 8,192; the layer scales' inputs (the attention's and the
    #   MLP's outputs) 2 x 2 x 1024 = 4,096                                                      -> 45,136
    # 1024 patches + the class token = 1,025 tokens, 24 layers (vision_feature_layer -1: all used)
    layers = 24 * 45_136 * 1025
    # the patch convolution's input 2 x 3 x 14^2 x 1024 = 1,204,224; the projector per patch: layer_norm over the
    # shuffled 4 x 1024 (4,104 per patch), linear_1's bf16 cast 2 x 1024, the GELU's and linear_2's inputs
    # 2 x 2 x 896 per token of 4 patches (896 per patch)
    head = 1024 * (4_104 + 2_048 + 896)
    assert bytes_of(train_step(r).terms, "saved.vision_tower") == 1_204_224 + layers + head == 1_118_766_976


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=1, prompt_len=1024, images_per_sample=1))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 1 tile of 1,025 tokens, bf16; the running layer is the MLP moment: input, residual and normalised input
    # (3 x 1024 x 2 B = 6,144) and fc1's output and the GELU's (2 x 4096 x 2 B = 16,384) -> 22,528 per token, and
    # the embeddings' output bound in InternVLVisionModel.forward through the layers, 1024 x 2 B = 2,048 -> 24,576;
    # pixel values 3 x 448^2 x 2 B = 1,204,224
    assert vision.get(K.VISION_TOWER) == 1025 * 24_576 + 1_204_224 == 26_394_624


def test_tower_quantized_on_load_by_hand() -> None:
    m = model_from_config(CFG, name="ivl")
    # q/k/v/projection_layer 4 x 1024^2, fc1/fc2 2 x 1024 x 4096 per layer x 24 = 301,989,888; the projector's
    # linear_1 4096 x 896 + linear_2 896^2 = 4,472,832
    assert tower_quantized_linears(m) == 24 * (4 * 1024**2 + 2 * 1024 * 4096) + 4096 * 896 + 896 * 896 == 306_462_720


def test_bad_downsample_ratio_and_language_model_are_refused() -> None:
    bad = copy.deepcopy(CFG)
    bad["downsample_ratio"] = 0.3
    with pytest.raises(ScenarioError, match="downsample_ratio"):
        model_from_config(bad)
    layers = copy.deepcopy(CFG)
    layers["vision_feature_layer"] = [-1, -2]  # two layers' states concatenated: the projector's norm would not take them
    with pytest.raises(ScenarioError, match="vision_feature_layer"):
        model_from_config(layers)
    other = copy.deepcopy(CFG)
    other["text_config"]["model_type"] = "internlm2"
    with pytest.raises(ScenarioError, match="internlm2"):
        model_from_config(other)
