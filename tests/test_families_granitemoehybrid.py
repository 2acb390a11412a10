"""Granite 4.0 hybrid (``granitemoehybrid``, transformers ``modeling_granitemoehybrid.py``): tensors counted by hand
and on transformers' meta device, generate estimated (analytic against traced), vLLM's state pages, and the MoE
releases refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from vramplan import estimate
from vramplan.catalog.resolve import resolve
from vramplan.serve.vllm import decide
from vramplan.spec.hf_config import model_from_config

# A test input, not a released checkpoint: a small shape with one mixer and one attention layer each way, the
# Granite 4.0 multipliers and no positional encoding
TESTER: dict[str, Any] = {
    "model_type": "granitemoehybrid", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "shared_intermediate_size": 64, "num_local_experts": 0,
    "layer_types": ["mamba", "attention", "mamba", "attention"], "mamba_n_heads": 16, "mamba_d_state": 16,
    "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16, "max_position_embeddings": 512,
    "position_embedding_type": "nope", "tie_word_embeddings": True, "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22, "attention_multiplier": 0.0078125, "logits_scaling": 8.0}

# The shape public descriptions of ibm-granite/granite-4.0-h-micro quote (40 layers, attention at 5, 15, 25 and 35,
# hidden 2048, 32 heads, 8 KV heads, shared MLP 8192, 64 mixer heads of 64, state 128, no experts, no positional
# encoding, tied embeddings, 131,072 positions); its config.json could not be read verbatim, so it is a test input,
# not a catalog row
MICRO: dict[str, Any] = {
    "model_type": "granitemoehybrid", "vocab_size": 100352, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 8, "shared_intermediate_size": 8192, "num_local_experts": 0,
    "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)], "mamba_n_heads": 64,
    "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
    "max_position_embeddings": 131072, "position_embedding_type": "nope", "tie_word_embeddings": True}


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168 (tied: no lm_head); final norm 32
    # every layer: two norms 64; shared_mlp input_linear 32 x 128 = 4,096, output_linear 64 x 32 = 2,048 -> 6,208;
    #   x 4 = 24,832
    # mixer (inter 64, 16 heads of 4, conv_dim 64 + 2 x 16 = 96): conv1d 96 x 4 + 96 = 480; in_proj 32 x (64 + 96 + 16)
    #   = 5,632; dt_bias, A_log, D 48; norm 64; out_proj 64 x 32 = 2,048 -> 8,272, x 2 = 16,544
    # attention (head_dim 8): q 32 x 32 + k 32 x 16 + v 32 x 16 + o 32 x 32 = 3,072, x 2 = 6,144
    # 3,168 + 32 + 24,832 + 16,544 + 6,144 = 50,720
    m = model_from_config(TESTER)
    assert m.num_parameters == 50_720
    assert m.mamba is not None and m.mamba.layers == (0, 2)
    assert m.position == "none" and m.tie_word_embeddings


@pytest.mark.parametrize("tied", [True, False])
def test_micro_shape_matches_transformers_meta_module(tied: bool) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    shape = {**MICRO, "tie_word_embeddings": tied}
    spec = model_from_config(shape)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**shape)
        with torch.device("meta"):
            module = transformers.AutoModelForCausalLM.from_config(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    # embed 100,352 x 2,048 = 205,520,896; final norm 2,048
    # every layer: norms 4,096 + shared_mlp 2,048 x 16,384 + 8,192 x 2,048 = 50,331,648 -> 50,335,744, x 40 =
    #   2,013,429,760
    # mixer (conv_dim 4,352): conv1d 4,352 x 4 + 4,352 = 21,760; in_proj 2,048 x (4,096 + 4,352 + 64) = 17,432,576;
    #   dt_bias, A_log, D 192; norm 4,096; out_proj 4,096 x 2,048 = 8,388,608 -> 25,847,232, x 36 = 930,500,352
    # attention (head_dim 64): 2 x 2,048 x 2,048 + 2 x 2,048 x 512 = 10,485,760, x 4 = 41,943,040
    # tied: 3,191,396,096; untied adds the lm_head's 205,520,896
    assert spec.num_parameters == (3_191_396_096 if tied else 3_396_916_992)


# the tester with experts: 4 of intermediate 32, top 2
MOE_TESTER: dict[str, Any] = {**TESTER, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}

# Granite 4.0-H-Tiny's shape: hidden 1536, 40 layers, 12 heads and 4 KV heads, 64 experts of 512 (top 6), shared MLP
# 1024, 48 mixer heads of 64 (ssm_d_inner 3072), state 128, 1 group, vocab 100,352, as llama.cpp prints it for the
# GGUF of ibm-granite/granite-4.0-h-tiny (koboldcpp issue 1781: "model params = 6.94 B"); the attention layers' places
# are assumed (they do not change the count or the cache)
TINY: dict[str, Any] = {
    **MICRO, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 4, "shared_intermediate_size": 1024,
    "intermediate_size": 512, "num_local_experts": 64, "num_experts_per_tok": 6, "mamba_n_heads": 48}


def test_moe_tester_count_by_hand() -> None:
    # the tester's 50,720 and per layer: router 32 x 4 = 128, experts gate_up 4 x 64 x 32 = 8,192, down 4 x 32 x 32 =
    # 4,096 -> 12,416, x 4 = 49,664: 100,384
    m = model_from_config(MOE_TESTER)
    assert m.num_parameters == 100_384
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.shared_intermediate_size) == (4, 2, 64)
    assert m.traits.router_topk_first and not m.traits.experts_are_linears


def test_tiny_shape_matches_transformers_meta_module() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = model_from_config(TINY)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**TINY)
        with torch.device("meta"):
            module = transformers.AutoModelForCausalLM.from_config(cfg)
    # embed 100,352 x 1,536 = 154,140,672; final norm 1,536
    # every layer: norms 3,072; shared_mlp 1,536 x 2,048 + 1,024 x 1,536 = 4,718,592; router 1,536 x 64 = 98,304;
    #   experts 64 x 1,024 x 1,536 = 100,663,296 and 64 x 1,536 x 512 = 50,331,648 -> 155,814,912, x 40 = 6,232,596,480
    # mixer (inter 3,072, conv_dim 3,328): conv1d 16,640; in_proj 1,536 x 6,448 = 9,904,128; 144; norm 3,072;
    #   out_proj 4,718,592 -> 14,642,576, x 36 = 527,132,736
    # attention (head_dim 128): 2 x 1,536^2 + 2 x 1,536 x 512 = 6,291,456, x 4 = 25,165,824
    # 6,939,037,248: llama.cpp's "6.94 B"
    assert spec.num_parameters == sum(p.numel() for p in module.parameters()) == 6_939_037_248


@pytest.mark.parametrize(("model", "prompt"), [(TESTER, 100), (TESTER, 200), (MOE_TESTER, 100), (MOE_TESTER, 200)])
def test_traced_generate_agrees_with_the_analytic_engine(model: dict[str, Any], prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": model, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # as Bamba's (tests/test_families_hybrid.py): the analytic mixer term leaves out the einsums' transient copies
    assert 0.95 < a / t <= 1.0


def test_vllm_state_pages_for_the_micro_shape() -> None:
    doc = {"model": MICRO, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"vllm_version": "0.11", "max_model_len": 8192, "kv_cache_memory_bytes": 10 * 1024**3}}
    d = decide(resolve(doc), version="0.11")
    # conv_dim 4,096 + 2 x 128 = 4,352; state page (3 x 4,352 + 64 x 64 x 128) x 2 B = 537,344 x 2 = 1,074,688 B
    assert d.mamba_state_page_bytes == 1_074_688
    # attention per token 2 x 8 x 64 x 2 B = 2,048; block 16 x cdiv(1,074,688, 32,768) = 16 x 33 = 528;
    # page 528 x 2,048 = 1,081,344
    assert (d.block_size, d.page_bytes) == (528, 1_081_344)
    # 4 attention and 36 mixer layers: groups of 4, 1 + 9 = 10 groups
    assert (d.layers_per_group, len(d.groups)) == (4, 10)
    # 10,737,418,240 // 1,081,344 = 9,929 pages; // 4 = 2,482 blocks; 2,482 // 10 x 528 = 130,944 tokens
    assert (d.num_gpu_blocks, d.kv_cache_tokens) == (2482, 130_944)
    # a request of 8,192 tokens: cdiv(8,192, 528) = 16 + 9 = 25 blocks -> 2,482 / 25 = 99.28
    assert d.max_concurrency == pytest.approx(99.28)
    # no positional encoding: no rotary cache
    assert d.rotary_cache_bytes == 0


def test_vllm_state_pages_for_the_tiny_shape() -> None:
    doc = {"model": TINY, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"vllm_version": "0.19", "max_model_len": 32768, "kv_cache_memory_bytes": 10 * 1024**3}}
    d = decide(resolve(doc), version="0.19")
    # conv_dim 3,072 + 256 = 3,328; state page (3 x 3,328 + 48 x 64 x 128) x 2 B = 403,200 x 2 = 806,400 B;
    # attention per token 2 x 4 x 128 x 2 B = 2,048; block 16 x cdiv(806,400, 32,768) = 16 x 25 = 400; page 819,200
    assert (d.mamba_state_page_bytes, d.block_size, d.page_bytes) == (806_400, 400, 819_200)
    # 10,737,418,240 // 819,200 = 13,107 pages; // 4 = 3,276 blocks; per request cdiv(32,768, 400) = 82 + 9 = 91
    assert (d.num_gpu_blocks, d.blocks_per_request) == (3276, 91)
    assert d.max_concurrency == pytest.approx(3276 / 91)
