"""LLaVA (spec/families/llava.py): the CLIP tower and projector's parameters against transformers' module on the
meta device, the image tokens, the tower's activations in training (its unused last layer freed before the
backward) and in the prefill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meta_build import meta_module, tower_totals, tracked_peak
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_tokens

DATA = Path(__file__).resolve().parent / "data"
# llava-hf/llava-1.5-7b-hf's config (CLIP ViT-L/14 at 336 pixels, Vicuna-7B with 32,064 tokens), its values as
# a LLaMA-Factory training log (transformers 4.41.1) prints LlavaConfig for snapshot
# 05ae2434cbb430be33edcba0c5203e7023f785b7; the same log reports "all params: 7067621376" with 4,194,304 LoRA
# parameters added: 7,063,427,072 without them, the count below
LLAVA = DATA / "llava-1.5-7b" / "config.json"
# a small SigLIP LLaVA: two feature layers concatenated, the "full" strategy, no projector bias, a Mistral
TINY = DATA / "llava-siglip-tiny" / "config.json"


def _cfg(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def test_llava_parameters_by_hand() -> None:
    m = model_from_config(_cfg(LLAVA), name="llava")
    assert m.model_type == "llava" and m.vision is not None and not m.tie_word_embeddings
    # CLIP, d = 1024, i = 4096, 24 layers, 336 / 14 = 24 -> 576 patches:
    #   class_embedding 1,024; patch_embedding (no bias) 1024 x 3 x 14 x 14 = 602,112;
    #   position_embedding (576 + 1) x 1024 = 590,848; pre_layrnorm and post_layernorm 2 x 2 x 1024 = 4,096
    #   per layer: q, k, v, out 4 x (1024^2 + 1024) = 4,198,400; fc1 1024 x 4096 + 4096 = 4,198,400;
    #              fc2 4096 x 1024 + 1024 = 4,195,328; layer_norm1/2 2 x 2 x 1024 = 4,096 -> 12,596,224
    tower = 1_024 + 602_112 + 590_848 + 4_096 + 24 * 12_596_224
    assert tower == 303_507_456
    # projector: linear_1 1024 x 4096 + 4096 = 4,198,400; linear_2 4096 x 4096 + 4096 = 16,781,312
    projector = 4_198_400 + 16_781_312
    assert m.vision_parameters == tower + projector == 324_487_168
    # Llama-2-7B's shape with 32,064 tokens: 6,738,415,616 + 2 x 64 x 4096 = 6,738,939,904
    assert m.num_parameters - m.vision_parameters == 6_738_939_904
    assert m.num_parameters == 7_063_427_072
    v = m.vision
    assert (v.patches_per_image, v.extra_tokens, v.tokens_per_image, v.unused_layers) == (576, 1, 576, 1)
    # neither quantized nor adapted
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(v.param_prefixes))


@pytest.mark.parametrize("path", [LLAVA, TINY], ids=["llava-1.5-7b", "llava-siglip-tiny"])
def test_count_equals_transformers_module_on_the_meta_device(path: Path) -> None:
    cfg = _cfg(path)
    spec = model_from_config(cfg, name=path.parent.name)
    module = meta_module(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    # and tensor by tensor for the tower and projector (the adapter lists the layers' tensors once, per_layer times)
    theirs = tower_totals(module)
    assert v_rows(spec) == theirs


def v_rows(spec: Any) -> dict[str, int]:
    return {p.name: p.total for p in spec.params if p.name.startswith(spec.vision.param_prefixes)}


def test_siglip_tower_tokens_and_projector() -> None:
    m = model_from_config(_cfg(TINY), name="tiny")
    v = m.vision
    assert v is not None
    # SigLIP has no class token; 224 / 16 = 14 -> 196 patches; "full" keeps every one: 196 image tokens
    assert (v.patches_per_image, v.extra_tokens, v.tokens_per_image) == (196, 0, 196)
    # vision_feature_layer [-2, -5] over 6 layers: outputs of layers 5 and 2 (7 hidden states), layer 6 unused;
    # linear_1 takes 2 x 128 = 256 features, no bias: 256 x 256 + 256 x 256 = 131,072
    assert v.unused_layers == 1
    rows = v_rows(m)
    assert rows["multi_modal_projector.linear_1.weight"] == 256 * 256
    assert "multi_modal_projector.linear_1.bias" not in rows


def test_default_strategy_drops_the_class_token_and_full_keeps_it() -> None:
    cfg = _cfg(LLAVA)
    # LlavaProcessor: (336 // 14)^2 + 1 (num_additional_image_tokens) = 577, less 1 under "default"
    assert model_from_config(cfg).vision.tokens_per_image == 576  # type: ignore[union-attr]
    full = {**cfg, "vision_feature_select_strategy": "full"}
    assert model_from_config(full).vision.tokens_per_image == 577  # type: ignore[union-attr]


def test_unknown_tower_is_refused() -> None:
    cfg = _cfg(LLAVA)
    cfg["vision_config"] = {**cfg["vision_config"], "model_type": "pixtral"}
    with pytest.raises(ScenarioError, match="vision tower of model_type 'pixtral' is not modelled"):
        model_from_config(cfg)


def test_transformers_config_takes_the_text_models_own_type() -> None:
    assert transformers_config(_cfg(LLAVA))["model_type"] == "llama"
    assert transformers_config(_cfg(TINY))["model_type"] == "mistral"


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": str(LLAVA), "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_image_tokens_in_the_sequence_and_the_cache() -> None:
    r = resolve(_doc(seq_len=2048, images_per_sample=3, image_size=672))
    assert image_tokens(r.scenario, r.model) == 3 * 576  # every image cropped to 336: image_size ignored
    with pytest.raises(ScenarioError, match="1,152 tokens, more than inference.prompt_len 1,000"):
        resolve(_doc("inference", prompt_len=1000, images_per_sample=2))


def _terms(**train: Any) -> dict[str, Any]:
    from vramplan.analytic.train import train_step

    res = train_step(resolve(_doc(micro_batch_size=1, seq_len=2048, **train)))
    return {t.name: t for t in res.terms if t.name.startswith("saved.vision_tower")}


def test_tower_activations_by_hand() -> None:
    from vramplan.analytic.timeline import FORWARD, LOSS, TIED_EMBEDDING

    # per token and CLIP layer, bf16-mixed (fp32 residual stream), SDPA flash, d = 1024, i = 4096, 16 heads:
    #   layer_norm1 fp32 input 4 x 1024 + mean/rstd 8 = 4,104; q/k/v's bf16 input casts 3 x 2 x 1024 = 6,144;
    #   flash q, k, v, output 4 x 2 x 1024 = 8,192; logsumexp 4 x 16 = 64; layer_norm2 4,104; fc1's input cast
    #   2,048; quick_gelu saves its input and the sigmoid 2 x 2 x 4096 = 16,384; fc2 input 8,192   -> 49,232
    # the tower runs over 576 patches + the class token = 577 tokens
    layer = 49_232 * 577
    assert layer == 28_406_864
    # kept to the embedding's backward: the patch convolution's input 2 x 3 x 14^2 x 576 = 677,376;
    # pre_layrnorm 4,104 x 577 = 2,368,008; layers 1-23; the projector on 576 tokens: linear_1's bf16 cast
    # 2 x 1024, the GELU input and linear_2's input 2 x 2 x 4096 -> 18,432 x 576 = 10,616,832
    kept = 677_376 + 2_368_008 + 23 * layer + 10_616_832
    assert kept == 667_020_088
    # layer 24 (after vision_feature_layer -2) and post_layernorm on its class token (4,104): to the loss only
    unused = layer + 4_104
    terms = _terms(images_per_sample=1)
    assert terms["saved.vision_tower"].nbytes == kept
    assert terms["saved.vision_tower_unused"].nbytes == unused == 28_410_968
    assert (terms["saved.vision_tower"].born, terms["saved.vision_tower"].dies) == (FORWARD, TIED_EMBEDDING)
    assert (terms["saved.vision_tower_unused"].born, terms["saved.vision_tower_unused"].dies) == (FORWARD, LOSS)
    # full checkpointing: each layer keeps its fp32 input, 4 x 1024 x 577 = 2,363,392
    ckpt = _terms(images_per_sample=1, gradient_checkpointing="full")
    assert ckpt["saved.vision_tower"].nbytes == 677_376 + 2_368_008 + 23 * 2_363_392 + 10_616_832
    assert ckpt["saved.vision_tower_unused"].nbytes == 2_363_392 + 4_104
    # frozen (LoRA, or freeze_vision_tower) or no image: nothing
    assert _terms(images_per_sample=1, peft={"method": "lora"}) == {}
    assert _terms() == {}


def test_replay_frees_the_unused_layer_before_the_backward() -> None:
    from vramplan.alloc import replay
    from vramplan.analytic.events import train_run_events
    from vramplan.analytic.train import train_step

    tr = train_step(resolve(_doc(micro_batch_size=1, seq_len=1024, images_per_sample=1, peft=None)))
    assert tr.layout is not None
    assert sum(tr.layout.vision_unused) == 13 + 1  # the unused layer's 13 tensors and post_layernorm's
    events = train_run_events(tr.layout)
    # quick_gelu's saved tensors, 2 x 2 x 4096 x 577 = 9,453,568 B, one per tower layer: the 24th (the unused
    # layer's) is freed before the backward, the 23 others after the embedding's backward
    every = [e.block_id for e in events if e.nbytes == 9_453_568]
    assert len(every) % 24 == 0  # one pass per step the stream runs
    gelu = every[:24]
    freed = {e.block_id: i for i, e in enumerate(events) if e.nbytes < 0}
    assert freed[gelu[-1]] < min(freed[b] for b in gelu[:-1])
    assert replay(events).peak_allocated_bytes > 0


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=8, prompt_len=1024, images_per_sample=1))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 8 images of 577 tokens, bf16; CLIP's running layer is its MLP moment: the layer input, the residual, the
    # normalised input (3 x 1024) and quick_gelu's three 4096-wide tensors (fc1's output, the sigmoid and the
    # product) -> 2 x (3,072 + 12,288) = 30,720 per token; the encoder's input (pre_layrnorm's output), bound in
    # CLIPVisionTransformer.forward through the 24 layers: 1024 x 2 = 2,048 more (the selected state -2 is the last
    # layer's input, bound anyway) -> 32,768 x 577 = 18,907,136; pixels 576 x 3 x 14^2 x 2 = 677,376
    assert r.model.vision is not None and r.model.vision.kept_hidden_states == 1
    assert vision.get(K.VISION_TOWER) == 8 * (18_907_136 + 677_376) == 156_676_096


def test_held_tower_states_by_hand() -> None:
    # TINY's 6 SigLIP layers, vision_feature_layer [-2, -5]: hidden states 5 (the last layer's input, bound by the
    # encoder's loop) and 2 (layer 1's output, alive through layers 2-5 beside the loop's): the encoder's input and
    # state 2 -> 2
    tiny = model_from_config(_cfg(TINY), name="tiny").vision
    assert tiny is not None and tiny.kept_hidden_states == 2
    # -1 and -2 select the last layer's output and input, 0 the encoder's input: none is more than the one; -3 is
    # state 4, -4 state 3; [-3, 4] names state 4 twice
    for sel, kept in ((-1, 1), (-2, 1), (0, 1), (-3, 2), ([-3, -4, 1], 4), ([-3, 4], 2)):
        v = model_from_config({**_cfg(TINY), "vision_feature_layer": sel}, name="tiny").vision
        assert v is not None and v.kept_hidden_states == kept, sel


# a small LLaVA for a real forward on the CPU: CLIP at its real 336 pixels and patch 14 (577 tokens), narrower layers
SMALL: dict[str, Any] = {"model_type": "llava", "image_token_id": 1000, "vision_feature_layer": -2,
                         "vision_feature_select_strategy": "default", "torch_dtype": "bfloat16",
                         "text_config": {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256,
                                         "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
                                         "num_key_value_heads": 2},
                         "vision_config": {"model_type": "clip_vision_model", "hidden_size": 256,
                                           "intermediate_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 4,
                                           "image_size": 336, "patch_size": 14, "projection_dim": 256}}


def _tracked_tower(cfg: dict[str, Any], images: int, tokens: int, side: int, image_id: int) -> int:
    """Peak bytes beyond the weights and inputs while the vision tower runs, in a bf16 CPU forward of transformers'
    own LlavaForConditionalGeneration (trace/tracker.py), with bf16 pixel values (an input: in the base)."""
    torch = pytest.importorskip("torch")

    module = meta_module(cfg)
    cls, config = type(module), module.config
    torch.manual_seed(0)
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "sdpa"
    model = cls(config).to(torch.bfloat16).eval()
    ids = torch.randint(3, 900, (images, tokens + 16))
    ids[:, 4:4 + tokens] = image_id
    inputs = {"input_ids": ids, "pixel_values": torch.randn(images, 3, side, side, dtype=torch.bfloat16)}
    return tracked_peak(model, inputs, model.model.vision_tower)


@pytest.mark.parametrize(("cfg", "tokens", "side", "image_id"),
                         [(SMALL, 576, 336, 1000), ({**_cfg(TINY), "image_token_index": 999}, 196, 224, 999)], ids=["clip", "siglip-two-layers"])
def test_prefill_vision_moment_equals_a_tracked_forward(cfg: dict[str, Any], tokens: int, side: int,
                                                        image_id: int) -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    tracked = _tracked_tower(cfg, 2, tokens, side, image_id)
    r = resolve({"model": cfg, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                 "inference": {"batch_size": 2, "prompt_len": tokens + 16, "images_per_sample": 1,
                               "attention": "sdpa", "new_tokens": 1}})
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    analytic = vision.get(K.VISION_TOWER) + vision.get(K.INPUTS_EMBEDS)
    # the analytic moment counts the pixel values (bf16) the tracked forward holds as an input
    pixels = 2 * 3 * side * side * 2
    assert tracked + pixels == analytic
