"""RecurrentGemma (``recurrent_gemma``, transformers ``modeling_recurrent_gemma.py``): RG-LRU recurrent blocks and local
attention, its parameters counted by hand and on transformers' meta device; every task refused (the recurrent blocks'
memory is not modelled)."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import meta_causal_lm_count
from vramplan import estimate
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# A test input: four recurrent blocks and one attention block (recurrent, recurrent, attention, recurrent, recurrent)
TESTER: dict[str, Any] = {
    "model_type": "recurrent_gemma", "hidden_size": 32, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_key_value_heads": 1, "vocab_size": 99, "intermediate_size": 96, "attention_window_size": 16, "lru_width": 48}

# recurrentgemma-2b's shape (hidden 2560, 26 layers, 10 heads, 1 KV head, intermediate 15360, lru_width 2560, vocab
# 256000, window 2048): its config.json could not be read verbatim, so it is a test input, not a catalog row
R2B: dict[str, Any] = {
    "model_type": "recurrent_gemma", "hidden_size": 2560, "num_hidden_layers": 26, "num_attention_heads": 10,
    "num_key_value_heads": 1, "vocab_size": 256000, "intermediate_size": 15360, "attention_window_size": 2048,
    "lru_width": 2560}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168 (lm_head tied); norms 2 x 32 x 5 + final 32 = 352
    # recurrent block (lru 48, 4 heads of 12): linear_y, linear_x 32 x 48 + 48 = 1,584 each; linear_out 48 x 32 + 32
    #   = 1,568; conv_1d 48 x 4 + 48 = 240; recurrent_param 48; the two gates 2 x (4 x 12 x 12 + 4 x 12) = 1,248
    #   -> 6,272, x 4 = 25,088
    # attention (head_dim 32 / 4 = 8, 1 KV head): q 32 x 32 = 1,024; k, v 32 x 8 = 256 each; o 32 x 32 + 32 = 1,056
    #   -> 2,592
    # MLP (intermediate 96 // 2 = 48): gate, up 32 x 48 + 48 = 1,584 each; down 48 x 32 + 32 = 1,568 -> 4,736, x 5 =
    #   23,680
    # 3,168 + 352 + 25,088 + 2,592 + 23,680 = 54,880
    m = model_from_config(TESTER)
    assert m.num_parameters == 54_880
    # the attention layer is local over the window
    assert [ls.sliding_window for ls in m.layers] == [None, None, 16, None, None]


@pytest.mark.parametrize("cfg", [
    TESTER,
    {**TESTER, "attention_bias": True, "tie_word_embeddings": False, "block_types": ["recurrent", "attention"]},
    R2B,
])
def test_count_matches_transformers_meta_module(cfg: dict[str, Any]) -> None:
    assert model_from_config(cfg).num_parameters == _meta_count(cfg)


def test_2b_shape_count() -> None:
    # embed 256,000 x 2,560 = 655,360,000; norms 2 x 2,560 x 26 + 2,560 = 135,680
    # 26 layers of (recurrent, recurrent, attention): 18 recurrent, 8 attention
    # recurrent block: linear_y, linear_x, linear_out 3 x (2,560^2 + 2,560) = 19,668,480; conv 2,560 x 4 + 2,560 =
    #   12,800; recurrent_param 2,560; gates 2 x (10 x 256 x 256 + 10 x 256) = 1,315,840 -> 20,999,680, x 18 =
    #   377,994,240
    # attention (head_dim 256, 1 KV head): q 2,560^2 = 6,553,600; k, v 2,560 x 256 = 655,360 each; o 6,553,600 +
    #   2,560 -> 14,420,480, x 8 = 115,363,840
    # MLP (15,360 // 2 = 7,680): gate, up 2,560 x 7,680 + 7,680 = 19,668,480 each; down 7,680 x 2,560 + 2,560 =
    #   19,663,360 -> 59,000,320, x 26 = 1,534,008,320
    # 655,360,000 + 135,680 + 377,994,240 + 115,363,840 + 1,534,008,320 = 2,682,862,080
    assert model_from_config(R2B).num_parameters == 2_682_862_080


@pytest.mark.parametrize("doc", [
    {"task": "inference"},
    {"task": "train", "train": {"seq_len": 128}},
    {"task": "serve"},
])
def test_every_task_is_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match="RG-LRU recurrent blocks .* are not modelled; its parameters are counted "
                       r"\(54,880\)"):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})
