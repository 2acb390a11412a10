"""Zamba2 (``zamba2``, transformers ``modeling_zamba2.py``): Mamba2 layers with shared transformer blocks ahead of the
mixer in the "hybrid" layers, counted by hand and on transformers' meta device (blocks tied only under
tie_word_embeddings), generate estimated (the hybrid layers' KV cache, every layer's mixer state; analytic against
traced), and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic.inference import (
    kept_embeddings_bytes,
    shared_block_extra_bytes,
    shared_block_output_bytes,
)
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import ssm_state_bytes, ssm_state_note
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# A test input, not a released model: three hybrid layers served by two shared blocks (A, B, A), q/k/v adapters
TESTER: dict[str, Any] = {
    "model_type": "zamba2", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 6,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"], "num_attention_heads": 4,
    "n_mamba_heads": 4, "mamba_d_state": 8, "num_mem_blocks": 2, "use_shared_attention_adapter": True,
    "adapter_rank": 4, "intermediate_size": 48, "use_mem_rope": True, "chunk_size": 16,
    "max_position_embeddings": 4096}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168 (lm_head tied); final norm 32
    # mixer (inter 2 x 32 = 64, 4 heads of 16, conv_dim 64 + 2 x 1 x 8 = 80): conv1d 80 x 4 + 80 = 400; in_proj
    #   32 x (64 + 80 + 4) = 4,736; dt_bias, A_log, D 12; norm 64; out_proj 64 x 32 = 2,048 -> 7,260; with the layer's
    #   input_layernorm 32: 7,292, x 6 layers = 43,752
    # per hybrid layer: linear 32 x 32 = 1,024, x 3 = 3,072
    # a shared block (attention on 2 x 32 = 64, 4 heads of 16): q, k, v 64 x 64 = 4,096 each, o 64 x 32 = 2,048
    #   -> 14,336; gate_up 32 x 96 = 3,072, down 48 x 32 = 1,536; norms 64 + 32 -> 19,040, x 2 blocks = 38,080
    # adapters, one set per hybrid layer: q, k, v 3 x (64 x 4 + 4 x 64) = 1,536; gate_up 32 x 4 + 4 x 96 = 512
    #   -> 2,048, x 3 = 6,144
    # 3,168 + 32 + 43,752 + 3,072 + 38,080 + 6,144 = 94,248
    m = model_from_config(TESTER)
    assert m.num_parameters == 94_248
    assert m.mamba is not None and m.mamba.layers == tuple(range(6)) and m.mamba.shared_attention_layers == (1, 3, 4)
    # only the hybrid layers run the shared block's MLP
    assert [ls.intermediate_size for ls in m.layers] == [0, 48, 0, 48, 48, 0]


@pytest.mark.parametrize("extra", [
    {},
    # untied: transformers 5.24 ties the blocks only under tie_word_embeddings (get_expanded_tied_weights_keys), so
    # every hybrid layer holds its own block with all of its block's adapters
    {"tie_word_embeddings": False},
    {"tie_word_embeddings": False, "num_mem_blocks": 3},
    {"num_mem_blocks": 3},
    {"use_shared_attention_adapter": False, "num_mem_blocks": 1, "add_bias_linear": True, "num_key_value_heads": 2},
])
def test_count_matches_transformers_meta_module(extra: dict[str, Any]) -> None:
    cfg = {**TESTER, **extra}
    assert model_from_config(cfg).num_parameters == _meta_count(cfg)


def test_untied_count_by_hand() -> None:
    # the tied count 94,248, + lm_head 3,168, + a third block: each hybrid layer holds its own copy (19,040), + the
    # adapters: the two copies of block A (hybrid layers 0 and 2) hold both of block A's sets, the copy of block B its
    # one: 5 sets where the tied model held 3 (+ 2 x 2,048 = 4,096) -> 94,248 + 3,168 + 19,040 + 4,096 = 120,552
    assert model_from_config({**TESTER, "tie_word_embeddings": False}).num_parameters == 120_552


def test_default_configuration_matches_transformers() -> None:
    # Zamba2Config's defaults ("Zamba2-2.7B style": 54 layers, 9 of them hybrid, one shared block)
    cfg = {"model_type": "zamba2", "hidden_size": 2560, "num_attention_heads": 32, "vocab_size": 32000}
    m = model_from_config(cfg)
    assert m.num_layers == 54 and m.mamba is not None and len(m.mamba.shared_attention_layers) == 9
    assert m.num_parameters == _meta_count(cfg) == 2_481_848_336


def test_kv_cache_and_mixer_state() -> None:
    m = model_from_config(TESTER)
    # only the 3 hybrid layers cache keys and values: 3 x 2 x 4 KV heads x 16 (2 x 32 / 4) x 2 B = 768 B per token
    assert kv_bytes_per_token(m, 2) == 768
    # every layer keeps a mixer state: conv 80 x 4 x 2 B = 640, SSM 4 x 16 x 8 x 4 B = 2,048 -> 2,688, x 6 = 16,128
    assert ssm_state_bytes(m, 1, 2) == 16_128
    assert ssm_state_note(m, 2) == ("plus 16,128 B per sequence of Mamba2 convolution and SSM state in 6 mixer layers "
                                    "(beside the KV cache of the 3 that run a shared block), whatever the sequence "
                                    "length")


@pytest.mark.parametrize("prompt", [100, 200])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # the mixers' einsum copies are not counted (as for Bamba, analytic/ssm_state.py)
    assert 0.95 < a / t <= 1.0


def test_shared_block_terms_of_the_prefill() -> None:
    m = model_from_config(TESTER)
    # b 2, p 100, bf16: the embeddings and their clone 2 x 2 x 100 x 32 x 2 = 25,600; the block's extra
    # max(32, 2 x 48) = 96 wide: 2 x 100 x 96 x 2 = 38,400; the block's output beside the mixer 2 x 100 x 32 x 2 = 12,800
    assert kept_embeddings_bytes(m, 2, 100, 2) == 25_600
    assert shared_block_extra_bytes(m, 2, 100, 2) == 38_400
    assert shared_block_output_bytes(m, 2, 100, 2) == 12_800


@pytest.mark.parametrize(("doc", "path"), [
    ({"task": "train", "train": {"seq_len": 128}}, "training it is not estimated"),
    # vLLM serving is estimated (tests/test_serve_linear_mixers.py); the other engines' state pools are not modelled
    ({"task": "serve", "serve": {"engine": "sglang"}}, "serve.engine"),
    ({"task": "inference", "parallel": {"tp": 2}}, "parallel.tp"),
    ({"task": "inference", "software": {"transformers": "4.57.0"}}, "software.transformers"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "fp8"}}, "inference.kv_cache_dtype"),
])
def test_what_is_not_modelled_is_refused(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(VramplanError) as err:
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})
    assert path in str(err.value)


def test_a_layer_list_that_disagrees_with_the_layer_count_is_refused() -> None:
    with pytest.raises(VramplanError, match="layers_block_type names 6 layers"):
        model_from_config({**TESTER, "num_hidden_layers": 5})


# untied, one block, no q/k/v adapters, biases, grouped KV heads
SECOND: dict[str, Any] = {
    "model_type": "zamba2", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "num_attention_heads": 4, "num_key_value_heads": 2,
    "n_mamba_heads": 4, "mamba_d_state": 16, "num_mem_blocks": 1, "adapter_rank": 8, "intermediate_size": 256,
    "chunk_size": 32, "tie_word_embeddings": False, "add_bias_linear": True}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_traced_generate_agrees_on_a_second_shape(attention: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": SECOND, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": 300, "new_tokens": 8, "attention": attention}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # sdpa: the mixer's peak, below the trace by the scan's einsum copies; eager: the shared block's MLP moment with
    # the kept probabilities, above it by the bound shared_block_extra_bytes takes (its 2 x intermediate adapter sum
    # counted over the whole MLP moment): 0.975 and 1.030 when written
    assert 0.95 < a / t < 1.05
