"""Mistral Small 3.x (spec/families/mistral3.py): the Pixtral tower, patch merger, projector and Mistral language
model against transformers' module on the meta device; the image tokens ([IMG], [IMG_BREAK], [IMG_END]) and patches
against Pixtral's processor functions; the tower's activations in training and prefill by hand (flash); the packed
tower's block mask refused under sdpa and eager."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from meta_build import assert_equals_meta_module, tracked_peak
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid, image_tokens

# Mistral Small 3.1 24B's shape from Mistral3Config's docstring and init_kwargs (Pixtral 1024 x 24 layers at 1540
# pixels, patch 14; Mistral 5120 x 40 layers, 131,072 tokens), its lm_head untied: a shape, not a published
# config.json (none is stored here)
SMALL = Path(__file__).resolve().parent / "data" / "mistral-small-3.1-24b-shape" / "config.json"


def _cfg() -> dict[str, Any]:
    return dict(json.loads(SMALL.read_text()))


def _defaults() -> dict[str, Any]:
    transformers = pytest.importorskip("transformers")
    return dict(transformers.Mistral3Config().to_dict())


def test_parameters_by_hand() -> None:
    m = model_from_config(_cfg(), name="mistral-small")
    v = m.vision
    assert v is not None and not m.tie_word_embeddings
    # Pixtral, d = 1024, i = 4096, 24 layers, no biases: patch_conv 1024 x 3 x 14^2 = 602,112; ln_pre 1,024;
    #   per layer q, k, v, o 4 x 1024^2 = 4,194,304; gate, up, down 3 x 1024 x 4096 = 12,582,912; two norms 2,048
    #   -> 16,779,264; x 24 = 402,702,336
    tower = 602_112 + 1_024 + 402_702_336
    # projector: norm 1,024; merging_layer 4 x 1024 x 1024 = 4,194,304; linear_1 1024 x 5120 = 5,242,880;
    # linear_2 5120^2 = 26,214,400 (no biases)
    projector = 1_024 + 4_194_304 + 5_242_880 + 26_214_400
    assert m.vision_parameters == tower + projector == 438_958_080
    # Mistral 24B: embeddings and lm_head 2 x 131,072 x 5120 = 1,342,177,280; per layer q 5120 x 4096, k and v
    # 5120 x 1024 each, o 4096 x 5120 -> 52,428,800; MLP 3 x 5120 x 32,768 = 503,316,480; norms 10,240;
    # x 40 = 22,230,220,800; final norm 5,120
    assert m.num_parameters - m.vision_parameters == 1_342_177_280 + 22_230_220_800 + 5_120 == 23_572_403_200
    assert m.num_parameters == 24_011_361_280
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(v.param_prefixes))


@pytest.mark.parametrize("which", ["class-defaults", "mistral-small-3.1"])
def test_count_equals_transformers_module_on_the_meta_device(which: str) -> None:
    cfg = _defaults() if which == "class-defaults" else _cfg()
    spec = model_from_config(cfg, name=which)
    assert_equals_meta_module(spec, cfg)


def test_outer_flag_ties_the_head() -> None:
    # Mistral3Config's tie_word_embeddings (True) governs, whatever the text config says: 131,072 x 5120 fewer
    tied = model_from_config({k: v for k, v in _cfg().items() if k != "tie_word_embeddings"})
    assert tied.tie_word_embeddings
    assert model_from_config(_cfg()).num_parameters - tied.num_parameters == 131_072 * 5120


@pytest.mark.parametrize(("side", "patches", "tokens"), [
    # 1540 (or none given: the largest image): 1540 / 28 = 55 merged patches a side, 110^2 patches; 55 rows of
    # 55 [IMG] and one [IMG_BREAK] (the last [IMG_END]): 56 x 55 = 3,080
    (1540, 12_100, 3_080),
    (None, 12_100, 3_080),
    # 512: not scaled (ratio < 1); ceil(512 / 28) = 19 -> 38^2 = 1,444 patches, 20 x 19 = 380 tokens
    (512, 1_444, 380),
    # 3000: ratio 3000 / 1540 > 1, floor(3000 / ratio) = 1540 -> as 1540
    (3000, 12_100, 3_080),
])
def test_image_grid_by_hand(side: int | None, patches: int, tokens: int) -> None:
    v = model_from_config(_cfg()).vision
    assert v is not None
    assert image_grid(v, side) == (patches, tokens)


def _pixtral_processing(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``PixtralProcessor`` and the resize rule it calls.  ``image_processing_pixtral`` needs torchvision; without it
    its PIL twin (``image_processing_pil_pixtral.get_resize_output_image_size``, "Adapted from" it, the same rule)
    stands in for the module the processor imports it from."""
    pytest.importorskip("torch")
    import importlib
    import sys

    try:
        importlib.import_module("torchvision")
    except ImportError:
        from transformers.models.pixtral import image_processing_pil_pixtral as pil

        monkeypatch.setitem(sys.modules, "transformers.models.pixtral.image_processing_pixtral", pil)
        monkeypatch.delitem(sys.modules, "transformers.models.pixtral.processing_pixtral", raising=False)
    processing = importlib.import_module("transformers.models.pixtral.processing_pixtral")
    resize = sys.modules["transformers.models.pixtral.image_processing_pixtral"].get_resize_output_image_size
    return processing.PixtralProcessor, resize


def test_image_grid_matches_pixtrals_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    PixtralProcessor, get_resize_output_image_size = _pixtral_processing(monkeypatch)

    base = model_from_config(_cfg()).vision
    assert base is not None

    @settings(max_examples=60, deadline=None)
    @given(side=st.integers(1, 4000), edge=st.sampled_from([1024, 1540, 2048]), patch=st.sampled_from([14, 16]),
           merge=st.sampled_from([1, 2]))
    def check(side: int, edge: int, patch: int, merge: int) -> None:
        v = replace(base, longest_edge=edge, patch_size=patch, merge_size=merge)
        proc = SimpleNamespace(patch_size=patch, spatial_merge_size=merge,
                               image_processor=SimpleNamespace(size={"longest_edge": edge}),
                               _merge_kwargs=lambda **k: {"images_kwargs": {}})
        data = PixtralProcessor._get_num_multimodal_tokens(proc, image_sizes=[[side, side]])
        h, w = get_resize_output_image_size(np.zeros((side, side, 3)), size=(edge, edge),
                                            patch_size=(patch * merge, patch * merge))
        # the tower runs over the resized image's patches (PixtralVisionModel.forward crops each to its size)
        assert image_grid(v, side) == ((h // patch) * (w // patch), data["num_image_tokens"][0])

    check()


def test_transformers_config_takes_the_language_model() -> None:
    assert transformers_config(_cfg())["model_type"] == "mistral"


def test_feature_layer_list_is_refused() -> None:
    with pytest.raises(ScenarioError, match="only one layer is modelled"):
        model_from_config({**_cfg(), "vision_feature_layer": [-1, -2]})


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": str(SMALL), "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


@pytest.mark.parametrize("task", ["train", "inference"])
def test_packed_tower_under_eager_is_refused(task: str) -> None:
    size = {"seq_len": 8192} if task == "train" else {"prompt_len": 8192}
    with pytest.raises(ScenarioError, match="scores the whole pack under a block-diagonal mask") as err:
        resolve(_doc(task, attention="eager", images_per_sample=1, **size))
    assert f"set {task}.attention: sdpa or flash" in str(err.value)
    # no image: the language model alone, under any attention
    resolve(_doc(task, attention="eager", **size))


def test_image_tokens_in_the_sequence() -> None:
    r = resolve(_doc(seq_len=8192, images_per_sample=2, image_size=512, attention="flash"))
    assert image_tokens(r.scenario, r.model) == 2 * 380
    with pytest.raises(ScenarioError, match="6,160 tokens, more than inference.prompt_len 6,000"):
        resolve(_doc("inference", prompt_len=6000, images_per_sample=2, attention="flash"))


def _tower_terms(**train: Any) -> dict[str, int]:
    from vramplan.analytic.train import train_step

    doc = {"micro_batch_size": 1, "seq_len": 8192, "images_per_sample": 1, "attention": "flash", **train}
    res = train_step(resolve(_doc(**doc)))
    return {t.name: t.nbytes for t in res.terms if t.name.startswith("saved.vision_tower")}


def test_tower_activations_by_hand() -> None:
    # per patch and Pixtral layer, bf16-mixed (fp32 residual), flash, d = 1024, i = 4096, 16 heads:
    #   attention_norm (RMSNorm of the fp32 residual): its input 4 x 1024, rsqrt 4, the normalized fp32 tensor
    #   for the weight's gradient 4 x 1024 = 8,196; q/k/v's bf16 input casts 3 x 2 x 1024 = 6,144; flash's q, k, v,
    #   output 4 x 2 x 1024 = 8,192; logsumexp 4 x 16 = 64; ffn_norm 8,196; gate/up input casts 2 x 2048 = 4,096;
    #   SiLU's input, up's output, SiLU's output and down's input 4 x 2 x 4096 = 32,768            -> 67,656
    layer = 67_656 * 12_100
    # pixels 2 x 3 x 14^2 x 12,100 = 14,229,600; ln_pre 8,196 and RoPE's fp32 cos and sin 2 x 4 x 64 = 512 per
    # patch; the projector per patch: its norm 8,196, merging_layer's input 2 x 1024 = 2,048, linear_1's input
    # 2 x 1024 / 4 = 512, the GELU's and linear_2's inputs 2 x 2 x 5120 / 4 = 5,120
    around = 14_229_600 + (8_196 + 512 + 8_196 + 2_048 + 512 + 5_120) * 12_100
    assert _tower_terms() == {"saved.vision_tower": 24 * layer + around} == {"saved.vision_tower": 19_958_998_400}
    # full checkpointing: each layer keeps its fp32 input 4 x 1024 per patch
    assert _tower_terms(gradient_checkpointing="full") == {"saved.vision_tower": 24 * 4_096 * 12_100 + around}
    # a 512-pixel image: 1,444 patches, the same per-patch figures
    small = 2 * 3 * 196 * 1_444 + (24 * 67_656 + 24_584) * 1_444
    assert _tower_terms(image_size=512) == {"saved.vision_tower": small} == {"saved.vision_tower": 2_381_883_776}
    assert _tower_terms(freeze_vision_tower=True) == {}


def test_tower_block_mask_under_sdpa_by_hand() -> None:
    # SDPA (the default): flash's terms and the block mask the memory-efficient kernel keeps.  bf16-mixed: the
    # mask is built in the fp32 patch embeddings' dtype and autocast casts it to bf16 in every layer's SDPA call;
    # 12,100 keys are not a multiple of 8, so aten's preprocess_mask pads each copy to 12,104:
    # 2 x 12,100 x 12,104 = 292,916,800 B per layer, 24 layers
    flash = 19_958_998_400
    assert _tower_terms(attention="sdpa") == {"saved.vision_tower": flash + 24 * 292_916_800}
    assert flash + 24 * 292_916_800 == 26_989_001_600
    # full checkpointing: each layer keeps its inputs, the one fp32 mask among them, 4 x 12,100^2 = 585,640,000
    full = 24 * 4_096 * 12_100 + 14_229_600 + 24_584 * 12_100
    assert _tower_terms(attention="sdpa", gradient_checkpointing="full") == {"saved.vision_tower": full + 585_640_000}
    # bf16-true, no autocast: a 448 image is 32^2 = 1,024 patches, aligned: every layer saves the one bf16 mask,
    # 2 x 1,024^2 = 2,097,152; a 420 image is 30^2 = 900 patches, unaligned: a padded copy per layer,
    # 2 x 900 x 904 = 1,627,200
    pure = {"precision": "bf16-true"}
    assert (_tower_terms(attention="sdpa", image_size=448, **pure)["saved.vision_tower"]
            - _tower_terms(image_size=448, **pure)["saved.vision_tower"]) == 2_097_152
    assert (_tower_terms(attention="sdpa", image_size=420, **pure)["saved.vision_tower"]
            - _tower_terms(image_size=420, **pure)["saved.vision_tower"]) == 24 * 1_627_200


def test_two_images_are_packed_into_one_mask() -> None:
    # 2 images of 448: one pack of 2,048 patches, bf16-mixed: per layer 2 x 2,048^2 (aligned) = 8,388,608
    one = _tower_terms(attention="sdpa", image_size=448)["saved.vision_tower"]
    one_flash = _tower_terms(image_size=448)["saved.vision_tower"]
    two = _tower_terms(attention="sdpa", image_size=448, images_per_sample=2)["saved.vision_tower"]
    two_flash = _tower_terms(image_size=448, images_per_sample=2)["saved.vision_tower"]
    assert one - one_flash == 24 * 2 * 1_024**2
    assert two - two_flash == 24 * 2 * 2_048**2 == 4 * (one - one_flash)


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=1, prompt_len=4096, images_per_sample=1, attention="flash"))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 12,100 patches, bf16: the running layer's MLP moment, the layer input, the residual, the normalised input and
    # the gated MLP's three 4096-wide tensors, 2 x (3 x 1024 + 3 x 4096) = 30,720 per patch; ln_pre's output, bound
    # in PixtralVisionModel.forward through the layers (vision_feature_layer -1: no state more), and patch_conv's
    # output, held by patch_embeds_list's views, 2 x 2 x 1024 = 4,096; the rotary cos and sin (head_dim 1024 / 16)
    # 2 x 64 x 2 = 256 and their int64 positions 2 x 8 = 16; pixels 2 x 3 x 196 = 1,176
    assert r.model.vision is not None and r.model.vision.kept_hidden_states == 2
    assert vision.get(K.VISION_TOWER) == (30_720 + 4_096 + 272 + 1_176) * 12_100 == 438_794_400
    assert any("longest_edge (preprocessor_config.json, not read)" in a for a in r.assumptions)
    # under SDPA the packed block mask in bf16, 2 x 12,100^2 = 292,820,000, and the kernel's padded copy (12,100
    # keys unaligned) 2 x 12,100 x 12,104 = 292,916,800
    r = resolve(_doc("inference", batch_size=1, prompt_len=4096, images_per_sample=1, attention="sdpa"))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    assert vision.get(K.VISION_TOWER) == 438_794_400 + 292_820_000 + 292_916_800


def test_transformers_packs_the_images_under_a_block_mask() -> None:
    """What the refusal stands on, read off transformers 5.24 on the CPU: under sdpa a Pixtral tower runs two
    images (4 x 4 and 2 x 4 patches) as one sequence of 24 patches with a float [1, 1, 24, 24] block mask."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from unittest import mock

    vc = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=56, patch_size=14)
    vc._attn_implementation = "sdpa"
    tower = transformers.PixtralVisionModel(vc).train()
    calls: list[Any] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def record(q: Any, k: Any, v: Any, attn_mask: Any = None, **kw: Any) -> Any:
        calls.append((tuple(q.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    with mock.patch("torch.nn.functional.scaled_dot_product_attention", record):
        tower(torch.randn(2, 3, 56, 56), image_sizes=[(56, 56), (28, 56)])
    assert calls == [((1, 2, 24, 16), (1, 1, 24, 24))]


# a small Mistral 3 for a real forward on the CPU: a Pixtral tower of 3 layers at 224 pixels, patch 14 (256 patches)
TRACKED: dict[str, Any] = {"model_type": "mistral3", "image_token_index": 1000, "vision_feature_layer": -1,
                           "spatial_merge_size": 2, "torch_dtype": "bfloat16",
                           "text_config": {"model_type": "mistral", "vocab_size": 1024, "hidden_size": 256,
                                           "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
                                           "num_key_value_heads": 2, "head_dim": 64},
                           "vision_config": {"model_type": "pixtral", "hidden_size": 128, "intermediate_size": 512,
                                             "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 32,
                                             "image_size": 224, "patch_size": 14}}


def test_prefill_vision_moment_equals_a_tracked_forward() -> None:
    """The vision moment against the peak while transformers' own tower runs in a bf16 CPU forward (trace/
    tracker.py), the bf16 pixel values an input (in the base): the analytic moment counts them."""
    torch = pytest.importorskip("torch")
    from meta_build import meta_module
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    module = meta_module(TRACKED)
    cls, config = type(module), module.config
    torch.manual_seed(0)
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "sdpa"
    model = cls(config).to(torch.bfloat16).eval()
    # 8 x 8 merged patches: 64 [IMG] tokens among (8 + 1) x 8 = 72 image tokens
    ids = torch.randint(3, 900, (1, 72 + 16))
    ids[:, 4:4 + 64] = 1000
    inputs = {"input_ids": ids, "pixel_values": torch.randn(1, 3, 224, 224, dtype=torch.bfloat16),
              "image_sizes": torch.tensor([[224, 224]])}
    tracked = tracked_peak(model, inputs, model.model.vision_tower) + 3 * 224 * 224 * 2
    r = resolve({"model": TRACKED, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                 "inference": {"batch_size": 1, "prompt_len": 72 + 16, "images_per_sample": 1, "attention": "sdpa",
                               "new_tokens": 1}})
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    analytic = vision.get(K.VISION_TOWER) + vision.get(K.INPUTS_EMBEDS)
    # measured 256 B under, one byte a patch; without patch_conv's held output 65,536 B more, without the rotary
    # tables and positions 256 x 144 = 36,864 more
    assert 0 <= tracked - analytic <= 256
