"""PaliGemma (spec/families/paligemma.py): the SigLIP tower, linear projector and Gemma / Gemma 2 language model
against transformers' module on the meta device; the image tokens against PaliGemmaConfig's rule and the tower's
own output; the tower's activations in training and in the prefill by hand; the prefix-LM attention refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meta_build import assert_equals_meta_module
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_tokens

# PaliGemma 2 3B at 448 pixels, built from PaliGemmaConfig's docstring (SigLIP So400m/14, projection_dim = the
# Gemma 2 2B's hidden size) with the 448-pixel tower: a shape, not a published config.json (none is stored here)
PG2 = Path(__file__).resolve().parent / "data" / "paligemma2-3b-448-shape" / "config.json"


def _cfg(path: Path = PG2) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _defaults() -> dict[str, Any]:
    """PaliGemmaConfig() as transformers 5.24 builds it from its class defaults."""
    transformers = pytest.importorskip("transformers")
    return dict(transformers.PaliGemmaConfig().to_dict())


def test_default_parameters_by_hand() -> None:
    # PaliGemmaConfig(): its sub-configs from the init_kwargs (SigLIP So400m-like at 224, Gemma-2B)
    m = model_from_config(_defaults(), name="paligemma")
    v = m.vision
    assert v is not None and m.tie_word_embeddings
    # SigLIP d = 1152, i = 4096, 27 layers, 224 / 14 = 16 -> 256 patches, no head:
    #   patch_embedding 1152 x 3 x 14^2 + 1152 = 678,528; position_embedding 256 x 1152 = 294,912;
    #   per layer: q, k, v, out 4 x (1152^2 + 1152) = 5,313,024; fc1 1152 x 4096 + 4096 = 4,722,688;
    #              fc2 4096 x 1152 + 1152 = 4,719,744; layer_norm1/2 2 x 2 x 1152 = 4,608 -> 14,760,064
    #   post_layernorm 2 x 1152 = 2,304
    tower = 678_528 + 294_912 + 27 * 14_760_064 + 2_304
    assert tower == 399_497_472
    # projector: linear 1152 x 2048 + 2048 = 2,361,344
    assert m.vision_parameters == tower + 2_361_344 == 401_858_816
    # Gemma-2B with 257,152 tokens: embeddings 257,152 x 2048 = 526,647,296 (the LM head tied); per layer
    # q 2048 x 2048, k and v 2048 x 256 each, o 2048 x 2048 -> 9,437,184; gate, up, down 3 x 2048 x 16,384
    # = 100,663,296; two norms 4,096 -> 110,104,576; x 18 = 1,981,882,368; final norm 2,048
    assert m.num_parameters - m.vision_parameters == 526_647_296 + 1_981_882_368 + 2_048 == 2_508_531_712
    assert (v.patches_per_image, v.tokens_per_image, v.extra_tokens, v.unused_layers) == (256, 256, 0, 0)
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(v.param_prefixes))


def test_config_without_sub_configs_is_refused() -> None:
    # transformers would build it from PaliGemmaConfig's init_kwargs, which the traced engine's language model
    # (built alone from text_config) would not see
    with pytest.raises(ScenarioError, match="vision_config"):
        model_from_config({"model_type": "paligemma"})


@pytest.mark.parametrize("which", ["class-defaults", "paligemma2-448"])
def test_count_equals_transformers_module_on_the_meta_device(which: str) -> None:
    cfg = _defaults() if which == "class-defaults" else _cfg()
    spec = model_from_config(cfg, name=which)
    assert_equals_meta_module(spec, cfg)


def test_paligemma2_parameters() -> None:
    m = model_from_config(_cfg(), name="pg2")
    v = m.vision
    assert v is not None
    # 448 / 14 = 32 -> 1,024 patches and image tokens; position_embedding 1,024 x 1152
    assert (v.image_size, v.patches_per_image, v.tokens_per_image) == (448, 1024, 1024)
    # SigLIP So400m (i = 4304): per layer 5,313,024 + fc1 1152 x 4304 + 4304 + fc2 4304 x 1152 + 1152 + 4,608
    # = 5,313,024 + 4,962,512 + 4,959,360 + 4,608 = 15,239,504; x 27 = 411,466,608; patch_embedding 678,528;
    # position 1,179,648; post_layernorm 2,304; projector 1152 x 2304 + 2304 = 2,656,512
    assert m.vision_parameters == 411_466_608 + 678_528 + 1_179_648 + 2_304 + 2_656_512 == 415_983_600
    assert m.num_parameters == 3_033_127_152


@pytest.mark.parametrize("which", ["class-defaults", "paligemma2-448"])
def test_image_tokens_are_the_configs_rule_and_the_towers_output(which: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _defaults() if which == "class-defaults" else _cfg()
    v = model_from_config(cfg).vision
    assert v is not None
    config = transformers.PaliGemmaConfig(**{k: x for k, x in cfg.items() if k != "model_type"})
    # PaliGemmaConfig.__post_init__: text_config.num_image_tokens = (image_size // patch_size)^2, the processor's
    # image_seq_length for these checkpoints
    assert v.tokens_per_image == config.text_config.num_image_tokens
    # get_image_features projects every row of the tower's last_hidden_state: the image features per image
    with torch.device("meta"):
        tower = transformers.SiglipVisionModel(config.vision_config)
        out = tower(torch.empty(1, 3, v.image_size, v.image_size)).last_hidden_state
    assert out.shape[1] == v.tokens_per_image == v.patches_per_image


def test_processor_writes_image_seq_length_tokens_per_image() -> None:
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from transformers.models.paligemma.processing_paligemma import PaliGemmaProcessor

    v = model_from_config(_cfg()).vision
    assert v is not None
    proc = SimpleNamespace(image_seq_length=v.tokens_per_image, image_token="<image>")
    # _get_num_multimodal_tokens: image_seq_length per image, one tower pass each
    data = PaliGemmaProcessor._get_num_multimodal_tokens(proc, image_sizes=[[448, 448], [100, 900]])
    assert data["num_image_tokens"] == [1024, 1024] and data["num_image_patches"] == [1, 1]


def test_transformers_config_takes_the_language_model() -> None:
    assert transformers_config(_cfg())["model_type"] == "gemma2"
    assert transformers_config(_defaults())["model_type"] == "gemma"


def _doc(task: str = "train", model: str = str(PG2), **section: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


@pytest.mark.parametrize(("which", "task", "attention", "match", "hint"), [
    ("paligemma2", "train", "sdpa", "runs eager while the SigLIP tower runs SDPA", "attention: eager"),
    ("paligemma2", "inference", "sdpa", "runs eager while the SigLIP tower runs SDPA", "attention: eager"),
    ("paligemma2", "train", "flash", "_supports_flash_attn = False", "attention: eager"),
    ("paligemma", "train", "flash", "_supports_flash_attn = False", "attention: sdpa"),
])
def test_prefix_lm_attention_not_modelled_is_refused(tmp_path: Path, which: str, task: str, attention: str,
                                                     match: str, hint: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_defaults() if which == "paligemma" else _cfg()))
    size = {"seq_len": 2048} if task == "train" else {"prompt_len": 2048}
    with pytest.raises(ScenarioError, match=match) as err:
        resolve(_doc(task, model=str(path), attention=attention, images_per_sample=1, **size))
    assert f"set {task}.{hint}" in str(err.value)


def _pg1(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_defaults()))
    return str(path)


def test_sdpa_runs_the_memory_efficient_kernel_on_the_mask(tmp_path: Path) -> None:
    from dataclasses import replace

    from vramplan.analytic.attention import resolve_attention
    from vramplan.analytic.terms.context import step_policy
    from vramplan.analytic.train import train_step

    r = resolve(_doc(model=_pg1(tmp_path), micro_batch_size=1, seq_len=1024, images_per_sample=1))
    assert r.model.traits.sdpa_mask_always
    # flash takes no mask: the memory-efficient kernel (SDPA's default here, sdpa)
    assert resolve_attention(r.scenario, r.model, step_policy(r.scenario))[0] == "efficient"
    without = replace(r, model=replace(r.model, traits=replace(r.model.traits, sdpa_mask_always=False)))

    def saved(res: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in res.terms:  # the per-layer terms share a name: summed over the layers
            if t.name.startswith("saved."):
                out[t.name] = out.get(t.name, 0) + t.nbytes
        return out

    ours, plain = saved(train_step(r)), saved(train_step(without))
    # per token and decoder layer, Gemma-2B (8 heads, 1 K/V head of 256), bf16: the mask in the query dtype
    # 2 x 1,024 keys = 2,048 and K and V repeated to the 7 other heads 2 x 2 x (2048 - 256) = 7,168 -> 9,216,
    # over 1,024 tokens and 18 layers (each layer's "saved.kept")
    assert ours["saved.kept"] - plain["saved.kept"] == 18 * 9_216 * 1_024 == 169_869_312
    assert all(ours[k] == plain[k] for k in ours if k != "saved.kept")
    # full checkpointing: each layer keeps its input, and the boolean mask (1 byte per key) is kept with them
    ckpt = resolve(_doc(model=_pg1(tmp_path), micro_batch_size=1, seq_len=1024, images_per_sample=1,
                        gradient_checkpointing="full"))
    ckpt_plain = replace(ckpt, model=replace(ckpt.model, traits=replace(ckpt.model.traits, sdpa_mask_always=False)))
    assert saved(train_step(ckpt))["saved.shared"] - saved(train_step(ckpt_plain))["saved.shared"] == 1_024 * 1_024


def test_sdpa_prefill_by_hand(tmp_path: Path) -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", model=_pg1(tmp_path), batch_size=2, prompt_len=1024, images_per_sample=1))
    (prefill,) = [mo for mo in inference_step(r).moments if mo.get(K.RUNNING_LAYER)]
    # Gemma-2B, bf16, 2 x 1,024 tokens: the attention moment (3 x 2048 + 3 x 2048) x 2,048 x 2 = 50,331,648,
    # K and V repeated 2 x 2048 x 2,048 x 2 = 16,777,216, the boolean mask 2 x 1,024^2 = 2,097,152 and its bf16
    # copy 4,194,304 -> 73,400,320; the MLP moment (3 x 2048 + 3 x 16,384) x 2,048 x 2 = 226,492,416 with the
    # boolean mask alive, 228,589,568, is the larger
    assert prefill.get(K.RUNNING_LAYER) == 226_492_416 + 2_097_152 == 228_589_568
    # the tower under SDPA (no mask: SigLIP is handed none) runs flash: its MLP moment 2 x (3 x 1152 + 2 x 4096)
    # = 23,296 per patch, the embeddings' output bound in SiglipVisionTransformer.forward through the layers
    # 2 x 1152 = 2,304 and the pixels 2 x 3 x 14^2 = 1,176, 256 patches, 2 images
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    assert vision.get(K.VISION_TOWER) == 2 * 256 * (23_296 + 2_304 + 1_176) == 13_709_312


def test_image_tokens_in_the_sequence_and_the_cache() -> None:
    r = resolve(_doc(seq_len=4096, images_per_sample=2, image_size=896, attention="eager"))
    assert image_tokens(r.scenario, r.model) == 2 * 1024  # every image resized to 448: image_size ignored
    with pytest.raises(ScenarioError, match="2,048 tokens, more than inference.prompt_len 2,000"):
        resolve(_doc("inference", prompt_len=2000, images_per_sample=2, attention="eager"))


def _tower_terms(path: Path, **train: Any) -> dict[str, int]:
    from vramplan.analytic.train import train_step

    res = train_step(resolve(_doc(model=str(path), micro_batch_size=1, seq_len=1024, attention="eager",
                                  images_per_sample=1, **train)))
    return {t.name: t.nbytes for t in res.terms if t.name.startswith("saved.vision_tower")}


def test_tower_activations_by_hand(tmp_path: Path) -> None:
    from vramplan.analytic.timeline import FORWARD, TIED_EMBEDDING
    from vramplan.analytic.train import train_step

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_defaults()))
    # per patch and SigLIP layer, bf16-mixed (fp32 residual), eager, d = 1152, i = 4096, 16 heads, 256 patches:
    #   layer_norm1 fp32 input 4 x 1152 + mean/rstd 8 = 4,616; q/k/v's bf16 input casts 3 x 2 x 1152 = 6,912;
    #   q and k for the scores' matmul 2 x 2 x 1152 = 4,608; the fp32 softmax output 4 x 16 x 256 = 16,384 and its
    #   bf16 cast for the matmul with v 2 x 16 x 256 = 8,192; v 2,304; out_proj's input 2,304; layer_norm2 4,616;
    #   fc1's input cast 2,304; gelu_pytorch_tanh's input 2 x 4096 = 8,192; fc2's input 8,192      -> 68,624
    layer = 68_624 * 256
    # the patch convolution's input 2 x 3 x 14^2 x 256 = 301,056; post_layernorm 4,616 x 256 = 1,181,696; the
    # projector's input (the norm's output in bf16) 2 x 1152 x 256 = 589,824
    head = 301_056 + 1_181_696 + 589_824
    assert _tower_terms(path) == {"saved.vision_tower": 27 * layer + head}
    assert 27 * layer + head == 476_401_664
    # full checkpointing: each layer keeps its fp32 input, 4 x 1152 x 256 = 1,179,648
    assert _tower_terms(path, gradient_checkpointing="full") == {"saved.vision_tower": 27 * 1_179_648 + head}
    # frozen tower, LoRA or no image: nothing
    assert _tower_terms(path, freeze_vision_tower=True) == {}
    assert _tower_terms(path, peft={"method": "lora"}) == {}
    res = train_step(resolve(_doc(model=str(path), micro_batch_size=1, seq_len=1024, attention="eager",
                                  images_per_sample=1)))
    (term,) = [t for t in res.terms if t.name == "saved.vision_tower"]
    assert (term.born, term.dies) == (FORWARD, TIED_EMBEDDING)


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=2, prompt_len=2048, images_per_sample=1, attention="eager"))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 2 images of 1,024 patches, bf16, eager: the running layer's attention moment is the larger: the layer input,
    # the normalised input and q (3 x 1152 x 1,024 x 2 = 7,077,888), the scores, their fp32 softmax and its bf16
    # copy (16 heads x 1,024^2 x 10 = 167,772,160) and a 4-D mask (1,024^2 x 2 = 2,097,152; the decoder layers'
    # rule: SiglipAttention is handed none, an over-count of 0.1 % here); the embeddings' output bound in
    # SiglipVisionTransformer.forward through the layers, 1152 x 1,024 x 2 = 2,359,296; the pixels 3 x 448^2 x 2 =
    # 1,204,224
    per_image = 7_077_888 + 167_772_160 + 2_097_152 + 2_359_296 + 1_204_224
    assert vision.get(K.VISION_TOWER) == 2 * per_image == 361_021_440
    assert any("prefix LM" in a for a in r.assumptions)


def test_kv_cache_holds_the_image_tokens() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    # the image tokens are positions of the prompt (prompt_len counts them: 2 x 1,024 + 1,000 text = 3,048);
    # Gemma 2 2B's cache: 26 layers x 2 (k, v) x 4 KV heads x 256 x 2 B = 106,496 B per position, every layer
    # holding all of them (the 13 sliding layers' window, 4096, is not reached)
    r = resolve(_doc("inference", batch_size=1, prompt_len=3048, new_tokens=16, images_per_sample=2,
                     attention="eager"))
    moments = inference_step(r).moments
    assert max(mo.get(K.KV_PROMPT) for mo in moments) == 106_496 * 3048 == 324_599_808
    # the last decode step reads the cache of the prompt and the 15 tokens generated before it
    assert max(mo.get(K.KV_ALL) for mo in moments) == 106_496 * (3048 + 15) == 326_197_248


def test_transformers_hands_sdpa_the_mask_and_repeated_kv() -> None:
    """What ``Traits.sdpa_mask_always`` stands on, read off transformers 5.24 on the CPU: a tiny PaliGemma in
    training under sdpa calls ``scaled_dot_product_attention`` with no mask in the SigLIP tower and, in every
    decoder layer, a boolean [b, 1, s, s] mask with K and V repeated to the query heads (no enable_gqa)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from unittest import mock

    cfg = transformers.PaliGemmaConfig(
        vision_config={"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                       "vision_use_head": False},
        text_config={"model_type": "gemma", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 300},
        projection_dim=32, image_token_index=299)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.PaliGemmaForConditionalGeneration(cfg).train()
    calls: list[tuple[int, Any]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def record(q: Any, k: Any, v: Any, attn_mask: Any = None, **kw: Any) -> Any:
        mask = None if attn_mask is None else (attn_mask.dtype, tuple(attn_mask.shape))
        calls.append((k.shape[1], mask, kw.get("enable_gqa")))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    # (28 / 14)^2 = 4 image tokens, then the prefix (token type 0) and a 3-token suffix (token type 1)
    ids = torch.tensor([[299] * 4 + [2, 5, 6, 7, 8, 9]])
    with mock.patch("torch.nn.functional.scaled_dot_product_attention", record):
        model(input_ids=ids, pixel_values=torch.randn(1, 3, 28, 28),
              token_type_ids=torch.tensor([[0] * 7 + [1] * 3]), labels=ids)
    assert calls == [(2, None, None), (4, (torch.bool, (1, 1, 10, 10)), None), (4, (torch.bool, (1, 1, 10, 10)), None)]
