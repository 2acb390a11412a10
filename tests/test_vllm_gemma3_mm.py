"""vLLM's multimodal profile run for Gemma 3 (serve/vllm_mm.py ``_fixed_image_profile``, facts/vllm_multimodal.py
``GEMMA3_MM_ROWS``): google/gemma-3-4b-it (SigLIP d 1,152, I 4,304, 27 layers, 896 / 14 = 64 patches a side; text
hidden 2,560), bf16, 8,192 batched tokens, 256 sequences, max_model_len 32,768."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.facts.vllm_multimodal import GEMMA3_MM_ROWS, gemma3_mm_row, mm_profile_read
from vramplan.serve.vllm import decide
from vramplan.serve.vllm_mm import mm_profile, mm_profile_modelled


def _resolved(version: str = "0.21.0", limit: int | None = None, batched: int = 8192, seqs: int = 256) -> Any:
    serve = {"max_model_len": 32768, "max_num_seqs": seqs, "max_num_batched_tokens": batched, "dtype": "bf16",
             "vllm_version": version, "limit_mm_per_prompt": limit}
    return resolve({"model": "google/gemma-3-4b-it", "task": "serve", "hardware": {"gpu": "H100-SXM"},
                    "framework": "vllm", "serve": serve})


def _mm(version: str, **kw: Any) -> Any:
    r = _resolved(version, **kw)
    sv = r.scenario.serve
    mm = mm_profile(r.model, 32768, sv.max_num_batched_tokens, sv.max_num_seqs, 2, sv.limit_mm_per_prompt,
                    tuple(int(x) for x in version.split(".")))
    assert mm is not None
    return mm


def test_adapter_marks_the_fixed_image() -> None:
    v = _resolved().model.vision
    # Gemma3Processor's full_image_sequence: "\n\n" <start_of_image> 256 x <image_soft_token> <end_of_image> "\n\n"
    assert (v.fixed_image_profile, v.image_wrap_tokens, v.tokens_per_image, v.patches_per_image) == (True, 4, 256, 4096)


def test_tower_bytes_per_patch_from_0100() -> None:
    mm = _mm("0.21.0")
    # held: pixels in bf16 3 x 14 x 14 x 2 = 1,176 + the embeddings 1,152 x 2 = 2,304 -> 3,480 B; attention 7 x 1,152 x
    # 2 = 16,128 B; MLP (3 x 1,152 + 2 x 4,304) x 2 = (3,456 + 8,608) x 2 = 24,128 B
    assert (mm.held_per_patch, mm.attention_per_patch, mm.mlp_per_patch) == (3_480, 16_128, 24_128)


def test_row_0210_embeds_budget_items_outputs_peak() -> None:
    mm = _mm("0.21.0")
    # the budget counts the 256 embeddings: budget max(8,192, 256) = 8,192; items: per prompt max(1, min(999,
    # 32,768 // 256 = 128)) = 128, max(1, min(8,192 // 256 = 32, 256 x 128)) = 32
    assert (mm.modality, mm.tokens_per_item, mm.budget_tokens, mm.items) == ("image", 256, 8192, 32)
    # outputs kept as they are: 32 x 256 x 2,560 x 2 = 41,943,040 B
    assert mm.output_bytes == 41_943_040
    # 32 x 4,096 = 131,072 patches x (3,480 + 24,128 = 27,608) = 3,618,635,776 B
    assert mm.encoder_peak_bytes == 131_072 * 27_608 == 3_618_635_776


def test_row_090_float32_pixels_and_cdiv() -> None:
    mm = _mm("0.9.0")
    # float32 pixels: 3 x 14 x 14 x 4 = 2,352 + 2,304 = 4,656 B held; items min(cdiv(8,192, 256) = 32, 256 x 999) = 32
    assert (mm.held_per_patch, mm.items, mm.tokens_per_item) == (4_656, 32, 256)
    assert mm.encoder_peak_bytes == 131_072 * (4_656 + 24_128) == 3_772_776_448
    assert mm.exact


def test_row_0110_placeholder_counted_and_scattered_into_the_budget() -> None:
    mm = _mm("0.11.0")
    # get_mm_max_contiguous_tokens: 256 + 4 = 260 tokens; items max(1, min(8,192 // 260 = 31, 256 x min(999, 126)))
    # = 31; each 256-row output scattered into zeros of 8,192 rows (256 < 8,192): 31 x (256 + 8,192) x 2,560 x 2 =
    # 31 x 8,448 x 5,120 = 1,340,866,560 B
    assert (mm.tokens_per_item, mm.items, mm.encoded_tokens_per_item) == (260, 31, 256)
    assert mm.output_bytes == 1_340_866_560
    assert mm.encoder_peak_bytes == 31 * 4096 * 27_608 == 3_505_553_408


def test_row_0120_scattered_into_the_placeholder() -> None:
    mm = _mm("0.12.0")
    # zeros of max_mm_tokens_per_item = 260 rows beside each 256-row output: 31 x (256 + 260) x 5,120 = 81,899,520 B
    assert mm.output_bytes == 81_899_520


def test_row_0130_embeds_again() -> None:
    mm = _mm("0.13.0")
    assert (mm.tokens_per_item, mm.items, mm.output_bytes) == (256, 32, 41_943_040)


def test_items_capped_by_sequences() -> None:
    mm = _mm("0.21.0", seqs=2, limit=3)
    # per prompt max(1, min(3, 128)) = 3; items max(1, min(32, 2 x 3 = 6)) = 6
    assert mm.items == 6


def test_limit_zero_disables_the_encoder() -> None:
    r = _resolved(limit=0)
    assert mm_profile(r.model, 32768, 8192, 256, 2, 0, (0, 21, 0)) is None


def test_row_082_features_scattered_and_limit_one() -> None:
    mm = _mm("0.8.2")
    # get_num_image_tokens: <start_of_image> + 256 + <end_of_image> = 258 (the "\n\n" tokens stripped); items
    # min(cdiv(8,192, 258) = 32, 256 x 1) = 32; outputs scattered into 258 NaN rows each: 32 x 258 x 2,560 x 2 =
    # 42,270,720 B; float32 pixels: held 2,352 + 2,304 = 4,656 B
    assert (mm.tokens_per_item, mm.items, mm.encoded_tokens_per_item, mm.held_per_patch) == (258, 32, 258, 4_656)
    assert mm.output_bytes == 42_270_720
    assert _mm("0.8.2", seqs=8).items == 8  # min(32, 8 x 1): the limit of 1 when not set
    assert _mm("0.9.0", seqs=8).items == 32  # min(32, 8 x 999)


def test_before_082_not_modelled() -> None:
    m = _resolved().model
    assert not mm_profile_modelled((0, 8, 1), m) and mm_profile_modelled((0, 8, 2), m)
    assert not mm_profile_read((0, 8, 1), 0, True) and mm_profile_read((0, 8, 2), 0, True)
    d = decide(_resolved(version="0.8.0"), "0.8.0")
    assert d.mm_profile is None
    assert any(a.startswith("not modelled: the multimodal encoder of Gemma3ForConditionalGeneration")
               for a in d.assumptions)


def test_report_states_the_profile() -> None:
    rep = estimate(_resolved())
    assert not [a for a in rep.assumptions if a.startswith("not modelled:") and "encoder" in a]
    note = next(a for a in rep.assumptions if a.startswith("multimodal profile run (vLLM 0.21.0"))
    assert "32 image item(s) of 256 tokens" in note and "not set: 999" in note and "896 x 896" in note


def test_decision_keeps_the_outputs() -> None:
    on, off = decide(_resolved(version="0.11.0"), "0.11.0"), decide(_resolved(version="0.11.0", limit=0), "0.11.0")
    assert on.mm_profile is not None and off.mm_profile is None
    # the encoder's moment: 3,505,553,408 B; the language model's moment with the 1,340,866,560 B of outputs and zeros
    lm = on.activation_peak_bytes - on.cublas_workspace_bytes
    assert lm >= on.mm_profile.encoder_peak_bytes
    assert any("the whole placeholder: 256 embeddings and 4 begin/end-of-image" in a for a in on.assumptions)


def test_release_between_rows_takes_the_nearest_earlier() -> None:
    d = decide(_resolved(version="0.10.1"), "0.10.1")
    assert d.mm_profile is not None and d.mm_profile.fixed is not None
    assert d.mm_profile.fixed.first == (0, 10, 0) and not d.mm_profile.exact
    assert any("this release not read: the rules from 0.10.0 on" in a for a in d.assumptions)


@pytest.mark.parametrize(("version", "read"), [("0.8.2", True), ("0.8.4", False), ("0.9.0", True), ("0.11.0", True), ("0.14.0", True),
                                               ("0.19.0", False), ("0.26.0", True), ("0.33.0", True)])
def test_unread_tower_is_stated(version: str, read: bool) -> None:
    d = decide(_resolved(version=version), version)
    notes = [a for a in d.assumptions if a.startswith("not modelled: the vision tower's forward")]
    assert bool(notes) is not read


@pytest.mark.parametrize("row", GEMMA3_MM_ROWS, ids=lambda r: ".".join(map(str, r.first)))
def test_every_row_read_and_sourced(row: Any) -> None:
    assert row.first in row.read_at and row.first in row.tower_read_at and row.sources
    assert gemma3_mm_row(row.first) == (row, True)
