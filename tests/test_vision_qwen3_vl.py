"""Qwen3-VL and Qwen3-VL-MoE (spec/families/qwen3_vl.py): parameters by hand and against transformers' module on
the meta device, image tokens against transformers' ``smart_resize`` with the releases' processor values, the tower's
saved tensors and prefill moment by hand."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import assert_equals_meta_module, meta_module, tracked_peak
from vramplan.catalog.resolve import resolve
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid, image_tokens

# The values of Qwen/Qwen3-VL-4B-Instruct's config.json (https://huggingface.co/Qwen/Qwen3-VL-4B-Instruct,
# transformers_version 4.57.0.dev0) as a public third-party copy reproduces them (the Hub cannot be read here), the
# keys that shape the model; not a catalog row (no copy from a cited revision)
QWEN3_VL_4B: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": True,
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "text_config": {"model_type": "qwen3_vl_text", "attention_bias": False, "attention_dropout": 0.0, "head_dim": 128,
                    "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 9728,
                    "max_position_embeddings": 262144, "num_attention_heads": 32, "num_hidden_layers": 36,
                    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 5000000,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                    "tie_word_embeddings": True, "vocab_size": 151936, "dtype": "bfloat16"},
    "vision_config": {"model_type": "qwen3_vl", "deepstack_visual_indexes": [5, 11, 17], "depth": 24,
                      "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024, "in_channels": 3,
                      "intermediate_size": 4096, "num_heads": 16, "num_position_embeddings": 2304,
                      "out_hidden_size": 2560, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
}
DEFAULTS = {"model_type": "qwen3_vl", "text_config": {}, "vision_config": {}}
MOE_DEFAULTS = {"model_type": "qwen3_vl_moe", "text_config": {}, "vision_config": {}}


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": QWEN3_VL_4B, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_tower_by_hand() -> None:
    m = model_from_config(QWEN3_VL_4B, name="qwen3-vl-4b")
    # d = 1024, i = 4096, 24 blocks, out 2560, merge 2 (4d = 4096), 3 DeepStack mergers:
    #   patch_embed Conv3d 1024 x 3 x 2 x 16 x 16 + bias 1024 = 1,573,888; pos_embed 2304 x 1024 = 2,359,296
    #   per block: norm1/norm2 4 x 1024 = 4,096; qkv 1024 x 3072 + 3072 = 3,148,800; proj 1024^2 + 1024 =
    #     1,049,600; linear_fc1 1024 x 4096 + 4096 = 4,198,400; linear_fc2 4096 x 1024 + 1024 = 4,195,328
    #     -> 12,596,224 x 24 = 302,309,376
    #   merger: norm 2 x 1024; fc1 4096^2 + 4096 = 16,781,312; fc2 4096 x 2560 + 2560 = 10,488,320 -> 27,271,680
    #   each DeepStack merger: norm 2 x 4096 = 8,192 + the same fc1, fc2 -> 27,277,824 x 3 = 81,833,472
    tower = 1_573_888 + 2_359_296 + 302_309_376 + 27_271_680 + 81_833_472
    assert m.vision_parameters == tower == 415_347_712
    assert m.num_parameters == 4_437_815_808
    assert m.tie_word_embeddings and m.qk_norm


@pytest.mark.parametrize("cfg", [QWEN3_VL_4B, DEFAULTS, MOE_DEFAULTS], ids=["4b", "class-defaults", "moe-defaults"])
def test_count_and_names_equal_transformers_module_on_the_meta_device(cfg: dict[str, Any]) -> None:
    spec = model_from_config(cfg, name="q")
    assert_equals_meta_module(spec, cfg, only="model.visual.")


@pytest.mark.parametrize(("size", "patches", "tokens"), [
    # smart_resize, factor 32 (patch 16 x merge 2), min_pixels 65,536, max_pixels 16,777,216:
    (448, 784, 196),        # 448 = 14 x 32 kept: 28^2 patches, / 4
    (1000, 3844, 961),      # round(1000 / 32) x 32 = 992: 62^2
    (200, 256, 64),         # 192^2 < min_pixels: ceil(200 x sqrt(65,536 / 40,000) / 32) x 32 = 256: 16^2
    (None, 65_536, 16_384),  # not given: the largest square, sqrt(16,777,216) = 4096: 256^2
])
def test_image_tokens_follow_smart_resize(size: int | None, patches: int, tokens: int) -> None:
    v = model_from_config(QWEN3_VL_4B, name="q").vision
    assert v is not None
    assert image_grid(v, size) == (patches, tokens)


@pytest.mark.parametrize("side", [64, 200, 448, 513, 1000, 2048, 5000])
def test_smart_resize_equals_transformers(side: int) -> None:
    pytest.importorskip("torch")
    # the PIL backend's copy (the torchvision one needs torchvision): the same function
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    v = model_from_config(QWEN3_VL_4B, name="q").vision
    assert v is not None
    h, w = smart_resize(side, side, factor=32, min_pixels=65_536, max_pixels=16_777_216)
    assert image_grid(v, side) == ((h // 16) * (w // 16), (h // 16) * (w // 16) // 4)


def test_tower_activations_by_hand() -> None:
    from vramplan.analytic.terms import bytes_of
    from vramplan.analytic.train import train_step

    r = resolve(_doc(micro_batch_size=1, seq_len=2048, images_per_sample=1, image_size=448))
    assert image_tokens(r.scenario, r.model) == 196
    # per patch and block, bf16-mixed, SDPA flash, d = 1024 (16 heads of 64), i = 4096:
    #   norm1 (LayerNorm: fp32 input 4 x 1024 + mean/rstd 8) 4,104; qkv's input cast 2,048; the fused qkv buffer v
    #   keeps alive 2 x 2,048 = 4,096; flash q, k, v, output 4 x 2,048 = 8,192; logsumexp 4 x 16 = 64; norm2 4,104;
    #   linear_fc1's input cast 2,048; gelu_pytorch_tanh's input 2 x 4096 = 8,192; linear_fc2's input 8,192
    #   -> 41,040
    # 448 x 448: 784 patches, 24 blocks; patch_embed input 2 x 3 x 2 x 16^2 = 3,072 per patch; four mergers (the
    # final one and three DeepStack ones), each a norm 4,104 and its MLP's three inputs 3 x 2 x 1024 = 6,144
    expected = 784 * (24 * 41_040 + 3_072 + 4 * (4_104 + 6_144))
    assert bytes_of(train_step(r).terms, "saved.vision_tower") == expected == 806_754_816
    assert any("3 DeepStack mergers" in a for a in r.assumptions)


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=2, prompt_len=1024, images_per_sample=1, image_size=448))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 2 images of 784 patches, bf16; the running layer is the MLP moment: input, residual and normalised input
    # (3 x 1024 x 2 B = 6,144) and linear_fc1's output and the GELU's (2 x 4096 x 2 B = 16,384) -> 22,528 per patch;
    # pixel values 784 x 3 x 2 x 16^2 x 2 B = 2,408,448 per image; the DeepStack features of blocks 5, 11 and 17,
    # alive through the last block: 3 x 2560 x 2 B = 15,360 per merged token, 784 / 4 = 196 of them; held through
    # the blocks per patch: pos_embeds, cos and sin (head_dim 1024 / 16) and the 4 interpolation weights in fp32,
    # (1024 + 2 x 64 + 4) x 4 = 4,624, and 2 position ids and 4 interpolation indices in int64, 6 x 8 = 48 -> 4,672
    assert r.model.vision is not None and r.model.vision.kept_merged_elements == 3 * 2560
    assert vision.get(K.VISION_TOWER) == 2 * (784 * (22_528 + 4_672) + 2_408_448 + 196 * 15_360) == 53_487_616


def _small(deep: list[int]) -> dict[str, Any]:
    """A small Qwen3-VL for a real forward on the CPU: 4 blocks of 128, patch 16, merge 2, out_hidden_size 256."""
    return {"model_type": "qwen3_vl", "image_token_id": 1000, "video_token_id": 1001, "vision_start_token_id": 1002,
            "vision_end_token_id": 1003, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
            "text_config": {"model_type": "qwen3_vl_text", "vocab_size": 1024, "hidden_size": 256,
                            "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "head_dim": 64,
                            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [12, 10, 10],
                                             "rope_type": "default"}},
            "vision_config": {"model_type": "qwen3_vl", "deepstack_visual_indexes": deep, "depth": 4,
                              "hidden_act": "gelu_pytorch_tanh", "hidden_size": 128, "in_channels": 3,
                              "intermediate_size": 512, "num_heads": 4, "num_position_embeddings": 2304,
                              "out_hidden_size": 256, "patch_size": 16, "spatial_merge_size": 2,
                              "temporal_patch_size": 2}}


def _bf16_model_and_image(cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """transformers' own Qwen3VLForConditionalGeneration for ``cfg`` in bf16 under SDPA, and the inputs of one
    448 x 448 image (28 x 28 patches) in a 212-token prompt."""
    torch = pytest.importorskip("torch")
    module = meta_module(cfg)
    cls, config = type(module), module.config
    torch.manual_seed(0)
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "sdpa"
    model = cls(config).to(torch.bfloat16).eval()
    ids = torch.randint(3, 900, (1, 196 + 16))
    ids[:, 4:4 + 196] = 1000
    inputs = {"input_ids": ids, "pixel_values": torch.randn(784, 3 * 2 * 16 * 16, dtype=torch.bfloat16),
              "image_grid_thw": torch.tensor([[1, 28, 28]]), "mm_token_type_ids": (ids == 1000).long()}
    return model, inputs


def _tracked_blocks(cfg: dict[str, Any]) -> int:
    """Peak bytes beyond the weights and inputs while the tower's blocks run, in a bf16 CPU forward of transformers'
    own Qwen3VLForConditionalGeneration (trace/tracker.py) over one 448 x 448 image (28 x 28 patches)."""
    model, inputs = _bf16_model_and_image(cfg)
    blocks = model.model.visual.blocks
    return tracked_peak(model, inputs, blocks[0], blocks[-1])


def test_tensors_held_through_the_blocks_equal_a_tracked_forward() -> None:
    """What transformers' own forward holds as the first block starts (trace/tracker.py, bf16 on the CPU): the
    prompt's embeddings (212 x 256 x 2 B = 108,544), the block's input (784 x 128 x 2 B = 200,704) and
    ``VisionSpec.held_per_patch`` over 784 patches: pos_embeds, cos, sin (head_dim 128 / 4 = 32) and 4 weights in
    fp32, (128 + 64 + 4) x 4 = 784, and 6 int64 ids and indices, 48 -> 832 B a patch, 652,288."""
    torch = pytest.importorskip("torch")
    from vramplan.trace.tracker import Tracker

    cfg = _small([])
    v = model_from_config(cfg, name="small").vision
    assert v is not None and v.held_per_patch == (("fp32", 128 + 64 + 4), ("int64", 6))
    model, inputs = _bf16_model_and_image(cfg)
    with torch.no_grad(), Tracker() as tr:
        tr.track([*model.parameters(), *model.buffers(), *inputs.values()], "weights")
        base = tr.live_bytes
        model.model.visual.blocks[0].register_forward_pre_hook(lambda *a: tr.mark("blocks"))
        model(**inputs, use_cache=True, logits_to_keep=1)
    start = {name: i for i, name in tr.marks}["blocks"]
    live = sum(e.nbytes for e in tr.events[:start])
    # measured 8 B more: cu_seqlens (int32, 2 entries)
    assert 0 <= live - base - (108_544 + 200_704 + 652_288) <= 8


def test_deepstack_features_in_the_vision_moment_equal_a_tracked_forward() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    def analytic(deep: list[int]) -> int:
        r = resolve({"model": _small(deep), "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                     "inference": {"batch_size": 1, "prompt_len": 196 + 16, "images_per_sample": 1,
                                   "attention": "sdpa", "new_tokens": 1, "image_size": 448}})
        (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
        return vision.get(K.VISION_TOWER)

    # DeepStack after blocks 0 and 1 (alive through the last block) and 3 (the last: made after it): 2 x 256 x 2 B
    # per merged token, 196 of them = 200,704, what transformers' own forward holds more than without DeepStack
    # (the rest of the blocks' moment is not compared here)
    more = 2 * 256 * 2 * 196
    assert analytic([0, 1, 3]) - analytic([]) == more == 200_704
    assert _tracked_blocks(_small([0, 1, 3])) - _tracked_blocks(_small([])) == more


def test_kv_cache_holds_the_image_tokens() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    # the image tokens are positions of the prompt (prompt_len counts them: 2 x 196 + 632 text = 1,024); the 4B's
    # cache: 36 layers x 2 (k, v) x 8 KV heads x 128 x 2 B = 147,456 B per position
    r = resolve(_doc("inference", batch_size=1, prompt_len=1024, new_tokens=16, images_per_sample=2, image_size=448))
    assert image_tokens(r.scenario, r.model) == 392
    moments = inference_step(r).moments
    assert max(mo.get(K.KV_PROMPT) for mo in moments) == 147_456 * 1024 == 150_994_944


def test_transformers_config_takes_the_language_model() -> None:
    """The traced engine's language model alone: a Qwen3 of the text_config, its count the adapter's less the tower
    (4,437,815,808 - 415,347,712 = 4,022,468,096)."""
    from vramplan.spec.families import transformers_config

    tc = transformers_config(QWEN3_VL_4B)
    assert tc["model_type"] == "qwen3" and "vision_config" not in tc
    module = meta_module(tc, auto="AutoModelForCausalLM")
    assert sum(p.numel() for p in module.parameters()) == 4_022_468_096
    # a text_config left to its class's defaults is still the family's language model (not gemma3_text)
    assert transformers_config(DEFAULTS)["model_type"] == "qwen3"
    assert transformers_config(MOE_DEFAULTS)["model_type"] == "qwen3_moe"
