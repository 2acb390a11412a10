"""Qwen3-Omni (spec/families/qwen3_omni_moe.py): the parameters by hand and against transformers' own
``Qwen3OmniMoeForConditionalGeneration`` on the meta device (with and without the talker, as ``enable_audio_output``
says), the Thinker's language model for the traced engine, the Thinker's generate in both engines, and the refusals
of training and serving."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.models import model_config
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.vision import image_grid

INSTRUCT: dict[str, Any] = model_config("Qwen/Qwen3-Omni-30B-A3B-Instruct")
THINKING: dict[str, Any] = {**INSTRUCT, "enable_audio_output": False}  # the -Thinking / -Captioner layout

# a small Qwen3-Omni (Thinker only, as -Thinking) for the engines: 2 decoder layers of 8 experts, a 2-block tower with
# one DeepStack merger, a 2-layer audio encoder
SMALL: dict[str, Any] = {
    "model_type": "qwen3_omni_moe", "architectures": ["Qwen3OmniMoeForConditionalGeneration"], "dtype": "bfloat16",
    "enable_audio_output": False,
    "thinker_config": {
        "model_type": "qwen3_omni_moe_thinker", "tie_word_embeddings": False,
        "text_config": {"model_type": "qwen3_omni_moe_text", "hidden_size": 256, "intermediate_size": 512,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                        "vocab_size": 2048, "moe_intermediate_size": 128, "num_experts": 8,
                        "num_experts_per_tok": 2, "max_position_embeddings": 4096,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000,
                                            "mrope_section": [16, 8, 8], "interleaved": True}},
        "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
                          "out_hidden_size": 256, "deepstack_visual_indexes": [0]},
        "audio_config": {"encoder_layers": 2, "d_model": 64, "encoder_attention_heads": 2, "encoder_ffn_dim": 128,
                         "output_dim": 256, "downsample_hidden_size": 32},
    },
}


def _by_module(spec: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in spec.params:
        head = p.name.split(".")[0]
        key = head if head in ("visual", "audio_tower", "talker", "code2wav") else "language_model"
        out[key] = out.get(key, 0) + p.total
    return out


def test_parameters_by_hand() -> None:
    parts = _by_module(model_from_config(INSTRUCT, name="omni"))
    # audio encoder, d 1280, FFN 5120, 32 layers, 480 channels, 128 mel bins, output 2048:
    #   conv2d1 480 x 1 x 9 + 480 = 4,800; conv2d2, conv2d3 480 x 480 x 9 + 480 = 2,074,080 each
    #   conv_out: 128 mel bins -> 64 -> 32 -> 16 after three stride-2 convolutions: 480 x 16 x 1280 = 9,830,400
    #   per layer: q/k/v/out 4 x (1280^2 + 1280) = 6,558,720; two LayerNorms 5,120; fc1 1280 x 5120 + 5120 =
    #     6,558,720; fc2 5120 x 1280 + 1280 = 6,554,880 -> 19,677,440 x 32 = 629,678,080
    #   ln_post 2,560; proj1 1280^2 + 1280 = 1,639,680; proj2 1280 x 2048 + 2048 = 2,623,488
    audio = 4_800 + 2 * 2_074_080 + 9_830_400 + 629_678_080 + 2_560 + 1_639_680 + 2_623_488
    assert parts["audio_tower"] == audio == 647_927_168
    # vision tower, d 1152, MLP 4304, 27 blocks, out 2048, merge 2 (4d = 4608), 3 DeepStack mergers:
    #   patch_embed 1152 x 3 x 2 x 16 x 16 + 1152 = 1,770,624; pos_embed 2304 x 1152 = 2,654,208
    #   per block: norms 4,608; qkv 1152 x 3456 + 3456 = 3,984,768; proj 1152^2 + 1152 = 1,328,256; linear_fc1
    #     1152 x 4304 + 4304 = 4,962,512; linear_fc2 4304 x 1152 + 1152 = 4,959,360 -> 15,239,504 x 27 = 411,466,608
    #   merger: ln_q 2 x 1152; mlp.0 4608^2 + 4608 = 21,238,272; mlp.2 4608 x 2048 + 2048 = 9,439,232 -> 30,679,808
    #   each DeepStack merger: ln_q 2 x 4608 = 9,216 + the same MLP -> 30,686,720 x 3 = 92,060,160
    vision = 1_770_624 + 2_654_208 + 411_466_608 + 30_679_808 + 92_060_160
    assert parts["visual"] == vision == 538_631_408
    # talker, h 1024, 16 heads of 128, 2 KV heads, 20 layers, 128 experts of 384, shared expert 768, vocab 3072:
    #   per layer: q 1024 x 2048 = 2,097,152; k, v 2 x 1024 x 256 = 524,288; o 2,097,152; q/k norms 256; router
    #     128 x 1024 = 131,072; experts gate_up 128 x 768 x 1024 = 100,663,296, down 128 x 1024 x 384 = 50,331,648;
    #     shared expert 3 x 1024 x 768 = 2,359,296; its gate 1024; two norms 2048 -> 158,207,232 x 20 = 3,164,144,640
    #   norm 1024; codec_embedding 3072 x 1024 = 3,145,728; text_ and hidden_projection 2 x (2048^2 + 2048 +
    #     2048 x 1024 + 1024) = 12,589,056; codec_head 1024 x 3072 = 3,145,728
    #   code predictor, 5 layers of h 1024, 16 heads of 128, 8 KV heads, MLP 3072, 16 code groups, vocab 2048: per
    #     layer q 2,097,152 + k, v 2 x 1,048,576 + o 2,097,152 + q/k norms 256 + MLP 3 x 1024 x 3072 = 9,437,184 +
    #     norms 2048 = 15,730,944 x 5 = 78,654,720; norm 1024; 15 codec embeddings and 15 heads 2 x 15 x 2048 x 1024
    #     = 62,914,560 -> 141,570,304
    talker = 3_164_144_640 + 1_024 + 3_145_728 + 12_589_056 + 3_145_728 + 141_570_304
    assert parts["talker"] == talker == 3_324_596_480
    # Code2Wav, h 1024, 16 heads of 64, 8 layers, MLP 3072, 16 quantizers of 2048, decoder 1536, rates 8, 5, 4, 3:
    #   transformer: per layer 4 x 1024^2 + 3 x 1024 x 3072 + 4 x 1024 (two norms, two layer scales) = 13,635,584
    #     x 8 = 109,084,672, norm 1024; code_embedding 32,768 x 1024 = 33,554,432
    #   upsample, 2 x (ConvTranspose1d 1024 x 1024 x 2 + 1024; depthwise Conv1d 1024 x 7 + 1024; LayerNorm 2048;
    #     pwconv1 1024 x 4096 + 4096; pwconv2 4096 x 1024 + 1024; gamma 1024) = 2 x 10,503,168 = 21,006,336
    #   decoder: Conv1d 1024 -> 1536, kernel 7: 11,011,584; block k (a = 1536 / 2^k -> b = a / 2, rate u): SnakeBeta
    #     2a, ConvTranspose1d a x b x 2u + b, three residual units of 4b (two SnakeBetas) + b^2 x 7 + b + b^2 + b
    #     -> 33,047,808 (1536 -> 768, 8), 6,496,896 (768 -> 384, 5), 1,478,976 (384 -> 192, 4), 333,984 (192 -> 96,
    #     3); the last SnakeBeta 2 x 96 = 192 and Conv1d 96 -> 1, kernel 7: 672 + 1 -> 52,370,113
    decoder = 11_011_584 + 33_047_808 + 6_496_896 + 1_478_976 + 333_984 + 192 + 673
    assert decoder == 52_370_113
    assert parts["code2wav"] == 109_085_696 + 33_554_432 + 21_006_336 + decoder == 216_016_577
    # the language model: Qwen3-30B-A3B's shape with a 152,064 vocabulary, as the qwen3_moe variant counts it
    assert parts["language_model"] == 30_532_646_912
    assert sum(parts.values()) == 35_259_818_545  # the checkpoint's 15 shards hold as many (catalog row's notes)
    # without the talker (enable_audio_output false: -Thinking, -Captioner) the Thinker alone
    assert model_from_config(THINKING, name="t").num_parameters == 35_259_818_545 - talker - 216_016_577 \
        == 31_719_205_488


@pytest.mark.parametrize("cfg", [INSTRUCT, THINKING, SMALL], ids=["instruct", "thinking", "small"])
def test_count_and_names_equal_transformers_module_on_the_meta_device(cfg: dict[str, Any]) -> None:
    from meta_build import meta_module

    spec = model_from_config(cfg, name="q")
    module = meta_module(cfg, auto="AutoModelForMultimodalLM")
    assert type(module).__name__ == "Qwen3OmniMoeForConditionalGeneration"
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    theirs: dict[str, int] = {}
    for name, p in module.named_parameters():
        if name.startswith(("thinker.model.language_model.", "thinker.lm_head.")):
            continue
        key = ".".join(x for x in name.removeprefix("thinker.").removeprefix("model.").split(".") if not x.isdigit())
        theirs[key] = theirs.get(key, 0) + p.numel()
    held = ("visual.", "audio_tower.", "talker.", "code2wav.")
    ours: dict[str, int] = {}
    for p in spec.params:
        if p.name.startswith(held):
            key = ".".join(x for x in p.name.split(".") if not x.isdigit())
            ours[key] = ours.get(key, 0) + p.total
    assert ours == theirs
    # the talker and Code2Wav exist exactly when the config says enable_audio_output
    assert hasattr(module, "talker") == bool(cfg.get("enable_audio_output", True))


def test_transformers_config_takes_the_thinkers_language_model() -> None:
    """The traced engine's model: the Thinker's text_config as a Qwen3-MoE causal LM, the adapter's language model
    (30,532,646,912 = 35,259,818,545 less the towers, the talker and Code2Wav)."""
    from meta_build import meta_causal_lm_count
    from vramplan.spec.families import transformers_config

    tc = transformers_config(INSTRUCT)
    assert tc["model_type"] == "qwen3_moe" and tc["hidden_size"] == 2048
    assert not {"vision_config", "audio_config", "talker_config"} & set(tc)
    assert meta_causal_lm_count(tc) == 30_532_646_912


def test_the_thinker_computes_every_positions_logits() -> None:
    """Traits.head_on_every_position: transformers' Thinker forward has no logits_to_keep, so generate's prefill
    returns the logits of every prompt position (here 2 x 16 x 2048 on the meta device)."""
    import inspect

    torch = pytest.importorskip("torch")
    from meta_build import meta_module

    thinker = meta_module(SMALL, auto="AutoModelForMultimodalLM").thinker
    assert "logits_to_keep" not in inspect.signature(thinker.forward).parameters
    out = thinker(input_ids=torch.zeros((2, 16), dtype=torch.long, device="meta"))
    assert tuple(out.logits.shape) == (2, 16, 2048)
    assert model_from_config(SMALL, name="s").traits.head_on_every_position


def _doc(task: str, model: dict[str, Any] | str = "Qwen/Qwen3-Omni-30B-A3B-Instruct", **section: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H100-80GB"}, "task": task, task: section}


def test_prefill_holds_every_prompt_positions_logits() -> None:
    """The Instruct's generate prefill, batch 4 x 2048 tokens: the head's moment (final hidden states and the prompt's
    logits) outgrows the running layer, and the logits are every position's in bf16."""
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=4, prompt_len=2048, new_tokens=16))
    (pre,) = [mo for mo in inference_step(r).moments if mo.phase == "prefill"]
    # 4 x 2048 positions x 152,064 x 2 B = 2,491,416,576; the final hidden states 4 x 2048 x 2048 x 2 B = 33,554,432
    assert pre.get(K.PROMPT_LOGITS) == 4 * 2048 * 152_064 * 2 == 2_491_416_576
    assert pre.get(K.FINAL_HIDDEN) == 33_554_432
    # the weights: every parameter, the talker's and Code2Wav's included, in bf16
    assert pre.get(K.PARAMETERS) == 2 * 35_259_818_545


def test_image_prefill_moment_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.moment import K

    r = resolve(_doc("inference", batch_size=2, prompt_len=1024, images_per_sample=1, image_size=448))
    assert r.model.vision is not None
    # smart_resize, factor 32, min 3,136 and max 12,845,056 pixels: 448 kept, 28^2 = 784 patches, / 4 = 196 tokens;
    # not given, the largest square 3584 (sqrt 12,845,056): 224^2 = 50,176 patches, 12,544 tokens
    assert image_grid(r.model.vision, 448) == (784, 196)
    assert image_grid(r.model.vision, None) == (50_176, 12_544)
    (vision,) = [mo for mo in inference_step(r).moments if mo.get(K.VISION_TOWER)]
    # the running layer is the MLP moment: input, residual and normalised input (3 x 1152 x 2 B = 6,912) and
    # linear_fc1's output and the GELU's (2 x 4304 x 2 B = 17,216) -> 24,128 per patch; pixel values 784 x 3 x 2 x
    # 16^2 x 2 B = 2,408,448 per image; the DeepStack features of blocks 8, 16 and 24 alive through the last (26):
    # 3 x 2048 x 2 B = 12,288 per token, 196 tokens = 2,408,448; held through the blocks per patch: pos_embeds, cos
    # and sin (head_dim 1152 / 16 = 72) and 4 interpolation weights in fp32, (1152 + 144 + 4) x 4 = 5,200, and 6 int64
    # position ids and indices, 48 -> 5,248; 2 images: 2 x (784 x (24,128 + 5,248) + 2,408,448 + 2,408,448)
    assert r.model.vision.kept_merged_elements == 3 * 2048
    assert vision.get(K.VISION_TOWER) == 2 * (784 * (24_128 + 5_248) + 2_408_448 + 196 * 12_288) == 55_695_360


def test_generate_analytic_matches_trace() -> None:
    """The small Thinker's generate, batch 2 x 512 + 64 tokens: both engines' peak allocated within 3% once the
    weights the traced engine does not build (the tower's and the audio encoder's, counted by the analytic engine
    only) are set aside; the prompt's logits are not at either peak here (the running layer is larger)."""
    pytest.importorskip("torch")
    from vramplan.analytic.overhead import cublas_workspace_bytes
    from vramplan.engine import estimate as analytic_estimate
    from vramplan.trace.engine import trace
    from vramplan.trace.report import peak_of

    r, st = trace(resolve({"model": SMALL, "task": "inference", "hardware": {"gpu": "a100"},
                           "inference": {"batch_size": 2, "prompt_len": 512, "new_tokens": 64}}))
    ws = cublas_workspace_bytes(r.gpu, handles=1)
    held = sum(p.total for p in r.model.params if p.name.startswith(("visual.", "audio_tower.")))
    traced = peak_of(st.events, st.marks).raw_bytes - ws
    analytic = analytic_estimate(r).per_gpu.peak_allocated_bytes - ws - 2 * held
    assert abs(analytic / traced - 1) < 0.03
    notes = " ".join(r.assumptions)
    assert "held, not run: the audio encoder (" in notes


def test_full_fine_tuning_and_serving_are_refused() -> None:
    with pytest.raises(ScenarioError, match="full fine-tuning of Qwen/Qwen3-Omni-30B-A3B-Instruct is not modelled"):
        resolve(_doc("train", micro_batch_size=1, seq_len=1024))
    with pytest.raises(ScenarioError, match="serving Qwen/Qwen3-Omni-30B-A3B-Instruct is not modelled"):
        resolve(_doc("serve"))
    # the -Thinking layout (no talker): refused all the same (its audio encoder)
    with pytest.raises(ScenarioError, match="it holds the audio encoder \\(647,927,168 parameters\\)"):
        resolve(_doc("train", THINKING, micro_batch_size=1, seq_len=1024))


@pytest.mark.parametrize("peft", [{"method": "lora", "rank": 16},
                                  {"method": "lora", "rank": 16, "target_modules": "all-linear"}],
                         ids=["q_v", "all-linear"])
def test_lora_analytic_matches_trace(peft: dict[str, Any]) -> None:
    """LoRA on the small Thinker, 2 x 512 tokens: both engines' peak allocated within 3% once the weights the traced
    engine does not build (the tower's and the audio encoder's: 2 B each) and the two cuBLAS workspaces are set
    aside; the held modules are said, their adapters said as not counted."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.analytic.overhead import cublas_workspace_bytes
    from vramplan.engine import estimate as analytic_estimate
    from vramplan.trace.engine import trace
    from vramplan.trace.report import peak_of

    r, st = trace(resolve({"model": SMALL, "task": "train", "hardware": {"gpu": "a100"},
                           "train": {"micro_batch_size": 2, "seq_len": 512, "peft": peft}}))
    ws = cublas_workspace_bytes(r.gpu, handles=2)
    held = sum(p.total for p in r.model.params if p.name.startswith(("visual.", "audio_tower.")))
    traced = peak_of(st.events, st.marks).raw_bytes - ws
    analytic = analytic_estimate(r).per_gpu.peak_allocated_bytes - ws - 2 * held
    assert abs(analytic / traced - 1) < 0.03
    said = " ".join(r.assumptions)
    assert "frozen under PEFT" in said and "adapters PEFT would place on the held modules' linears" in said


def test_speech_output_is_said_only_with_the_talker() -> None:
    said = " ".join(resolve(_doc("inference", batch_size=1, prompt_len=128, new_tokens=8)).assumptions)
    assert "not modelled: speech output" in said and "return_audio=False" in said
    said = " ".join(resolve(_doc("inference", THINKING, batch_size=1, prompt_len=128, new_tokens=8)).assumptions)
    assert "speech output" not in said


def test_quantized_held_modules_are_said() -> None:
    # transformers 4.57, where each expert was an MLP of nn.Linear that bitsandbytes converts (on 5.x its fused experts
    # stay 16-bit, refused: tests/test_moe_bnb_experts.py)
    said = " ".join(resolve({**_doc("inference", batch_size=1, prompt_len=128, new_tokens=8, quantization="int8"),
                             "software": {"transformers": "4.57.0"}}).assumptions)
    assert "not modelled: inference.quantization int8 of the held modules' nn.Linear weights" in said
    said = " ".join(resolve(_doc("inference", batch_size=1, prompt_len=128, new_tokens=8)).assumptions)
    assert "held modules' nn.Linear" not in said


def test_lora_adapters_by_hand() -> None:
    """LoRA rank 8 on q_proj and v_proj (the targets assumed where PEFT has no default): adapters on the Thinker's
    language model only, 48 layers x 8 x ((2048 + 4096) + (2048 + 512)) = 3,342,336 parameters; none on the tower,
    the audio encoder, the talker or Code2Wav (said, not counted)."""
    from vramplan.analytic.layout import rank_params

    r = resolve(_doc("train", micro_batch_size=1, seq_len=1024, peft={"method": "lora", "rank": 8}))
    assert rank_params(r.model, 1, 1, 1, 0, r.scenario.train.peft).lora == 48 * 8 * (6144 + 2560) == 3_342_336


def test_plan_finds_lora_setups_and_states_full_fine_tuning_refused() -> None:
    """The planner resolved the model with the schema's defaults (full fine-tuning), which the held talker refuses,
    so every plan of Qwen3-Omni was refused, LoRA included.  Now LoRA setups are planned, and a full fine-tuning
    search fits nothing and its notes give the estimator's refusal."""
    from vramplan.plan import TrainJob, plan

    res = plan("Qwen/Qwen3-Omni-30B-A3B-Instruct", "H200", 1, TrainJob(seq_len=1024, global_batch=1, peft="lora"))
    assert res.fits and res.chosen is not None and res.chosen.setup["peft"] is not None
    full = plan("Qwen/Qwen3-Omni-30B-A3B-Instruct", "H200", 1, TrainJob(seq_len=1024, global_batch=1, peft="none"))
    assert not full.fits
    assert any("were skipped: the estimator refuses them" in n and "train.peft" in n for n in full.notes)


@pytest.mark.parametrize("experts", [0, 4])
def test_a_nested_moe_with_fewer_experts_than_it_routes_to_is_refused(experts: int) -> None:
    """A nested language model with no routed experts (thinker_config.text_config.num_experts: 0) raised
    ZeroDivisionError in num_active_parameters (a traceback, exit 1); top_k 8 of 4 experts is refused alike."""
    cfg = model_config("Qwen/Qwen3-Omni-30B-A3B-Instruct")
    text = {**cfg["thinker_config"]["text_config"], "num_experts": experts}
    bad = {**cfg, "thinker_config": {**cfg["thinker_config"], "text_config": text}}
    with pytest.raises(ScenarioError, match="1 <= top_k <= the expert count"):
        model_from_config(bad)
