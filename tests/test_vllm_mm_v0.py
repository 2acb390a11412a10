"""vLLM's V0 multimodal profile run (serve/vllm_mm.py ``mm_profile_v0``, facts/vllm_multimodal.py ``MM_V0_RULES``):
Qwen2.5-VL-7B-Instruct and Qwen2-VL-2B (shape), 0.6.3-0.7.3.

Per patch of both towers (d 1,280, 16 heads of 80, patch 14, 2 frames, 3 channels: 1,176 pixel values; bf16), the
``torch`` row with the pixels in float32 as every V0 release passes them: held 1,176 x 4 + 1,176 x 2 + 40 x 4 =
7,216 B; attention 8 x 1,280 x 2 + 4 x 1,280 x 4 + 3 x 80 x 4 = 20,480 + 20,480 + 960 = 41,920 B; MLP Qwen2.5-VL
(3 x 1,280 + 3 x 3,420) x 2 = 28,200 B, Qwen2-VL (2 x 1,280 + 3 x 5,120) x 2 = 35,840 B: 7,216 + 41,920 = 49,136 B
a patch for both.  The float32 pixels of a patch: 1,176 x 4 = 4,704 B."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from test_vllm_multimodal import QWEN25_VL_7B
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_multimodal import MM_V0_RULES, mm_v0_read, mm_v0_rule
from vramplan.serve.vllm import decide
from vramplan.serve.vllm_mm import MmProfile, encoder_bound, mm_profile_v0, mm_v0_modelled

PER_PATCH = 49_136
PIXELS_F32 = 4_704
QWEN2_VL_2B = json.loads((Path(__file__).resolve().parent / "data" / "qwen2-vl-2b-shape" / "config.json").read_text())


def _model(cfg: dict[str, Any] | None = None) -> Any:
    serve = {"max_model_len": 32768, "max_num_seqs": 256, "max_num_batched_tokens": 32768, "dtype": "bf16",
             "vllm_version": "0.7.3"}
    return resolve({"model": cfg or QWEN25_VL_7B, "task": "serve", "hardware": {"gpu": "H100-SXM"},
                    "framework": "vllm", "serve": serve}).model


def _v0(version: str, max_model_len: int, batched: int, seqs: int, limit: int | None,
        cfg: dict[str, Any] | None = None) -> MmProfile:
    mm = mm_profile_v0(_model(cfg), max_model_len, batched, seqs, 2, limit, tuple(map(int, version.split("."))))
    assert mm is not None and mm.v0 is not None
    return mm


def test_rows_by_release() -> None:
    assert [r.first for r in MM_V0_RULES] == [(0, 6, 1), (0, 6, 5), (0, 6, 6), (0, 7, 0), (0, 7, 3)]
    assert mm_v0_rule((0, 6, 0)) is None and mm_v0_rule((0, 8, 0)) is None
    assert mm_v0_rule((0, 6, 4)) == (MM_V0_RULES[0], False)  # not read: the 0.6.3 row assumed
    assert mm_v0_rule((0, 7, 2)) == (MM_V0_RULES[3], True)
    # Qwen2.5-VL (gated tower MLP) only from 0.7.2 (vLLM had no qwen2_5_vl.py before)
    assert not mm_v0_read((0, 7, 0), 12_845_056, gated=True) and mm_v0_read((0, 7, 2), 12_845_056, gated=True)
    assert mm_v0_read((0, 6, 6), 12_845_056) and not mm_v0_read((0, 6, 6), 0)


def test_0_7_3_one_sequence_one_image_one_video() -> None:
    mm = _v0("0.7.3", 32768, 32768, 256, None)
    v0 = mm.v0
    assert v0 is not None
    # image: 3,584 x 3,584, 65,536 patches, 16,384 tokens; video at max_model_len: room 32,768 - 16,384 = 16,384: 2
    # frames (3 pad to 4 = 2 temporal patches, 32,768 > 16,384), 1 temporal patch, 16,384 tokens; limit 1 (unset):
    # max_mm_tokens 16,384 + 16,384 = 32,768; sequences min(256, 32,768 // 32,768) = 1 of 32,768 tokens; its prompt
    # 16,384 + 16,384 = 32,768 <= 32,768: the items stay
    assert (v0.max_mm_tokens, v0.seqs, v0.seqs_with_items) == (32_768, 1, 1)
    assert (v0.images, v0.image_patches, v0.videos, v0.video_patches, v0.video_tokens) == (1, 65_536, 1, 65_536,
                                                                                         16_384)
    assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (7_216, 41_920, 28_200)
    # inputs_embeds first: 32,768 x 3,584 x 2 = 234,881,024 B
    assert v0.embeds_bytes == 234_881_024
    # images: 65,536 x 49,136 + 234,881,024 + the video's pixels 65,536 x 4,704 = 3,220,176,896 + 234,881,024 +
    # 308,281,344 = 3,763,339,264 B
    assert v0.image_moment_bytes == 65_536 * PER_PATCH + 234_881_024 + 65_536 * PIXELS_F32 == 3_763_339_264
    # video: the same + the images' outputs 16,384 x 3,584 x 2 = 117,440,512 B: 3,880,779,776 B, the peak
    assert v0.video_moment_bytes == 3_763_339_264 + 117_440_512 == mm.encoder_peak_bytes
    # kept through the language model: the float32 pixels of both, 131,072 x 4,704 = 616,562,688 B (0.7.x frees the
    # outputs with get_input_embeddings_v0)
    assert mm.output_bytes == 131_072 * PIXELS_F32 == 616_562_688


def test_0_7_3_several_sequences() -> None:
    mm = _v0("0.7.3", 32768, 200_000, 4, 2)
    v0 = mm.v0
    assert v0 is not None
    # limit 2: video at max_model_len: room 32,768 - 2 x 16,384 = 0, 1 frame: 16,384; max_mm_tokens 2 x 16,384 +
    # 2 x 16,384 = 65,536; sequences min(4, 200,000 // 65,536 = 3) = 3: 200,000 = 2 x 66,667 + 66,666; each: room
    # 66,666 - 32,768 = 33,898: 4 frames (2 temporal patches), 2 a video: 1 temporal patch; prompt 65,536 fits
    assert (v0.max_mm_tokens, v0.seqs, v0.seqs_with_items) == (65_536, 3, 3)
    assert (v0.images, v0.image_patches, v0.videos, v0.video_patches) == (6, 393_216, 6, 393_216)
    # inputs_embeds 200,000 x 3,584 x 2 = 1,433,600,000 B; images 393,216 x 49,136 + 1,433,600,000 + 393,216 x 4,704
    # = 19,321,061,376 + 1,433,600,000 + 1,849,688,064 = 22,604,349,440 B
    assert v0.image_moment_bytes == 22_604_349_440
    # videos: + the images' outputs 98,304 x 3,584 x 2 = 704,643,072 B: 23,308,992,512 B
    assert mm.encoder_peak_bytes == 22_604_349_440 + 704_643_072 == 23_308_992_512


def test_0_7_2_rounds_frames_up_and_drops_the_items() -> None:
    # max_model_len 32,768, 65,536 batched tokens: 0.7.3 fits the largest video in the room, 0.7.2 overshoots it
    new, old = _v0("0.7.3", 32768, 65536, 256, None), _v0("0.7.2", 32768, 65536, 256, None)
    assert new.v0 is not None and old.v0 is not None
    # 0.7.2 at max_model_len: room 16,384: frames 3 (max(3 // 2, 1) = 1 patch), rounded up to 4: 2 temporal patches,
    # 32,768 tokens; max_mm_tokens 16,384 + 32,768 = 49,152; 65,536 // 49,152 = 1 sequence of 65,536; its video: room
    # 49,152, 7 frames (3 patches), rounded up to 8: 4 temporal patches, 65,536 tokens: prompt 81,920 > 65,536, so
    # the sequence is text only ("total_len > seq_len and not envs.VLLM_USE_V1")
    assert (old.v0.max_mm_tokens, old.v0.seqs, old.v0.seqs_with_items, old.v0.longest_seq) == (49_152, 1, 0, 81_920)
    assert (old.encoder_peak_bytes, old.output_bytes, old.items) == (0, 0, 0)
    # 0.7.3: max_mm_tokens 32,768, 65,536 // 32,768 = 2 sequences of 32,768 (as test_0_7_3_one_sequence...) each
    assert (new.v0.seqs, new.v0.seqs_with_items, new.v0.images, new.v0.videos) == (2, 2, 2, 2)


def test_0_6_6_images_only_encoded_first_outputs_kept() -> None:
    mm = _v0("0.6.6", 32768, 32768, 256, None, QWEN2_VL_2B)
    v0 = mm.v0
    assert v0 is not None
    # the registry: image 16,384 + a one-temporal-patch video 16,384 = 32,768: 1 sequence; the dummy: 1 image, no video
    assert (v0.max_mm_tokens, v0.seqs, v0.images, v0.videos) == (32_768, 1, 1, 0)
    assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (7_216, 41_920, 35_840)
    # get_multimodal_embeddings before inputs_embeds: 65,536 x 49,136 = 3,220,176,896 B
    assert v0.embeds_bytes == 0 and mm.encoder_peak_bytes == 3_220_176_896
    # kept: the pixels 65,536 x 4,704 = 308,281,344 B and the outputs (a local of forward) 16,384 x 1,536 x 2 =
    # 50,331,648 B
    assert mm.output_bytes == 308_281_344 + 50_331_648 == 358_612_992


def test_0_6_3_caps_max_pixels_and_fills_the_sequences() -> None:
    mm = _v0("0.6.3", 32768, 32768, 256, None, QWEN2_VL_2B)
    v0 = mm.v0
    assert v0 is not None
    # max_pixels min(12,845,056, 1,003,520): smart_resize of the square: floor(1,001.76 / 28) x 28 = 980 a side,
    # 70 x 70 = 4,900 patches, 1,225 tokens; max_mm_tokens 1,225 + 1,225 = 2,450; min(256, 32,768 // 2,450 = 13) = 13
    # sequences of 2,520 or 2,521 tokens (>= 1,225 + 2), 1 image each
    assert (mm.patches_per_item, mm.tokens_per_item) == (4_900, 1_225)
    assert (v0.max_mm_tokens, v0.seqs, v0.images, v0.image_patches) == (2_450, 13, 13, 63_700)
    # embed_tokens first: 32,768 x 1,536 x 2 = 100,663,296 B; 63,700 x 49,136 + 100,663,296 = 3,230,626,496 B
    assert v0.embeds_bytes == 100_663_296
    assert mm.encoder_peak_bytes == 63_700 * PER_PATCH + 100_663_296 == 3_230_626_496
    # kept: 63,700 x 4,704 + 15,925 x 1,536 x 2 = 299,644,800 + 48,921,600 = 348,566,400 B
    assert mm.output_bytes == 348_566_400


def test_0_6_3_refuses_a_sequence_shorter_than_its_images() -> None:
    # 1,000 batched tokens: 1 sequence of 1,000 < 1,225 + 2: vLLM raises "Qwen2-VL cannot process 1 images"
    with pytest.raises(ScenarioError, match="cannot process 1 images in a prompt"):
        mm_profile_v0(_model(QWEN2_VL_2B), 32768, 1000, 256, 2, None, (0, 6, 3))


def test_limit_zero_profiles_nothing() -> None:
    assert mm_profile_v0(_model(), 32768, 32768, 256, 2, 0, (0, 7, 3)) is None


def _decide(version: str, limit: int | None = None, **serve: Any) -> Any:
    sv = {"max_model_len": 32768, "max_num_seqs": 256, "max_num_batched_tokens": 32768, "dtype": "bf16",
          "vllm_version": version, "limit_mm_per_prompt": limit, **serve}
    r = resolve({"model": QWEN25_VL_7B, "task": "serve", "hardware": {"gpu": "H100-SXM"}, "framework": "vllm",
                 "serve": sv})
    return decide(r, version)


def test_decision_takes_the_v0_encoder_from_the_kv_pool() -> None:
    on, off = _decide("0.7.3"), _decide("0.7.3", limit=0)
    assert on.mm_profile is not None and off.mm_profile is None
    assert mm_v0_modelled((0, 7, 3), resolve({"model": QWEN25_VL_7B, "task": "serve", "hardware": {"gpu": "H100-SXM"},
                                              "framework": "vllm", "serve": {"vllm_version": "0.7.3"}}).model)
    lm = max(on.forward_peak_bytes, on.sampler_peak_bytes)
    expected = max(on.mm_profile.encoder_peak_bytes, lm + on.mm_profile.output_bytes)
    assert on.activation_peak_bytes - on.cublas_workspace_bytes == expected
    assert on.kv_cache_bytes < off.kv_cache_bytes
    assert any("V0 engine, facts/vllm_multimodal.py MM_V0_RULES" in a for a in on.assumptions)
    assert not any(a.startswith("not modelled: the multimodal encoder") for a in on.assumptions)
    assert any("V0 dummy sequences carry no item" in a for a in off.assumptions)


def test_decision_states_dropped_items() -> None:
    # 16,384 batched tokens: the one sequence (16,384) is shorter than its image and video (32,768): nothing encoded
    d = _decide("0.7.3", max_num_batched_tokens=16384)
    assert d.mm_profile is not None and d.mm_profile.encoder_peak_bytes == 0
    assert any("the profile run encodes nothing" in a for a in d.assumptions)


def test_0_6_5_encodes_before_the_embeddings() -> None:
    mm = _v0("0.6.5", 32768, 32768, 256, None, QWEN2_VL_2B)
    assert mm.v0 is not None
    # the 0.6.3 batch (13 sequences, 63,700 patches), but get_multimodal_embeddings runs before inputs_embeds:
    # 63,700 x 49,136 = 3,129,963,200 B; the outputs kept as in 0.6.3
    assert (mm.v0.seqs, mm.v0.image_patches, mm.v0.embeds_bytes) == (13, 63_700, 0)
    assert mm.encoder_peak_bytes == 63_700 * PER_PATCH == 3_129_963_200
    assert mm.output_bytes == 348_566_400


@pytest.mark.parametrize("row", MM_V0_RULES, ids=lambda r: ".".join(map(str, r.first)))
def test_v0_row_is_sourced_and_read_within_its_range(row: Any) -> None:
    later = [r.first for r in MM_V0_RULES if r.first > row.first]
    assert row.sources and all(row.first <= at < (later[0] if later else (0, 8, 0)) for at in row.read_at)
    assert all(at in row.read_at for at in row.tower_read_at)


# ---- a multimodal combination that is not modelled: stated, with the KV band lowered by a derived bound ----


def test_encoder_bound_arithmetic() -> None:
    m = _model()
    # V1: item max(32,768, 1,225) = 32,768 tokens; budget max(16,384, 32,768) = 32,768; + one item: 65,536 tokens;
    # patches 65,536 x 4,900 / 1,225 = 262,144; per patch (serve/vllm_mm.py encoder_bound) held 1,176 x 6 + 80 x 4 +
    # 1,280 x 2 = 9,936 B, attention 12 x 1,280 x 2 + 16 x 1,280 + 12 x 80 = 52,160 B (MLP 33,320 B): 62,096 B;
    # 262,144 x 62,096 = 16,278,093,824 B; outputs 2 x 65,536 x 3,584 x 2 = 939,524,096 B
    b = encoder_bound(m, 32768, 16384, 2, None, v0=False)
    assert b is not None
    assert (b.tokens, b.patches, b.per_patch) == (65_536, 262_144, 62_096)
    assert (b.encoder_bytes, b.output_bytes) == (16_278_093_824, 939_524_096)
    # V0, limit 1 (unset): 32,768 + 2 x 1 x 32,768 = 98,304 tokens, 393,216 patches
    v0 = encoder_bound(m, 32768, 16384, 2, None, v0=True)
    assert v0 is not None and (v0.tokens, v0.patches) == (98_304, 393_216)
    zero = encoder_bound(m, 32768, 16384, 2, 0, v0=True)
    assert zero is not None and zero.bytes == 0


def test_unmodelled_combination_states_it_and_widens_the_kv_band() -> None:
    from vramplan.engine import estimate
    from vramplan.report.band import band_bounds, with_band

    # Qwen2.5-VL at vLLM 0.7.0 (V0; vLLM had no Qwen2.5-VL before 0.7.2): not modelled
    sv = {"max_model_len": 32768, "max_num_seqs": 256, "max_num_batched_tokens": 32768, "dtype": "bf16",
          "vllm_version": "0.7.0"}
    r = resolve({"model": QWEN25_VL_7B, "task": "serve", "hardware": {"gpu": "H100-SXM"}, "framework": "vllm",
                 "serve": sv})
    assert not mm_v0_modelled((0, 7, 0), r.model)
    d = decide(r, "0.7.0")
    assert d.mm_profile is None
    # V0 bound: max(32,768, 32,768) + 2 x 32,768 = 98,304 tokens: 24,417,140,736 + 2 x 98,304 x 3,584 x 2 =
    # 24,417,140,736 + 1,409,286,144 = 25,826,426,880 B
    assert d.encoder_bound_bytes == 25_826_426_880
    notes = [a for a in d.assumptions if a.startswith("not modelled: the multimodal encoder")]
    assert notes and "an upper bound of what the profile run takes, 24.05 GiB" in notes[0]
    rep = estimate(r)
    kv = rep.serve.kv_cache_bytes
    # the report's KV class (the widest of the calibration: "not modelled" widens it, report/band.py)
    q = rep.band["classes"]["kv_cache"]["log_quantile"]
    assert any(a.startswith("band widened to the widest class") for a in rep.assumptions)
    # that class's low end alone would be kv x e^-q; the bound takes it to (kv - bound) x e^-q
    # (the band key's quantile is rounded to 6 decimals: equal to a millionth)
    assert rep.serve.kv_cache_bytes_low == pytest.approx(band_bounds(max(kv - 25_826_426_880, 0), q)[0], rel=1e-6)
    assert rep.serve.kv_cache_bytes_low < band_bounds(kv, q)[0]
    # the bound travels with the report: banding it again (as a validation run does with a held-out calibration)
    # keeps the widened low end
    assert rep.band["kv_unmodelled_bytes"] == 25_826_426_880
    assert with_band(rep).serve.kv_cache_bytes_low == rep.serve.kv_cache_bytes_low


def test_v1_release_falling_back_to_v0_takes_the_v0_profile() -> None:
    # vLLM 0.8.2 on a T4 (compute capability 7.5 < 8.0: arg_utils.py _is_v1_supported_oracle, 0.8.0:1475, falls back
    # to V0): the whole decision, the multimodal profile run included, is the V0 engine's as 0.7.3 runs it
    # (serve/vllm.py decide, facts/vllm_releases.py V0_ENGINE_STANDIN), with nothing left unmodelled (no bound); an
    # A100 (8.0) stays on V1
    sv = {"max_model_len": 8192, "max_num_seqs": 16, "max_num_batched_tokens": 8192, "dtype": "fp16",
          "vllm_version": "0.8.2"}
    pinned = decide(resolve({"model": QWEN2_VL_2B, "task": "serve", "hardware": {"gpu": "T4"}, "framework": "vllm",
                             "serve": {**sv, "vllm_version": "0.7.3"}}), "0.7.3")
    for gpu, falls in (("T4", True), ("A100-SXM4-40GB", False)):
        r = resolve({"model": QWEN2_VL_2B, "task": "serve", "hardware": {"gpu": gpu}, "framework": "vllm",
                     "serve": sv})
        d = decide(r, "0.8.2")
        assert d.assumptions[0].startswith("vLLM 0.8.2 falls back to the V0 engine on this GPU") is falls
        if falls:
            assert d.mm_profile is not None and d.mm_profile == pinned.mm_profile
            assert d.num_gpu_blocks == pinned.num_gpu_blocks and d.encoder_bound_bytes == 0
