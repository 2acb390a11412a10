"""Selective checkpointing (Megatron's attention-core recompute) keeps what is not the attention core.

``analytic/terms/layers.py`` adds to a layer's saved bytes what the per-token records do not hold: DoRA's scaled
outputs and identity through lora_A, LoRA on fused experts, a hybrid's mixer, cross-attention, the norms' fp32 weight
copies, an expert capacity's extra rows.  Recomputing the attention core frees none of them, so under
``gradient_checkpointing: attention-core`` they cost what they cost without checkpointing.
"""

from __future__ import annotations

from typing import Any

from vramplan import estimate


def _activations(method: str, policy: str) -> int:
    doc: dict[str, Any] = {
        "model": "meta-llama/Llama-3.2-1B", "task": "train", "hardware": {"gpu": "A100-80GB"},
        "train": {"micro_batch_size": 2, "seq_len": 512, "gradient_checkpointing": policy,
                  "peft": {"method": method, "rank": 16, "target_modules": ["q_proj", "v_proj"]}}}
    return estimate(doc).per_gpu.breakdown["activations"]


def test_dora_outputs_stay_saved_under_attention_core() -> None:
    dora_share_none = _activations("dora", "none") - _activations("lora", "none")
    dora_share_core = _activations("dora", "attention-core") - _activations("lora", "attention-core")
    # DoRA's records are per layer and outside attention: 16 layers x 27,394,048 B at 2 x 512 tokens
    assert dora_share_none == 16 * 27_394_048
    # before this rule the attention-core policy dropped them (its kept bytes were the per-token records only)
    assert dora_share_core == dora_share_none
