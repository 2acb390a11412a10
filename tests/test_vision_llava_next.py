"""LLaVA-NeXT (spec/families/llava_next.py): LLaVA's tower and projector with image_newline, against transformers'
module on the meta device; anyres tiles and image tokens by hand and against transformers' own functions; the
tower's activations per tile in training and in the prefill."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from meta_build import meta_module
from vramplan.catalog.resolve import resolve
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid, image_tiles, select_best_resolution

# llava-v1.6-vicuna-7b's shape: llava-1.5-7b's CLIP tower and Vicuna-7B (32,064 tokens) with LlavaNextConfig's
# default image_grid_pinpoints
CONFIG = Path(__file__).resolve().parent / "data" / "llava-next-7b-shape" / "config.json"


def _cfg() -> dict[str, Any]:
    return dict(json.loads(CONFIG.read_text()))


def _vision() -> Any:
    v = model_from_config(_cfg()).vision
    assert v is not None
    return v


def test_parameters_are_llavas_and_the_newline() -> None:
    m = model_from_config(_cfg(), name="llava-next")
    # llava-1.5-7b's 7,063,427,072 (tests/test_vision_llava.py) + image_newline, one 4096-wide vector
    assert m.num_parameters == 7_063_427_072 + 4096 == 7_063_431_168
    assert m.vision_parameters == 324_487_168 + 4096


def test_count_equals_transformers_module_on_the_meta_device() -> None:
    cfg = _cfg()
    spec = model_from_config(cfg, name="llava-next")
    module = meta_module(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("size", "tiles", "tokens"), [
    # 672 (and not given: the largest square of the grid): best resolution 672 x 672, 2 x 2 tiles + the base image;
    # tokens: 48 x 48 patches of the tiles (no unpadding for a square) + 48 newlines + 24 x 24 + 1 base, less the
    # class token (strategy "default") = 2,304 + 48 + 576 = 2,928
    (672, 5, 2928),
    (None, 5, 2928),
    # 336: every pinpoint keeps the whole 336^2; the least padding is 336 x 672 (the first of the tied two): 1 x 2
    # tiles + base = 3; 24 x 48 patches unpadded to 24 x 24 (padding (48 - 24) // 2 = 12 a side) + 24 newlines
    # + 576 = 1,176
    (336, 3, 1176),
    # 1000: 672 x 672 keeps the most (672^2); 5 passes and 2,928 tokens
    (1000, 5, 2928),
])
def test_anyres_tiles_and_tokens(size: int | None, tiles: int, tokens: int) -> None:
    v = _vision()
    assert image_tiles(v, size) == tiles
    assert image_grid(v, size) == (tiles * 576, tokens)


@pytest.mark.parametrize("side", [100, 336, 337, 500, 672, 673, 900, 1008, 2000])
def test_anyres_matches_transformers_functions(side: int) -> None:
    pytest.importorskip("torch")
    from transformers.image_processing_utils import select_best_resolution as theirs_best
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    pins = [list(p) for p in _cfg()["image_grid_pinpoints"]]
    v = _vision()
    assert select_best_resolution(side, side, v.grid_pinpoints) == tuple(theirs_best((side, side), pins))
    assert image_tiles(v, side) == image_size_to_num_patches((side, side), pins, 336)
    proc = SimpleNamespace(image_processor=SimpleNamespace(image_grid_pinpoints=pins), patch_size=14,
                           num_additional_image_tokens=1)
    proc._get_unpadded_features = lambda *a: LlavaNextProcessor._get_unpadded_features(proc, *a)
    # LlavaNextProcessor.replace_image_token: _get_number_of_features less 1 under the "default" strategy
    expected = LlavaNextProcessor._get_number_of_features(proc, side, side, 336, 336) - 1
    assert image_grid(v, side)[1] == expected


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": str(CONFIG), "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_tower_activations_per_tile_by_hand() -> None:
    from vramplan.analytic.terms import bytes_of
    from vramplan.analytic.train import train_step

    res = train_step(resolve(_doc(micro_batch_size=1, seq_len=4096, images_per_sample=1)))
    # 5 passes of llava-1.5-7b's tower per 672 x 672 image, each as tests/test_vision_llava.py computes it: the
    # pixels 677,376, pre_layrnorm 2,368,008, 23 used layers of 28,406,864 and the projector on 576 rows x 18,432
    assert bytes_of(res.terms, "saved.vision_tower") == 5 * (677_376 + 2_368_008 + 23 * 28_406_864
                                                             + 576 * 18_432) == 3_335_100_440
    # the unused last layer and post_layernorm on each pass's class token
    assert bytes_of(res.terms, "saved.vision_tower_unused") == 5 * (28_406_864 + 4_104) == 142_054_840


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=2, prompt_len=4096, images_per_sample=1))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 2 images x 5 passes of 577 tokens: the running layer 30,720 and the encoder's input bound through the layers
    # 2,048 per token, (30,720 + 2,048) x 577 = 18,907,136, and each pass's pixels 3 x 336^2 x 2 = 677,376
    # (tests/test_vision_llava.py)
    assert vision.get(K.VISION_TOWER) == 10 * (18_907_136 + 677_376) == 195_845_120
    assert any("cut into 4 tiles of 336 x 336" in a for a in r.assumptions)


def test_anyres_matches_transformers_on_random_grids() -> None:
    # any square side and any grid of tile multiples: tiles and tokens equal transformers' own functions
    pytest.importorskip("torch")
    from dataclasses import replace

    from hypothesis import given, settings
    from hypothesis import strategies as st
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    base = _vision()
    grids = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=6)

    @settings(max_examples=60, deadline=None)
    @given(side=st.integers(1, 3000), grid=grids)
    def check(side: int, grid: list[tuple[int, int]]) -> None:
        pins = [[336 * h, 336 * w] for h, w in grid]
        v = replace(base, grid_pinpoints=tuple((h, w) for h, w in pins))
        proc = SimpleNamespace(image_processor=SimpleNamespace(image_grid_pinpoints=pins), patch_size=14,
                               num_additional_image_tokens=1)
        proc._get_unpadded_features = lambda *a: LlavaNextProcessor._get_unpadded_features(proc, *a)
        assert image_tiles(v, side) == image_size_to_num_patches((side, side), pins, 336)
        assert image_grid(v, side)[1] == LlavaNextProcessor._get_number_of_features(proc, side, side, 336, 336) - 1

    check()


def test_freeze_vision_tower_freezes_the_newline_too() -> None:
    from vramplan.analytic.attention import resolve_attention
    from vramplan.analytic.terms.context import StepContext, step_policy

    r = resolve(_doc(micro_batch_size=1, seq_len=4096, freeze_vision_tower=True))
    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario))
    # 7,063,431,168 parameters less the tower, the projector and image_newline (324,491,264): the language model
    assert StepContext(r, 0, attention, repeat).trainable == 7_063_431_168 - 324_491_264 == 6_738_939_904


def test_sparse_mistral_text_config_takes_mistral_defaults() -> None:
    # llava-v1.6-mistral-7b-hf's text_config names the model type, the vocabulary and a few keys but not hidden_size,
    # the layers or the heads: MistralConfig's defaults fill them (4096 wide, 32 layers, 32 heads of which 8 KV heads,
    # MLP 14,336), as transformers builds it
    cfg = _cfg()
    cfg["text_config"] = {"model_type": "mistral", "vocab_size": 32_064, "max_position_embeddings": 32_768,
                          "rms_norm_eps": 1e-5, "sliding_window": None}
    spec = model_from_config(cfg, name="llava-next-mistral")
    assert spec.hidden_size == 4096 and spec.num_layers == 32 and spec.num_kv_heads == 8
    assert spec.num_parameters == sum(p.numel() for p in meta_module(cfg).parameters())
