"""QLoRA on a mixture-of-experts model: stock bitsandbytes converts ``nn.Linear`` modules only, so experts held as
parameters (transformers >= 5's fused experts; gpt-oss's in every release) stay 16-bit and peft's
``prepare_model_for_kbit_training`` casts them to fp32 (bitsandbytes issue #1849).  ``train.quantize_moe_experts``
says whether the framework quantized them (axolotl, Unsloth); without it such a run is refused with the extra bytes
(spec/load.py ``_moe_expert_quant_problems``), never estimated as if 4-bit."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.errors import ScenarioError


def _doc(model: str = "mistralai/Mixtral-8x7B-v0.1", **train: Any) -> dict[str, Any]:
    return {"model": model, "task": "train", "hardware": {"gpu": "H100-SXM"},
            "train": {"micro_batch_size": 1, "seq_len": 1024, "gradient_checkpointing": "full",
                      "peft": {"method": "qlora", "rank": 16}, "quantization": "nf4", **train}}


def test_stock_transformers_5_is_refused_with_the_extra_bytes() -> None:
    # Mixtral-8x7B experts: 32 layers x 8 experts x 3 x 4096 x 14336 = 45,097,156,608 parameters; fp32 after peft's
    # cast 180,388,626,432 B against nf4's 45,097,156,608 / 2 + 4 B absmax per 64 = 22,548,578,304 + 2,818,572,288
    # = 25,367,150,592 B: 155,021,475,840 B = 144.4 GiB more
    with pytest.raises(ScenarioError) as exc:
        estimate(_doc())
    text = str(exc.value)
    assert "train.quantize_moe_experts" in text and "bitsandbytes issue #1849" in text and "144.4 GiB" in text


def test_said_quantized_or_transformers_4_is_estimated() -> None:
    said = estimate(_doc(quantize_moe_experts=True))
    assert any(a.startswith("MoE experts 4-bit as train.quantize_moe_experts says") for a in said.assumptions)
    v4 = estimate({**_doc(), "software": {"transformers": "4.46.0"}})
    assert any(a.startswith("MoE experts quantized per expert by bitsandbytes") for a in v4.assumptions)


@pytest.mark.parametrize("doc", [
    _doc(quantize_moe_experts=False),
    # gpt-oss's experts are parameters in transformers 4.x too: stock bitsandbytes never converts them
    {**_doc("openai/gpt-oss-20b"), "software": {"transformers": "4.56.0"}},
])
def test_experts_left_unquantized_are_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert "train.quantize_moe_experts" in str(exc.value)


@pytest.mark.parametrize("doc", [
    _doc("meta-llama/Llama-2-7b-hf", quantize_moe_experts=True),  # a dense model
    {**_doc(quantize_moe_experts=True, quantization="none"), "train": {"peft": {"method": "lora"},
                                                                      "quantize_moe_experts": True}},
])
def test_the_key_is_refused_where_it_does_not_apply(doc: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert "applies to bitsandbytes QLoRA on a mixture-of-experts model only" in str(exc.value)


def test_inference_with_stock_bitsandbytes_on_fused_experts_is_refused() -> None:
    doc = {"model": "mistralai/Mixtral-8x7B-v0.1", "task": "inference", "hardware": {"gpu": "H100-SXM"},
           "inference": {"quantization": "nf4", "batch_size": 1, "prompt_len": 512, "new_tokens": 64}}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert "inference.quantization" in str(exc.value) and "bitsandbytes issue #1849" in str(exc.value)
    # transformers 4.x: every expert an MLP of nn.Linear, each converted to Linear4bit
    assert estimate({**doc, "software": {"transformers": "4.46.0"}}).per_gpu.peak_allocated_bytes > 0


def test_the_traced_engine_refuses_experts_it_would_not_quantize() -> None:
    # gpt-oss's experts were never nn.Linear: trace/quant.py leaves them 16-bit, so the key is refused there rather than
    # traced against it
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as traced

    doc = {**_doc("openai/gpt-oss-20b", quantize_moe_experts=True)}
    with pytest.raises(ScenarioError) as exc:
        traced(doc)
    assert "train.quantize_moe_experts" in str(exc.value) and "--engine analytic" in str(exc.value)
    said = estimate(doc).assumptions
    assert any("run through the grouped GEMMs" in a for a in said)
