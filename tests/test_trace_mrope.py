"""Qwen2-VL's config.json writes ``rope_scaling: {type: mrope}``; the traced engine builds its language model as
Qwen2, whose rotary registry has no "mrope" entry: it used to fail with a traceback (KeyError: 'mrope')."""

from __future__ import annotations

import pytest

from vramplan.spec.families import transformers_config

QWEN2_VL_7B = {  # Qwen/Qwen2-VL-7B-Instruct config.json (the text part and the vision_config keys the adapter reads)
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 32768, "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 152064,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                      "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


def test_mrope_is_transformers_default_rotary() -> None:
    cfg = transformers_config(QWEN2_VL_7B)
    # transformers' Qwen2VLConfig renames "mrope" to "default" (M-RoPE = the default rotary, per-section positions)
    assert cfg["rope_scaling"] == {"type": "default", "rope_type": "default", "mrope_section": [16, 24, 24]}
    # the input is not changed
    assert QWEN2_VL_7B["rope_scaling"] == {"type": "mrope", "mrope_section": [16, 24, 24]}


def test_traced_engine_estimates_a_qwen2_vl_config() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate

    rep = estimate({"model": QWEN2_VL_7B, "task": "train", "hardware": {"gpu": "A100-80GB"},
                    "train": {"micro_batch_size": 1, "seq_len": 256, "precision": "bf16-true",
                              "gradient_checkpointing": "full",
                              "peft": {"method": "lora", "rank": 8, "target_modules": ["q_proj", "v_proj"]}}})
    # the language model's bf16 weights alone: per layer q/o 2 x 3584^2 + k/v 2 x 3584 x 512 (29.36e6 with biases)
    # + MLP 3 x 3584 x 18944 (203.7e6) = 233.1e6, x 28 = 6.527e9; embedding and head 2 x 152064 x 3584 = 1.090e9;
    # 7.617e9 x 2 B = 15.23e9 B.  The peak is above them (the traced tower is not built: the report says so)
    assert rep.per_gpu.peak_allocated_bytes > 15_230_000_000
