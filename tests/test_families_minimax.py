"""MiniMax-Text-01 (``minimax``, transformers ``modeling_minimax.py``): lightning (linear) attention layers interleaved
with softmax attention, mixture-of-experts MLPs; its parameters counted by hand and on transformers' meta device;
every task refused (the lightning attention's state and prefill are not modelled)."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import meta_causal_lm_count
from vramplan import estimate
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


@pytest.mark.parametrize("doc", [
    {"task": "inference"},
    {"task": "train", "train": {"seq_len": 128}},
    {"task": "serve"},
])
def test_every_task_is_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match=r"lightning \(linear\) attention layers .* are not modelled; its "
                       r"parameters are counted \(78,752\)"):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})


def test_a_layer_list_that_disagrees_with_the_layer_count_is_refused() -> None:
    with pytest.raises(VramplanError, match="layer_types names 4 layers"):
        model_from_config({**TESTER, "num_hidden_layers": 3,
                           "layer_types": ["full_attention", "linear_attention"] * 2})
