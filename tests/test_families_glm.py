"""The dense GLM families, ``glm`` (GLM-4-9B in transformers' format, modeling_glm.py) and ``glm4`` (GLM-4-0414,
modeling_glm4.py): tensors counted by hand from transformers 5.24, each count checked against transformers' own
module built on the meta device, and the activation terms that differ from Llama's (the fused gate_up_proj, the
sandwich norms of GLM-4-0414, the half-head rotary) checked by hand and against the traced engine."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.activations import ActContext, norm_tensors
from vramplan.analytic.inference import _mlp_width, rope_bytes
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config

# GlmConfig / Glm4Config's defaults (configuration_glm.py / configuration_glm4.py, transformers 5.24) are GLM-4-9B's
# shapes: h 4096, 40 layers, 32 heads / 2 KV heads of 128, I 13696, V 151552 untied, q/k/v biases, partial rotary 0.5
GLM_9B: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
    "intermediate_size": 13696, "vocab_size": 151552, "attention_bias": True, "partial_rotary_factor": 0.5,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "pad_token_id": 151329,
}
# GLM-4-32B-0414 as its GGUF metadata prints it (ik_llama.cpp pull request 344: 61 blocks, embedding 6144, feed
# forward 23040, 48 heads / 2 KV heads, rope dimension 64 of key length 128)
GLM4_32B: dict[str, Any] = {**GLM_9B, "hidden_size": 6144, "num_hidden_layers": 61, "num_attention_heads": 48,
                            "intermediate_size": 23040, "max_position_embeddings": 32768}


def _cfg(model_type: str, base: dict[str, Any]) -> dict[str, Any]:
    return {**base, "model_type": model_type}


def test_glm_families_are_supported() -> None:
    assert {"glm", "glm4"} <= set(SUPPORTED_MODEL_TYPES)


def test_glm_9b_count_by_hand() -> None:
    # embed = lm_head = 151552 * 4096 = 620,756,992
    # layer: q 4096 * 4096 + 4096 = 16,781,312; k + v 2 * (4096 * 256 + 256) = 2,097,664; o 4096 * 4096 = 16,777,216
    #        (no bias); gate_up 4096 * 27392 = 112,197,632; down 13696 * 4096 = 56,098,816; two norms 8,192
    #        -> 203,960,832, x 40 = 8,158,433,280
    # + 2 * 620,756,992 + final norm 4,096 = 9,399,951,360 (GLM-4-9B's published 9.4B)
    m = model_from_config(_cfg("glm", GLM_9B), name="glm-9b")
    assert m.num_parameters == 9_399_951_360
    names = {p.name for p in m.params}
    assert {"layers.self_attn.q_proj.bias", "layers.mlp.gate_up_proj.weight"} <= names
    assert "layers.self_attn.o_proj.bias" not in names and "layers.mlp.gate_proj.weight" not in names
    assert m.traits.fused_gate_up and m.traits.rotary_cat_copy and not m.sandwich_norms
    assert m.partial_rotary_factor == 0.5


def test_glm4_32b_count_by_hand() -> None:
    # embed = lm_head = 151552 * 6144 = 931,135,488
    # layer: q 6144 * 6144 + 6144 = 37,754,880; k + v 2 * (6144 * 256 + 256) = 3,146,240; o 6144^2 = 37,748,736;
    #        gate_up 6144 * 46080 = 283,115,520; down 23040 * 6144 = 141,557,760; four norms 24,576
    #        -> 503,347,712, x 61 = 30,704,210,432
    # + 2 * 931,135,488 + final norm 6,144 = 32,566,487,552 (the published "32B")
    m = model_from_config(_cfg("glm4", GLM4_32B), name="glm4-32b")
    assert m.num_parameters == 32_566_487_552
    names = {p.name for p in m.params}
    assert {"layers.post_self_attn_layernorm.weight", "layers.post_mlp_layernorm.weight",
            "layers.post_attention_layernorm.weight", "layers.input_layernorm.weight"} <= names
    assert "layers.pre_feedforward_layernorm.weight" not in names
    assert m.sandwich_norms and m.traits.sandwich_post_rms


def test_glm_configuration_defaults_apply() -> None:
    # a config without num_key_value_heads, head_dim or intermediate_size takes GlmConfig's (2, 128, 13696), not
    # Llama's reading (all heads, hidden / heads, 4 h)
    cfg = {"model_type": "glm4", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
           "vocab_size": 1000}
    m = model_from_config(cfg, name="tiny")
    assert (m.num_kv_heads, m.head_dim, m.intermediate_size, m.partial_rotary_factor) == (2, 128, 13696, 0.5)
    assert m.max_position_embeddings == 131072
    # a null value takes the default too; a null partial_rotary_factor rotates the whole head
    nulls = model_from_config({**cfg, "num_key_value_heads": None, "head_dim": None, "partial_rotary_factor": None},
                              name="tiny")
    assert (nulls.num_kv_heads, nulls.head_dim, nulls.partial_rotary_factor) == (2, 128, 1.0)


def test_partial_rotary_is_read_for_every_llama_like_family() -> None:
    # GLM-4.5 (glm4_moe: Glm4MoeConfig's default 0.5) and Phi-4-mini (phi3, 0.75 in its config) rotate part of each
    # head; a Llama without the key rotates all of it.  RoPE's cos and sin of a 1,024-token bf16 prompt:
    # 2 x 1024 x (128 x 0.75 = 96) x 2 = 393,216 B
    from vramplan.catalog.models import load_model

    assert load_model("zai-org/GLM-4.5-Air").partial_rotary_factor == 0.5
    phi = model_from_config({"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 2,
                             "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
                             "partial_rotary_factor": 0.75}, name="phi4-mini-like")
    assert phi.partial_rotary_factor == 0.75 and rope_bytes(phi, 1024, 2) == 393_216
    assert load_model("meta-llama/Llama-3.1-8B").partial_rotary_factor == 1.0


@pytest.mark.parametrize("model_type,base", [("glm", GLM_9B), ("glm4", GLM4_32B)])
def test_counts_equal_transformers_meta_module(model_type: str, base: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _cfg(model_type, base)
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    assert model_from_config(cfg, name=model_type).num_parameters == sum(p.numel() for p in module.parameters())


def _ctx(**kw: Any) -> ActContext:
    # bf16 mixed precision (fp32 residual, autocast), flash attention, full fine-tuning
    return ActContext(**{"compute_bytes": 2, "residual_bytes": 4, "linear_input_bytes": 2, "autocast": True,
                         "attention": "flash", "gqa_repeat": False, "seq_len": 512, **kw})


def test_glm4_sandwich_post_norms_save_what_a_post_norm_saves() -> None:
    # GLM-4-0414's post_self_attn_layernorm and post_mlp_layernorm are Llama's RMSNorm over the sublayer's bf16
    # output: fp32 copy 4 + normalized tensor in bf16 2 = 6 B per element, + 4 B of row statistic:
    # 6 * 6144 + 4 = 36,868 B per token; the pre-norms on the fp32 residual 8 * 6144 + 4 = 49,156
    m = model_from_config(_cfg("glm4", GLM4_32B), name="glm4-32b")
    saved = {t.name: t.nbytes for t in norm_tensors(m, _ctx())}
    assert saved == {"norm.input": 49_156, "norm.post_attention": 36_868, "norm.pre_feedforward": 49_156,
                     "norm.post_feedforward": 36_868}
    # a frozen base (LoRA): the weight keeps nothing, the fp32 copy stays: 4 * 6144 + 4 = 24,580
    frozen = {t.name: t.nbytes for t in norm_tensors(m, _ctx(frozen_base=True))}
    assert frozen["norm.post_attention"] == 24_580


def test_fused_gate_up_prefill_width_and_half_rotary() -> None:
    # Phi3MLP / GlmMLP: gate_up_proj's 2 I output (gate and up its views), act(gate) and the product: 4 I alive
    m = model_from_config(_cfg("glm", GLM_9B), name="glm-9b")
    assert _mlp_width(m, 1) == 4 * 13696
    # RoPE's cos and sin over the 64 rotated dims: 2 x 1024 x 64 x 2 = 262,144 B for a 1024-token bf16 prompt
    assert rope_bytes(m, 1024, 2) == 262_144


def test_each_layer_keeps_its_own_rotary_pair() -> None:
    # GLM's apply_rotary_pos_emb repeat_interleaves cos and sin in every layer and the products save them: per
    # position 2 x 64 rotated dims x 4 B (the fp32 residual's dtype under bf16 mixed precision) = 512 B, x 4,096
    # positions = 2,097,152 B per layer, whatever the micro-batch (position_ids has batch 1); 40 layers
    from vramplan.analytic.terms.context import StepContext
    from vramplan.analytic.terms.saved import rotary_layer_copies

    doc = {"model": _cfg("glm", GLM_9B), "hardware": {"gpu": "h100"},
           "train": {"micro_batch_size": 2, "seq_len": 4096}}
    terms = rotary_layer_copies(StepContext(resolve(doc), 0, "flash", False))
    assert len(terms) == 40 and {t.nbytes for t in terms} == {2_097_152}
    # every second layer checkpointed (a plain loop, full, checkpoint_every_n_layers 2): those layers make the pair in their
    # recompute, in their backward (born at the MLP's backward); the others in the forward
    ckpt = {**doc, "framework": "plain",
            "train": {**doc["train"], "gradient_checkpointing": "full", "checkpoint_every_n_layers": 2}}
    from vramplan.analytic.timeline import FORWARD, mlp

    born = {t.layer: t.born for t in rotary_layer_copies(StepContext(resolve(ckpt), 0, "flash", False))}
    assert (born[0], born[1], born[2], born[3]) == (FORWARD, mlp(1), FORWARD, mlp(3))
    # a Llama saves the shared pair only
    assert rotary_layer_copies(StepContext(resolve({**doc, "model": "meta-llama/Llama-3.1-8B"}), 0, "flash", False)) == []


@pytest.mark.parametrize("model_type", ["glm", "glm4"])
def test_analytic_matches_trace(model_type: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.analytic.overhead import cublas_workspace_bytes
    from vramplan.trace.engine import trace
    from vramplan.trace.report import peak_of
    from vramplan.trace.shrink import shrink

    # six layers: each layer's own rotary pair and sandwich norms add up with depth
    cfg = {**shrink(_cfg(model_type, GLM_9B), vocab=2048), "num_hidden_layers": 6}
    # training (bf16 mixed: the sandwich norms' bf16 inputs, fp32 rotary copies; bf16-true) and generate (the fused
    # MLP's prefill)
    train = {"micro_batch_size": 2, "seq_len": 512, "use_cache": False}
    for doc in ({"model": cfg, "hardware": {"gpu": "a100"}, "train": train},
                {"model": cfg, "hardware": {"gpu": "a100"}, "train": {**train, "precision": "bf16-true"}},
                {"model": cfg, "task": "inference", "hardware": {"gpu": "a100"},
                 "inference": {"batch_size": 2, "prompt_len": 512, "new_tokens": 64}}):
        r, st = trace(resolve(doc))
        ws = cublas_workspace_bytes(r.gpu, handles=2 if "train" in doc else 1)
        t = peak_of(st.events, st.marks).raw_bytes - ws
        a = estimate(r).per_gpu.peak_allocated_bytes - ws
        assert abs(a / t - 1) < 0.003, (model_type, doc.get("task", "train"), a, t)
