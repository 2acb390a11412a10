"""MiniMax-Text-01 (``minimax``, transformers ``modeling_minimax.py``): lightning (linear) attention layers interleaved
with softmax attention, mixture-of-experts MLPs; its parameters counted by hand and on transformers' meta device;
generate's lightning state, buffers and prefill by hand and against the traced engine; training and serving refused."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import (
    mixer_buffer_bytes,
    mixer_decode_bytes,
    mixer_prefill_bytes,
    ssm_state_bytes,
    ssm_state_layer_bytes,
    ssm_state_note,
)
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# A test input: MiniMaxConfig's default layer types (full, linear, full, linear), three experts
TESTER: dict[str, Any] = {
    "model_type": "minimax", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 99, "intermediate_size": 48, "num_local_experts": 3,
    "num_experts_per_tok": 2, "block_size": 16}

# A shape of MiniMax-Text-01's size (hidden 6144, 80 layers with softmax attention in every eighth, 64 heads of 128,
# 8 KV heads, 32 experts of 9216, top 2, vocab 200064): its config.json could not be read verbatim, so it is a test
# input, not a catalog row; its count is the published 456B total
M01: dict[str, Any] = {
    "model_type": "minimax", "hidden_size": 6144, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 200064, "intermediate_size": 9216, "num_local_experts": 32,
    "num_experts_per_tok": 2,
    "layer_types": ["full_attention" if (i + 1) % 8 == 0 else "linear_attention" for i in range(80)]}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embed and lm_head (untied) 2 x 99 x 32 = 6,336; final norm 32; layer norms 2 x 32 x 4 = 256
    # softmax attention (layers 0, 2; head_dim 8): q 32 x 32 = 1,024, k, v 32 x 16 = 512 each, o 1,024 -> 3,072, x 2
    #   = 6,144
    # lightning attention (layers 1, 3): norm 32; qkv_proj 32 x 96 = 3,072; out_proj 1,024; output_gate 1,024 ->
    #   5,152, x 2 = 10,304
    # MoE: router 3 x 32 = 96; gate_up 3 x 96 x 32 = 9,216; down 3 x 32 x 48 = 4,608 -> 13,920, x 4 = 55,680
    # 6,336 + 32 + 256 + 6,144 + 10,304 + 55,680 = 78,752
    m = model_from_config(TESTER)
    assert m.num_parameters == 78_752
    # active: the router and 2 of 3 experts per layer: 78,752 - 4 x (3,072 + 1,536) = 60,320
    assert m.num_active_parameters == 60_320


@pytest.mark.parametrize("cfg", [
    TESTER,
    {**TESTER, "head_dim": 16, "tie_word_embeddings": True,
     "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"]},
])
def test_count_matches_transformers_meta_module(cfg: dict[str, Any]) -> None:
    assert model_from_config(cfg).num_parameters == _meta_count(cfg)


def test_text_01_shape() -> None:
    # 456,089,655,296 (the published 456B), 48,403,306,496 active (45.9B without the embeddings and LM head,
    # 2 x 200,064 x 6,144 = 2,458,386,432)
    m = model_from_config(M01)
    assert m.num_parameters == _meta_count(M01) == 456_089_655_296
    assert m.num_active_parameters == 48_403_306_496


def test_text_01_state_buffers_and_prefill_by_hand() -> None:
    m = model_from_config(M01)
    assert m.mamba is not None and m.mamba.kind == "lightning" and len(m.mamba.layers) == 70
    # MiniMaxCache.linear_cache, bf16: 64 heads x 128 x 128 x 2 B = 2,097,152 a layer, x 70 = 146,800,640 a sequence
    assert ssm_state_layer_bytes(m, 2) == (0, 2_097_152)
    assert ssm_state_bytes(m, 1, 2) == 146_800_640
    # the 10 softmax layers: 2 x 8 KV heads x 128 x 2 B x 10 = 40,960 B a token
    assert kv_bytes_per_token(m, 2) == 40_960
    # decay buffers: 64 x (1 + 2 x 256 + 256^2) x 2 B = 8,454,272 a layer, x 70 = 591,799,040
    assert mixer_buffer_bytes(m, 2) == 591_799_040
    note = ssm_state_note(m, 2)
    assert note is not None and "146,800,640 B per sequence of lightning attention recurrent state in 70" in note
    # one sequence of 4,096 tokens, bf16 (u = 8,192, q = 8,192, h = 6,144): 2 h u = 100,663,296; the norm 4 q u +
    # 8 p q = 268,435,456 + 268,435,456, with the last block's locals 64 x 2 x (256^2 + 4 x 256 x 128 + 128^2) =
    # 27,262,976 -> 564,133,888 (above 6 q u + those and the loop's 4 q u + 128 x 278,528 = 304,087,040)
    assert mixer_prefill_bytes(m, 1, 4096, 2) == 100_663_296 + 564_133_888
    # a decode step: 3 x 64 x 128 x 128 + 2 x 6,144 + 6 x 8,192 = 3,207,168 elements x 2 B
    assert mixer_decode_bytes(m, 1, 2) == 6_414_336


def test_text_01_generate_by_the_analytic_engine() -> None:
    doc = {"task": "inference", "model": M01, "hardware": {"gpu": "H100"},
           "inference": {"batch_size": 1, "prompt_len": 4096, "new_tokens": 256}}
    e = estimate(doc)
    d = e.per_gpu.breakdown_detail
    # 4,096 tokens x 40,960 B of softmax KV; one sequence's lightning state; the decay buffers
    assert d["kv_cache"] == {"prompt": 167_772_160, "mixer state (convolution and recurrent)": 146_800_640}
    assert d["other"]["lightning attention decay buffers"] == 591_799_040
    assert any("70 of 80 layers are lightning (linear) attention" in x for x in e.assumptions)


# a tester whose lightning layers outweigh its experts: 8 heads of 64 over hidden 256, experts of 16, block 64
LIGHT: dict[str, Any] = {**TESTER, "hidden_size": 256, "num_attention_heads": 8, "head_dim": 64,
                         "num_key_value_heads": 2, "intermediate_size": 16, "vocab_size": 512, "block_size": 64,
                         "num_local_experts": 2, "num_experts_per_tok": 1}
# a tester whose experts outweigh its lightning layers
MOE: dict[str, Any] = {**TESTER, "hidden_size": 256, "intermediate_size": 384, "vocab_size": 512, "block_size": 64}


@pytest.mark.parametrize(("shape", "batch", "prompt", "low", "high"), [
    # a lightning layer peaks: 24,712,736 against 24,698,880 B (16 blocks); 16,593,440 against 16,436,224 (one block)
    (LIGHT, 1, 1000, 1.0, 1.002),
    (LIGHT, 2, 300, 1.0, 1.006),
    (LIGHT, 4, 40, 1.0, 1.01),
    # an MoE layer peaks
    (MOE, 2, 300, 0.99, 1.0),
])
def test_traced_generate_agrees_with_the_analytic_engine(shape: dict[str, Any], batch: int, prompt: int, low: float,
                                                        high: float) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": shape, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": batch, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc), traced(doc)
    assert low < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < high
    # the traced engine's cache: the softmax layers' keys and values and the lightning states, as the analytic one's
    kv = a.per_gpu.breakdown_detail["kv_cache"]
    assert t.per_gpu.breakdown_detail["kv_cache"]["layers.*.self_attn"] == sum(kv.values())


@pytest.mark.parametrize(("doc", "match"), [
    ({"task": "train", "train": {"seq_len": 128}}, "training is not estimated"),
    ({"task": "serve"}, "serving it with vllm is not estimated"),
    ({"task": "inference", "parallel": {"tp": 2}, "hardware": {"gpu": "H100", "num_gpus": 2}},
     "tensor parallelism is not estimated for it"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "fp8"}}, "its own MiniMaxCache"),
])
def test_refused(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(VramplanError, match="a hybrid of 2 lightning \\(linear\\) attention layers and 2 softmax "
                       "attention layers; .*" + match):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})


def test_a_layer_list_that_disagrees_with_the_layer_count_is_refused() -> None:
    with pytest.raises(VramplanError, match="layer_types names 4 layers"):
        model_from_config({**TESTER, "num_hidden_layers": 3,
                           "layer_types": ["full_attention", "linear_attention"] * 2})
