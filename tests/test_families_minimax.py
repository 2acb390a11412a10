"""MiniMax-Text-01 (``minimax``, transformers ``modeling_minimax.py``): lightning (linear) attention layers interleaved
with softmax attention, mixture-of-experts MLPs; its parameters counted by hand and on transformers' meta device;
generate's lightning state, buffers and prefill by hand and against the traced engine; the lightning layers' saved
tensors in training by hand and against autograd's graph, the training step against the traced engine; serving
refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from meta_build import graph_saved_storages, meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic.activations import total_bytes
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import (
    mixer_buffer_bytes,
    mixer_decode_bytes,
    mixer_prefill_bytes,
    ssm_state_bytes,
    ssm_state_layer_bytes,
    ssm_state_note,
)
from vramplan.analytic.terms.mamba2 import mixer_saved_tensors
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
    ({"task": "serve"}, "serving it with vllm is not estimated"),
    ({"task": "train", "train": {"seq_len": 128, "peft": {"method": "lora", "rank": 8}}},
     "training it with adapters is not estimated"),
    ({"task": "train", "train": {"seq_len": 128, "gradient_checkpointing": "selective"}},
     "selective checkpointing is not estimated"),
    ({"task": "train", "train": {"seq_len": 128}, "parallel": {"tp": 2}, "hardware": {"gpu": "H100", "num_gpus": 2}},
     "parallel.tp 2 is not estimated"),
    ({"task": "train", "train": {"seq_len": 128}, "software": {"transformers": "4.57.0"}},
     "modelled on transformers 5.24"),
    # the analytic engine's own refusal: autocast's half copies in the block loop (the traced engine runs it)
    ({"task": "train", "train": {"seq_len": 128, "precision": "bf16-mixed"}},
     "bf16-mixed training is not estimated by the analytic engine"),
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


def test_lightning_saved_by_hand() -> None:
    ms = model_from_config(TESTER).mamba
    assert ms is not None
    # h 32, 4 heads of 8 (D 32), block 16; 2 sequences of 40 tokens in bf16: T 80, 3 blocks (16, 16, 8); a head row of
    #   every sequence 4 x 2 x 2 = 16 B an element
    # qkv_proj's input 80 x 32 x 2 = 5,120; SiLU's input 3 x 80 x 32 x 2 = 15,360
    # matmul's copies of q, k, v (3 x 40 a sequence) and of v for the next state (blocks 1-2: 32): 16 x 8 x 152 = 19,456
    # scores 16 x (16^2 + 16^2 + 8^2) = 9,216; decayed query (blocks 2-3: 24 tokens) 16 x 8 x 24 = 3,072; decayed key
    #   (blocks 1-2: 32) 16 x 8 x 32 = 4,096; states 3 x 16 x 8^2 = 3,072; block_decay (block 2) 4 x 2 = 8
    # norm: fp32 input and inverse norms 80 x 32 x 4 + 80 x 4 = 10,560; normalized, output, sigmoid, out_proj's input
    #   4 x 80 x 32 x 2 = 20,480
    # 90,440
    assert total_bytes(mixer_saved_tensors(ms, 32, 2, False, 2, 40)) == 90_440
    # one sequence: q, k and v fold into bmm's batch as views of SiLU's output, kept whole: 3 x 40 x 32 x 2 = 7,680
    # in place of the copies; 2,560 + 7,680 + 7,680 + 8 x (576 + 8 x 24 + 8 x 32 + 3 x 64) + 8 + 5,280 + 10,240 = 43,176
    assert total_bytes(mixer_saved_tensors(ms, 32, 2, False, 1, 40)) == 43_176
    # whole blocks grow the records linearly: per 16 tokens of 2 sequences, 20,608 B outside the loop (in_proj input
    # 2,048, SiLU input 6,144, norm 4,096 + 128, four 2,048 B tensors) and a block's 17,408 (scores 4,096, q, k, v
    # and v again 8,192, decayed query and key 4,096, state 1,024); a lone block, first and last, saves no decayed
    # query (first) and no decayed key or v again (last): 6,144 less; each middle block adds an 8 B block_decay
    one = 20_608 + 17_408 - 6_144
    assert [total_bytes(mixer_saved_tensors(ms, 32, 2, False, 2, s)) for s in (16, 32, 48)] == [
        one, one + 20_608 + 17_408, one + 2 * (20_608 + 17_408) + 8] == [31_872, 69_888, 107_912]


def _graph_saved(shape: dict[str, Any], mode: str, batch: int, seq: int) -> int:
    """Bytes of the storages autograd's graph saves after one ``MiniMaxLightningAttention`` forward without a cache
    (parameters and the decay buffers excluded: resident)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**shape)
        weights = torch.bfloat16 if mode == "bf16" else torch.float32
        with torch.device("meta"):
            layer = MiniMaxLightningAttention(cfg, 1).to(weights)
        layer.train()
        resident = {id(p.untyped_storage()) for p in [*layer.parameters(), *layer.buffers()]}
        x = torch.empty(batch, seq, cfg.hidden_size, device="meta", dtype=weights, requires_grad=True)
        out, _ = layer(x, None, None)
    saved = graph_saved_storages(out, resident)
    return sum(saved.values())


# every dimension differs: hidden 40, 4 heads of 12, block 8; one head
UNEVEN: dict[str, Any] = {**TESTER, "hidden_size": 40, "head_dim": 12, "block_size": 8}
ONE_HEAD: dict[str, Any] = {**TESTER, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8}


@pytest.mark.parametrize(("shape", "mode", "batch", "seq"), [
    (TESTER, "bf16", 2, 16), (TESTER, "bf16", 2, 48), (TESTER, "bf16", 2, 40), (TESTER, "fp32", 2, 40),
    (TESTER, "bf16", 1, 40), (TESTER, "fp32", 1, 100), (TESTER, "bf16", 3, 7), (UNEVEN, "bf16", 3, 50),
    (ONE_HEAD, "bf16", 2, 40)])
def test_lightning_saved_equals_the_autograd_graph(shape: dict[str, Any], mode: str, batch: int, seq: int) -> None:
    ms = model_from_config(shape).mamba
    assert ms is not None
    c = 4 if mode == "fp32" else 2
    # exact: storage by storage
    assert _graph_saved(shape, mode, batch, seq) == total_bytes(
        mixer_saved_tensors(ms, shape["hidden_size"], c, False, batch, seq))


@pytest.mark.parametrize(("shape", "precision", "checkpointing", "batch", "seq", "low", "high"), [
    (TESTER, "bf16-true", "none", 2, 100, 0.99, 1.0), (TESTER, "fp32", "none", 2, 100, 0.99, 1.0),
    (TESTER, "bf16-true", "full", 2, 100, 0.98, 1.0), (MOE, "bf16-true", "none", 2, 300, 0.99, 1.0),
    (MOE, "bf16-true", "full", 2, 300, 0.95, 1.0), (LIGHT, "bf16-true", "none", 2, 300, 0.99, 1.0),
    (LIGHT, "bf16-true", "full", 2, 300, 0.92, 1.0), (LIGHT, "fp32", "full", 1, 200, 0.99, 1.0),
    (TESTER, "fp32", "full", 2, 100, 1.0, 1.01)])
def test_train_step_agrees_with_the_traced_engine(shape: dict[str, Any], precision: str, checkpointing: str,
                                                  batch: int, seq: int, low: float, high: float) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "train", "model": shape, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": batch, "seq_len": seq, "precision": precision, "optimizer": "adamw",
                     "gradient_checkpointing": checkpointing}}
    a, t = estimate(doc), traced(doc)
    # stated tolerance: the saved tensors are autograd's exactly (above); the gradients the block loop's backward
    # makes (each block's query, key and value gradients, scattered into full-length tensors by the slices' backward
    # and summed, then concatenated for qkv_proj) are not counted (an assumption the report states).  Without
    # checkpointing the peak is past them: under the traced peak by 0.4-0.8% (19,584,208 against 19,704,832 B for
    # the tester in bf16-true).  With full checkpointing the peak is in a recomputed layer's backward: under by 0.9%
    # (tester), 3.4% (MOE) and 6.5% (LIGHT, whose lightning layers dominate: 47,510,546 against 50,822,656 B); in
    # fp32 the tester is over by 0.8% (19,673,120 against 19,520,000 B) and LIGHT under by 0.4%
    assert low < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < high
    assert any("lightning (linear) attention, run by transformers" in x for x in a.assumptions)
