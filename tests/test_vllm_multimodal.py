"""vLLM's multimodal profile run (serve/vllm_mm.py, facts/vllm_multimodal.py): Qwen2.5-VL-7B-Instruct, 0.8.0-0.33.0."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.facts.vllm_multimodal import MM_PROFILE_RULES, mm_profile_rule
from vramplan.facts.vllm_releases import parse_release
from vramplan.serve.vllm import decide
from vramplan.serve.vllm_mm import _kept_rows, mm_profile, mm_profile_modelled, qwen_vl_item

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
    # counted: room 128,000 - 16,384 = 111,616 tokens: 6 temporal patches x 16,384 = 98,304 fit, 7 do not; 12 frames
    # (13 pad to 14 = 7); one video of 12 frames: 98,304 tokens > 16,384, so the video; budget max(16,384, 98,304)
    assert (mm.modality, mm.tokens_per_item) == ("video", 98_304)
    assert (mm.budget_tokens, mm.items) == (98_304, 1)
    # encoded: the dummy video is built for max_num_batched_tokens 16,384 less the 1 image's 16,384 = 0 tokens of
    # room: 0 frames, at least 1 (padded to 2: 1 temporal patch): 65,536 patches, 16,384 output rows
    assert (mm.frames, mm.patches_per_item, mm.encoded_tokens_per_item) == (1, 65_536, 16_384)
    assert mm.output_bytes == 16_384 * 3_584 * 2


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
    d = decide(_resolved(version="0.11.0", limit=None), "0.11.0")
    assert d.mm_profile is not None
    # 0.11.0: 128,000 tokens of room (no image subtracted): 7 temporal patches fit, 14 frames (the cap, 14); encoded
    # for max_model_len too: 7 x 65,536 = 458,752 patches x (2,512 + max(51,520, 33,320)) = 24,787,288,064 B (the
    # pixels in bf16, cast by the processor from 0.10.0), above the language model's moment
    assert d.mm_profile.encoder_peak_bytes == 458_752 * 54_032 == 24_787_288_064
    assert d.activation_peak_bytes == d.mm_profile.encoder_peak_bytes + d.cublas_workspace_bytes


@pytest.mark.parametrize("version", ["0.7.0"])
def test_release_not_read_keeps_the_assumption(version: str) -> None:
    # V0 before 0.7.2 had no Qwen2.5-VL (qwen2_5_vl.py): its profile run is not modelled (tests/test_vllm_mm_v0.py has
    # the V0 releases that are)
    d = decide(_resolved(version=version), version)
    assert d.mm_profile is None
    assert any(a.startswith("not modelled: the multimodal encoder of Qwen2_5_VLForConditionalGeneration") for a in
               d.assumptions)


def test_release_between_rows_takes_the_nearest_earlier() -> None:
    d = decide(_resolved(version="0.9.0"), "0.9.0")
    assert d.mm_profile is not None and d.mm_profile.rule is not None
    assert d.mm_profile.rule.first == (0, 8, 0) and not d.mm_profile.exact
    assert any("this release not read: the rules from 0.8.0 on (the nearest earlier) are assumed" in a
               for a in d.assumptions)


def test_family_without_checkpoint_pixels_not_modelled() -> None:
    m = _resolved().model
    assert mm_profile_modelled((0, 8, 2), m)
    # a tower whose processor's max_pixels is not known (LLaVA and mllama adapters set none; Gemma 3 takes
    # fixed_image_profile instead, tests/test_vllm_gemma3_mm.py)
    assert not mm_profile_modelled((0, 8, 2), replace(m, vision=replace(m.vision, checkpoint_max_pixels=0)))
    assert not mm_profile_modelled((0, 8, 2), replace(m, vision=None))


def test_report_states_the_profile_instead_of_not_modelled() -> None:
    from vramplan.engine import estimate

    modelled, unread = estimate(_resolved()), estimate(_resolved(version="0.7.0"))
    assert not [a for a in modelled.assumptions if a.startswith("not modelled:") and "encoder" in a]
    assert [a for a in modelled.assumptions if a.startswith("multimodal profile run (vLLM 0.8.2")]
    assert [a for a in unread.assumptions if a.startswith("not modelled: vLLM's encoder cache")]


def test_limit_on_a_text_model_is_stated() -> None:
    text = {k: v for k, v in QWEN25_VL_7B.items() if k != "vision_config"}
    d = decide(_resolved(model={**text, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}), "0.8.2")
    assert d.mm_profile is None
    assert "serve.limit_mm_per_prompt changes nothing: the model has no multimodal encoder" in d.assumptions


# ---- by release (facts/vllm_multimodal.py MM_PROFILE_RULES: one test per row) ----

def _mm(version: str, max_len: int, batched: int, seqs: int, limit: int | None) -> Any:
    mm = mm_profile(_resolved().model, max_len, batched, seqs, 2, limit, parse_release(version))
    assert mm is not None and mm.rule is not None
    return mm


def test_row_080_limits_count_the_images() -> None:
    # 0.8.x: limit 2 counts 2 images: room 128,000 - 2 x 16,384 = 95,232: 5 temporal patches (81,920), 10 frames, / 2
    # videos = 5 frames, padded to 6: 3 temporal patches = 49,152 tokens, the video; budget max(16,384, 49,152);
    # items min(cdiv(49,152, 49,152), 1,024 x 2) = 1
    mm = _mm("0.8.0", 128000, 16384, 1024, 2)
    assert (mm.modality, mm.tokens_per_item, mm.budget_tokens, mm.items) == ("video", 49_152, 49_152, 1)
    # encoded: 16,384 less 2 images' tokens: no room, 1 frame = 16,384 tokens
    assert mm.encoded_tokens_per_item == 16_384


def test_row_091_one_image_and_triton_rotary() -> None:
    # 0.9.1: one image and one video counted whatever the limit: room 128,000 - 16,384: 12 frames, 98,304 tokens
    mm = _mm("0.9.1", 128000, 16384, 1024, 2)
    assert (mm.modality, mm.tokens_per_item, mm.items) == ("video", 98_304, 1)
    # encoded for 16,384 tokens with no image: 2 frames (3 pad to 4 = 2 patches, too many) = 1 temporal patch
    assert (mm.frames, mm.encoded_tokens_per_item, mm.patches_per_item) == (2, 16_384, 65_536)
    # Triton rotary: 9 x 1,280 x 2 + 8 x 1,280 + 4 x 80 = 23,040 + 10,240 + 320 = 33,600 B a patch at attention
    assert mm.attention_per_patch == 33_600
    assert mm.encoder_peak_bytes == 65_536 * (7_216 + 33_600) == 2_674_917_376


def test_row_0100_floor_items_and_full_dummy() -> None:
    # 0.10.0: the dummy video is built for its own 98,304 tokens: 12 frames, all encoded
    mm = _mm("0.10.0", 128000, 16384, 1024, 1)
    assert (mm.frames, mm.encoded_tokens_per_item, mm.patches_per_item) == (12, 98_304, 393_216)
    assert mm.output_bytes == 98_304 * 3_584 * 2 == 704_643_072
    # images: max_model_len 32,768 less 1 image's 16,384 leaves 1 temporal patch for a video, a tie the image wins;
    # budget 40,000: max(1, min(40,000 // 16,384 = 2, 4 x 2)) = 2 (0.8.x-0.9.x: cdiv = 3)
    assert (_mm("0.10.0", 32768, 40000, 4, 2).items, _mm("0.9.1", 32768, 40000, 4, 2).items) == (2, 3)


def test_row_0101_items_per_prompt_capped_by_max_model_len() -> None:
    # 0.10.1: per prompt max(1, min(10, 32,768 // 16,384 = 2)) = 2; items max(1, min(65,536 // 16,384 = 4, 1 x 2)) = 2;
    # 0.10.0: min(4, 1 x 10) = 4
    assert (_mm("0.10.1", 32768, 65536, 1, 10).items, _mm("0.10.0", 32768, 65536, 1, 10).items) == (2, 4)
    # the dummy video is built for max_num_batched_tokens again (16,384: 2 frames)
    assert _mm("0.10.2", 128000, 16384, 1024, 1).encoded_tokens_per_item == 16_384


def test_row_0110_outputs_scattered_into_the_budget() -> None:
    # 0.11.0, max_model_len 20,000: a video gets 1 temporal patch (16,384), a tie the image wins; budget 40,000; per
    # prompt max(1, min(2, 20,000 // 16,384 = 1)) = 1; items max(1, min(2, 4 x 1)) = 2.  Each output's 16,384 rows
    # are scattered into zeros of 40,000 rows, the outputs kept too: 2 x (16,384 + 40,000) x 3,584 x 2 B
    mm = _mm("0.11.0", 20000, 40000, 4, 2)
    assert (mm.modality, mm.budget_tokens, mm.items) == ("image", 40_000, 2)
    assert mm.output_bytes == 2 * 56_384 * 3_584 * 2 == 808_321_024
    # 128,000 tokens: no image subtracted, 14 frames (the cap from 0.11.0) = 7 temporal patches = 114,688 tokens
    assert _mm("0.11.0", 128000, 16384, 1024, 1).tokens_per_item == 114_688


def test_row_0120_outputs_scattered_into_the_item() -> None:
    # 0.12.0: zeros of the tokens per item (16,384), as many as the output's rows: nothing scattered
    assert _mm("0.12.0", 20000, 40000, 4, 2).output_bytes == 2 * 16_384 * 3_584 * 2 == 234_881_024
    rule = mm_profile_rule((0, 12, 0))[0]
    # an output of 100 rows for an item of 200 tokens, budget 300: 100 + 200 kept (0.11.0: 100 + 300; 0.13.0: 100)
    assert (_kept_rows(rule, 100, 200, 300), _kept_rows(mm_profile_rule((0, 11, 0))[0], 100, 200, 300),
            _kept_rows(mm_profile_rule((0, 13, 0))[0], 100, 200, 300)) == (300, 400, 100)


def test_row_0130_image_by_factor_pair() -> None:
    v = replace(_resolved().model.vision, checkpoint_max_pixels=1_003_520)
    # smart_resize (to 0.12.x): sqrt(9,999,999^2 / 1,003,520) scales the side to 1,001.76, floor(/ 28) x 28 = 980:
    # (980 / 14)^2 = 4,900 patches, / 4 = 1,225 tokens
    assert qwen_vl_item(v, "smart_resize") == (4_900, 1_225)
    # factor (0.13.0 on): 1,003,520 // 28^2 = 1,280 tokens = 32 x 40 (isqrt 35, 34, 33 do not divide): 5,120 patches
    assert qwen_vl_item(v, "factor") == (5_120, 1_280)
    # the checkpoint's 12,845,056: 16,384 = 128 x 128 either way
    assert qwen_vl_item(_resolved().model.vision, "factor") == (65_536, 16_384)


def test_row_0130_outputs_kept_as_they_are() -> None:
    # 0.13.0-0.16.0: each output in the cache as encoded, 2 x 16,384 x 3,584 x 2 B
    assert _mm("0.16.0", 20000, 40000, 4, 2).output_bytes == _mm("0.13.0", 20000, 40000, 4, 2).output_bytes == 234_881_024


def test_row_0170_tie_goes_to_the_video() -> None:
    # 0.17.0: the same 16,384 tokens for an image and a 2-frame video: max by (tokens, name) picks "video"
    mm = _mm("0.17.0", 20000, 40000, 4, 2)
    assert (mm.modality, mm.frames, mm.patches_per_item, mm.items) == ("video", 2, 65_536, 2)
    assert _mm("0.16.0", 20000, 40000, 4, 2).modality == "image"


@pytest.mark.parametrize("row", MM_PROFILE_RULES, ids=lambda r: ".".join(map(str, r.first)))
def test_every_row_read_and_sourced(row: Any) -> None:
    assert row.first in row.read_at and row.sources
    assert mm_profile_rule(row.first) == (row, True)


def test_row_0110_tower_by_patch() -> None:
    mm = _mm("0.11.0", 128000, 16384, 1024, 1)
    # held: 1,176 pixels in bf16 (cast by the processor from 0.10.0) x 2 + 40 x 4 (rotary) = 2,512 B;
    # attention: 12 x 1,280 x 2 (residual, norm1, qkv 3d, q k v 3d, cat(q, k) 2d, rotated 2d) + 16 x 1,280 (float32
    # input and output of 2d) + 4 x 80 (cos, sin) = 30,720 + 20,480 + 320 = 51,520 B;
    # MLP: (5 x 1,280 + 3 x 3,420) x 2 = 33,320 B
    assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (2_512, 51_520, 33_320)


def test_row_0120_tower_rotates_a_view_in_the_dtype() -> None:
    mm = _mm("0.12.0", 128000, 16384, 1024, 1)
    # held: 1,176 pixels in bf16 x 2 + cos and sin of 40 each in bf16 (80 x 2) = 2,352 + 160 = 2,512 B;
    # attention at the projection: residual, norm1, qkv 3d, q and k rotated (a view of qkv, 2d), the attention's
    # output and the projection's (d each) = 9 x 1,280 x 2 = 23,040 B; MLP (5 x 1,280 + 3 x 3,420) x 2 = 33,320 B
    assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (2_512, 23_040, 33_320)
    # one 14-frame video of 114,688 tokens, 7 x 65,536 = 458,752 patches: 458,752 x (2,512 + max(23,040, 33,320)) =
    # 458,752 x 35,832 = 16,438,001,664 B (0.11.0: 458,752 x (2,512 + 51,520) = 24,787,288,064 B)
    assert (mm.items, mm.patches) == (1, 458_752)
    assert mm.encoder_peak_bytes == 16_438_001_664


def test_row_0150_tower_copies_q_and_k_contiguous() -> None:
    # 0.13.0 and 0.14.0 rotate the view still (ApplyRotaryEmb on qk_reshaped as it is): 9 x 1,280 x 2 = 23,040 B
    assert _mm("0.14.0", 128000, 16384, 1024, 1).attention_per_patch == 23_040
    for version in ("0.15.0", "0.21.0"):
        mm = _mm(version, 128000, 16384, 1024, 1)
        # qk_reshaped.contiguous() adds 2d: 11 x 1,280 x 2 = 28,160 B, still below the MLP's 33,320 B
        assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (2_512, 28_160, 33_320)


def test_qwen2_vl_tower_joins_q_and_k_by_cat_from_0120() -> None:
    cfg = json.loads((Path(__file__).resolve().parent / "data" / "qwen2-vl-2b-shape" / "config.json").read_text())
    m = _resolved(model=cfg).model
    for version in ("0.12.0", "0.21.0"):
        mm = mm_profile(m, 32768, 16384, 256, 2, 1, parse_release(version))
        assert mm is not None
        # d 1,280, I = 4 x 1,280 = 5,120: held 1,176 x 2 + 80 x 2 = 2,512 B; attention 9d + torch.cat([q, k]) 2d =
        # 11 x 1,280 x 2 = 28,160 B; MLP (2 x 1,280 + 3 x 5,120) x 2 = 35,840 B
        assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (2_512, 28_160, 35_840)


@pytest.mark.parametrize(("version", "read"), [("0.11.0", True), ("0.12.0", True), ("0.13.0", True),
                                               ("0.14.0", True), ("0.15.0", True), ("0.15.1", True),
                                               ("0.21.0", True), ("0.24.0", False), ("0.33.0", False)])
def test_unread_tower_widens_the_band(version: str, read: bool) -> None:
    d = decide(_resolved(version=version), version)
    notes = [a for a in d.assumptions if a.startswith("not modelled: the vision tower's forward")]
    assert bool(notes) is not read
    if version == "0.33.0":
        assert "assumed as read at 0.15.0, 0.15.1, 0.16.0, 0.17.0, 0.18.0, 0.21.0 " in notes[0]


def test_model_runner_v2_encoder_profile_is_stated_not_modelled() -> None:
    # Qwen2.5-VL-7B (Qwen2_5_VLForConditionalGeneration, dense): V1 at 0.24.0 (not a listed architecture), Model Runner
    # V2 from 0.25.0 (any non-MoE model: facts/vllm_releases.py MODEL_RUNNER_RULES), whose encoder profile is not read
    note = "not modelled: Model Runner V2's encoder profile"
    v1, v2 = (decide(_resolved(v), version=v) for v in ("0.24.0", "0.25.0"))
    assert not [a for a in v1.assumptions if a.startswith(note)]
    assert [a for a in v2.assumptions if a.startswith(note)]


def test_unset_limit_is_one_in_0_8_and_999_under_v1() -> None:
    # MultiModalConfig.get_limit_per_prompt: 0.8.2 "defaults to `1`"; 0.9.0 and 0.11.0 "999 if envs.VLLM_USE_V1
    # else 1".  0.9.0 (the 0.8.x runner rows): the image (16,384 tokens) is the item, and cdiv(65,536, 16,384) = 4
    # items are capped by max_num_seqs 1 x the limit: 4 with the unset limit (999), 1 with limit 1
    m = _resolved().model
    for version, default in (("0.8.2", 1), ("0.9.0", 999), ("0.11.0", 999)):
        rel = parse_release(version)
        unset = mm_profile(m, 32768, 65536, 1, 2, None, rel)
        given = mm_profile(m, 32768, 65536, 1, 2, default, rel)
        assert unset is not None and given is not None and unset.items == given.items
        assert unset.limit_default == default
    one = mm_profile(m, 32768, 65536, 1, 2, 1, parse_release("0.9.0"))
    many = mm_profile(m, 32768, 65536, 1, 2, None, parse_release("0.9.0"))
    assert one is not None and many is not None
    assert many.modality == "image" and many.tokens_per_item == 16384
    assert (many.items, one.items) == (4, 1)
