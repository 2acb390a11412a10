"""Granite 4.0 hybrid (``granitemoehybrid``, transformers ``modeling_granitemoehybrid.py``): tensors counted by hand
and on transformers' meta device, generate estimated (analytic against traced), vLLM's state pages, and the MoE
releases refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from vramplan import estimate
from vramplan.catalog.resolve import resolve
from vramplan.errors import VramplanError
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


def test_experts_are_refused() -> None:
    with pytest.raises(VramplanError, match="not modelled"):
        model_from_config({**TESTER, "num_local_experts": 4, "num_experts_per_tok": 2})


@pytest.mark.parametrize("prompt", [100, 200])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
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
