"""The buffers older transformers releases register at construction (analytic/hf_buffers.py), by hand.

Per attention layer: cos and sin of max_position_embeddings x head_dim elements, plus inv_freq (head_dim / 2 fp32).
Mistral-7B-v0.1: 32 layers, head_dim 128, 32,768 positions; in bf16 a layer holds 2 x 32,768 x 128 x 2 + 64 x 4 =
16,777,472 B, the model 32 x 16,777,472 = 536,879,104 B.  Llama-2-7B: 32 layers, head_dim 128, 4,096 positions.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.hf_buffers import causal_mask_buffer_bytes, rope_cache_bytes
from vramplan.catalog.models import load_model
from vramplan.engine import estimate

MISTRAL_BF16 = 32 * (2 * 32_768 * 128 * 2 + 64 * 4)  # 536,879,104
LLAMA2_BF16 = 32 * (2 * 4_096 * 128 * 2 + 64 * 4)  # 67,117,056 (fp32 inv_freq)
LLAMA2_BF16_CAST = 32 * (2 * 4_096 * 128 * 2 + 64 * 2)  # 67,112,960: the whole module cast, inv_freq too
LLAMA2_FP32 = 32 * (2 * 4_096 * 128 * 4 + 64 * 4)  # 134,225,920


def _train(model: str, transformers: str | None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 1},
                           "framework": "hf-trainer",
                           "train": {"micro_batch_size": 1, "seq_len": 512, "precision": "bf16-true",
                                     "gradient_checkpointing": "full", "attention": "flash"}}
    if transformers is not None:
        doc["software"] = {"transformers": transformers}
    for k, v in extra.items():
        if k in ("framework",):
            doc[k] = v
        elif k in ("fsdp", "num_gpus"):
            if k == "fsdp":
                doc.setdefault("parallel", {})["fsdp"] = v
            else:
                doc["hardware"]["num_gpus"] = v
        else:
            doc["train"][k] = v
    return doc


def _weights(doc: dict[str, Any]) -> dict[str, int]:
    return estimate(doc).per_gpu.breakdown_detail["weights"]


@pytest.mark.parametrize(("model", "version", "expected"), [
    ("mistralai/Mistral-7B-v0.1", (4, 34, 0), MISTRAL_BF16),   # Mistral's first release
    ("mistralai/Mistral-7B-v0.1", (4, 41, 2), MISTRAL_BF16),   # its last with the buffers
    ("mistralai/Mistral-7B-v0.1", (4, 42, 0), 0),              # 4.42: one model-level rotary, no cache
    ("meta-llama/Llama-2-7b-hf", (4, 31, 0), LLAMA2_BF16),
    ("meta-llama/Llama-2-7b-hf", (4, 30, 2), LLAMA2_FP32),     # before 4.31: fp32 from inv_freq, no cast
    ("meta-llama/Llama-2-7b-hf", (4, 40, 2), LLAMA2_BF16),     # 4.38-4.40's _cos_cached "for BC"
    ("meta-llama/Llama-2-7b-hf", (4, 41, 0), 0),
    ("meta-llama/Llama-2-7b-hf", None, 0),                     # no version: the current release, none
])
def test_rope_cache_windows(model: str, version: tuple[int, ...] | None, expected: int) -> None:
    assert rope_cache_bytes(load_model(model), version, 32, 2) == expected


def test_qwen2_and_mixtral_windows() -> None:
    qwen = load_model("Qwen/Qwen2-7B-Instruct")  # 28 layers, 32,768 positions, head_dim 128
    assert rope_cache_bytes(qwen, (4, 44, 2), 28, 2) == 28 * (2 * 32_768 * 128 * 2 + 64 * 4)  # 469,769,216
    assert rope_cache_bytes(qwen, (4, 45, 0), 28, 2) == 0
    assert rope_cache_bytes(qwen, (4, 36, 2), 28, 2) == 0  # before Qwen2's first release: no window
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert rope_cache_bytes(mixtral, (4, 47, 1), 32, 2) == MISTRAL_BF16  # Mixtral kept them to 4.47
    assert rope_cache_bytes(mixtral, (4, 48, 0), 32, 2) == 0


def test_causal_mask_buffer_4_38_only() -> None:
    llama, gemma = load_model("meta-llama/Llama-2-7b-hf"), load_model("google/gemma-7b")
    assert causal_mask_buffer_bytes(llama, (4, 38, 2)) == 4_096 ** 2  # 16,777,216 bools
    assert causal_mask_buffer_bytes(gemma, (4, 38, 1)) == 8_192 ** 2  # 67,108,864
    assert causal_mask_buffer_bytes(llama, (4, 39, 0)) == 0
    assert causal_mask_buffer_bytes(load_model("mistralai/Mistral-7B-v0.1"), (4, 38, 2)) == 0


def test_training_report_counts_the_buffers() -> None:
    # pure bf16 on one GPU: the model is built in bf16, so are the tables
    w = _weights(_train("mistralai/Mistral-7B-v0.1", "4.36.2"))
    assert w["rotary cos/sin buffers (older transformers)"] == MISTRAL_BF16
    assert "rotary cos/sin buffers (older transformers)" not in _weights(_train("mistralai/Mistral-7B-v0.1", "4.42.4"))
    # 4.38: the rotary tables and the causal mask together
    w = _weights(_train("meta-llama/Llama-2-7b-hf", "4.38.2"))
    assert w["rotary cos/sin buffers (older transformers)"] == LLAMA2_BF16
    assert w["causal-mask buffer (transformers 4.38)"] == 16_777_216


def test_peak_grows_by_exactly_the_buffers() -> None:
    old = estimate(_train("mistralai/Mistral-7B-v0.1", "4.36.2")).per_gpu.peak_allocated_bytes
    new = estimate(_train("mistralai/Mistral-7B-v0.1", "4.42.4")).per_gpu.peak_allocated_bytes
    assert old - new == MISTRAL_BF16


def test_buffer_dtype_follows_the_module() -> None:
    # bf16-mixed on one GPU: the model is built in fp32 (its stored parameters), so are the tables
    w = _weights(_train("meta-llama/Llama-2-7b-hf", "4.36.2", precision="bf16-mixed"))
    assert w["rotary cos/sin buffers (older transformers)"] == LLAMA2_FP32
    # FSDP under a mixed precision: MixedPrecision(buffer_dtype=bf16) casts them
    w = _weights(_train("meta-llama/Llama-2-7b-hf", "4.36.2", precision="bf16-mixed", fsdp="full_shard",
                        num_gpus=2))
    assert w["rotary cos/sin buffers (older transformers)"] == LLAMA2_BF16_CAST
    # FSDP2 (framework accelerate as vramplan exports it): MixedPrecisionPolicy casts no buffer, the tables stay fp32
    w = _weights(_train("meta-llama/Llama-2-7b-hf", "4.36.2", precision="bf16-mixed", fsdp="full_shard",
                        num_gpus=2, framework="accelerate"))
    assert w["rotary cos/sin buffers (older transformers)"] == LLAMA2_FP32
    # DeepSpeed's bit16 module (module.bfloat16()) under ZeRO-2
    doc = _train("meta-llama/Llama-2-7b-hf", "4.36.2", precision="bf16-mixed", framework="deepspeed", num_gpus=2)
    doc["parallel"] = {"zero_stage": 2}
    assert _weights(doc)["rotary cos/sin buffers (older transformers)"] == LLAMA2_BF16_CAST


def test_own_model_frameworks_have_none() -> None:
    doc = _train("meta-llama/Llama-2-7b-hf", "4.36.2", framework="torchtune")
    assert "rotary cos/sin buffers (older transformers)" not in _weights(doc)


def test_inference_counts_the_buffers_in_the_model_dtype() -> None:
    doc: dict[str, Any] = {"model": "mistralai/Mistral-7B-v0.1", "task": "inference",
                           "hardware": {"gpu": "A100-80GB", "num_gpus": 1},
                           "inference": {"batch_size": 1, "prompt_len": 128, "new_tokens": 16, "dtype": "fp16"},
                           "software": {"transformers": "4.35.2"}}
    rep = estimate(doc)
    assert rep.per_gpu.breakdown_detail["weights"]["rotary cos/sin buffers (older transformers)"] == MISTRAL_BF16
    assert any("registers rotary cos/sin buffers" in a for a in rep.assumptions)
    doc["software"] = {"transformers": "4.46.3"}
    assert "rotary cos/sin buffers (older transformers)" not in estimate(doc).per_gpu.breakdown_detail["weights"]


def test_traced_engine_adds_the_same_buffers() -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as trace

    doc: dict[str, Any] = {"model": "meta-llama/Llama-2-7b-hf", "task": "train",
                           "hardware": {"gpu": "H100-SXM", "num_gpus": 1}, "framework": "hf-trainer",
                           "train": {"micro_batch_size": 1, "seq_len": 64, "precision": "bf16-true",
                                     "gradient_checkpointing": "full", "attention": "sdpa"},
                           "software": {"transformers": "4.36.2"}}
    old = trace(doc).per_gpu.breakdown["weights"]
    doc["software"] = {"transformers": "4.46.3"}
    new = trace(doc).per_gpu.breakdown["weights"]
    # per layer cos and sin of 4,096 x 128 x 2 = 1,048,576 B each, and inv_freq's 256 B, which the allocator rounds to
    # 512: 32 x (2 x 1,048,576 + 512) = 67,125,248 (the analytic engine counts 256 for it: 67,117,056)
    assert old - new == 32 * (2 * 1_048_576 + 512)


def test_load_phase_holds_them_too() -> None:
    # the buffers exist from the model's construction, before any weight is loaded: the load phase's allocated bytes
    # grow by exactly them (4.36 against 4.42, Mistral-7B in bf16)
    old = estimate(_train("mistralai/Mistral-7B-v0.1", "4.36.2")).per_gpu.lifecycle
    new = estimate(_train("mistralai/Mistral-7B-v0.1", "4.42.4")).per_gpu.lifecycle
    assert old["load"]["allocated_bytes"] - new["load"]["allocated_bytes"] == MISTRAL_BF16


def _lora_438(version: str, checkpointing: str = "none") -> dict[str, Any]:
    doc = _train("meta-llama/Llama-2-7b-hf", version, precision="bf16-mixed", micro_batch_size=4, seq_len=2048,
                 attention="sdpa", gradient_checkpointing=checkpointing)
    doc["train"]["peft"] = {"method": "lora", "rank": 16}
    return doc


def test_release_4_38_masks_every_layer() -> None:
    # 4.38's _update_causal_mask hands each layer a 4-D mask: SDPA runs the memory-efficient kernel and keeps the
    # layer's [b, 1, s, s] slice in the compute dtype for the backward (Traits.sdpa_mask_always for that release).
    # Llama-2-7B, 4 x 2048, bf16: 32 layers x 4 x 2048^2 x 2 = 1,073,741,824 B more than 4.37 (flash, no mask) at
    # the peak, the end of the forward, where the 4-D (4, 1, 4096, 4096) mask is alive as well (4 x 4,096^2 x 2 =
    # 134,217,728 B), plus the 4,096^2 bool causal_mask buffer (16,777,216 B); the rotary buffers are in both
    old = estimate(_lora_438("4.37.2"))
    new = estimate(_lora_438("4.38.2"))
    assert any("attention kernel: efficient" in a for a in new.assumptions)
    assert new.per_gpu.peak_allocated_bytes - old.per_gpu.peak_allocated_bytes == (
        32 * 4 * 2048 ** 2 * 2 + 4 * 4096 ** 2 * 2 + 4096 ** 2)
    assert estimate(_lora_438("4.39.3")).per_gpu.peak_allocated_bytes == old.per_gpu.peak_allocated_bytes


def test_release_4_38_four_d_mask_term() -> None:
    from vramplan.analytic.terms.context import StepContext
    from vramplan.analytic.terms.saved import release_causal_mask
    from vramplan.analytic.timeline import LOSS, TIED_EMBEDDING
    from vramplan.catalog.resolve import resolve

    # (b, 1, P, P) in the embeddings' dtype: the frozen bf16 base's, 4 x 4,096^2 x 2 = 134,217,728 B, held by the
    # decoder's forward (to the loss) without checkpointing, by the checkpointed layers to the first layer's backward
    for ck, dies in (("none", LOSS), ("full", TIED_EMBEDDING)):
        r = resolve(_lora_438("4.38.2", ck))
        (term,) = release_causal_mask(StepContext(r, 0, "efficient", False))
        assert (term.nbytes, term.dies) == (4 * 4096 ** 2 * 2, dies)
        assert release_causal_mask(StepContext(resolve(_lora_438("4.39.3", ck)), 0, "flash", False)) == []


def test_release_4_38_inference_mask() -> None:
    # Gemma-7B (8,192 positions, no rotary cache in 4.38) generating for 2 rows in bf16: the causal_mask buffer
    # 8,192^2 = 67,108,864 B, and each forward's (2, 1, 8192, 8192) mask in bf16, 2 x 8,192^2 x 2 = 268,435,456 B
    doc: dict[str, Any] = {"model": "google/gemma-7b", "task": "inference",
                           "hardware": {"gpu": "A100-80GB", "num_gpus": 1},
                           "inference": {"batch_size": 2, "prompt_len": 512, "new_tokens": 16, "dtype": "bf16"},
                           "software": {"transformers": "4.38.2"}}
    detail = estimate(doc).per_gpu.breakdown_detail
    assert detail["weights"]["causal-mask buffer (transformers 4.38)"] == 8192 ** 2
    assert detail["activations"]["4-D causal mask (transformers 4.38)"] == 2 * 8192 ** 2 * 2
    doc["software"] = {"transformers": "4.39.3"}
    assert "4-D causal mask (transformers 4.38)" not in estimate(doc).per_gpu.breakdown_detail.get("activations", {})
