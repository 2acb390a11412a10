"""Qwen2-VL (spec/families/qwen2_vl.py): the LayerNorm / plain-MLP vision tower and merger against transformers'
module on the meta device, the image tokens (Qwen2.5-VL's smart_resize), the tower's activations in training and
in the prefill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meta_build import meta_module
from vramplan.catalog.resolve import resolve
from vramplan.spec.families import transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid, image_tokens

# Qwen2-VL-2B's shape (Qwen2-1.5B's decoder, tied, with the 32-block tower), the text keys at the top level as
# transformers 4.45 wrote Qwen2-VL's config.json
CONFIG = Path(__file__).resolve().parent / "data" / "qwen2-vl-2b-shape" / "config.json"


def _cfg() -> dict[str, Any]:
    return dict(json.loads(CONFIG.read_text()))


def test_tower_and_merger_by_hand() -> None:
    m = model_from_config(_cfg(), name="qwen2-vl")
    assert m.model_type == "qwen2_vl" and m.vision is not None and m.tie_word_embeddings
    # embed_dim 1280, mlp_ratio 4 -> 5120, 32 blocks, patches of 2 x 14 x 14 over 3 channels:
    #   patch_embed Conv3d without bias 1280 x 3 x 2 x 14 x 14 = 1,505,280
    #   per block: norm1, norm2 LayerNorms 2 x 2 x 1280 = 5,120; qkv 1280 x 3840 + 3840 = 4,919,040;
    #   proj 1280^2 + 1280 = 1,639,680; fc1 1280 x 5120 + 5120 = 6,558,720; fc2 5120 x 1280 + 1280 = 6,554,880
    #   -> 19,677,440
    #   merger: ln_q 2 x 1280 = 2,560; mlp.0 5120^2 + 5120 = 26,219,520; mlp.2 5120 x 1536 + 1536 = 7,865,856
    tower = 1_505_280 + 32 * 19_677_440 + 2_560 + 26_219_520 + 7_865_856
    assert m.vision_parameters == tower == 665_271_296
    # the language model: Qwen2-1.5B's shape, tied (1,543,714,304)
    assert m.num_parameters == 1_543_714_304 + tower == 2_208_985_600
    assert (m.vision.hidden_size, m.vision.intermediate_size, m.vision.tower.norm) == (1280, 5120, "layer")


def test_count_equals_transformers_module_on_the_meta_device() -> None:
    cfg = _cfg()
    spec = model_from_config(cfg, name="qwen2-vl")
    module = meta_module(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    assert spec.vision_parameters == sum(p.numel() for n, p in module.named_parameters() if n.startswith("model.visual."))


@pytest.mark.parametrize(("size", "patches", "tokens"), [
    (448, 1024, 256),    # 448 = 16 x 28: (448 / 14)^2 = 1024 patches, / 4 after the 2 x 2 merger
    (None, 4900, 1225),  # the largest square smart_resize lets through: 980 x 980
])
def test_image_tokens_follow_smart_resize(size: int | None, patches: int, tokens: int) -> None:
    v = model_from_config(_cfg()).vision
    assert v is not None
    assert image_grid(v, size) == (patches, tokens)


def test_transformers_config_builds_the_qwen2_language_model() -> None:
    assert transformers_config(_cfg())["model_type"] == "qwen2"


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": str(CONFIG), "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_tower_activations_by_hand() -> None:
    from vramplan.analytic.terms import bytes_of
    from vramplan.analytic.train import train_step

    r = resolve(_doc(micro_batch_size=1, seq_len=2048, images_per_sample=1, image_size=448))
    assert image_tokens(r.scenario, r.model) == 256
    # per patch and block, bf16-mixed, SDPA flash, d = 1280 (16 heads of 80), i = 5120:
    #   norm1 (LayerNorm: fp32 input 4 x 1280 + mean/rstd 8) 5,128; qkv's input cast 2,560; the fused qkv buffer v
    #   keeps alive 2 x 2,560 = 5,120; flash q, k, v, output 4 x 2,560 = 10,240; logsumexp 4 x 16 = 64; norm2
    #   5,128; fc1's input cast 2,560; quick_gelu's input and sigmoid 2 x 2 x 5120 = 20,480; fc2's input 10,240
    #   -> 61,520
    # 448 x 448: 1024 patches, 32 blocks; patch_embed input 2 x 3 x 2 x 14^2 = 2,352 per patch; merger ln_q 5,128
    # and its MLP's three inputs 3 x 2 x 1280 = 7,680 per patch
    expected = 1024 * (32 * 61_520 + 2_352 + 5_128 + 7_680)
    assert bytes_of(train_step(r).terms, "saved.vision_tower") == expected == 2_031_411_200


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=2, prompt_len=1024, images_per_sample=1, image_size=448))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 2 images of 1024 patches, bf16; the running layer is the MLP moment: input, residual and normalised input
    # (3 x 1280) and quick_gelu's three 5120-wide tensors -> 2 x (3,840 + 15,360) = 38,400 per patch; pixel values
    # 1024 x 3 x 2 x 14^2 x 2 = 2,408,448 per image; the rotary cos and sin (head_dim 1280 / 16 = 80) in fp32,
    # 2 x 80 x 4 = 640, and the int64 (row, column) position ids, 16, held through the blocks -> 656 per patch
    assert vision.get(K.VISION_TOWER) == 2 * (1024 * (38_400 + 656) + 2_408_448) == 84_803_584


@pytest.mark.parametrize(("release", "per_position_bytes"), [("4.45", 2 + 4), ("4.46", 2), ("4.53", 2), ("5.0", 0)])
def test_prefill_logits_of_every_position_before_logits_to_keep(release: str, per_position_bytes: int) -> None:
    """Qwen2VLForConditionalGeneration.forward took no logits_to_keep before transformers 5.0 (none in
    modeling_qwen2_vl.py 4.45-4.57): generate's prefill runs the head on all 6,144 prompt positions, and 4.45 also
    upcast them to fp32 (``logits = logits.float()`` at :1720; 4.46 casts only with labels).  The prefill's
    temporaries hold those logits: 6,144 x 152,064 x 2 B = 1,868,562,432 (bf16), + x 4 B = 3,737,124,864 (the fp32
    copy, alive with the bf16 one during the cast) at 4.45; from 5.0 the head runs on the last position only."""
    from vramplan import estimate

    sc = {"model": "Qwen/Qwen2-VL-7B-Instruct", "task": "inference", "hardware": {"gpu": "A100-80GB"},
          "inference": {"batch_size": 1, "prompt_len": 6144, "new_tokens": 16}, "software": {"transformers": release}}
    temporaries = estimate(sc).per_gpu.breakdown.get("temporaries", 0)
    logits = 6144 * 152_064 * per_position_bytes
    # the rest of the temporaries at the peak: the last position's logits handled by the sampler (a few MB at most)
    assert logits <= temporaries <= logits + 8 * 2**20


def test_qwen2_5_vl_took_logits_to_keep_from_4_54() -> None:
    """Qwen2.5-VL: none in modeling_qwen2_5_vl.py 4.49-4.53, 4.54 takes it; bf16 (the fp32 cast only with labels)."""
    from vramplan.analytic.inference import generate_behaviour

    traits = resolve({"model": "Qwen/Qwen2.5-VL-7B-Instruct", "hardware": {"gpu": "A100-80GB"}}).model.traits
    assert generate_behaviour(traits, (4, 53)).all_logits and not generate_behaviour(traits, (4, 53)).float_logits
    assert not generate_behaviour(traits, (4, 54)).all_logits
