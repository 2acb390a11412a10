"""Idefics3 and SmolVLM (spec/families/idefics3.py): the SigLIP-like tower, pixel-shuffle connector and Llama
language model against transformers' module on the meta device; the tiles and image tokens against the image
processor's and processor's own computations; the tower's activations per tile in training and prefill by hand."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from meta_build import assert_equals_meta_module
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config
from vramplan.spec.families.idefics3 import idefics3_grid
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid, image_tiles, image_tokens

DATA = Path(__file__).resolve().parent / "data"
# Idefics3-8B-Llama3's shape (SigLIP So400m/14 at 364 pixels, scale_factor 2, Llama 3 8B with 128,259 tokens) and
# SmolVLM-256M's (a 768-wide SigLIP at 512 pixels, patch 16, scale_factor 4, a SmolLM2-135M): shapes from the
# configuration classes' docstrings and defaults, not published config.json files (none is stored here)
IDEFICS3 = DATA / "idefics3-8b-shape" / "config.json"
SMOLVLM = DATA / "smolvlm-256m-shape" / "config.json"


def _cfg(path: Path = IDEFICS3) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _defaults(kind: str) -> dict[str, Any]:
    transformers = pytest.importorskip("transformers")
    cls = transformers.Idefics3Config if kind == "idefics3" else transformers.SmolVLMConfig
    return dict(cls().to_dict())


def test_idefics3_parameters_by_hand() -> None:
    m = model_from_config(_cfg(), name="idefics3-8b")
    v = m.vision
    assert v is not None and not m.tie_word_embeddings
    # tower, d = 1152, i = 4304, 27 layers, 364 / 14 = 26 -> 676 positions: patch_embedding 1152 x 3 x 14^2 + 1152
    # = 678,528; position_embedding 676 x 1152 = 778,752; per layer 15,239,504 (tests/test_vision_paligemma.py's
    # So400m layer) x 27 = 411,466,608; post_layernorm 2,304
    tower = 678_528 + 778_752 + 411_466_608 + 2_304
    # connector: proj 1152 x 2^2 x 4096 = 18,874,368 (no bias)
    assert m.vision_parameters == tower + 18_874_368 == 431_800_560
    # Llama 3 8B with 128,259 tokens: 8,030,261,248 + 2 x 3 x 4096 = 8,030,285,824
    assert m.num_parameters - m.vision_parameters == 8_030_285_824
    assert m.num_parameters == 8_462_086_384
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(v.param_prefixes))


@pytest.mark.parametrize("which", ["idefics3-class-defaults", "smolvlm-class-defaults", "idefics3-8b", "smolvlm-256m"])
def test_count_equals_transformers_module_on_the_meta_device(which: str) -> None:
    cfg = {"idefics3-class-defaults": lambda: _defaults("idefics3"), "smolvlm-class-defaults": lambda: _defaults("smolvlm"),
           "idefics3-8b": _cfg, "smolvlm-256m": lambda: _cfg(SMOLVLM)}[which]()
    spec = model_from_config(cfg, name=which)
    assert_equals_meta_module(spec, cfg, language_model="model.text_model.")


def test_smolvlm_256m_parameters() -> None:
    m = model_from_config(_cfg(SMOLVLM), name="smolvlm")
    v = m.vision
    assert v is not None
    # tower d = 768, i = 3072, 12 layers, 512 / 16 = 32 -> 1,024 positions: patch_embedding 768 x 3 x 16^2 + 768
    # = 590,592; position_embedding 1,024 x 768 = 786,432; per layer q/k/v/out 4 x (768^2 + 768) = 2,362,368,
    # fc1 768 x 3072 + 3072 = 2,362,368, fc2 3072 x 768 + 768 = 2,360,064, norms 3,072 -> 7,087,872 x 12 =
    # 85,054,464; post_layernorm 1,536; connector 768 x 4^2 x 576 = 7,077,888
    assert m.vision_parameters == 590_592 + 786_432 + 85_054_464 + 1_536 + 7_077_888 == 93_510_912
    assert m.num_parameters == 256_484_928


def test_class_defaults_cannot_take_an_image() -> None:
    # Idefics3Config(): 224 / 32 = 7 patches a side, which pixel_shuffle cannot fold by 2: parameters only
    m = model_from_config(_defaults("idefics3"))
    assert m.vision is not None and "cannot fold 7 patches a side by scale_factor 2" in m.vision.images_refused
    assert model_from_config(_cfg()).vision.images_refused == ""  # type: ignore[union-attr]


def test_image_tiles_and_tokens_by_hand() -> None:
    v = model_from_config(_cfg()).vision
    assert v is not None
    # a square image of any side is rescaled to longest_edge 4 x 364 = 1,456: 4 x 4 tiles of 364 and the whole
    # image, 17 passes of 26^2 = 676 patches; image_seq_len 676 / 2^2 = 169; tokens 169 + 3 + 4 x (4 x 171 + 1)
    # = 172 + 2,740 = 2,912
    for side in (None, 100, 364, 2000):
        assert image_tiles(v, side) == 17
        assert image_grid(v, side) == (17 * 676, 2_912)
    s = model_from_config(_cfg(SMOLVLM)).vision
    assert s is not None
    # SmolVLM-256M: 4 x 4 tiles of 512 and the whole image, 1,024 patches each; image_seq_len 1,024 / 4^2 = 64;
    # 67 + 4 x (4 x 66 + 1) = 1,127
    assert image_grid(s, None) == (17 * 1_024, 1_127)


def _processor(edge: int, tile: int, seq: int) -> Any:
    pytest.importorskip("torch")
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    ip = Idefics3ImageProcessorPil(size={"longest_edge": edge}, max_image_size={"longest_edge": tile})
    # a tokenizer that keeps "\n\n" one token (the Llama 3 and SmolLM2 BPE merges), as the adapter assumes
    return SimpleNamespace(image_processor=ip, image_seq_len=seq, _merge_kwargs=lambda **k: {"images_kwargs": {}},
                           tokenizer=lambda text, add_special_tokens: {"input_ids": [0]})


@pytest.mark.parametrize(("edge", "tile"), [(1456, 364), (2048, 512), (1536, 512), (364, 364), (2000, 364), (9000, 512)])
def test_grid_matches_the_image_processor_and_processor(edge: int, tile: int) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    proc = _processor(edge, tile, 169)

    @settings(max_examples=40, deadline=None)
    @given(h=st.integers(1, 5000), w=st.integers(1, 5000))
    def check(h: int, w: int) -> None:
        patches, rows, cols = proc.image_processor.get_number_of_image_patches(h, w, {})
        assert idefics3_grid(h, w, edge, tile) == (rows, cols)
        assert patches == (rows * cols + 1 if rows else 0)

    check()
    # the adapter's tokens for a square image at the processor's defaults relative to the tower
    v = model_from_config(_cfg()).vision
    assert v is not None
    proc = _processor(4 * 364, 364, 169)
    data = Idefics3Processor._get_num_multimodal_tokens(proc, image_sizes=[[500, 500], [3000, 3000]])
    assert data["num_image_tokens"] == [v.tokens_per_image] * 2
    assert data["num_image_patches"] == [image_tiles(v, None)] * 2


def test_transformers_config_takes_the_language_model() -> None:
    assert transformers_config(_cfg())["model_type"] == "llama"
    assert transformers_config(_cfg(SMOLVLM))["model_type"] == "llama"


def _doc(task: str = "train", path: Path = IDEFICS3, **section: Any) -> dict[str, Any]:
    return {"model": str(path), "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_images_in_the_sequence_and_refused_where_impossible(tmp_path: Path) -> None:
    r = resolve(_doc(seq_len=8192, images_per_sample=2))
    assert image_tokens(r.scenario, r.model) == 2 * 2_912
    with pytest.raises(ScenarioError, match="5,824 tokens, more than inference.prompt_len 5,000"):
        resolve(_doc("inference", prompt_len=5000, images_per_sample=2))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_defaults("idefics3")))
    with pytest.raises(ScenarioError, match="cannot take an image"):
        resolve(_doc(path=path, seq_len=4096, images_per_sample=1))
    resolve(_doc(path=path, seq_len=4096))  # the language model alone


def _tower_terms(**train: Any) -> dict[str, int]:
    from vramplan.analytic.train import train_step

    res = train_step(resolve(_doc(micro_batch_size=1, seq_len=4096, images_per_sample=1, **train)))
    return {t.name: t.nbytes for t in res.terms if t.name.startswith("saved.vision_tower")}


def test_tower_activations_per_tile_by_hand() -> None:
    # per patch and layer, bf16-mixed (fp32 residual), SDPA flash (full tiles: no mask), d = 1152, i = 4304,
    # 16 heads: layer_norm1 4 x 1152 + 8 = 4,616; q/k/v casts 3 x 2 x 1152 = 6,912; flash q, k, v, output
    # 4 x 2,304 = 9,216; logsumexp 64; layer_norm2 4,616; fc1's input cast 2,304; gelu_pytorch_tanh's input
    # 2 x 4304 = 8,608; fc2's input 8,608                                                          -> 44,944
    patches = 17 * 676
    # around the layers, per patch: the pixels 2 x 3 x 14^2 = 1,176; post_layernorm 4,616; proj's input 2 x 1152
    around = (1_176 + 4_616 + 2_304) * patches
    assert _tower_terms() == {"saved.vision_tower": 27 * 44_944 * patches + around}
    assert 27 * 44_944 * patches + around == 14_038_443_328
    # full checkpointing: each layer keeps its fp32 input 4 x 1152 per patch
    assert _tower_terms(gradient_checkpointing="full") == {"saved.vision_tower": 27 * 4_608 * patches + around}
    assert _tower_terms(freeze_vision_tower=True) == {}


def test_prefill_vision_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=1, prompt_len=4096, images_per_sample=1))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 17 passes of 676 patches, bf16: the running layer's MLP moment, the layer input, the residual, the
    # normalised input and fc1's output and GELU's output, 2 x (3 x 1152 + 2 x 4304) = 24,128 per patch; the
    # embeddings' output bound in Idefics3VisionTransformer.forward through the layers, 2 x 1152 = 2,304; the
    # pixels 2 x 3 x 14^2 = 1,176
    assert vision.get(K.VISION_TOWER) == 17 * 676 * (24_128 + 2_304 + 1_176) == 317_271_136
    assert any("cut into 16 tiles of 364 x 364" in a for a in r.assumptions)
    assert any("preprocessor_config.json, not read" in a for a in r.assumptions)


def test_transformers_runs_full_tiles_without_a_mask() -> None:
    """What the tower's SDPA flash terms stand on, read off transformers 5.24 on the CPU: full tiles (the padding
    mask all ones) reach ``scaled_dot_product_attention`` with no mask, one batch row per tile
    (``_ignore_bidirectional_mask_sdpa``)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from unittest import mock

    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer

    vc = transformers.Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=56, patch_size=14)
    vc._attn_implementation = "sdpa"
    tower = Idefics3VisionTransformer(vc).train()
    calls: list[Any] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def record(q: Any, k: Any, v: Any, attn_mask: Any = None, **kw: Any) -> Any:
        calls.append((tuple(q.shape), attn_mask))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    with mock.patch("torch.nn.functional.scaled_dot_product_attention", record):
        tower(torch.randn(3, 3, 56, 56))
    assert calls == [((3, 2, 16, 16), None)]
