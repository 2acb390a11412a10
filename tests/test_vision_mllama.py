"""Llama 3.2 Vision (spec/families/mllama.py): the vision model's, the projector's and the cross-attention
language model's parameters by hand and against transformers' module on the meta device; every task refused
with the reason (spec/checks.py cross_attention_problems)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meta_build import meta_module
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import FAMILIES, flatten_text_config, transformers_config
from vramplan.spec.hf_config import model_from_config

# a small shape config written for these tests (tests/data/mllama-tiny-shape/README.md), not a released model
TINY = Path(__file__).resolve().parent / "data" / "mllama-tiny-shape" / "config.json"
# transformers 5.24 MllamaConfig() with every default (configuration_mllama.py): the 11B shape of its docstring
DEFAULTS: dict[str, Any] = {"model_type": "mllama", "vision_config": {}, "text_config": {}}


def _cfg() -> dict[str, Any]:
    return dict(json.loads(TINY.read_text()))


def _rows(spec: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in spec.params:
        out[p.name] = out.get(p.name, 0) + p.total
    return out


def test_tiny_parameters_by_hand() -> None:
    m = model_from_config(_cfg(), name="tiny")
    assert m.model_type == "mllama" and m.vision is not None and not m.tie_word_embeddings
    # vision model, d = 64, i = 128, 4 local + 2 global layers, 56 / 14 = 4 -> 16 patches + class = 17 positions,
    # 2 tiles, 3 aspect ratios (+1 padding id = 4 embedding rows):
    #   patch_embedding 64 x 3 x 14 x 14 = 37,632; class_embedding 64;
    #   gated_positional_embedding: gate 1, embedding 17 x 64 = 1,088, tile_embedding 4 x (2 x 17 x 64) = 8,704;
    #   pre/post_tile_positional_embedding 2 x (4 x 2 x 64 + 1) = 1,026; layernorm_pre/post 2 x 2 x 64 = 256
    stem = 37_632 + 64 + 1 + 1_088 + 8_704 + 1_026 + 256
    assert stem == 48_771
    #   per layer: q, k, v, o 4 x 64 x 64 = 16,384; fc1 64 x 128 + 128 = 8,320; fc2 128 x 64 + 64 = 8,256;
    #   two LayerNorms 4 x 64 = 256 -> 33,216; the global layers add gate_attn and gate_ffn: 33,218
    tower = stem + 4 * 33_216 + 2 * 33_218
    assert tower == 248_071
    # projector: 192 x 128 + 128 = 24,704
    assert m.vision_parameters == tower + 24_704 == 272_775
    # language model, h = 128, 4 heads (head_dim 32), 2 KV heads, i = 256, 5 layers, cross-attention at 1 and 4:
    #   embed_tokens (1000 + 8) x 128 = 129,024; lm_head 1000 x 128 = 128,000; norm 128
    #   every layer: MLP 3 x 128 x 256 = 98,304; two RMSNorms 256 -> 98,560
    #   attention q 128 x 128, k and v 128 x 64 each, o 128 x 128 -> 49,152
    #   self-attention layers 0, 2, 3: 3 x 49,152 = 147,456
    #   cross-attention layers 1, 4: 2 x (49,152 + q_norm 32 + k_norm 32 + two gates 2) = 98,436
    text = 129_024 + 128_000 + 128 + 5 * 98_560 + 147_456 + 98_436
    assert text == 995_844
    assert m.num_parameters - m.vision_parameters == text
    assert m.num_parameters == 1_268_619
    rows = _rows(m)
    assert rows["layers.self_attn.q_proj.weight"] == 3 * 128 * 128
    assert rows["layers.cross_attn.k_proj.weight"] == 2 * 128 * 64
    assert {p.name: p.layer_span for p in m.params}["layers.cross_attn.q_proj.weight"] == (1, 4)
    assert {p.name: p.layer_span for p in m.params}["layers.self_attn.q_proj.weight"] == (0, 2, 3)
    # a cross-attention layer holds its own tensors and not self-attention's
    assert m.layer_params(1) - m.layer_params(0) == 98_436 // 2 - 49_152
    v = m.vision
    # MllamaProcessor: one <|image|> token per image; the cross-attention keys/values per image: 2 tiles x 17
    assert (v.tokens_per_image, v.cross_attention_tokens_per_image, v.cross_attention_layers) == (1, 34, (1, 4))
    assert v.num_layers == 6 and v.patches_per_image == 2 * 16
    # neither quantized nor adapted
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(v.param_prefixes))


@pytest.mark.parametrize("cfg", [_cfg(), DEFAULTS], ids=["tiny-shape", "transformers-defaults"])
def test_count_equals_transformers_module_on_the_meta_device(cfg: dict[str, Any]) -> None:
    spec = model_from_config(cfg, name="mllama")
    module = meta_module(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    # tensor by tensor (the adapter lists repeated layers' tensors once, per_layer or layer_span times)
    theirs: dict[str, int] = {}
    for name, p in module.named_parameters():
        key = name.removeprefix("model.").removeprefix("language_model.")
        key = ".".join(x for x in key.split(".") if not x.isdigit())
        theirs[key] = theirs.get(key, 0) + p.numel()
    assert _rows(spec) == theirs


def test_defaults_by_hand() -> None:
    m = model_from_config(DEFAULTS, name="mllama")
    # MllamaConfig's defaults: 40 decoder layers, 8 of them cross-attention; h = 4096, 32 heads, 8 KV heads,
    # i = 14,336, vocab 128,256 (+ 8 embedding rows)
    #   embed_tokens 128,264 x 4096 = 525,369,344; lm_head 128,256 x 4096 = 525,336,576; norm 4,096
    #   per layer: MLP 3 x 4096 x 14,336 = 176,160,768 + two norms 8,192 = 176,168,960
    #   attention q and o 2 x 4096^2 = 33,554,432, k and v 2 x 4096 x 1024 = 8,388,608 -> 41,943,040;
    #   cross layers add q_norm and k_norm (128 each) and two gates: 41,943,298
    text = 525_369_344 + 525_336_576 + 4_096 + 40 * 176_168_960 + 32 * 41_943_040 + 8 * 41_943_298
    assert text == 9_775_192_080
    assert m.num_parameters - m.vision_parameters == text
    # vision: d = 1280, i = 5120, 448 / 14 = 32 -> 1,025 positions, 4 tiles, 8 aspect ratios (9 rows)
    #   patch 1280 x 3 x 14^2 = 752,640; class 1,280; positional gate 1 + 1,025 x 1280 = 1,312,001;
    #   tile_embedding 9 x 4 x 1,025 x 1280 = 47,232,000; pre/post tile 2 x (9 x 4 x 1280 + 1) = 92,162;
    #   layernorm_pre/post 5,120
    #   per layer: 4 x 1280^2 = 6,553,600; fc1 + fc2 2 x 1280 x 5120 + 5120 + 1280 = 13,113,600; norms 5,120
    #   -> 19,672,320; 32 local + 8 global (+2 gates each)
    #   projector 7680 x 4096 + 4096 = 31,461,376
    vision = (752_640 + 1_280 + 1_312_001 + 47_232_000 + 92_162 + 5_120 + 40 * 19_672_320 + 8 * 2
              + 31_461_376)
    assert m.vision_parameters == vision == 867_749_395
    assert m.num_parameters == 10_642_941_475
    assert m.vision is not None and m.vision.cross_attention_tokens_per_image == 4 * 1_025


def test_the_whole_config_reaches_the_adapter() -> None:
    assert "mllama" in FAMILIES
    assert "vision_config" in flatten_text_config(_cfg())
    # the traced engine and measure would build the language model alone (MllamaForCausalLM)
    assert transformers_config(_cfg())["model_type"] == "mllama_text_model"


def test_cross_attention_layers_outside_the_model_are_refused() -> None:
    cfg = _cfg()
    cfg["text_config"] = {**cfg["text_config"], "cross_attention_layers": [1, 5]}
    with pytest.raises(ScenarioError, match=r"cross_attention_layers \[1, 5\] name layers outside the 5"):
        model_from_config(cfg)


@pytest.mark.parametrize(("task", "words"), [
    ("train", "training memory is not estimated for it: the cross-attention layers' saved tensors"),
    ("inference", "inference memory is not estimated for it: the cross-attention layers' KV cache"),
    ("serve", "serve memory is not estimated for it: the cross-attention layers' KV cache"),
])
def test_every_task_is_refused_with_the_reason(task: str, words: str) -> None:
    doc = {"model": str(TINY), "hardware": {"gpu": "H100-80GB"}, "task": task}
    with pytest.raises(ScenarioError) as err:
        resolve(doc)
    text = str(err.value)
    # 2 cross-attention layers, 2 tiles x 17 positions = 34 keys/values per image; 1,268,619 parameters (above)
    assert "reads its images through 2 cross-attention layers (34 vision keys and values per image)" in text
    assert "its parameters are counted (1,268,619)" in text
    assert words in text


def test_no_cross_attention_layers_is_a_llama_beside_the_vision_model_and_still_refused() -> None:
    cfg = _cfg()
    cfg["text_config"] = {**cfg["text_config"], "cross_attention_layers": []}
    m = model_from_config(cfg, name="no-cross")
    # every layer self-attention: 995,844 - 98,436 (the cross layers' own) + 2 x 49,152 (their self-attention)
    assert m.num_parameters - m.vision_parameters == 995_844 - 98_436 + 2 * 49_152 == 995_712
    assert m.num_parameters == sum(p.numel() for p in meta_module(cfg).parameters())
    doc = {"model": cfg, "hardware": {"gpu": "H100-80GB"}, "task": "inference"}
    with pytest.raises(ScenarioError, match="reads its images through 0 cross-attention layers"):
        resolve(doc)
