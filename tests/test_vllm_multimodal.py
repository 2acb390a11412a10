"""vLLM's multimodal profile run (serve/vllm_mm.py, facts/vllm_multimodal.py): Qwen2.5-VL-7B-Instruct at 0.8.2."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.serve.vllm import decide
from vramplan.serve.vllm_mm import mm_profile, mm_profile_modelled, qwen_vl_item

# Qwen2.5-VL-7B-Instruct's config.json (the keys the spec reads)
QWEN25_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 128000, "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 152064, "hidden_act": "silu",
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                      "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


def _resolved(version: str = "0.8.2", limit: int | None = 10, model: Any = None) -> Any:
    serve = {"max_model_len": 128000, "max_num_seqs": 1024, "max_num_batched_tokens": 16384, "dtype": "bf16",
             "vllm_version": version, "limit_mm_per_prompt": limit}
    return resolve({"model": model or QWEN25_VL_7B, "task": "serve", "hardware": {"gpu": "H100-SXM"},
                    "framework": "vllm", "serve": serve})


def test_largest_image() -> None:
    # smart_resize of a 9,999,999-pixel square under max_pixels 12,845,056, factor 28: floor(3,584 / 28) x 28 =
    # 3,584 a side; (3,584 / 14)^2 = 65,536 patches; / (2 x 2) = 16,384 tokens (vLLM 0.8.2 logged a budget of 16,384)
    assert qwen_vl_item(_resolved().model.vision) == (65_536, 16_384)


def test_qwen25_vl_7b_image_budget_items_outputs_peak() -> None:
    mm = mm_profile(_resolved().model, 128000, 16384, 1024, 2, 10)
    assert mm is not None
    # limit 10: the images' 10 x 16,384 tokens exceed max_model_len, so a video gets 1 frame (16,384 tokens), a tie
    # the image wins; budget max(16,384, 16,384) = 16,384; items min(cdiv(16,384, 16,384), 1,024 x 10) = 1
    assert (mm.modality, mm.tokens_per_item, mm.budget_tokens, mm.items) == ("image", 16_384, 16_384, 1)
    # outputs kept: 1 x 16,384 tokens x 3,584 x 2 B = 117,440,512 B
    assert mm.output_bytes == 117_440_512
    # per patch: held 1,176 x 4 (float32 pixels, 3 x 2 x 14 x 14) + 1,176 x 2 (bf16 copy) + 40 x 4 (rotary) = 7,216 B;
    # attention 8 x 1,280 x 2 + 16 x 1,280 + 12 x 80 = 41,920 B; MLP (3 x 1,280 + 3 x 3,420) x 2 = 28,200 B
    assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (7_216, 41_920, 28_200)
    # 65,536 patches x (7,216 + 41,920) = 3,220,176,896 B
    assert mm.encoder_peak_bytes == 3_220_176_896


def test_default_limit_profiles_a_video() -> None:
    mm = mm_profile(_resolved(limit=None).model, 128000, 16384, 1024, 2, None)
    assert mm is not None
    # room 128,000 - 16,384 = 111,616 tokens: 6 temporal patches x 16,384 = 98,304 fit, 7 do not; 12 frames (13 pad
    # to 14 = 7); one video of 12 frames: 98,304 tokens > 16,384, so the video; budget max(16,384, 98,304)
    assert (mm.modality, mm.frames, mm.tokens_per_item, mm.patches_per_item) == ("video", 12, 98_304, 393_216)
    assert (mm.budget_tokens, mm.items) == (98_304, 1)


def test_items_capped_by_requests() -> None:
    # max_model_len 32,768 with 2 images a prompt: no room for a video frame, the image (16,384) wins; budget
    # 40,000: cdiv(40,000, 16,384) = 3 items, but 1 request x 2 images = 2
    mm = mm_profile(_resolved().model, 32768, 40000, 1, 2, 2)
    assert mm is not None
    assert (mm.modality, mm.budget_tokens, mm.items) == ("image", 40_000, 2)
    assert mm.output_bytes == 2 * 16_384 * 3_584 * 2


def test_decision_keeps_outputs_through_the_lm_batch() -> None:
    on, off = decide(_resolved(), "0.8.2"), decide(_resolved(limit=0), "0.8.2")
    assert on.mm_profile is not None and off.mm_profile is None
    # the sampler's dummy run (1,024 requests x 152,064 entries) outgrows the encoder's 3.0 GiB, so the profile peaks
    # in the language model's moment with the 117,440,512 B of outputs alive
    assert on.sampler_peak_bytes > on.mm_profile.encoder_peak_bytes
    assert on.activation_peak_bytes - off.activation_peak_bytes == 117_440_512
    assert any("Encoder cache will not be initialized" in a for a in off.assumptions)
    assert any("encoder budget 16,384 tokens, 1 image item(s)" in a for a in on.assumptions)


def test_encoder_moment_sets_the_peak_for_a_long_video() -> None:
    d = decide(_resolved(limit=None), "0.8.2")
    assert d.mm_profile is not None
    # 393,216 patches x 49,136 B = 19,321,061,376 B, above the language model's moment
    assert d.mm_profile.encoder_peak_bytes == 393_216 * 49_136
    assert d.activation_peak_bytes == d.mm_profile.encoder_peak_bytes + d.cublas_workspace_bytes


@pytest.mark.parametrize("version", ["0.7.3", "0.9.0", "0.11"])
def test_release_not_read_keeps_the_assumption(version: str) -> None:
    d = decide(_resolved(version=version), version)
    assert d.mm_profile is None
    assert any(a.startswith("not modelled: the multimodal encoder of Qwen2_5_VLForConditionalGeneration") for a in
               d.assumptions)


def test_family_without_checkpoint_pixels_not_modelled() -> None:
    m = _resolved().model
    assert mm_profile_modelled((0, 8, 2), m)
    # a tower whose processor's max_pixels is not known (LLaVA, Gemma 3, mllama adapters set none)
    assert not mm_profile_modelled((0, 8, 2), replace(m, vision=replace(m.vision, checkpoint_max_pixels=0)))
    assert not mm_profile_modelled((0, 8, 2), replace(m, vision=None))


def test_report_states_the_profile_instead_of_not_modelled() -> None:
    from vramplan.engine import estimate

    modelled, unread = estimate(_resolved()), estimate(_resolved(version="0.11"))
    assert not [a for a in modelled.assumptions if a.startswith("not modelled:") and "encoder" in a]
    assert [a for a in modelled.assumptions if a.startswith("multimodal profile run (vLLM 0.8.2")]
    assert [a for a in unread.assumptions if a.startswith("not modelled: vLLM's encoder cache")]


def test_limit_on_a_text_model_is_stated() -> None:
    text = {k: v for k, v in QWEN25_VL_7B.items() if k != "vision_config"}
    d = decide(_resolved(model={**text, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}), "0.8.2")
    assert d.mm_profile is None
    assert "serve.limit_mm_per_prompt changes nothing: the model has no multimodal encoder" in d.assumptions
