"""Phi-4-multimodal, transformers' port (spec/families/phi4_multimodal.py): parameters by hand and against
transformers' module on the meta device, the processor's crops and image tokens by hand, the tower's prefill moment by
hand and against a tracked CPU forward of transformers' own module, and the tasks refused (serving, a trained tower)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meta_build import meta_module, tower_totals, tracked_peak
from vramplan.catalog.models import list_models
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid

ROW = next(r for r in list_models() if r.id == "microsoft/Phi-4-multimodal-instruct")
# every optional shape: an odd number of patches a side (42 / 14 = 3: the reflection pad before the pool), two
# subsampling stages (time_reduction 4), symmetric relative-position buckets, a downsampled audio projector input, the
# last layer's output as the feature (nothing unused), an untied head
ODD: dict[str, Any] = {"model_type": "phi4_multimodal", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                       "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                         "num_attention_heads": 4, "image_size": 42, "crop_size": 42,
                                         "feature_layer": -1},
                       "audio_config": {"hidden_size": 32, "intermediate_size": 40, "num_blocks": 2,
                                        "num_attention_heads": 4, "ext_pw_out_channel": 32,
                                        "depthwise_separable_out_channel": 32, "depthwise_multiplier": 2,
                                        "nemo_conv_channels": 16, "time_reduction": 4, "bias_symmetric": True,
                                        "bias_max_distance": 50, "downsample_rate": 2}}


def _doc(task: str, model: Any = ROW.id, **section: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_parameters_by_hand() -> None:
    m = model_from_config(ROW.config, name=ROW.id)
    # SigLIP tower, d = 1152, i = 4304, 27 layers, 448 / 14 = 32 patches a side:
    #   patch embedding 1152 x 3 x 14^2 + 1152 = 678,528; positions 1024 x 1152 = 1,179,648; post_layernorm 2,304
    #   per layer: q/k/v/out_proj 4 x (1152^2 + 1152) = 5,313,024; fc1 1152 x 4304 + 4304 = 4,962,512; fc2
    #     4,958,208 + 1152 = 4,959,360; two LayerNorms 4,608 -> 15,239,504 x 27 = 411,466,608
    #   pooling head: probe 1,152; in_proj 3 x 1152^2 + 3 x 1152 = 3,984,768; out_proj 1,328,256; layernorm 2,304;
    #     fc1 4,962,512; fc2 4,959,360 -> 15,238,352
    # projector: img_projection_up 1152 x 3072 + 3072 = 3,542,016; img_projection_down 3072^2 + 3072 = 9,440,256;
    # the two separators 2 x 1152
    image = 678_528 + 1_179_648 + 411_466_608 + 2_304 + 15_238_352 + 3_542_016 + 9_440_256 + 2_304
    # audio conformer, d = 1024, i = 1536, 24 blocks, 1024 subsampling channels, 80 mel bins / 8 = 10:
    #   embed.conv: Conv2d(1, 1024, 3) 9,216 + 1,024, then 2 x (depthwise 9,216 + 1,024, pointwise 1024^2 + 1024)
    #     = 2,129,920; embed.out 10,240 x 1024 + 1024 = 10,486,784; relative bias buckets 2 x 500 x 16 = 16,000
    #   per block: two feed-forwards 2 x (LayerNorm 2,048 + gate_up 1024 x 3072 + 3072 + down 1536 x 1024 + 1024)
    #     = 9,449,472; q/k/v/o 4 x (1024^2 + 1024) = 4,198,400; conv: LayerNorm 2,048, b1/b2 2,048, glu conv
    #     2048 x 1024 + 2048 = 2,099,200, depthwise 1024 x 3 + 1024 = 4,096, pointwise 1,049,600, ext_pw 1,049,600
    #     = 4,206,592; layer_norm_att and layer_norm 4,096 -> 17,858,560 x 24 = 428,605,440
    #   projectors: 2 x (up 1024 x 3072 + 3072 = 3,148,800; down 9,440,256) = 25,178,112
    audio = 2_129_920 + 10_486_784 + 16_000 + 428_605_440 + 25_178_112
    assert (image, audio) == (441_550_016, 466_416_256)
    # the language model: Phi-4-mini's (the phi3 adapter), tied head: 3,836,021,760
    assert m.vision_parameters == image + audio
    assert m.num_parameters == 3_836_021_760 + image + audio == 4_743_988_032


@pytest.mark.parametrize("cfg", [ROW.config, ODD], ids=["phi-4-multimodal-instruct", "optional-shapes"])
def test_count_and_names_equal_transformers_module_on_the_meta_device(cfg: dict[str, Any]) -> None:
    spec = model_from_config(cfg, name="phi4mm")
    module = meta_module(cfg, auto="AutoModelForCausalLM")  # Phi4MultimodalForCausalLM holds every tower
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    theirs = tower_totals(module, language_model="model.layers.", only="model.embed_tokens_extend.")
    mine: dict[str, int] = {}
    for p in spec.params:  # the subsampling convolutions' indices (embed.conv.0, .2, .3, ...) summed as theirs
        if p.name.startswith("embed_tokens_extend."):
            name = ".".join(x for x in p.name.split(".") if not x.isdigit())
            mine[name] = mine.get(name, 0) + p.total
    assert mine == theirs


def test_crops_and_image_tokens_by_hand() -> None:
    v = model_from_config(ROW.config, name="phi4mm").vision
    assert v is not None
    # dynamic_preprocess: ceil(side / 448) crops a side while at most 36; the whole image besides; each pass
    # 1,024 patches pooled to 16 x 16. Tokens: 256 + 16 (global, a separator per row) + 1 + (16 c)^2 + 16 c
    assert image_grid(v, 448) == (2 * 1024, 256 + 16 + 1 + 256 + 16) == (2_048, 545)
    assert image_grid(v, 449) == (5 * 1024, 273 + 1024 + 32) == (5_120, 1_329)
    assert image_grid(v, 1344) == (10 * 1024, 273 + 2304 + 48)
    # 6 x 6 = 36 crops at 2688; past it 7 x 7 = 49 > 36: the largest square grid, 6 x 6; not given: the same
    assert image_grid(v, 2688) == image_grid(v, 5000) == image_grid(v, None) == (37 * 1024, 273 + 9216 + 96)
    # an odd patch side (42 / 14 = 3) is padded to 4 before the 2 x 2 pool: 2 x 2 pooled patches a pass
    odd = model_from_config(ODD, name="odd").vision
    assert odd is not None and image_grid(odd, 84) == (5 * 9, 4 + 2 + 1 + 16 + 4)


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=1, prompt_len=2048, images_per_sample=1, image_size=896, new_tokens=8))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 5 passes of 1,024 patches, bf16: the running layer's MLP moment, input, residual and normalised input
    # (3 x 1152 x 2 B = 6,912) and fc1's and the GELU's outputs (2 x 4304 x 2 B = 17,216), with the encoder's input
    # (the embeddings' output) held through the later layers (1152 x 2 B = 2,304; the feature layer's output at -2 is
    # the last layer's input) -> 26,432 B per patch; the pixel values in bf16 5 x 3 x 448^2 x 2 B = 6,021,120
    assert vision.get(K.VISION_TOWER) == 5 * 1024 * 26_432 + 6_021_120 == 141_352_960
    # the prompt's embeddings, 2048 x 3072 x 2 B
    assert vision.get(K.INPUTS_EMBEDS) == 2048 * 3072 * 2
    # the encoder's input is held at any feature layer: ODD's 2 layers at -1 (nothing unused) hold it too
    odd = model_from_config(ODD, name="odd").vision
    assert odd is not None and odd.unused_layers == 0 and odd.kept_hidden_states == 1


# a small Phi-4-multimodal for a real forward on the CPU: the tower and pixel values at their real 448 x 448 and 14
# (1,024 patches a pass), narrower layers
SMALL: dict[str, Any] = {"model_type": "phi4_multimodal", "vocab_size": 1024, "hidden_size": 256,
                         "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1,
                         "eos_token_id": 2, "torch_dtype": "bfloat16",
                         "vision_config": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
                                           "num_attention_heads": 4, "image_token_id": 1000},
                         "audio_config": {"num_blocks": 1, "hidden_size": 32, "intermediate_size": 32,
                                          "num_attention_heads": 4, "ext_pw_out_channel": 32,
                                          "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32,
                                          "audio_token_id": 1001}}


def _tracked_image_encoding(side: int) -> int:
    """Peak bytes beyond the weights and inputs while ``image_embed`` runs, in a bf16 CPU forward of transformers'
    own module (trace/tracker.py), with the inputs Phi4MultimodalImageProcessor makes for one square ``side`` image
    (a multiple of 448: c x c crops and the whole image, all patches valid; l.224-244)."""
    torch = pytest.importorskip("torch")

    module = meta_module(SMALL, auto="AutoModelForCausalLM")
    cls, config = type(module), module.config
    torch.manual_seed(0)
    config._attn_implementation = "sdpa"
    model = cls(config).to(torch.bfloat16).eval()
    c = side // 448
    tokens = 273 + 256 * c * c + 16 * c
    ids = torch.randint(3, 900, (1, tokens + 16))
    ids[0, 4:4 + tokens] = 1000
    inputs = {"input_ids": ids, "image_pixel_values": torch.randn(1, 1 + c * c, 3, 448, 448),
              "image_sizes": torch.tensor([[side, side]]), "image_attention_mask": torch.ones(1, 1 + c * c, 32, 32)}
    return tracked_peak(model, inputs, model.model.embed_tokens_extend.image_embed)


@pytest.mark.parametrize("side", [448, 896])
def test_prefill_vision_moment_equals_a_tracked_forward(side: int) -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    tracked = _tracked_image_encoding(side)
    c = side // 448
    r = resolve(_doc("inference", SMALL, batch_size=1, prompt_len=273 + 256 * c * c + 16 * c + 16,
                     images_per_sample=1, image_size=side, attention="sdpa", new_tokens=1))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    analytic = vision.get(K.VISION_TOWER) + vision.get(K.INPUTS_EMBEDS)
    # measured: 0.10% under at 448 (11,095,650 tracked) and 896 (27,709,570): about 5.7 kB a pass of the embeddings'
    # position ids and the patch masks, not counted
    assert 0 <= tracked - analytic <= 0.002 * tracked


def test_serving_and_a_trained_tower_are_refused_lora_and_a_frozen_tower_estimated() -> None:
    with pytest.raises(ScenarioError, match="serving .* is not modelled"):
        resolve(_doc("serve"))
    with pytest.raises(ScenarioError, match="freeze_vision_tower"):
        resolve(_doc("train", micro_batch_size=1, seq_len=2048, images_per_sample=1, image_size=896))
    # PEFT has no default targets for phi4_multimodal (nor phi3): the towers' q_proj/v_proj do not stand for them
    with pytest.raises(ScenarioError, match="no default LoRA targets for model type 'phi4_multimodal'"):
        resolve(_doc("train", micro_batch_size=1, seq_len=2048, peft={"method": "lora"}))
    lora = resolve(_doc("train", micro_batch_size=1, seq_len=2048, images_per_sample=1, image_size=896,
                        peft={"method": "lora", "target_modules": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}))
    frozen = resolve(_doc("train", micro_batch_size=1, seq_len=2048, images_per_sample=1, image_size=896,
                          freeze_vision_tower=True))
    for r in (lora, frozen):
        assert any("runs 1 image(s) per sequence without autograd" in a for a in r.assumptions)
        assert any("audio encoder" in a for a in r.assumptions)


def test_more_image_tokens_than_the_prompt_and_an_odd_crop_are_refused() -> None:
    with pytest.raises(ScenarioError, match="1,329"):
        resolve(_doc("inference", batch_size=1, prompt_len=1024, images_per_sample=1, image_size=896))
    crop = copy.deepcopy(SMALL)
    crop["vision_config"]["crop_size"] = 336
    with pytest.raises(ScenarioError, match="crop_size 336"):
        resolve(_doc("inference", crop, batch_size=1, prompt_len=4096, images_per_sample=1, image_size=448))


def test_tower_linears_quantized_on_load_by_hand() -> None:
    from vramplan.spec.vision_quant import tower_quantized_linears

    m = model_from_config(ROW.config, name="phi4mm")
    # every nn.Linear outside the language model (the pooling head's in_proj is a bare Parameter and its out_proj a
    # NonDynamicallyQuantizableLinear; convolutions stay): SigLIP layers 27 x (4 x 1152^2 + 2 x 1152 x 4304) =
    # 411,070,464; head fc1/fc2 2 x 4,958,208; projector 1152 x 3072 + 3072^2 = 12,976,128; audio embed.out
    # 10,240 x 1024; blocks 24 x (2 x (1024 x 3072 + 1536 x 1024) + 4 x 1024^2) = 327,155,712; audio projectors
    # 2 x (1024 x 3072 + 3072^2) = 25,165,824
    assert tower_quantized_linears(m) == (411_070_464 + 2 * 4_958_208 + 12_976_128 + 10_485_760 + 327_155_712
                                          + 25_165_824) == 796_770_304
