"""Vision-language models: the Gemma 3 adapter's vision tower and projector, the image tokens, and what the
report says is not modelled."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vramplan.catalog.models import load_model
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_tokens

GEMMA3 = "google/gemma-3-4b-it"


def test_gemma3_vision_tower_and_projector_by_hand() -> None:
    m = load_model(GEMMA3)
    assert m.vision is not None and m.model_type == "gemma3"
    # SigLIP, d = 1152, i = 4304, 27 layers, 896 x 896 images in 14 x 14 patches (google/gemma-3-4b-it):
    #   patch_embedding 1152 x 3 x 14 x 14 + 1152 = 677,376 + 1,152 = 678,528
    #   position_embedding (896 / 14)^2 = 4096 positions x 1152 = 4,718,592
    #   per layer: q, k, v, out 4 x (1152^2 + 1152) = 5,313,024; fc1 4304 x 1152 + 4304 = 4,962,512;
    #              fc2 1152 x 4304 + 1152 = 4,959,360; layer_norm1/2 2 x 2 x 1152 = 4,608  -> 15,239,504
    #   27 layers 411,466,608; post_layernorm 2,304
    tower = 678_528 + 4_718_592 + 27 * 15_239_504 + 2_304
    assert tower == 416_866_032
    # projector: mm_input_projection_weight 1152 x 2560 = 2,949,120 + mm_soft_emb_norm 1152 = 2,950,272
    projector = 1152 * 2560 + 1152
    assert m.vision_parameters == tower + projector == 419_816_304
    # the language model alone is the gemma3_text adapter's count of the same text_config
    text = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262_208,
            "sliding_window": 1024}
    assert m.num_parameters == model_from_config(text).num_parameters + tower + projector == 4_300_079_472
    assert (m.vision.patches_per_image, m.vision.tokens_per_image, m.vision.num_layers) == (4096, 256, 27)
    # the tower is neither quantized nor adapted: no tensor of it is a "linear"
    assert all(p.role in ("other", "norm", "bias") for p in m.params if p.name.startswith(m.vision.param_prefixes))


def test_siglip_head_is_counted_when_vision_use_head() -> None:
    row = copy.deepcopy(_config())
    row["vision_config"]["vision_use_head"] = True
    with_head = model_from_config(row).num_parameters
    # SiglipMultiheadAttentionPoolingHead: probe d + in_proj 3d^2 + 3d + out_proj d^2 + d + LayerNorm 2d
    #   + fc1 d x i + i + fc2 i x d + d, d = 1152, i = 4304
    d, i = 1152, 4304
    head = d + 3 * d * d + 3 * d + d * d + d + 2 * d + d * i + i + i * d + d
    assert with_head - load_model(GEMMA3).num_parameters == head == 15_238_352


def _config() -> dict[str, Any]:
    from vramplan.catalog.models import list_models

    return next(dict(r.config) for r in list_models() if r.id == GEMMA3)


def test_transformers_config_still_takes_the_language_model() -> None:
    # the traced engine and measure build the language model of a multimodal config (its report says so)
    assert transformers_config(_config())["model_type"] == "gemma3_text"


def _doc(task: str = "train", **section: Any) -> dict[str, Any]:
    return {"model": GEMMA3, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_image_tokens_are_256_per_image() -> None:
    # Gemma3Processor.image_seq_length 256 (transformers 5.24 processing_gemma3.py): 3 images x 256 = 768
    r = resolve(_doc(seq_len=1024, images_per_sample=3))
    assert image_tokens(r.scenario, r.model) == 768
    assert any("768 image tokens are counted in seq_len" in a for a in r.assumptions)
    assert any(a.startswith("vision tower activations: 3 image(s) of 4,096 patches") for a in r.assumptions)


def test_more_image_tokens_than_the_sequence_holds_is_refused() -> None:
    # 5 x 256 = 1280 > 1024
    with pytest.raises(ScenarioError, match="1,280 tokens, more than train.seq_len 1,024"):
        resolve(_doc(seq_len=1024, images_per_sample=5))


def test_images_for_a_text_model_are_refused() -> None:
    doc = {**_doc(images_per_sample=1), "model": "meta-llama/Llama-3.1-8B"}
    with pytest.raises(ScenarioError, match="has no vision tower"):
        resolve(doc)


def test_serve_states_the_encoder_cache_as_not_modelled() -> None:
    # Gemma 3's profile run is modelled from vLLM 0.8.2 (facts/vllm_multimodal.py GEMMA3_MM_ROWS), not at 0.8.0
    old = resolve({"model": GEMMA3, "hardware": {"gpu": "H100-80GB"}, "task": "serve",
                   "serve": {"vllm_version": "0.8.0"}})
    assert any(a.startswith("not modelled: vLLM's encoder cache") for a in old.assumptions)
    r = resolve({"model": GEMMA3, "hardware": {"gpu": "H100-80GB"}, "task": "serve"})
    assert not any(a.startswith("not modelled: vLLM's encoder cache") for a in r.assumptions)


def test_serve_at_tp_states_the_towers_sharding_as_not_modelled() -> None:
    # Qwen2.5-VL-7B's tower and merger linears: per block qkv 1280 x 3840 + proj 1280 x 1280 + gate, up and down
    # 3 x 1280 x 3420 = 19,686,400; x 32 blocks = 629,964,800; merger 5120 x 5120 + 5120 x 3584 = 44,564,480;
    # 674,529,280 elements; at tp 2 a sharded tower holds half: 674,529,280 x 1 // 2 x 2 B = 674,529,280 B = 0.63 GiB
    doc = {"model": "qwen/qwen2.5-vl-7b-instruct", "hardware": {"gpu": "H100-80GB", "num_gpus": 2}, "task": "serve",
           "parallel": {"tp": 2}}
    notes = [a for a in resolve(doc).assumptions if "tensor-parallel sharding of the vision tower" in a]
    assert len(notes) == 1 and "up to 0.63 GiB more weights per rank" in notes[0] and notes[0].startswith("not modelled")
    one = {**doc, "hardware": {"gpu": "H100-80GB"}, "parallel": {"tp": 1}}
    assert not any("sharding of the vision tower" in a for a in resolve(one).assumptions)


def test_text_only_batch_on_a_vlm_says_the_tower_gets_no_gradient() -> None:
    r = resolve(_doc())
    assert any("get no gradient" in a for a in r.assumptions)
    lora = resolve(_doc(peft={"method": "lora"}))
    assert not any("get no gradient" in a for a in lora.assumptions)
    assert any("adapters peft would place on the vision tower" in a for a in lora.assumptions)


def test_inference_image_tokens_count_in_the_prompt() -> None:
    r = resolve(_doc("inference", prompt_len=600, images_per_sample=2))
    assert image_tokens(r.scenario, r.model) == 512  # 2 x 256
    assert not any(a.startswith("not modelled") for a in r.assumptions)
    with pytest.raises(ScenarioError, match="more than inference.prompt_len"):
        resolve(_doc("inference", prompt_len=500, images_per_sample=2))


def test_trace_report_says_the_tower_is_not_traced() -> None:
    from types import SimpleNamespace

    from vramplan.trace.engine import _assumptions

    r = resolve(_doc(seq_len=512, images_per_sample=1))
    st = SimpleNamespace(sdpa=[], notes=[])
    notes = _assumptions(r, st, [])  # type: ignore[arg-type]
    assert any(n.startswith("not modelled: the vision tower and projector (419,816,304 parameters) and the images: "
                            "the traced engine builds and traces the language model alone") for n in notes)


def _activations(**train: Any) -> int:
    """The tower's saved-activation term of the step (bytes), and the peak moment holds it."""
    from vramplan.analytic.terms import bytes_of
    from vramplan.analytic.train import train_step

    res = train_step(resolve(_doc(micro_batch_size=1, seq_len=2048, **train)))
    return bytes_of(res.terms, "saved.vision_tower")


def test_tower_activations_by_hand() -> None:
    # per patch and SigLIP layer, bf16-mixed (fp32 residual stream), SDPA flash, d = 1152, i = 4304, 16 heads:
    #   layer_norm1 fp32 input 4 x 1152 + mean/rstd 8 = 4,616; q/k/v's bf16 input casts 3 x 2 x 1152 = 6,912;
    #   flash q, k, v, output 4 x 2 x 1152 = 9,216; logsumexp 4 x 16 = 64; layer_norm2 4,616;
    #   fc1's input cast 2,304; GELU input 2 x 4304 = 8,608; fc2 input 8,608              -> 44,944
    # per image: 4096 patches x 27 layers x 44,944 = 4,970,446,848; patch conv input 2 x 3 x 14^2 x 4096
    #   = 4,816,896; post_layernorm 4,616 x 4096 = 18,907,136; AvgPool2d input 4 x 1152 x 4096 = 18,874,368
    per_image = 4096 * 27 * 44_944 + 4_816_896 + 18_907_136 + 18_874_368
    assert per_image == 5_013_045_248
    assert _activations() == 0
    assert _activations(images_per_sample=1) == per_image
    assert _activations(images_per_sample=2) == 2 * per_image
    # full checkpointing: each tower layer keeps its fp32 input, 4 x 1152 x 4096 = 18,874,368 x 27 layers
    assert _activations(images_per_sample=1, gradient_checkpointing="full") == (
        4_816_896 + 27 * 18_874_368 + 18_907_136 + 18_874_368)
    # a frozen tower (LoRA) records nothing
    assert _activations(images_per_sample=1, peft={"method": "lora"}) == 0


def test_tower_term_lives_from_the_forward_to_the_embedding_backward() -> None:
    from vramplan.analytic.timeline import FORWARD, TIED_EMBEDDING
    from vramplan.analytic.train import train_step

    res = train_step(resolve(_doc(micro_batch_size=1, seq_len=2048, images_per_sample=1)))
    (term,) = [t for t in res.terms if t.name == "saved.vision_tower"]
    assert (term.born, term.dies) == (FORWARD, TIED_EMBEDDING)
    # one allocation per saved tensor: the conv input, 27 layers x 13 tensors (q/k/v's three input casts
    # each), the post-layernorm's and the pool's input
    assert len(term.tensors) == 1 + 27 * 13 + 2


def test_tower_activations_raise_the_peak() -> None:
    from vramplan.engine import estimate

    def peak(images: int) -> int:
        return estimate(resolve(_doc(micro_batch_size=2, seq_len=2048, images_per_sample=images))).per_gpu.peak_allocated_bytes

    # alive from the forward through the whole backward, the tower's 2 x 2 images' tensors (4 x 5,013,045,248 B)
    # are under the backward's peak
    assert peak(2) - peak(0) == 4 * 5_013_045_248


def test_freeze_vision_tower_drops_its_gradients_and_states() -> None:
    from vramplan.analytic.attention import resolve_attention
    from vramplan.analytic.terms.context import StepContext, step_policy
    from vramplan.engine import estimate

    def run(**train: Any) -> tuple[int, int, int]:
        r = resolve(_doc(micro_batch_size=1, seq_len=2048, images_per_sample=1, **train))
        attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario))
        c = StepContext(r, 0, attention, repeat)
        rep = estimate(r)
        return c.trainable, int(rep.per_gpu.breakdown["optimizer_states"]), _activations(images_per_sample=1, **train)

    trained, frozen = run(), run(freeze_vision_tower=True)
    # 4,300,079,472 parameters, of which 419,816,304 in the tower and projector: 3,880,263,168 stay trainable
    assert (trained[0], frozen[0]) == (4_300_079_472, 3_880_263_168)
    # AdamW's two fp32 states: 8 B x 419,816,304 = 3,358,530,432 B fewer
    assert trained[1] - frozen[1] == 8 * 419_816_304 == 3_358_530_432
    # a frozen tower saves no activation
    assert (trained[2], frozen[2]) == (5_013_045_248, 0)
    r = resolve(_doc(freeze_vision_tower=True))
    assert any(a.startswith("freeze_vision_tower: the vision tower and projector keep their weights") for a in r.assumptions)
    with pytest.raises(ScenarioError, match="no vision tower to freeze"):
        resolve({**_doc(freeze_vision_tower=True), "model": "meta-llama/Llama-3.1-8B"})


QWEN = "Qwen/Qwen2.5-VL-7B-Instruct"


def test_qwen2_5_vl_tower_and_merger_by_hand() -> None:
    m = load_model(QWEN)
    assert m.vision is not None and m.model_type == "qwen2_5_vl" and not m.tie_word_embeddings
    # d = 1280, i = 3420, 32 blocks, patches of 2 x 14 x 14 over 3 channels:
    #   patch_embed Conv3d without bias 1280 x 3 x 2 x 14 x 14 = 1,505,280
    #   per block: norm1, norm2 2 x 1280 = 2,560; qkv 1280 x 3840 + 3840 = 4,919,040; proj 1280^2 + 1280 =
    #   1,639,680; gate/up 2 x (1280 x 3420 + 3420) = 8,762,040; down 3420 x 1280 + 1280 = 4,378,880 -> 19,702,200
    #   merger: ln_q 1280; mlp.0 5120^2 + 5120 = 26,219,520; mlp.2 5120 x 3584 + 3584 = 18,353,664 -> 44,574,464
    tower = 1_505_280 + 32 * 19_702_200 + 44_574_464
    assert m.vision_parameters == tower == 676_550_144
    text = {k: v for k, v in _row(QWEN)["text_config"].items() if k != "layer_types"}
    language = model_from_config({**text, "model_type": "qwen2", "tie_word_embeddings": False}).num_parameters
    assert m.num_parameters == language + tower == 8_292_166_656


def _row(model_id: str) -> dict[str, Any]:
    from vramplan.catalog.models import list_models

    return next(dict(r.config) for r in list_models() if r.id == model_id)


@pytest.mark.parametrize(("size", "patches", "tokens"), [
    # smart_resize, factor 28 (patch 14 x merge 2), min_pixels 3,136; a given image capped at the released
    # checkpoint's max_pixels 12,845,056 (preprocessor_config.json, which AutoProcessor.from_pretrained reads):
    (448, 1024, 256),    # 448 = 16 x 28 kept: (448 / 14)^2 = 1024 patches, / 4 = 256 tokens
    (224, 256, 64),      # 224 = 8 x 28: 16^2 = 256 patches, 64 tokens
    (1024, 5476, 1369),  # round(1024 / 28) x 28 = 1036, 1036^2 = 1,073,296 under the cap: 74^2 = 5476 patches
    (1680, 14400, 3600),  # 1680 = 60 x 28 kept (2,822,400 pixels): 120^2 = 14,400 patches, 3,600 tokens
    (5000, 64516, 16129),  # round(5000 / 28) x 28 = 5012, 5012^2 > 12,845,056: beta = 5000 / sqrt(12,845,056),
                           #   floor(5000 / beta / 28) x 28 = 3556: 254^2 = 64,516 patches, 16,129 tokens
    (30, 16, 4),         # 28^2 < min_pixels: beta = sqrt(3136 / 900), ceil(30 x beta / 28) x 28 = 56: 4^2, 4 tokens
    # not given: the processor class's default size, the largest square under its max_pixels 1,003,520,
    # floor(sqrt(1,003,520) / 28) x 28 = 980
    (None, 4900, 1225),
])
def test_qwen2_5_vl_image_tokens_follow_smart_resize(size: int | None, patches: int, tokens: int) -> None:
    from vramplan.spec.vision import image_grid

    v = load_model(QWEN).vision
    assert v is not None
    assert image_grid(v, size) == (patches, tokens)


def test_gemma3_ignores_image_size() -> None:
    r = resolve(_doc(seq_len=1024, images_per_sample=1, image_size=448))
    assert image_tokens(r.scenario, r.model) == 256
    assert any("image_size ignored" in a for a in r.assumptions)


def test_qwen2_5_vl_tower_activations_by_hand() -> None:
    from vramplan.analytic.terms import bytes_of
    from vramplan.analytic.train import train_step

    doc = {"model": QWEN, "hardware": {"gpu": "H100-80GB"}, "task": "train",
           "train": {"micro_batch_size": 1, "seq_len": 2048, "images_per_sample": 1, "image_size": 448}}
    r = resolve(doc)
    assert image_tokens(r.scenario, r.model) == 256
    # per patch and block, bf16-mixed, SDPA flash, d = 1280 (16 heads of 80), i = 3420:
    #   norm1 (RMSNorm: fp32 input and normalized copy 8 x 1280, rstd 4) 10,244; qkv's input cast 2,560; the
    #   fused qkv buffer v keeps alive 2 x 2,560 = 5,120; flash q, k, v, output 4 x 2,560 = 10,240; logsumexp
    #   4 x 16 = 64; norm2 10,244; gate/up input casts 2 x 2,560 = 5,120; gate, SiLU, up outputs and down's
    #   input 4 x 2 x 3420 = 27,360                                                               -> 70,952
    # 448 x 448: 1024 patches; 32 blocks; patch_embed input 2 x 3 x 2 x 14^2 = 2,352 per patch; merger ln_q
    # 10,244 and its MLP's three inputs 3 x 2 x 1280 = 7,680 per patch
    expected = 1024 * (32 * 70_952 + 2_352 + 10_244 + 7_680)
    assert bytes_of(train_step(r).terms, "saved.vision_tower") == expected == 2_345_717_760


def test_measure_refuses_a_vision_language_model() -> None:
    from vramplan.measure.build import unsupported

    problems = unsupported(resolve(_doc()), "cpu")
    assert any(p.where == "model" and "vision-language model" in p.message for p in problems)


def test_inference_vision_encoder_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=8, prompt_len=1024, images_per_sample=2))
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # 8 prompts x 2 images = 16 images of 4096 patches, bf16; SigLIP's running layer is its MLP moment: the
    # layer input, the residual, the normalised input (3 x 1152) and fc1's and GELU's outputs (2 x 4304):
    # 4096 x 12,064 x 2 = 98,828,288 per image; the embeddings' output, bound in SiglipVisionTransformer.forward
    # through the layers, 4096 x 1152 x 2 = 9,437,184; pixel values 4096 x 3 x 14^2 x 2 = 4,816,896 per image
    assert vision.get(K.VISION_TOWER) == 16 * (98_828_288 + 9_437_184 + 4_816_896) == 1_809_317_888
    assert vision.get(K.KV_PROMPT) == 0  # the prompt's cache is not built yet


def test_gemma3_tower_names_equal_transformers_module_on_the_meta_device() -> None:
    """Every vision tower and projector tensor under the name transformers 5.24 gives it: SiglipVisionModel holds
    its embeddings, encoder and post_layernorm directly under ``vision_tower.`` (no ``vision_model`` wrapper), so
    ``model.vision_tower.embeddings.patch_embedding.weight``, not ``vision_tower.vision_model.embeddings...``."""
    from meta_build import meta_module, tower_totals

    m = load_model(GEMMA3)
    assert m.vision is not None
    module = meta_module(_config())
    theirs = tower_totals(module)
    ours = {p.name: p.total for p in m.params if p.name.startswith(m.vision.param_prefixes)}
    assert ours == theirs
    assert "vision_tower.embeddings.patch_embedding.weight" in ours


def test_a_given_image_is_capped_at_the_checkpoint_max_pixels_and_the_report_says_so() -> None:
    # Qwen2-VL-7B generate with one 1,680 x 1,680 image: 3,600 image tokens (not the class default's 1,225), and the
    # report names the checkpoint's preprocessor_config.json; without image_size it names the larger images it allows
    from vramplan.engine import estimate

    doc = {"model": "Qwen/Qwen2-VL-7B-Instruct", "task": "inference", "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 1, "prompt_len": 3625, "new_tokens": 8, "images_per_sample": 1,
                         "image_size": 1680}}
    rep = estimate(doc)
    assert any("max_pixels 12,845,056 of the released checkpoints' preprocessor_config.json" in a
               for a in rep.assumptions)
    rep = estimate({**doc, "inference": {**doc["inference"], "image_size": None, "prompt_len": 1300}})
    assert any("lets images up to 12,845,056 pixels through: set image_size" in a for a in rep.assumptions)
