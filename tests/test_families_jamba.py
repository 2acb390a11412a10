"""Jamba (``jamba``, transformers ``modeling_jamba.py``): Mamba-1 mixers beside attention layers, dense and
mixture-of-experts MLPs.  Tensors counted by hand and on transformers' meta device, the mixers' state and scan by
hand, generate estimated (analytic against traced), and what is not modelled refused."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import mixer_decode_bytes, mixer_prefill_bytes, ssm_state_bytes
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# A test input, not a released checkpoint: attention at layers 1 and 3 (period 2, offset 1), mixers at 0 and 2,
# experts at 0 and 2 (period 2, offset 0), dense MLPs at 1 and 3; dt rank "auto" = ceil(32 / 16) = 2
TESTER: dict[str, Any] = {
    "model_type": "jamba", "vocab_size": 99, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_period": 2, "attn_layer_offset": 1,
    "expert_layer_period": 2, "expert_layer_offset": 0, "num_experts": 4, "num_experts_per_tok": 2,
    "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto", "tie_word_embeddings": False}

# ai21labs/Jamba-v0.1's published shape (its config.json's size keys, as public copies quote them; not read verbatim
# from the Hub, so a test input and no catalog row): attention every 8 layers from 4, experts every 2 from 1
JAMBA_V01: dict[str, Any] = {
    "model_type": "jamba", "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_offset": 4,
    "attn_layer_period": 8, "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 16,
    "mamba_expand": 2, "mamba_dt_rank": 256, "mamba_conv_bias": True, "mamba_proj_bias": False, "num_experts": 16,
    "num_experts_per_tok": 2, "tie_word_embeddings": False, "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16"}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168; lm_head 3,168; final norm 32; every layer's two norms 2 x 32 x 4 = 256
    # attention (layers 1, 3; head_dim 8): q 32 x 32 + k 32 x 16 + v 32 x 16 + o 32 x 32 = 3,072, x 2 = 6,144
    # mixer (layers 0, 2; I = 2 x 32 = 64, n 16, r 2, d_conv 4): conv1d 64 x 4 + 64 = 320; in_proj 32 x 128 = 4,096;
    #   x_proj 64 x (2 + 32) = 2,176; dt_proj 2 x 64 + 64 = 192; A_log 64 x 16 = 1,024; D 64; out_proj 64 x 32 = 2,048;
    #   dt/b/c norms 2 + 16 + 16 = 34 -> 9,954, x 2 = 19,908
    # dense MLP (layers 1, 3): 3 x 32 x 64 = 6,144, x 2 = 12,288
    # MoE (layers 0, 2): router 4 x 32 = 128; experts 4 x 3 x 32 x 64 = 24,576 -> 24,704, x 2 = 49,408
    # 6,336 + 32 + 256 + 6,144 + 19,908 + 12,288 + 49,408 = 94,372
    m = model_from_config(TESTER)
    assert m.num_parameters == 94_372
    assert m.mamba is not None and m.mamba.layers == (0, 2) and m.mamba.kind == "mamba1"
    assert m.mamba.time_step_rank == 2 and m.mamba.intermediate_size == 64
    assert [ls.moe for ls in m.layers] == [True, False, True, False]
    assert [ls.intermediate_size for ls in m.layers] == [0, 64, 0, 64]
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_intermediate_size) == (4, 2, 64)
    assert m.position == "none"
    # KV cache of the two attention layers only: 2 x (2 x 2 KV heads x 8) x 2 B = 128 B per token
    assert kv_bytes_per_token(m, 2) == 128


@pytest.mark.parametrize("changes", [
    {},
    # no conv bias, projection biases, tied embeddings, one expert (every layer dense), offset 0, dt rank 5, MHA
    {"mamba_conv_bias": False, "mamba_proj_bias": True, "tie_word_embeddings": True, "num_experts": 1,
     "attn_layer_offset": 0, "mamba_dt_rank": 5, "num_key_value_heads": 4},
])
def test_tester_matches_transformers_meta_module(changes: dict[str, Any]) -> None:
    shape = {**TESTER, **changes}
    assert model_from_config(shape).num_parameters == _meta_count(shape)


def test_jamba_v01_shape_against_meta_module_and_by_hand() -> None:
    # embed and lm_head 2 x 65,536 x 4,096 = 536,870,912; final norm 4,096; norms 2 x 4,096 x 32 = 262,144
    # attention (layers 4, 12, 20, 28; head_dim 128): 2 x 4,096^2 + 2 x 4,096 x 1,024 = 41,943,040, x 4 = 167,772,160
    # mixer (28 layers; I 8,192, n 16, r 256): conv1d 8,192 x 4 + 8,192 = 40,960; in_proj 4,096 x 16,384 = 67,108,864;
    #   x_proj 8,192 x 288 = 2,359,296; dt_proj 256 x 8,192 + 8,192 = 2,105,344; A_log 131,072; D 8,192;
    #   out_proj 33,554,432; norms 288 -> 105,308,448, x 28 = 2,948,636,544
    # dense MLP (16 even layers): 3 x 4,096 x 14,336 = 176,160,768, x 16 = 2,818,572,288
    # MoE (16 odd layers): router 65,536 + experts 16 x 176,160,768 = 2,818,637,824, x 16 = 45,098,205,184
    # 536,870,912 + 4,096 + 262,144 + 167,772,160 + 2,948,636,544 + 2,818,572,288 + 45,098,205,184 = 51,570,323,328
    # (the model card's "52B total parameters")
    m = model_from_config(JAMBA_V01)
    assert m.num_parameters == 51_570_323_328
    assert m.num_parameters == _meta_count(JAMBA_V01)
    assert m.mamba is not None and len(m.mamba.layers) == 28


def test_state_and_scan_by_hand() -> None:
    m = model_from_config(JAMBA_V01)
    # bf16: conv 8,192 x 4 x 2 = 65,536; SSM 8,192 x 16 x 4 = 524,288; 589,824 per layer, x 28 = 16,515,072 per
    # sequence; 2 sequences 33,030,144
    assert ssm_state_bytes(m, 2, 2) == 33_030_144
    # KV: 4 attention layers x 2 x 8 KV heads x 128 x 2 B = 16,384 B per token
    assert kv_bytes_per_token(m, 2) == 16_384
    # the prefill scan with the dt/B/C norms (FalconMamba's forward, same I and n as falcon-mamba-7b), b 1, p 1,000:
    # 3 x 1,000 x 8,192 x 16 x 4 = 1,572,864,000; 1,000 x 8,192 x (4 + 12 + 4) = 163,840,000;
    # 1,000 x 2 x (4 x 8,192 + 2 x 16) = 65,600,000 -> 1,802,304,000
    assert mixer_prefill_bytes(m, 1, 1000, 2) == 1_802_304_000
    # decode: 20 B per state element, 8,192 x 16 x 20 = 2,621,440 per sequence
    assert mixer_decode_bytes(m, 1, 2) == 2_621_440


@pytest.mark.parametrize("prompt", [100, 200])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc), traced(doc)
    # within 0.4% of the trace on this shape (11,594,056 against 11,576,320 B at 100 prompt tokens)
    assert 0.99 < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < 1.01
    # Jamba's dt/B/C norm weights are parameters: no note of FalconMamba's buffers
    assert not any("non-persistent buffers" in x for x in a.assumptions)


@pytest.mark.parametrize(("doc", "path"), [
    # training is estimated, full and LoRA (tests/test_mamba1_train.py); DoRA and tensor parallelism are not
    ({"task": "train", "train": {"micro_batch_size": 1, "seq_len": 128,
                                 "peft": {"method": "dora", "target_modules": ["q_proj"]}}}, "train.peft.method"),
    # vLLM is modelled from 0.11.0 (tests/test_serve_state_space.py); SGLang's state pool is not
    ({"task": "serve", "serve": {"engine": "sglang"}}, "serve.engine"),
    ({"task": "inference", "parallel": {"tp": 2}}, "parallel.tp"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "int8"}}, "inference.kv_cache_dtype"),
    # transformers 4.x's HybridMambaAttentionDynamicCache (states in the model dtype) is other code
    ({"task": "inference", "software": {"transformers": "4.48.0"}}, "software.transformers"),
])
def test_what_is_not_modelled_is_refused(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(VramplanError) as exc:
        estimate({**doc, "model": TESTER, "hardware": {"gpu": "A100-80GB"}})
    text = str(exc.value)
    assert path in text and "hybrid of 2 Mamba mixer layers and 2 attention layers" in text


@pytest.mark.parametrize(("changes", "needle"), [
    ({"use_mambapy": True}, "use_mambapy"),
    ({"layers_block_type": ["mamba", "attention", "mamba", "attention"]}, "attn_layer_period"),
    ({"attn_layer_offset": 2}, "attention layer offset (2) must be smaller"),
    ({"expert_layer_offset": 2}, "expert layer offset (2) must be smaller"),
])
def test_unmodelled_configs_are_refused(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises((VramplanError, ValueError)) as exc:
        model_from_config({**TESTER, **changes})
    assert needle in str(exc.value)
