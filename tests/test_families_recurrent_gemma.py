"""RecurrentGemma (``recurrent_gemma``, transformers ``modeling_recurrent_gemma.py``): RG-LRU recurrent blocks and local
attention, its parameters counted by hand and on transformers' meta device; generate's state (on the modules) and prefill
by hand, against a real CPU prefill and the traced engine; training and serving refused."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import bf16_prefill, meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import (
    mixer_decode_bytes,
    mixer_prefill_bytes,
    ssm_state_bytes,
    ssm_state_layer_bytes,
)
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


# a larger tester whose recurrent blocks outweigh the cuBLAS workspace: hidden 256, lru 384, 5 layers, window 64
MID: dict[str, Any] = {**TESTER, "hidden_size": 256, "lru_width": 384, "intermediate_size": 768, "vocab_size": 512,
                       "attention_window_size": 64}


def test_state_by_hand() -> None:
    m = model_from_config(R2B)
    assert m.mamba is not None and m.mamba.kind == "rg_lru" and len(m.mamba.layers) == 18
    # conv1d_state 2,560 x (4 - 1) x 2 B = 15,360; recurrent_states 2,560 x 4 B = 10,240 -> 25,600 a block
    assert ssm_state_layer_bytes(m, 2) == (15_360, 10_240)
    # x 18 blocks = 460,800 B per sequence; 4 sequences 1,843,200
    assert ssm_state_bytes(m, 4, 2) == 1_843_200
    # the 8 local attention blocks: 2 x 1 KV head x 256 x 2 B = 1,024 B a block and token, 8,192 for the 8
    assert kv_bytes_per_token(m, 2) == 8_192


def _module_state_after_a_prefill(cfg: dict[str, Any], batch: int, tokens: int) -> int:
    """Bytes of the recurrent blocks' conv1d_state and recurrent_states after a real bf16 prefill on the CPU."""
    torch = pytest.importorskip("torch")
    module = bf16_prefill(cfg, batch, tokens)[0]
    held = [getattr(mod, name, None) for mod in module.modules() for name in ("conv1d_state", "recurrent_states")]
    return sum(t.numel() * t.element_size() for t in held if isinstance(t, torch.Tensor))


def test_state_equals_the_modules_after_a_prefill() -> None:
    # 4 blocks x 2 sequences x 48 x (3 x 2 + 4) B = 3,840
    state = _module_state_after_a_prefill(TESTER, 2, 10)
    assert state == ssm_state_bytes(model_from_config(TESTER), 2, 2) == 3_840


def test_prefill_and_decode_blocks_by_hand() -> None:
    m = model_from_config(R2B)
    # 2 sequences of 512 tokens, bf16: (2 x 2,560 + 12 x 2,560) x 512 = 18,350,080 elements a sequence, the padded
    # convolution 2,560 x (512 + 3) = 1,318,400 -> x 2 x 2 B = 78,673,920; the scan's fp32 steps 2 x 2,560 x 16 =
    # 81,920 -> 78,755,840
    assert mixer_prefill_bytes(m, 2, 512, 2) == 78_755_840
    # a decode step, 1 sequence: 2 x (2 x 2,560 + (8 + 14) x 2,560) + 12 x 2,560 = 153,600; every block's extra
    # column 18 x 2,560 x 2 = 92,160 -> 245,760
    assert mixer_decode_bytes(m, 1, 2) == 245_760


def test_generate_running_layer_is_the_recurrent_block() -> None:
    doc = {"task": "inference", "model": R2B, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": 512, "new_tokens": 16}}
    e = estimate(doc)
    assert e.per_gpu.breakdown_detail["activations"]["running layer"] == 78_755_840
    # 2 x 460,800 of state; the prompt's keys and values: 2 x 512 x 8,192 = 8,388,608
    assert e.per_gpu.breakdown_detail["kv_cache"] == {"prompt": 8_388_608,
                                                      "mixer state (convolution and recurrent)": 921_600}
    assert any("18 of 26 layers are RG-LRU recurrent blocks" in x for x in e.assumptions)


@pytest.mark.parametrize(("batch", "prompt", "new"), [
    # the prefill's running block peaks: 17,485,312 against 17,481,216 B at 100 tokens (the prompt past the window)
    (2, 100, 10),
    (4, 200, 10),
    (2, 32, 20),
])
def test_traced_generate_agrees_with_the_analytic_engine(batch: int, prompt: int, new: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": MID, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": batch, "prompt_len": prompt, "new_tokens": new}}
    a, t = estimate(doc), traced(doc)
    assert 0.995 < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < 1.005
    # the traced engine counts the modules' state as the cache: per block, after the prefill conv1d_state 384 x 3 x 2 B
    # and recurrent_states 384 x 4 B, after the decode step conv1d_state's view of 384 x 4 x 2 B and recurrent_states
    # 384 x 4 B (a view of the step's fp32 output): 4 blocks x batch x 384 x (6 + 4 + 8 + 4) B
    events = _trace_events(doc)
    held = sum(e.nbytes for e in events if e.nbytes > 0 and e.category == "kv_cache" and e.op == "recurrent state")
    assert held == 4 * batch * 384 * 22


def _trace_events(doc: dict[str, Any]) -> Any:
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.engine import trace

    _, st = trace(resolve(doc))
    return st.events


@pytest.mark.parametrize(("doc", "match"), [
    ({"task": "train", "train": {"seq_len": 128}},
     r"training is not estimated: the RG-LRU's recurrence runs as a Python loop over the tokens \(_rnn_scan\)"),
    ({"task": "serve"}, "serving it with vllm is not estimated"),
    ({"task": "inference", "parallel": {"tp": 2}, "hardware": {"gpu": "H100", "num_gpus": 2}},
     "tensor parallelism is not estimated for it"),
    ({"task": "inference", "software": {"transformers": "4.46"}}, "modelled on transformers 5.24"),
])
def test_refused(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(VramplanError, match="RecurrentGemma \\(Griffin\\) model of 4 RG-LRU recurrent blocks and 1 "
                       "local attention blocks; .*" + match):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})
