"""LFM2 (``lfm2``, transformers ``modeling_lfm2.py``): gated short-convolution blocks beside grouped-query attention.
Tensors counted by hand and on transformers' meta device, the convolution state by hand and against transformers' own
cache after a prefill, generate by the analytic engine against the traced engine's, a convolution block's saved
tensors by hand and against autograd's graph, training by the analytic engine against the traced engine's, and what
is not modelled refused."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import category_bytes, meta_causal_lm_count, prefill_state_bytes
from vramplan import estimate
from vramplan.analytic.activations import total_bytes
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import (
    mixer_decode_bytes,
    mixer_prefill_bytes,
    ssm_state_bytes,
    ssm_state_note,
)
from vramplan.analytic.terms.mamba2 import mixer_saved_tensors
from vramplan.errors import VramplanError
from vramplan.spec.families.lfm2 import ff_width
from vramplan.spec.hf_config import model_from_config

# A test input, not a released checkpoint: attention at layers 1 and 3 (full_attn_idxs), convolution at 0 and 2;
# block_ff_dim 96 -> int(2 x 96 / 3) = 64, a multiple of 16 already; tied embeddings (the default)
TESTER: dict[str, Any] = {
    "model_type": "lfm2", "vocab_size": 99, "hidden_size": 32, "block_ff_dim": 96, "block_multiple_of": 16,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "full_attn_idxs": [1, 3]}

# LiquidAI/LFM2-1.2B's published shape (its config.json's size keys, as public copies quote them; not read verbatim
# from the Hub, so a test input and no catalog row)
LFM2_1_2B: dict[str, Any] = {
    "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048, "block_ff_dim": 12288, "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "conv_L_cache": 3,
    "conv_bias": False, "max_position_embeddings": 128000, "torch_dtype": "bfloat16"}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168 (tied: no lm_head); embedding_norm 32; every layer's two norms 2 x 32 x 4 = 256
    # attention (layers 1, 3; head_dim 8): q 32 x 32 = 1,024; k 32 x 16 = 512; v 512; out_proj 1,024; q/k layernorms
    #   16 -> 3,088, x 2 = 6,176
    # convolution (layers 0, 2; conv_L_cache 3): conv 32 x 3 = 96; in_proj 32 x 96 = 3,072; out_proj 1,024 -> 4,192,
    #   x 2 = 8,384
    # feed_forward (every layer, width 64): 3 x 32 x 64 = 6,144, x 4 = 24,576
    # 3,168 + 32 + 256 + 6,176 + 8,384 + 24,576 = 42,592
    m = model_from_config(TESTER)
    assert m.num_parameters == 42_592
    assert m.mamba is not None and m.mamba.layers == (0, 2) and m.mamba.kind == "short_conv"
    assert (m.mamba.conv_dim, m.mamba.ssm_state_elements) == (32, 0)
    assert m.intermediate_size == 64 and m.tie_word_embeddings
    # KV cache of the two attention layers only: 2 x 2 x 2 KV heads x 8 x 2 B = 128 B per token
    assert kv_bytes_per_token(m, 2) == 128


@pytest.mark.parametrize(("cfg", "width"), [
    # int(2 x 12,288 / 3) = 8,192, x 1.0, a multiple of 256 already
    ({"block_ff_dim": 12288}, 8192),
    # block_ff_dim replaces intermediate_size (Lfm2Config.__post_init__)
    ({"intermediate_size": 8192, "block_ff_dim": 12288}, 8192),
    # int(2 x 100 / 3) = 66; x 1.5 = 99; rounded up to 256 -> 256
    ({"intermediate_size": 100, "block_ffn_dim_multiplier": 1.5}, 256),
    # a null multiplier: the two thirds alone (int(2 x 100 / 3) = 66)
    ({"intermediate_size": 100, "block_ffn_dim_multiplier": None}, 66),
    ({"intermediate_size": 100, "block_auto_adjust_ff_dim": False}, 100),
])
def test_ff_width(cfg: dict[str, Any], width: int) -> None:
    assert ff_width(cfg) == width


@pytest.mark.parametrize("changes", [
    {},
    # no auto-adjust, conv bias, kernel 4, untied (the checkpoints' tie_embedding alias), MHA, explicit layer types
    {"block_ff_dim": None, "intermediate_size": 96, "block_auto_adjust_ff_dim": False, "conv_bias": True,
     "conv_L_cache": 4, "num_key_value_heads": 4, "tie_embedding": False, "full_attn_idxs": None,
     "layer_types": ["conv", "full_attention", "conv", "conv"]},
    # a multiplier that rounds up, a head_dim of its own, every layer attention (full_attn_idxs absent)
    {"block_ffn_dim_multiplier": 1.5, "head_dim": 16, "full_attn_idxs": None},
])
def test_tester_matches_transformers_meta_module(changes: dict[str, Any]) -> None:
    shape = {k: v for k, v in {**TESTER, **changes}.items() if v is not None}
    assert model_from_config(shape).num_parameters == _meta_count(shape)


def test_every_layer_attention_is_no_hybrid() -> None:
    m = model_from_config({k: v for k, v in TESTER.items() if k != "full_attn_idxs"})
    assert m.mamba is None


def test_1_2b_shape_against_meta_module_and_by_hand() -> None:
    # embed 65,536 x 2,048 = 134,217,728 (tied); embedding_norm 2,048; norms 2 x 2,048 x 16 = 65,536
    # attention (6 layers, head_dim 64): q 2,048^2 = 4,194,304; k, v 2 x 2,048 x 512 = 2,097,152; out_proj 4,194,304;
    #   q/k layernorms 128 -> 10,485,888, x 6 = 62,915,328
    # convolution (10 layers): conv 2,048 x 3 = 6,144; in_proj 2,048 x 6,144 = 12,582,912; out_proj 4,194,304
    #   -> 16,783,360, x 10 = 167,833,600
    # feed_forward (16 layers, width 8,192): 3 x 2,048 x 8,192 = 50,331,648, x 16 = 805,306,368
    # 134,217,728 + 2,048 + 65,536 + 62,915,328 + 167,833,600 + 805,306,368 = 1,170,340,608 (the model card's "1.2B")
    m = model_from_config(LFM2_1_2B)
    assert m.num_parameters == 1_170_340_608
    assert m.num_parameters == _meta_count(LFM2_1_2B)


def test_state_by_hand() -> None:
    m = model_from_config(LFM2_1_2B)
    # bf16: 2,048 x 3 x 2 B = 12,288 per convolution block, x 10 = 122,880 per sequence; 4 sequences 491,520
    assert ssm_state_bytes(m, 4, 2) == 491_520
    # KV: 6 attention layers x 2 x 8 KV heads x 64 x 2 B = 12,288 B per token
    assert kv_bytes_per_token(m, 2) == 12_288
    note = ssm_state_note(m, 2)
    assert note is not None and "122,880 B per sequence of short-convolution convolution state" in note
    # the running block at the prefill, 1 sequence of 1,000 tokens: 2,048 x (8 x 1,000 + 3 - 1) x 2 B = 32,776,192
    assert mixer_prefill_bytes(m, 1, 1000, 2) == 32_776_192
    # a decode step's block: 2,048 x (3 + 7) x 2 B = 40,960 per sequence
    assert mixer_decode_bytes(m, 1, 2) == 40_960


def test_state_equals_transformers_cache_after_a_prefill() -> None:
    state = prefill_state_bytes(TESTER, 2, 10)
    # 2 convolution blocks x 2 sequences x 32 x 3 x 2 B = 768
    assert state == ssm_state_bytes(model_from_config(TESTER), 2, 2) == 768


def test_traced_training_step_holds_the_adapters_parameters() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.engine import trace

    doc = {"model": TESTER, "hardware": {"gpu": "A100-80GB"}, "train": {"micro_batch_size": 1, "seq_len": 64}}
    r, st = trace(resolve(doc))
    weights = category_bytes(st.events, "weights")
    grads = category_bytes(st.events, "gradients")
    states = category_bytes(st.events, "optimizer_states")
    # bf16-mixed: fp32 parameters (42,592 x 4 = 170,368 B; the tied head once), fp32 gradients, AdamW's two moments
    assert weights == grads == 4 * r.model.num_parameters == 170_368
    assert states == 2 * weights
    assert [ph for _, ph in st.marks] == ["forward", "backward", "optimizer", "end"]


# a tester whose convolution blocks outweigh its MLPs (block_ff_dim 24 -> int(2 x 24 / 3) = 16 channels), so that the
# prefill's running layer is a convolution block
CONV_HEAVY: dict[str, Any] = {**TESTER, "vocab_size": 512, "hidden_size": 256, "block_ff_dim": 24}


@pytest.mark.parametrize(("shape", "prompt", "low", "high"), [
    # the MLP phase of an attention layer is the running layer: within 0.2% (8,762,432 against 8,775,680 B at 100)
    (TESTER, 100, 0.99, 1.0),
    (TESTER, 200, 0.99, 1.0),
    # a convolution block is: the analytic engine counts every attention layer's prompt KV while an earlier block runs
    # (an upper bound): 11,883,520 against 11,786,752 B at 100 tokens, 13,035,520 against 12,838,912 at 200
    (CONV_HEAVY, 100, 1.0, 1.01),
    (CONV_HEAVY, 200, 1.0, 1.02),
])
def test_traced_generate_agrees_with_the_analytic_engine(shape: dict[str, Any], prompt: int, low: float,
                                                        high: float) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": shape, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc), traced(doc)
    assert low < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < high
    assert any("gated short-convolution blocks without a KV cache" in x for x in a.assumptions)
    if shape is CONV_HEAVY:
        # the running block, 2 x 256 x (8 x prompt + 2) x 2 B (821,248 B at 100 tokens)
        assert a.per_gpu.breakdown_detail["activations"]["running layer"] == 2 * 256 * (8 * prompt + 2) * 2


def test_conv_block_saved_by_hand() -> None:
    ms = model_from_config(TESTER).mamba
    assert ms is not None
    # h 32, k 3, 2 sequences of 40 tokens (T 80), bf16: in_proj input 80 x 32 x 2 = 5,120; BCx 3 x 5,120 = 15,360;
    # the convolution's input 5,120; its padded output 2 x 42 x 32 x 2 = 5,376; out_proj's input 5,120
    # 2 x 32 x 2 x (7 x 40 + 2) = 36,096
    assert total_bytes(mixer_saved_tensors(ms, 32, 2, False, 2, 40)) == 36_096
    # fp32: twice as much
    assert total_bytes(mixer_saved_tensors(ms, 32, 4, False, 2, 40)) == 72_192


def _graph_saved(mode: str, batch: int, seq: int) -> int:
    """Bytes of the storages autograd's graph saves after one ``Lfm2ShortConv`` forward (parameters excluded)."""
    pytest.importorskip("transformers")
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    from meta_build import mixer_graph_saved

    return mixer_graph_saved(Lfm2ShortConv, TESTER, mode, batch, seq)


@pytest.mark.parametrize(("mode", "batch", "seq"), [("bf16", 2, 40), ("fp32", 2, 40), ("mixed", 3, 100)])
def test_conv_block_saved_equals_the_autograd_graph(mode: str, batch: int, seq: int) -> None:
    ms = model_from_config(TESTER).mamba
    assert ms is not None
    c = 4 if mode == "fp32" else 2
    analytic = total_bytes(mixer_saved_tensors(ms, 32, c, mode == "mixed", batch, seq))
    # autocast's bf16 copies of in_proj's, out_proj's and the convolution's weights: the weight-cast terms', not the
    # block's (32 x 96 + 32 x 32 + 32 x 3) x 2 B = 8,384
    casts = 8_384 if mode == "mixed" else 0
    # exact: storage by storage
    assert _graph_saved(mode, batch, seq) == analytic + casts


@pytest.mark.parametrize(("shape", "precision", "checkpointing"), [
    (TESTER, "bf16-true", "none"), (TESTER, "bf16-mixed", "full"), (CONV_HEAVY, "bf16-true", "none"),
    (CONV_HEAVY, "bf16-mixed", "none"), (CONV_HEAVY, "bf16-mixed", "full")])
def test_train_step_agrees_with_the_traced_engine(shape: dict[str, Any], precision: str, checkpointing: str) -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "train", "model": shape, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 2, "seq_len": 100, "precision": precision, "optimizer": "adamw",
                     "gradient_checkpointing": checkpointing}}
    a, t = estimate(doc), traced(doc)
    # within 0.5% either way: the saved tensors are autograd's exactly (above); what differs is the trace's rounding of
    # every block to 512 B and the backward's own gradients inside a block (not counted, as for Mamba2's mixers):
    # 18,778,624 against 18,810,368 B (-0.17%) for the tester in bf16-true, 31,511,200 against 31,504,896 (+0.02%)
    # for the convolution-heavy one
    assert 0.995 < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < 1.005
    assert any("gated short-convolution blocks, run by transformers" in x for x in a.assumptions)


def test_the_analytic_engine_refuses_what_hybrid_training_does_not_model() -> None:
    # LoRA is estimated (tests/test_hybrid_peft.py); DoRA's per-layer records assume every layer holds the same
    # adapted linears, which the convolution and attention blocks do not
    doc = {"task": "train", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 1, "seq_len": 64, "peft": {"method": "lora", "rank": 8}}}
    assert estimate(doc).per_gpu.peak_allocated_bytes > 0
    doc["train"]["peft"]["method"] = "dora"
    with pytest.raises(VramplanError) as exc:
        estimate(doc)
    assert "train.peft.method" in str(exc.value) and "2 gated short-convolution layers" in str(exc.value)


@pytest.mark.parametrize(("doc", "path"), [
    # vLLM serving is estimated (tests/test_serve_linear_mixers.py); the other engines' state pools are not modelled
    ({"task": "serve", "serve": {"engine": "sglang"}}, "serve.engine"),
    ({"task": "inference", "parallel": {"tp": 2}}, "parallel.tp"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "int8"}}, "inference.kv_cache_dtype"),
    # transformers 4.x's Lfm2HybridConvCache is other code
    ({"task": "inference", "software": {"transformers": "4.57.0"}}, "software.transformers"),
])
def test_what_is_not_modelled_is_refused(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(VramplanError) as exc:
        estimate({**doc, "model": TESTER, "hardware": {"gpu": "A100-80GB"}})
    text = str(exc.value)
    assert path in text and "hybrid of 2 gated short-convolution layers and 2 attention layers" in text


def test_layer_types_of_another_length_are_refused() -> None:
    with pytest.raises((VramplanError, ValueError)) as exc:
        model_from_config({**TESTER, "layer_types": ["conv", "full_attention"]})
    assert "must list 4 entries" in str(exc.value)
