"""Whisper (spec/families/whisper.py; EncoderDecoderSpec.audio): the parameters by hand, the speech encoder's front
end in training and in generate by hand, the analytic engine against the traced one (transformers' own
WhisperForConditionalGeneration run on the meta device with dummy input_features), and the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import generate_phase_peaks
from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.encoder_decoder import (
    audio_input_bytes,
    cross_cache_bytes,
    decoder_step_bytes,
    encoder_kept_bytes,
    encoder_layer_bytes,
    front_end_bytes,
)
from vramplan.analytic.terms.context import StepContext, step_policy
from vramplan.analytic.terms.encoder_decoder import front_end_saved
from vramplan.catalog.models import load_model
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError


def _train(model: str = "openai/whisper-tiny", **train: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H100-80GB"}, "task": "train",
            "train": {"precision": "bf16-mixed", "seq_len": 128, **train}}


def _infer(model: str = "openai/whisper-large-v3", **inference: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
            "inference": {"dtype": "fp16", **inference}}


def _context(doc: dict[str, Any]) -> StepContext:
    r = resolve(doc)
    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)
    return StepContext(r, 0, attention, repeat)


def test_whisper_tiny_parameters_by_hand() -> None:
    m = load_model("openai/whisper-tiny")
    # d = 384, 80 mel bins, vocab 51,865, 4 + 4 layers, FFN 1,536, 1,500 source and 448 target positions.
    # conv1 384 x 80 x 3 + 384 = 92,544; conv2 384 x 384 x 3 + 384 = 442,752; positions 1,500 x 384 = 576,000.
    # An encoder layer: k 147,456 (no bias), v, q, out 3 x (147,456 + 384) -> 590,976; two LayerNorms 2 x 768;
    # fc1 589,824 + 1,536; fc2 589,824 + 384 -> 1,774,080; x 4 = 7,096,320; the final layer_norm 768.
    # Encoder: 92,544 + 442,752 + 576,000 + 7,096,320 + 768 = 8,208,384
    assert m.encoder_parameters == 8_208_384
    # Decoder: embed_tokens 51,865 x 384 = 19,916,160; positions 448 x 384 = 172,032; a layer 1,774,080 + the
    # cross-attention 590,976 + 768 = 2,365,824, x 4 = 9,463,296; layer_norm 768 -> 29,552,256; proj_out tied.
    assert m.num_parameters == 8_208_384 + 19_916_160 + 172_032 + 9_463_296 + 768 == 37_760_640
    ed = m.encoder_decoder
    assert ed is not None and ed.audio is not None
    assert (ed.audio.mel_bins, ed.audio.input_frames, ed.audio.encoder_frames) == (80, 3000, 1500)
    assert m.max_position_embeddings == 448 and ed.encoder.max_position_embeddings == 1500


def test_large_v3_turbo_shape() -> None:
    m = load_model("whisper-turbo")
    ed = m.encoder_decoder
    assert ed is not None and ed.audio is not None
    # 32 encoder layers, 4 decoder layers, 128 mel bins
    assert (ed.encoder_layers, m.num_layers, ed.audio.mel_bins) == (32, 4, 128)


def test_front_end_saved_by_hand() -> None:
    c = _context(_train(micro_batch_size=2))
    # bf16-mixed: r = 4, c = 2; 2 samples x 80 mel bins x 3,000 frames = 480,000 features: fp32 1,920,000 B and
    # conv1's autocast copy 960,000 B; conv1's output (the GELU's input) 2 x 3,000 x 384 x 2 = 4,608,000, the GELU's
    # output (conv2's input) 4,608,000, conv2's output 2 x 1,500 x 384 x 2 = 2,304,000
    assert front_end_saved(c, c.act) == [1_920_000, 960_000, 4_608_000, 4_608_000, 2_304_000]
    lora = _context(_train(micro_batch_size=2, peft={"method": "lora"}))
    # LoRA: the convolutions are frozen and nothing before them requires grad: the batch's features alone
    # (the base in bf16: 480,000 x 2)
    assert front_end_saved(lora, lora.act) == [960_000]


def test_frozen_positions_take_no_optimizer_state() -> None:
    c = _context(_train())
    # embed_positions.requires_grad_(False): 1,500 x 384 = 576,000 parameters untrained
    assert c.rp.frozen == 576_000
    assert c.trainable == 37_760_640 - 576_000


def test_generate_terms_by_hand() -> None:
    m = load_model("openai/whisper-large-v3")
    b, c = 4, 2
    # d = 1,280, 20 heads of 64, FFN 5,120, 32 decoder layers, 1,500 encoder positions, 128 x 3,000 features
    # the caller's features and generate's segment copy: 2 x 4 x 128 x 3,000 x 2
    assert audio_input_bytes(m, b, c) == 2 * 4 * 128 * 3000 * 2 == 6_144_000
    # the front end: 4 x 1,280 x 2 x max(2 x 3,000, 3,000 + 2 x 1,500) = 10,240 x 6,000
    assert front_end_bytes(m, b, c) == 61_440_000
    # kept: inputs_embeds 4 x 1,500 x 1,280 x 2 = 15,360,000 and all_positions 8 x 1,500 = 12,000
    assert encoder_kept_bytes(m, b, 1500, c) == 15_372_000
    # a layer over 6,000 positions: max(2h + 5q, 3h + 4q, 3h + 2I, 3h + I) = 3 x 1,280 + 2 x 5,120 = 14,080
    assert encoder_layer_bytes(m, b, 1500, c) == 6000 * 2 * 14_080 == 168_960_000
    # the cross-attention cache: 32 layers x 2 x 4 x 1,500 x 1,280 x 2
    assert cross_cache_bytes(m, b, 1500, c) == 983_040_000
    # a one-token decoder step: 4 x (5 x 1,280 + 1,280) x 2
    assert decoder_step_bytes(m, b, 1500, c) == 61_440


def test_generate_reads_the_model_s_source_length() -> None:
    res = estimate(_infer(batch_size=4, new_tokens=128))
    # the cross-attention cache of the 1,500 positions, whatever prompt_len's default (512) says
    assert res.per_gpu.breakdown_detail["kv_cache"]["cross-attention keys and values (encoder output)"] \
        == 983_040_000
    assert any("prompt_len is not read" in a for a in res.assumptions)
    same = estimate(_infer(batch_size=4, new_tokens=128, prompt_len=1500))
    assert same.per_gpu.peak_allocated_bytes == res.per_gpu.peak_allocated_bytes


@pytest.mark.parametrize(("doc", "key"), [
    (_train(source_len=3000), "train.source_len"),
    (_train(seq_len=512), "train.seq_len"),
    (_infer(prompt_len=512), "inference.prompt_len"),
    (_infer(new_tokens=448), "inference.new_tokens"),
])
def test_what_whisper_does_not_take_is_refused(doc: dict[str, Any], key: str) -> None:
    with pytest.raises(ScenarioError) as err:
        resolve(doc)
    assert any(p.where == key for p in err.value.problems), err.value


def test_the_source_length_key_takes_the_model_s_own() -> None:
    a = estimate(_train(micro_batch_size=2)).per_gpu.peak_allocated_bytes
    assert estimate(_train(micro_batch_size=2, source_len=1500)).per_gpu.peak_allocated_bytes == a


# the traced engine runs transformers' own WhisperForConditionalGeneration: within 3% of it in peak allocated bytes
AGREEMENT = [
    ("openai/whisper-tiny", {"micro_batch_size": 4}),
    ("openai/whisper-tiny", {"micro_batch_size": 4, "precision": "bf16-true"}),
    ("openai/whisper-tiny", {"micro_batch_size": 4, "gradient_checkpointing": "full"}),
    ("openai/whisper-tiny", {"micro_batch_size": 4, "peft": {"method": "lora", "rank": 16}}),
    ("openai/whisper-base", {"micro_batch_size": 8, "seq_len": 448}),
]


@pytest.mark.parametrize(("model", "train"), AGREEMENT, ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items() if k != "peft") + ("-lora" if "peft" in x else ""))
def test_analytic_agrees_with_the_trace(model: str, train: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = _train(model, **train)
    a = estimate(doc).per_gpu.peak_allocated_bytes
    t = traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a - t) / t < 0.03, (a, t)


# a Whisper small enough for the CPU: 40 encoder positions (80 frames of 8 mel bins)
TINY_WHISPER: dict[str, Any] = {"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 3,
                                "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 96,
                                "decoder_ffn_dim": 128, "num_mel_bins": 8, "max_source_positions": 40,
                                "max_target_positions": 64, "vocab_size": 500, "decoder_start_token_id": 1,
                                "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 2}


def _tracked(raw: dict[str, Any], b: int, n: int, dtype: str) -> tuple[int, int, int]:
    """transformers 5.24's generate of ``raw`` (random weights, in ``dtype``, SDPA) on the CPU, counted storage by
    storage (trace/tracker.py) beyond the weights, buffers and the caller's input_features: (the encoder's peak, the
    first decoder step's peak up to its last cross-attention write, the peak of the decoder steps)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.AutoModelForSpeechSeq2Seq.from_config(transformers.AutoConfig.for_model(**raw),
                                                                attn_implementation="sdpa").eval()
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = model.to(dt)
    s = raw["max_source_positions"]
    features = torch.randn(b, raw["num_mel_bins"], 2 * s).to(dt)
    c = 4 if dtype == "fp32" else 2
    # the first step's last cross-attention write: b x S x d_model x c bytes
    return generate_phase_peaks(model, {"input_features": features}, n, b * s * raw["d_model"] * c)


@pytest.mark.parametrize(("raw", "b", "dtype"), [
    (TINY_WHISPER, 2, "fp32"),  # the encoder's peak at its attention (2h + 5q > 3h + 2I)
    (TINY_WHISPER, 2, "bf16"),
    ({**TINY_WHISPER, "encoder_ffn_dim": 700}, 2, "fp32"),  # the encoder's peak in its MLP (3h + 2I)
    (TINY_WHISPER, 1, "fp32"),
])
def test_generate_against_transformers_on_the_cpu(raw: dict[str, Any], b: int, dtype: str) -> None:
    from vramplan.analytic.generate import generate_step
    from vramplan.analytic.moment import K

    n = 6
    enc, first, decode = _tracked(raw, b, n, dtype)
    doc = {"model": raw, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
           "inference": {"batch_size": b, "new_tokens": n, "dtype": dtype}}
    res = generate_step(resolve(doc))
    c = 4 if dtype == "fp32" else 2
    # the caller's features are the tracker's base (the model counts them, beside generate's segment copy)
    caller = b * 8 * 80 * c

    def total(mo: Any) -> int:
        drop = ("parameters", "cuBLAS workspaces")
        return sum(v for part in mo.parts.values() for k, v in part.items() if k not in drop) - caller

    modelled: dict[str, int] = {}
    for mo in res.moments:
        modelled[mo.phase] = max(modelled.get(mo.phase, 0), total(mo))
    write = next(mo for mo in res.moments if mo.get(K.CROSS_KV_WRITE))
    # not modelled: the scalar tensors Whisper's generate lifts (48 B) and its int64 bookkeeping of one entry per
    # sequence (WhisperGenerationMixin.generate's per-sequence tensors, 6 x 8 B before the encoder, 3 x 8 B more at
    # the decoder steps), as the T5 and BART checks leave out generate's (tests/test_families_encdec.py)
    assert enc - modelled["encoder"] == 48 + 6 * 8 * b
    assert first - total(write) == 48 + 9 * 8 * b
    # every later step is covered: the last step's moment is an upper bound (top-k/top-p sampling assumed)
    assert max(modelled["prefill"], modelled["decode"]) + 48 + 9 * 8 * b >= decode


def test_published_whisper_large_v3_fine_tune() -> None:
    # validation/published.yaml hfdisc150-whisper-large-v3-full-fp16-a100-bs2-nvsmi: full fine-tuning of
    # whisper-large-v3 (1,543,490,560 parameters) at batch 2 on an A100, "Max GPU memory consumption was 32GB"
    # (32 x 2^30 = 34,359,738,368 B).  The estimate adds Adam's states, the checkpointed activations, the CUDA context
    # and the caching allocator's rounding to the weights and gradients below, and lands within 5% below the reading
    from pathlib import Path

    import yaml

    rows = yaml.safe_load((Path(__file__).resolve().parents[1] / "validation/published.yaml").read_text("utf-8"))
    (row,) = [r for r in rows if r["id"] == "hfdisc150-whisper-large-v3-full-fp16-a100-bs2-nvsmi"]
    assert row["measured"]["bytes"] == 34_359_738_368
    rep = estimate(row["scenario"])
    assert rep.model["parameters"] == 1_543_490_560
    # fp32 weights 1,543,490,560 x 4 = 6,173,962,240; the encoder's sinusoidal positions (1,500 x 1,280 = 1,920,000,
    # requires_grad False in WhisperEncoder) get no gradient: (1,543,490,560 - 1,920,000) x 4 = 6,166,282,240
    assert rep.per_gpu.breakdown["weights"] == 6_173_962_240
    assert rep.per_gpu.breakdown["gradients"] == 6_166_282_240
    err = (rep.per_gpu.device_used_bytes - 34_359_738_368) / 34_359_738_368
    assert -0.05 < err < 0.0
