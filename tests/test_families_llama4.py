"""Llama 4 (``llama4_text`` and ``llama4``, transformers 5.24 ``modeling_llama4.py``): tensors counted by hand and
against ``Llama4ForCausalLM`` / ``Llama4ForConditionalGeneration`` built on the meta device, from small synthetic
configs (no verbatim Scout or Maverick config.json is in the catalog); the tasks whose mechanisms are not modelled
refused."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.families.llama4 import moe_layers
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config

# Maverick's shape in small: MoE on every other layer (interleave_moe_layer_step 2), chunked RoPE layers
TEXT: dict[str, Any] = {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32,
                        "intermediate_size_mlp": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "num_local_experts": 4,
                        "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 8}
VISION: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                          "vision_output_dim": 48, "image_size": 56, "patch_size": 14, "projector_input_dim": 48,
                          "projector_output_dim": 48, "pixel_shuffle_ratio": 0.5}
MULTI: dict[str, Any] = {"model_type": "llama4", "text_config": TEXT, "vision_config": VISION}


def test_llama4_is_supported() -> None:
    assert {"llama4", "llama4_text"} <= set(SUPPORTED_MODEL_TYPES)


def test_moe_layers_follow_the_interleave_step() -> None:
    # Llama4TextConfig: range(step - 1, n, step); Scout's step 1 -> every layer, Maverick's step 2 -> 1, 3, 5, ...
    assert moe_layers({"interleave_moe_layer_step": 1}, 4) == {0, 1, 2, 3}
    assert moe_layers({"interleave_moe_layer_step": 2}, 48) == set(range(1, 48, 2))
    assert moe_layers({"moe_layers": [0, 5], "interleave_moe_layer_step": 2}, 6) == {0, 5}  # the list wins


def test_llama4_text_count_by_hand() -> None:
    # h 64, 4 layers, 4 heads x 16 (kv 2), V 100, 4 experts of I 32, dense layers of intermediate_size_mlp 96;
    # interleave_moe_layer_step 2: MoE on layers 1 and 3, dense on 0 and 2
    # embed_tokens + lm_head (untied) 2 * 100 * 64 = 12,800
    # attention q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12,288, x 4 = 49,152 (the L2 q/k norm has no weight)
    # norms 2 * 64 * 4 + final 64 = 576
    # dense MLP 3 * 64 * 96 = 18,432, x 2 = 36,864
    # MoE router 64*4 = 256 + experts gate_up 4*64*64 = 16,384 + down 4*32*64 = 8,192 + shared 3*64*32 = 6,144
    #   = 30,976, x 2 = 61,952
    # total 12,800 + 49,152 + 576 + 36,864 + 61,952 = 161,344
    m = model_from_config(TEXT)
    assert m.num_parameters == 161_344
    assert [la.moe for la in m.layers] == [False, True, False, True]
    assert [la.intermediate_size for la in m.layers] == [96, 0, 96, 0]
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.shared_intermediate_size) == (4, 1, 32)
    # default no_rope_layers: layer 3 (every 4th) is NoPE and global, layers 0-2 chunked
    assert m.traits.experts_run_every_token and m.traits.attention_chunk_size == 8


def test_llama4_vision_count_by_hand() -> None:
    # tower d 32, I 128, 2 layers, patch 14 over a 56 image (16 patches + class token), 3 channels:
    # patch_embedding.linear 3*14*14*32 = 18,816; class_embedding 32; positional_embedding_vlm 17*32 = 544;
    # layernorm_pre/post 4*32 = 128
    # layer: q/k/v/o 4*(32*32 + 32) = 4,224; fc1 32*128 + 128 = 4,224; fc2 128*32 + 32 = 4,128; two LayerNorms 128
    #   = 12,704, x 2 = 25,408
    # vision_adapter.mlp fc1 128*48 = 6,144, fc2 48*48 = 2,304; multi_modal_projector.linear_1 48*64 = 3,072
    # total 18,816 + 32 + 544 + 128 + 25,408 + 6,144 + 2,304 + 3,072 = 56,448; with the text 161,344 -> 217,792
    m = model_from_config(MULTI)
    assert m.vision_parameters == 56_448
    assert m.num_parameters == 217_792
    assert m.traits.image_path_unmodelled


def test_llama4_counts_match_transformers_on_meta() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    text = {k: v for k, v in TEXT.items() if k != "model_type"}
    with torch.device("meta"):
        causal = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**text))
        multi = transformers.Llama4ForConditionalGeneration(
            transformers.Llama4Config(text_config=TEXT, vision_config=VISION))
    assert sum(p.numel() for p in causal.parameters()) == model_from_config(TEXT).num_parameters
    assert sum(p.numel() for p in multi.parameters()) == model_from_config(MULTI).num_parameters


def _doc(model: dict[str, Any], task: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": task, "hardware": {"gpu": "H100-80GB"}}
    if task == "inference":
        doc["inference"] = {"batch_size": 1, "prompt_len": 64, "new_tokens": 4, "dtype": "bf16"}
    elif task == "train":
        doc["train"] = {"micro_batch_size": 1, "seq_len": 64}
    else:
        doc["serve"] = {"max_model_len": 64}
    return doc


@pytest.mark.parametrize("task", ["train", "inference"])
def test_experts_on_every_token_are_refused(task: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(_doc(TEXT, task))
    assert "Llama4TextMoe" in str(exc.value) and "--engine trace" in str(exc.value) and "task: serve" in str(exc.value)


def test_chunked_attention_serving_before_0_11_is_refused() -> None:
    # vLLM 0.10.0 keeps its hybrid KV cache manager on for chunked local attention (ChunkedLocalAttentionSpec):
    # not modelled, refused
    doc = {**_doc(TEXT, "serve"), "serve": {"vllm_version": "0.10"}}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert "ChunkedLocalAttentionSpec" in str(exc.value) and "chunks of 8 tokens" in str(exc.value)
    assert "attention_chunk_size to null" in str(exc.value)


def test_chunked_attention_from_0_11_holds_full_pages_as_stated() -> None:
    # vLLM 0.11.0-0.33.0 disable the hybrid KV cache manager for chunked local attention (unless
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1) and turn every ChunkedLocalAttentionSpec into a
    # FullAttentionSpec: the same 512 B per token as with attention_chunk_size null
    for version in ("0.11", "0.33"):
        r = estimate({**_doc(TEXT, "serve"), "serve": {"vllm_version": version}})
        assert r.serve is not None and r.serve.kv_cache_bytes == 512 * r.serve.kv_cache_tokens
        assert any("disables its hybrid KV cache manager" in a for a in r.assumptions)
        plain = estimate({**_doc({**TEXT, "attention_chunk_size": None}, "serve"), "serve": {"vllm_version": version}})
        assert plain.serve is not None and r.serve.kv_cache_bytes == plain.serve.kv_cache_bytes


@pytest.mark.parametrize("task", ["train", "inference", "serve"])
def test_multimodal_tasks_are_refused(task: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(_doc(MULTI, task))
    assert "image path" in str(exc.value) and "56,448" in str(exc.value)


def test_serving_without_chunks_holds_full_pages() -> None:
    # attention_chunk_size null (the refusal's nearest setting): Llama4TextConfig.layer_types all "full_attention",
    # and every layer's vLLM page is full: 2 (K, V) x 4 layers x 2 kv heads x 16 head_dim x 2 B = 512 B per token
    r = estimate(_doc({**TEXT, "attention_chunk_size": None}, "serve"))
    assert r.serve is not None and r.serve.kv_cache_tokens > 0
    assert r.serve.kv_cache_bytes == 512 * r.serve.kv_cache_tokens
    # the weights: 161,344 parameters x 2 B (bf16) = 322,688
    assert r.per_gpu.breakdown_detail["weights"]["parameters"] == 322_688


def test_the_traced_engine_runs_a_training_step() -> None:
    # the analytic engine refuses training (experts on every token); the traced engine runs transformers' own
    # Llama4ForCausalLM forward and backward: every parameter once in fp32 (4 B), its gradient (4 B) and AdamW's two
    # moments (8 B): 161,344 x 4 = 645,376 B of weights
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.engine import trace

    doc = {"model": TEXT, "hardware": {"gpu": "h100"}, "train": {"micro_batch_size": 1, "seq_len": 64}}
    r, st = trace(resolve(doc))
    def total(category: str) -> int:
        return sum(e.nbytes for e in st.events if e.nbytes > 0 and e.category == category)
    assert r.model.num_parameters == 161_344
    assert total("weights") == 645_376
    assert total("gradients") == 645_376 and total("optimizer_states") == 2 * 645_376
    assert [ph for _, ph in st.marks] == ["forward", "backward", "optimizer", "end"]


# Llama4TextConfig's defaults are Scout's language model (configuration_llama4.py: checkpoint
# meta-llama/Llama-4-Scout-17B-16E); Maverick's differs by 128 experts on every other layer and no q/k norm (the
# shape named in modeling_llama4.py's comments: "the 128E model interleaves dense / sparse", "does not use qk_norm").
# Shapes, not catalog rows: no verbatim config.json was read from a cited source.
SCOUT: dict[str, Any] = {"model_type": "llama4_text"}
MAVERICK: dict[str, Any] = {"model_type": "llama4_text", "num_local_experts": 128, "interleave_moe_layer_step": 2,
                            "use_qk_norm": False}


def test_scout_and_maverick_shapes_by_hand() -> None:
    # h 5120, 48 layers, 40 heads x 128 (kv 8), V 202,048, experts of I 8192, dense MLPs of 16,384:
    # embed_tokens + lm_head 2 * 202,048 * 5120 = 2,068,971,520; final norm 5,120
    # attention q 5120^2 + k, v 5120 * 1024 each + o 5120^2 = 62,914,560, + two norms 10,240 = 62,924,800 a layer
    # Scout, 16 experts on every layer: router 5120 * 16 = 81,920, gate_up 16 * 5120 * 16,384 = 1,342,177,280,
    #   down 16 * 8192 * 5120 = 671,088,640, shared 3 * 5120 * 8192 = 125,829,120 -> 2,139,176,960;
    #   48 * (62,924,800 + 2,139,176,960) = 105,700,884,480; + 2,068,971,520 + 5,120 = 107,769,861,120
    assert model_from_config(SCOUT).num_parameters == 107_769_861_120
    # Maverick, 128 experts on the 24 odd layers: router 655,360 + gate_up 10,737,418,240 + down 5,368,709,120 +
    #   shared 125,829,120 = 16,232,611,840, x 24 = 389,582,684,160; dense 3 * 5120 * 16,384 = 251,658,240, x 24 =
    #   6,039,797,760; attention and norms 48 * 62,924,800 = 3,020,390,400;
    #   + 2,068,971,520 + 5,120 = 400,711,848,960 (the "400B total" of its name)
    m = model_from_config(MAVERICK)
    assert m.num_parameters == 400_711_848_960
    assert sum(la.moe for la in m.layers) == 24 and m.layers[1].moe and not m.layers[0].moe


@pytest.mark.parametrize("cfg", [SCOUT, MAVERICK], ids=["scout", "maverick"])
def test_scout_and_maverick_shapes_match_transformers_on_meta(cfg: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(
            **{k: v for k, v in cfg.items() if k != "model_type"}))
    assert sum(p.numel() for p in model.parameters()) == model_from_config(cfg).num_parameters
