"""A vision-language model's tower and projector under quantization (spec/vision_quant.py): quantized on load
(transformers' quantizers and vLLM reach every nn.Linear of the tower), or as a pre-quantized checkpoint stores it
(its skip list), in the analytic engine's and the vLLM model's weight bytes; what cannot be told is refused."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from vramplan.analytic.layout import rank_params
from vramplan.analytic.weights import weights_bytes
from vramplan.catalog.models import list_models, load_model
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.serve.vllm import serve_weights_bytes
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision_quant import skipped_by, tower_quantized_linears

QWEN = "Qwen/Qwen2.5-VL-7B-Instruct"
GEMMA3 = "google/gemma-3-4b-it"

# Qwen2.5-VL-7B's tower (vision_config: hidden 1280, intermediate 3420, depth 32, out_hidden_size 3584, merge 2):
# per block qkv 1280 x 3840 = 4,915,200, proj 1280 x 1280 = 1,638,400, gate/up/down 3 x 1280 x 3420 = 13,132,800
#   -> 19,686,400 x 32 blocks = 629,964,800; merger mlp.0 5120 x 5120 = 26,214,400, mlp.2 5120 x 3584 = 18,350,080
BLOCK_LINEARS = 32 * (4_915_200 + 1_638_400 + 3 * 4_377_600)
MERGER_LINEARS = 26_214_400 + 18_350_080
TOWER_LINEARS = BLOCK_LINEARS + MERGER_LINEARS


def _config(model_id: str) -> dict[str, Any]:
    return copy.deepcopy(next(dict(r.config) for r in list_models() if r.id == model_id))


def _awq(skip: list[str] | None) -> dict[str, Any]:
    """Qwen/Qwen2.5-VL-7B-Instruct-AWQ's config.json: the base model's with the quantization_config AutoAWQ writes
    (awq/models/qwen2_5_vl.py ``Qwen2_5_VLAWQForCausalLM.modules_to_not_convert = ["visual"]``)."""
    cfg = _config(QWEN)
    cfg["quantization_config"] = {"bits": 4, "group_size": 128, "modules_to_not_convert": skip, "quant_method": "awq",
                                  "version": "gemm", "zero_point": True}
    return cfg


def _tower_delta(m: Any, quant: str, dense: int = 2) -> int:
    """The bytes the tower's quantized linears change the rank's weights by (with them minus without)."""
    rp = rank_params(m, 1, 1, 1, 0, None)
    return weights_bytes(rp, dense, quant) - weights_bytes(replace(rp, tower_linear_shapes=()), dense, quant)


def test_every_tower_linear_is_listed() -> None:
    m = load_model(QWEN)
    assert m.vision is not None
    assert sum(i * o * n for _, i, o, n in m.vision.quantized_linears) == TOWER_LINEARS == 674_529_280
    # the patch embedding (a Conv3d), norms and biases are not nn.Linear weights: 676,550,144 - 674,529,280
    assert m.vision_parameters - TOWER_LINEARS == 2_020_864


def test_nf4_on_load_quantizes_the_tower_by_hand() -> None:
    # nf4 per matrix: numel / 2 payload + numel / 64 fp32 absmax (every matrix is a multiple of 64): numel x 9 / 16
    #   674,529,280 x 9 / 16 = 379,422,720 B in place of 674,529,280 x 2 = 1,349,058,560 B in bf16
    assert _tower_delta(load_model(QWEN), "nf4") == 379_422_720 - 1_349_058_560 == -969_635_840


def test_inference_report_says_the_tower_is_quantized() -> None:
    doc = {"model": QWEN, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
           "inference": {"quantization": "nf4", "prompt_len": 512}}
    r = resolve(doc)
    line = next(a for a in r.assumptions if a.startswith("vision tower:"))
    assert "674,529,280 of them in 7 linear weight group(s)" in line and "stored as nf4" in line
    assert "get_keys_to_not_convert" in line


def test_serve_fp8_quantizes_the_tower_by_hand() -> None:
    # vLLM's in-flight fp8: one byte per weight and an fp32 scale per output row of each matrix
    #   rows: 32 x (3840 + 1280 + 3420 + 3420 + 1280) = 423,680, merger 5120 + 3584 = 8,704 -> 432,384 x 4 B
    rows = 32 * (3840 + 1280 + 3420 + 3420 + 1280) + 5120 + 3584
    fp8 = TOWER_LINEARS + rows * 4
    assert fp8 == 676_258_816
    doc = {"model": QWEN, "hardware": {"gpu": "H100-80GB"}, "task": "serve", "serve": {"quantization": "fp8"}}
    r = resolve(doc)
    with_tower, _ = serve_weights_bytes(r)
    m = r.model
    assert m.vision is not None
    bare = replace(m, vision=replace(m.vision, quantized_linears=()))
    without, _ = serve_weights_bytes(replace(r, model=bare))
    assert with_tower - without == fp8 - 2 * TOWER_LINEARS


def test_awq_checkpoint_skipping_visual_holds_the_tower_in_fp16() -> None:
    m = model_from_config(_awq(["visual"]), name="awq")
    assert m.vision is not None and not m.vision.quant_refused
    assert tower_quantized_linears(m) == 0 and _tower_delta(m, "awq-4bit") == 0
    r = resolve({"model": _awq(["visual"]), "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                 "inference": {"prompt_len": 512}})
    assert r.scenario.inference.quantization == "awq-4bit"
    assert any("held unquantized in the model's dtype (the checkpoint's quantization_config skips them)" in a
               for a in r.assumptions)


def test_awq_checkpoint_without_a_tower_skip_is_refused() -> None:
    with pytest.raises(ScenarioError, match="AutoAWQ quantizes the decoder layers only"):
        resolve({"model": _awq(None), "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                 "inference": {"prompt_len": 512}})


def test_gptq_checkpoint_holds_the_tower_unquantized() -> None:
    cfg = _config(QWEN)
    cfg["quantization_config"] = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq"}
    m = model_from_config(cfg, name="gptq")
    assert tower_quantized_linears(m) == 0


def test_bnb_checkpoint_skip_list_per_instance_by_hand() -> None:
    # llm_int8_skip_modules naming the merger and one block's down_proj: the merger's 44,564,480 weights and
    # block 31's down_proj (3420 x 1280 = 4,377,600) stay bf16; the rest, 674,529,280 - 44,564,480 - 4,377,600 =
    # 625,587,200, is nf4 (x 9 / 16 = 351,892,800 B in place of 1,251,174,400 B)
    cfg = _config(QWEN)
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_compute_dtype": "bfloat16",
                                  "llm_int8_skip_modules": ["lm_head", "merger", "visual.blocks.31.mlp.down_proj"]}
    m = model_from_config(cfg, name="bnb")
    assert tower_quantized_linears(m) == TOWER_LINEARS - MERGER_LINEARS - 4_377_600 == 625_587_200
    assert _tower_delta(m, "nf4") == 351_892_800 - 1_251_174_400
    r = resolve({"model": cfg, "hardware": {"gpu": "H100-80GB"}, "task": "inference", "inference": {"prompt_len": 64}})
    assert any("3 skipped instance(s) held unquantized" in a for a in r.assumptions)


def test_compressed_tensors_ignore_regex_leaves_the_tower() -> None:
    cfg = _config(QWEN)
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head", "re:visual.*"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                  "dynamic": True}}}}
    assert tower_quantized_linears(model_from_config(cfg, name="ct")) == 0


def test_a_tower_skip_entry_matching_no_tower_name_is_refused() -> None:
    cfg = _config(QWEN)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                  "modules_to_not_convert": ["model.visual.encoder.layers.0"]}
    m = model_from_config(cfg, name="fp8")
    assert m.vision is not None and "match none of the tower's" in m.vision.quant_refused
    doc = {"model": cfg, "hardware": {"gpu": "H100-80GB"}, "task": "serve", "serve": {}}
    with pytest.raises(ScenarioError, match="vision tower under fp8-block: not modelled"):
        resolve(doc)


def test_a_legacy_siglip_name_reaches_its_instance() -> None:
    # gemma-3's SigLIP: the checkpoint's vision_tower.vision_model.encoder.layers.26.mlp.fc2 is the 5.x module
    # vision_tower.encoder.layers.26.mlp.fc2 (CLIPVisionModel's PrefixChange); 1152 x 4304 weights stay bf16
    cfg = _config(GEMMA3)
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "llm_int8_skip_modules": ["lm_head",
                                                            "vision_tower.vision_model.encoder.layers.26.mlp.fc2"]}
    m = model_from_config(cfg, name="bnb")
    assert m.vision is not None and not m.vision.quant_refused
    assert tower_quantized_linears(m) == 411_070_464 - 4304 * 1152


def test_entries_naming_modules_the_model_lacks_change_nothing() -> None:
    # a skip list written for several architectures: Qwen2.5-VL has no multi_modal_projector, modality_projection
    # or vision_tower; the merger's two linears are the only tower instances skipped
    cfg = _config(QWEN)
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "llm_int8_skip_modules": ["lm_head", "multi_modal_projector", "merger",
                                                            "modality_projection", "vision_tower"]}
    m = model_from_config(cfg, name="bnb")
    assert m.vision is not None and not m.vision.quant_refused
    assert tower_quantized_linears(m) == TOWER_LINEARS - MERGER_LINEARS


def test_gemma3_qlora_quantizes_siglip_but_not_the_projector_parameter() -> None:
    # SigLIP (d 1152, i 4304, 27 layers): q/k/v/out 4 x 1152^2 + fc1/fc2 2 x 1152 x 4304 = 15,224,832 per layer
    #   x 27 = 411,070,464 quantized; mm_input_projection_weight is a Parameter (a matmul), never quantized
    m = load_model(GEMMA3)
    assert tower_quantized_linears(m) == 27 * (4 * 1152 * 1152 + 2 * 1152 * 4304) == 411_070_464
    assert all("mm_input_projection" not in name for name, *_ in m.vision.linears)  # type: ignore[union-attr]
    r = resolve({"model": GEMMA3, "hardware": {"gpu": "H100-80GB"}, "task": "train",
                 "train": {"quantization": "nf4", "peft": {"method": "lora"}, "seq_len": 512}})
    assert any("411,070,464 of them" in a for a in r.assumptions)


@pytest.mark.parametrize(("module", "entries", "skipped"), [
    ("visual.blocks.3.attn.qkv", ("visual",), True),
    ("visual.blocks.3.attn.qkv", ("model.visual",), True),
    ("visual.blocks.3.attn.qkv", ("visual.blocks.3",), True),
    ("visual.blocks.31.attn.qkv", ("visual.blocks.3",), False),  # a module boundary, not a prefix of the string
    ("visual.blocks.3.attn.qkv", ("re:visual.*",), True),
    ("visual.blocks.3.attn.qkv", ("re:model.visual.*",), True),
    ("visual.blocks.3.attn.qkv", ("lm_head", "re:.*lm_head"), False),
])
def test_skip_entries(module: str, entries: tuple[str, ...], skipped: bool) -> None:
    assert skipped_by(module, entries) is skipped


def test_images_under_nf4_say_the_towers_dequantized_temporary_is_not_counted() -> None:
    # the largest quantized tower linear: the merger's mlp.0, 5120 x 5120 = 26,214,400 weights
    doc = {"model": QWEN, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
           "inference": {"quantization": "nf4", "prompt_len": 2048, "images_per_sample": 1}}
    r = resolve(doc)
    assert any(a.startswith("not modelled: nf4 dequantizes each of the tower's") and "26,214,400" in a
               for a in r.assumptions)
    no_images = resolve({**doc, "inference": {"quantization": "nf4", "prompt_len": 2048}})
    assert not any("dequantizes each of the tower's" in a for a in no_images.assumptions)


LISTS = ("blocks", "layers", "layer", "deepstack_merger_list")
LMS = ("language_model", "text_model")  # the language model (Idefics3 names it text_model)


def _data(name: str) -> dict[str, Any]:
    import json
    from pathlib import Path

    return dict(json.loads((Path(__file__).resolve().parent / "data" / name / "config.json").read_text()))


def _vlm_configs() -> list[tuple[str, dict[str, Any]]]:
    from test_vision_internvl import CFG as INTERNVL
    from test_vision_qwen3_vl import QWEN3_VL_4B

    out = [(QWEN, _config(QWEN)), (GEMMA3, _config(GEMMA3)), ("qwen3-vl-4b", QWEN3_VL_4B), ("internvl", INTERNVL)]
    out += [(name, _data(name)) for name in ("llava-1.5-7b", "llava-siglip-tiny", "llava-next-7b-shape",
                                             "qwen2-vl-2b-shape", "paligemma2-3b-448-shape",
                                             "mistral-small-3.1-24b-shape", "idefics3-8b-shape")]
    return out


@pytest.mark.parametrize(("name", "cfg"), _vlm_configs(), ids=[n for n, _ in _vlm_configs()])
def test_tower_linears_are_the_modules_transformers_quantizers_replace(name: str, cfg: dict[str, Any]) -> None:
    """The oracle: transformers 5.24's own module on the meta device.  ``replace_with_bnb_linear`` converts the
    modules whose type is exactly ``nn.Linear`` outside ``get_modules_to_not_convert`` (``get_keys_to_not_convert``:
    the LM head; ``_keep_in_fp32_modules``: none of these classes sets one); every such module outside the language
    model is one of the adapter's ``VisionSpec.linears``, with its shape."""
    torch = pytest.importorskip("torch")
    from transformers.quantizers.base import get_keys_to_not_convert

    from meta_build import meta_module

    module = meta_module(cfg)
    assert not module._keep_in_fp32_modules
    skip = set(get_keys_to_not_convert(module))
    theirs: dict[str, tuple[int, int, int]] = {}
    for full, sub in module.named_modules():
        if type(sub) is not torch.nn.Linear or full in skip or any(f".{lm}." in f".{full}." for lm in LMS):
            continue
        parts = full.removeprefix("model.").split(".")
        # drop the ModuleList index (blocks.3, layers.3, layer.3, deepstack_merger_list.1), keep Sequential's (mlp.0)
        key = ".".join(x for j, x in enumerate(parts) if not (x.isdigit() and parts[j - 1] in LISTS)) + ".weight"
        n = theirs.get(key, (0, 0, 0))[2]
        theirs[key] = (sub.in_features, sub.out_features, n + 1)
    spec = model_from_config(cfg, name=name)
    assert spec.vision is not None
    assert {n: (i, o, k) for n, i, o, k in spec.vision.quantized_linears} == theirs


def test_awq_skip_list_transformers_5_would_not_match_is_said() -> None:
    # should_convert_module (transformers 5.24 quantizers_utils.py) anchors a plain entry at the name's start or
    # takes it as a suffix: "visual" leaves model.visual.blocks.0.attn.qkv to be converted, "model.visual" does not
    pytest.importorskip("transformers")
    from transformers.quantizers.quantizers_utils import should_convert_module

    assert should_convert_module("model.visual.blocks.0.attn.qkv", ["visual"])
    assert not should_convert_module("model.visual.blocks.0.attn.qkv", ["model.visual"])
    r = resolve({"model": _awq(["visual"]), "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                 "inference": {"prompt_len": 512}})
    assert any(a.startswith("not modelled: transformers 5.24 matches the skip entries ['visual']") for a in r.assumptions)
    same = resolve({"model": _awq(["model.visual"]), "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                    "inference": {"prompt_len": 512}})
    assert not any("should_convert_module" in a for a in same.assumptions)
    assert tower_quantized_linears(model_from_config(_awq(["model.visual"]), name="awq")) == 0


@pytest.mark.parametrize(("model", "quant"), [(QWEN, "nf4"), (GEMMA3, "nf4"), (QWEN, "none")])
def test_the_load_plan_holds_the_resident_weights(model: str, quant: str) -> None:
    """The lifecycle's load makes every parameter tensor as the step then holds it: each instance of a tower layer's
    tensors (one per group before), the quantized tower linears at their format's bytes.  Qwen2.5-VL-7B in bf16:
    8,292,166,656 x 2 = 16,584,333,312 B (1,221,536,400 B of tower instances were missing)."""
    from vramplan.analytic.lifecycle.load import _held_bytes, load_plan
    from vramplan.analytic.train import train_step

    train: dict[str, Any] = {"seq_len": 512, "micro_batch_size": 1, "peft": {"method": "lora"}}
    if quant != "none":
        train["quantization"] = quant
    c = train_step(resolve({"model": model, "hardware": {"gpu": "H100-80GB"}, "train": train})).context
    assert c is not None
    assert sum(load_plan(c).sizes) == weights_bytes(c.rp, _held_bytes(c), c.quant)
    if quant == "none" and model == QWEN:
        assert sum(load_plan(c).sizes) == 2 * 8_292_166_656


def test_gptq_checkpoint_with_a_tower_skip_entry_is_not_refused() -> None:
    # GPTQ never quantizes the tower, so a skip entry naming it ("visual") decides nothing: no refusal
    cfg = _config(QWEN)
    cfg["quantization_config"] = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq",
                                  "modules_to_not_convert": ["visual.blocks.99"]}
    m = model_from_config(cfg, name="gptq")
    assert m.vision is not None and m.vision.quant_refused == ""
    assert tower_quantized_linears(m) == 0
