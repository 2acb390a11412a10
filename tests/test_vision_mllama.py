"""Llama 3.2 Vision (spec/families/mllama.py): the vision model's, the projector's and the cross-attention
language model's parameters by hand and against transformers' module on the meta device; Hugging Face generate;
what is refused, with the reason (spec/checks.py cross_attention_problems; training: tests/test_mllama_train.py)."""

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
    ("train", "qlora is not modelled for it (QLoRA: transformers quantizes the vision model's linears too"),
    ("serve", "vLLM 0.11 does not serve it: the model was removed with the V0 engine's encoder-decoder support"),
])
def test_training_and_serving_are_refused_with_the_reason(task: str, words: str) -> None:
    doc: dict[str, Any] = {"model": str(TINY), "hardware": {"gpu": "H100-80GB"}, "task": task}
    if task == "train":
        doc["train"] = {"peft": {"method": "qlora"}}
    with pytest.raises(ScenarioError) as err:
        resolve(doc)
    text = str(err.value)
    # 2 cross-attention layers, 2 tiles x 17 positions = 34 keys/values per image; 1,268,619 parameters (above)
    assert "reads its images through 2 cross-attention layers (34 vision keys and values per image)" in text
    assert "its parameters are counted (1,268,619)" in text
    assert words in text
    hint = "set peft.method: lora" if task == "train" else "vLLM serves it from 0.6.2 to 0.10.2 only"
    assert hint in text


@pytest.mark.parametrize(("section", "words"), [
    ({"inference": {"attention": "flash"}}, "_supports_flash_attn = False"),
    ({"parallel": {"tp": 2}}, "its generate is modelled on one GPU only"),
    ({"inference": {"kv_cache_dtype": "fp8"}}, "a fp8 cache is not modelled for it"),
    ({"software": {"transformers": "4.46"}}, "modelled on transformers 5.24's modeling_mllama.py, not 4.46"),
    ({"inference": {"quantization": "nf4"}}, "nf4 is not modelled for it: transformers 5.24 quantizes the vision"),
])
def test_inference_settings_not_modelled_are_refused(section: dict[str, Any], words: str) -> None:
    doc: dict[str, Any] = {"model": str(TINY), "hardware": {"gpu": "H100-80GB", "num_gpus": 2}, "task": "inference",
                           "inference": {"images_per_sample": 1, "prompt_len": 64}}
    for k, v in section.items():
        doc[k] = {**doc.get(k, {}), **v}
    with pytest.raises(ScenarioError, match=words):
        resolve(doc)


def test_no_cross_attention_layers_is_a_llama_beside_the_vision_model_and_still_refused() -> None:
    cfg = _cfg()
    cfg["text_config"] = {**cfg["text_config"], "cross_attention_layers": []}
    m = model_from_config(cfg, name="no-cross")
    # every layer self-attention: 995,844 - 98,436 (the cross layers' own) + 2 x 49,152 (their self-attention)
    assert m.num_parameters - m.vision_parameters == 995_844 - 98_436 + 2 * 49_152 == 995_712
    assert m.num_parameters == sum(p.numel() for p in meta_module(cfg).parameters())
    doc = {"model": cfg, "hardware": {"gpu": "H100-80GB"}, "task": "train", "train": {"peft": {"method": "qlora"}}}
    with pytest.raises(ScenarioError, match="reads its images through 0 cross-attention layers"):
        resolve(doc)


def _generate(**inference: Any) -> Any:
    from vramplan.analytic.inference import inference_step

    doc = {"model": str(TINY), "hardware": {"gpu": "H100-80GB"}, "task": "inference",
           "inference": {"images_per_sample": 1, "prompt_len": 16, "new_tokens": 4, **inference}}
    return inference_step(resolve(doc))


def _parts(mo: Any) -> dict[str, int]:
    return {k: v for part in mo.parts.values() for k, v in part.items()}


def test_generate_with_an_image_by_hand() -> None:
    res = _generate()
    tower, mask, prefill, decode = res.moments
    # bf16 (c = 2), one prompt of 16 tokens and one image, 4 new tokens (cache at 16 + 4 - 1 = 19 tokens).
    # Cross-attention cache: 2 layers x 1 x (2 tiles x 17) x 2 (K, V) x 2 KV heads x 32 x 2 B = 17,408
    # Text cache: the 3 self-attention layers x 2 x 2 x 32 x 2 B = 768 B per token: 16 -> 12,288; 19 -> 14,592
    assert (res.prompt_cache_bytes, res.final_cache_bytes) == (12_288 + 17_408, 14_592 + 17_408)
    # generate's inputs: fp32 pixel values 2 tiles x 3 x 56^2 x 4 = 75,264, the int64 aspect-ratio ids and mask
    # (1 + 2) x 8 = 24 and the int64 cross-attention mask 16 x 1 x 2 x 8 = 256
    assert _parts(tower)["pixel values and cross-attention mask (generate's inputs)"] == 75_544
    # the vision model: S = 2 tiles x 24 (17 padded to 8) = 48 positions, d = 64: a state 48 x 64 x 2 = 6,144;
    # the aspect-ratio mask 48^2 x 2 = 4,608; 4 local + 2 global states kept;
    #   the last global layer running: 5 states (30,720) + max(7d = 43,008, (2d + 2I) = 36,864) = 73,728
    #   the stack: 6 states 36,864 + 2 x 6,144 + 2 unpadded copies (34 x 64 x 2 = 4,352 each) + the last state's
    #   copy 4,352 = 62,208; the concatenation: 36,864 + 2 x 4,352 + 4,352 + 3 x 4,352 = 62,976
    # and the patch embedding's output, 2 tiles x 16 patches x 64 x 2 = 4,096, kept until the forward returns
    assert _parts(tower)["vision tower"] == 4_096 + 4_608 + 73_728
    # the mask's preparation: 16 x 34 = 544 elements x max(8 + 4 + 2, 9 + 2 x 2) = 7,616, beside the vision output
    # and the projector's (34 x (192 + 128) x 2 = 21,760)
    assert _parts(mask)["cross-attention mask"] == 7_616
    assert _parts(mask)["vision output and projected states"] == 21_760
    # through the prompt: the cross cache, the kept mask 16 x (34 + 1) x 2 = 1,120
    pre = _parts(prefill)
    assert (pre["cross-attention keys and values (images)"], pre["cross-attention mask"]) == (17_408, 1_120)
    # a decode step under SDPA: one query, packed onto the KV heads (no repeat): the query side (2h + 2q) x 2 = 1,024
    # and the mask row padded from 34 to 40 keys (80) = 1,104 < one self-attention layer's torch.cat of its keys
    # (2 x 2 x 32 x 2 = 256 B per token: 19 x 256 / 2 = 2,432)
    dec = _parts(decode)
    assert "cross-attention layer (decode)" not in dec and dec["cache growth (torch.cat of one layer)"] == 2_432
    # the prefill's cross layer: k_norm's moment (2 x 2 + 8) x 64 x 34 + 2 x 128 x 16 x 2 = 34,304, or at SDPA the
    # text side (2 x 128 + 2 x 128) x 16 x 2 = 16,384, K and V repeated 2 x 128 x 34 x 2 = 17,408 and the mask padded
    # to 40 keys 16 x 40 x 2 = 1,280: 35,072
    from vramplan.analytic.cross_attention import cross_images, cross_layer_bytes

    m = model_from_config(_cfg(), name="tiny")
    ci = cross_images(m, 1, 1)
    assert ci is not None and cross_layer_bytes(m, ci, 16, 2, "sdpa") == 35_072
    assert dec["all tokens"] == 14_592 and dec["cross-attention keys and values (images)"] == 17_408
    # the int64 mask in model_kwargs at 19 rows: 19 x 2 x 8 = 304
    assert dec["pixel values and cross-attention mask (generate's inputs)"] == 75_264 + 24 + 304


def test_the_eager_cross_layer_by_hand() -> None:
    res = _generate(attention="eager")
    tower = _parts(res.moments[0])
    # eager in the vision model: the MLP moment with the probabilities 4 heads x 48^2 x 2 = 18,432 kept, or at the
    # softmax 5d (30,720) + 4 x 48^2 x (2 x 2 + 4) = 73,728 -> 104,448; with 5 states: 30,720 + 104,448 = 135,168
    assert tower["vision tower"] == 4_096 + 4_608 + 135_168
    dec = _parts(res.moments[3])
    # decode (eager repeats K and V at every step): (2h + q) x 2 = 768, K and V repeated 2 x 128 x 34 x 2 = 17,408,
    # the scores 4 heads x 34 x (2 x 2 + 4) = 1,088
    assert dec["cross-attention layer (decode)"] == 768 + 17_408 + 1_088


def test_without_an_image_the_cross_layers_cache_nothing() -> None:
    res = _generate(images_per_sample=0)
    # no vision moments, and only the 3 self-attention layers' cache: 16 x 768 and 19 x 768
    assert len(res.moments) == 2
    assert (res.prompt_cache_bytes, res.final_cache_bytes) == (12_288, 14_592)
    assert all("cross" not in k for mo in res.moments for k in _parts(mo))


def test_defaults_cross_cache_and_report() -> None:
    from vramplan.engine import estimate

    doc = {"model": DEFAULTS, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
           "inference": {"images_per_sample": 1, "prompt_len": 512, "new_tokens": 128}}
    report = estimate(doc).model_dump()
    # 8 cross layers x 4 tiles x 1,025 positions x 2 x 8 KV heads x 128 x 2 B = 134,348,800 B per image
    text = "\n".join(report["assumptions"])
    assert "4 x 1,025 = 4,100 vision positions" in text and "each of the 8 cross-attention layers caches" in text
    assert "the local (32 layers) and global (8) encoders run over each image's 4 x 1,032 positions" in text
    from vramplan.analytic.cross_attention import cross_images, cross_kv_bytes

    m = model_from_config(DEFAULTS, name="mllama")
    assert cross_kv_bytes(m, cross_images(m, 1, 1), 2) == 134_348_800


def test_the_traced_engine_refuses_mllama() -> None:
    from vramplan.trace.engine import trace

    doc = {"model": str(TINY), "hardware": {"gpu": "H100-80GB"}, "task": "inference"}
    with pytest.raises(ScenarioError, match="the traced engine does not build mllama-tiny-shape's cross-attention"):
        trace(doc)


def _tiny_model(attention: str) -> Any:
    """transformers 5.24's ``MllamaForConditionalGeneration`` of the tiny shape (``_cfg``), fp32 on the CPU, seeded."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = _cfg()
    cfg = transformers.MllamaConfig(vision_config=raw["vision_config"], text_config=raw["text_config"],
                                    image_token_index=1000)
    cfg._attn_implementation = attention
    torch.manual_seed(0)
    return transformers.MllamaForConditionalGeneration(cfg).eval()


def test_transformers_generate_caches_what_is_modelled() -> None:
    """Read off transformers 5.24 on the CPU with the tiny shape: generate's DynamicCache holds the self-attention
    layers' text tokens (8 + 3 - 1 = 10) and the cross-attention layers' 2 x 17 = 34 vision positions, in the model
    dtype; the local encoder keeps its 4 states over 2 x 24 padded positions; SDPA gets the aspect-ratio mask in the
    vision model and, in each cross-attention layer, K and V repeated from 2 to 4 heads with a [1, 1, 8, 34] mask in
    the prefill, the 2 cached heads with a one-row mask at a decode step."""
    torch = pytest.importorskip("torch")
    from unittest import mock

    from vramplan.analytic.cross_attention import cross_images, cross_kv_bytes

    raw = _cfg()
    model = _tiny_model("sdpa")
    local: list[tuple[int, ...]] = []
    model.model.vision_model.transformer.register_forward_hook(
        lambda mod, args, out: local.extend(tuple(h.shape) for h in out.hidden_states))
    calls: list[tuple[int, int, Any]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def record(q: Any, k: Any, v: Any, attn_mask: Any = None, **kw: Any) -> Any:
        calls.append((k.shape[1], k.shape[2], None if attn_mask is None else tuple(attn_mask.shape)))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    ids = torch.tensor([[1000, *range(5, 12)]])
    with mock.patch("torch.nn.functional.scaled_dot_product_attention", record):
        out = model.generate(input_ids=ids, pixel_values=torch.randn(1, 1, 2, 3, 56, 56),
                             aspect_ratio_ids=torch.tensor([[2]]), aspect_ratio_mask=torch.ones(1, 1, 2, dtype=torch.long),
                             cross_attention_mask=torch.ones(1, 8, 1, 2, dtype=torch.long), max_new_tokens=3,
                             min_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    cache = out.cache
    assert type(cache).__name__ == "DynamicCache"
    shapes = [tuple(layer.keys.shape) for layer in cache.layers]
    assert shapes == [(1, 2, 10, 32), (1, 2, 34, 32), (1, 2, 10, 32), (1, 2, 10, 32), (1, 2, 34, 32)]
    assert all(layer.keys.dtype == torch.float32 for layer in cache.layers)
    cross = sum(cache.layers[i].keys.nbytes + cache.layers[i].values.nbytes for i in (1, 4))
    m = model_from_config(raw, name="tiny")
    assert cross == cross_kv_bytes(m, cross_images(m, 1, 1), 4) == 2 * 2 * 2 * 34 * 32 * 4
    assert local == [(1, 48, 64)] * 4
    # the prefill: 6 vision layers over 48 positions with the [1, 1, 48, 48] mask, then the language model's 5 layers
    # (self-attention: 2 KV heads repeated to 4 under the causal mask path; cross: 34 keys repeated to 4 heads)
    assert calls[:6] == [(4, 48, (1, 1, 48, 48))] * 6
    assert calls[7] == (4, 34, (1, 1, 8, 34)) and calls[10] == (4, 34, (1, 1, 8, 34))
    # a decode step's cross-attention layer: one query, packed onto the 2 KV heads (pack_gqa), a one-row mask
    assert calls[12] == (2, 34, (1, 1, 1, 34))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_vision_model_peak_equals_transformers_on_the_cpu(attention: str) -> None:
    """The vision model's live tensors at its peak, beyond its weights and inputs, counted storage by storage
    (trace/tracker.py) while transformers 5.24's ``MllamaVisionModel`` runs the tiny shape in fp32 on the CPU:
    equal to ``vision_model_bytes`` (the CPU's SDPA kernel differs from CUDA's, but the peak holds no kernel
    workspace: it is the assembly of the output or the last global layer)."""
    torch = pytest.importorskip("torch")
    from vramplan.analytic.cross_attention import cross_images, vision_model_bytes
    from vramplan.trace.tracker import Tracker

    raw = _cfg()
    vision = _tiny_model(attention).model.vision_model
    inputs = {"pixel_values": torch.randn(1, 1, 2, 3, 56, 56), "aspect_ratio_ids": torch.tensor([[2]]),
              "aspect_ratio_mask": torch.ones(1, 1, 2, dtype=torch.long)}
    with torch.no_grad(), Tracker() as tr:
        tr.track([*vision.parameters(), *inputs.values()], "weights")
        base = tr.live_bytes
        vision(**inputs)
    m = model_from_config(raw, name="tiny")
    ci = cross_images(m, 1, 1)
    assert ci is not None
    # fp32: eager 8,192 + 9,216 + 5 states x 12,288 + (5 x 64 x 48 x 4 + 4 x 48^2 x 8) = 214,016;
    # sdpa 8,192 + 9,216 + 61,440 + 7 x 64 x 48 x 4 = 164,864
    expected = {"eager": 214_016, "sdpa": 164_864}[attention]
    assert tr.peak_bytes - base == vision_model_bytes(ci, 4, attention) == expected


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_prefill_peak_against_transformers_on_the_cpu(attention: str) -> None:
    """The whole prefill forward (vision model, projector, mask, 5 decoder layers, cache written, logits_to_keep=1) of
    the tiny shape in fp32 on the CPU, counted storage by storage (trace/tracker.py), against the largest of the
    modelled prefill moments' tensors beyond the weights, generate's inputs and cuBLAS: under eager the vision
    model's peak, equal; under SDPA the last cross-attention layer's MLP, 128 B over the model: the int64 position
    ids [1, 16] (MllamaTextModel.forward's arange), which the language model's prefill terms leave out."""
    torch = pytest.importorskip("torch")
    from vramplan.analytic.inference import inference_step
    from vramplan.trace.tracker import Tracker

    raw = _cfg()
    model = _tiny_model(attention)
    p = 16
    inputs = {"input_ids": torch.tensor([[1000, *range(5, 5 + p - 1)]]),
              "pixel_values": torch.randn(1, 1, 2, 3, 56, 56), "aspect_ratio_ids": torch.tensor([[2]]),
              "aspect_ratio_mask": torch.ones(1, 1, 2, dtype=torch.long),
              "cross_attention_mask": torch.ones(1, p, 1, 2, dtype=torch.long)}
    with torch.no_grad(), Tracker() as tr:
        tr.track([*model.parameters(), *inputs.values()], "weights")
        base = tr.live_bytes
        model(**inputs, use_cache=True, logits_to_keep=1)
    doc = {"model": raw, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
           "inference": {"images_per_sample": 1, "prompt_len": p, "new_tokens": 1, "attention": attention,
                         "dtype": "fp32"}}
    outside = ("parameters", "cuBLAS workspaces", "pixel values and cross-attention mask (generate's inputs)")
    modelled = max(sum(v for k, v in _parts(mo).items() if k not in outside) for mo in inference_step(resolve(doc)).moments)
    assert tr.peak_bytes - base - modelled == {"eager": 0, "sdpa": p * 8}[attention]


def test_kv_command_states_the_cross_attention_cache() -> None:
    from typer.testing import CliRunner

    from vramplan.cli.main import app

    res = CliRunner().invoke(app, ["kv", str(TINY), "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    # the per-token table: the 3 self-attention layers, 3 x 2 x 2 KV heads x 32 x 2 B = 768 B per token; beside it
    # the 2 cross-attention layers' 2 x 34 x 2 x 2 x 32 x 2 B = 17,408 B per image
    assert (payload["layers"], payload["bytes_per_token"]) == (3, 768)
    assert payload["cross_attention_bytes_per_image"] == 17_408


def test_bf16_before_sm80_is_refused_under_sdpa_and_estimated_eager() -> None:
    from vramplan.engine import estimate

    # a T4 (sm75) has no bf16 flash or memory-efficient kernel: SDPA's math kernel would run in the vision model and
    # the cross-attention layers too, which the cross-attention terms do not model
    doc: dict[str, Any] = {"model": str(TINY), "hardware": {"gpu": "T4"}, "task": "inference",
                           "inference": {"images_per_sample": 1, "prompt_len": 16, "dtype": "bf16"}}
    with pytest.raises(ScenarioError, match="SDPA runs its math kernel in the vision model"):
        estimate(doc)
    doc["inference"]["attention"] = "eager"
    assert estimate(doc).per_gpu is not None
