"""Vision-language models: the Gemma 3 adapter's vision tower and projector, the image tokens, and what the
report says is not modelled."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vramplan.catalog.models import load_model
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_tokens

GEMMA3 = "google/gemma-3-4b-it"


def test_gemma3_vision_tower_and_projector_by_hand() -> None:
    m = load_model(GEMMA3)
    assert m.vision is not None and m.model_type == "gemma3"
    # SigLIP, d = 1152, i = 4304, 27 layers, 896 x 896 images in 14 x 14 patches (google/gemma-3-4b-it):
    #   patch_embedding 1152 x 3 x 14 x 14 + 1152 = 677,376 + 1,152 = 678,528
    #   position_embedding (896 / 14)^2 = 4096 positions x 1152 = 4,718,592
    #   per layer: q, k, v, out 4 x (1152^2 + 1152) = 5,313,024; fc1 4304 x 1152 + 4304 = 4,962,512;
    #              fc2 1152 x 4304 + 1152 = 4,959,360; layer_norm1/2 2 x 2 x 1152 = 4,608  -> 15,239,504
    #   27 layers 411,466,608; post_layernorm 2,304
    tower = 678_528 + 4_718_592 + 27 * 15_239_504 + 2_304
    assert tower == 416_866_032
    # projector: mm_input_projection_weight 1152 x 2560 = 2,949,120 + mm_soft_emb_norm 1152 = 2,950,272
    projector = 1152 * 2560 + 1152
    assert m.vision_parameters == tower + projector == 419_816_304
    # the language model alone is the gemma3_text adapter's count of the same text_config
    text = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262_208,
            "sliding_window": 1024}
    assert m.num_parameters == model_from_config(text).num_parameters + tower + projector == 4_300_079_472
    assert (m.vision.patches_per_image, m.vision.tokens_per_image, m.vision.num_layers) == (4096, 256, 27)
    # the tower is neither quantized nor adapted: no tensor of it is a "linear"
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(m.vision.param_prefixes))


def test_siglip_head_is_counted_when_vision_use_head() -> None:
    row = copy.deepcopy(_config())
    row["vision_config"]["vision_use_head"] = True
    with_head = model_from_config(row).num_parameters
    # SiglipMultiheadAttentionPoolingHead: probe d + in_proj 3d^2 + 3d + out_proj d^2 + d + LayerNorm 2d
    #   + fc1 d x i + i + fc2 i x d + d, d = 1152, i = 4304
    d, i = 1152, 4304
    head = d + 3 * d * d + 3 * d + d * d + d + 2 * d + d * i + i + i * d + d
    assert with_head - load_model(GEMMA3).num_parameters == head == 15_238_352


def _config() -> dict[str, Any]:
    from vramplan.catalog.models import list_models

    return next(dict(r.config) for r in list_models() if r.id == GEMMA3)


def test_transformers_config_still_takes_the_language_model() -> None:
    # the traced engine and measure build the language model of a multimodal config (its report says so)
    assert transformers_config(_config())["model_type"] == "gemma3_text"


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": GEMMA3, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_image_tokens_are_256_per_image() -> None:
    # Gemma3Processor.image_seq_length 256 (transformers 5.24 processing_gemma3.py): 3 images x 256 = 768
    r = resolve(_doc(seq_len=1024, images_per_sample=3))
    assert image_tokens(r.scenario, r.model) == 768
    assert any("768 image tokens are counted in seq_len" in a for a in r.assumptions)
    assert any(a.startswith("not modelled: the vision tower's activations for 3 image(s) of 4,096 patches")
               for a in r.assumptions)


def test_more_image_tokens_than_the_sequence_holds_is_refused() -> None:
    # 5 x 256 = 1280 > 1024
    with pytest.raises(ScenarioError, match="1,280 tokens, more than train.seq_len 1,024"):
        resolve(_doc(seq_len=1024, images_per_sample=5))


def test_images_for_a_text_model_are_refused() -> None:
    doc = {**_doc(images_per_sample=1), "model": "meta-llama/Llama-3.1-8B"}
    with pytest.raises(ScenarioError, match="has no vision tower"):
        resolve(doc)


def test_serve_states_the_encoder_cache_as_not_modelled() -> None:
    r = resolve({"model": GEMMA3, "hardware": {"gpu": "H100-80GB"}, "task": "serve"})
    assert any(a.startswith("not modelled: vLLM's encoder cache") for a in r.assumptions)


def test_text_only_batch_on_a_vlm_says_the_tower_gets_no_gradient() -> None:
    r = resolve(_doc())
    assert any("get no gradient" in a for a in r.assumptions)
    lora = resolve(_doc(peft={"method": "lora"}))
    assert not any("get no gradient" in a for a in lora.assumptions)
    assert any("adapters peft would place on the vision tower" in a for a in lora.assumptions)


def test_inference_image_tokens_count_in_the_prompt() -> None:
    r = resolve(_doc("inference", prompt_len=600, images_per_sample=2))
    assert image_tokens(r.scenario, r.model) == 512  # 2 x 256
    with pytest.raises(ScenarioError, match="more than inference.prompt_len"):
        resolve(_doc("inference", prompt_len=500, images_per_sample=2))


def test_trace_report_says_the_tower_is_not_traced() -> None:
    from types import SimpleNamespace

    from vramplan.trace.engine import _assumptions

    r = resolve(_doc(seq_len=512, images_per_sample=1))
    st = SimpleNamespace(sdpa=[], notes=[])
    notes = _assumptions(r, st, [])  # type: ignore[arg-type]
    assert "not modelled: the vision tower and projector (419,816,304 parameters) and the images: the traced " \
           "engine builds and traces the language model alone" in notes
