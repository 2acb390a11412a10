"""Quantization formats: one row per format, read by the engine, the trace, the exporters and the rules."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.weights import quantized_linear_bytes
from vramplan.export.hf import bnb_config_kwargs
from vramplan.facts.quantization import (
    DQ_BLOCK,
    NF4_BLOCK,
    QUANT_FORMATS,
    QuantFormat,
    quant_format,
    quant_names,
)
from vramplan.plan.setup import TrainSetup
from vramplan.plan.steptime.memory_bound import dequant_bytes_per_weight_use
from vramplan.spec.scenario import Inference, Train
from vramplan.validate.rules import weights_bytes

N = 4096 * 4096  # one 4096 x 4096 linear: 16,777,216 weights, 4,096 output rows
# hand-computed bytes of that linear per format
EXPECTED = {
    "nf4": 8_388_608 + 4 * 262_144,  # 4-bit payload + one fp32 absmax per 64 (16,777,216 / 64 = 262,144)
    "fp4": 8_388_608 + 4 * 262_144,
    "nf4-dq": 8_388_608 + 262_144 + 4 * 1_024,  # uint8 absmax per 64 + one fp32 per 256 absmaxes = 8,654,848
    "int8": 16_777_216 + 4 * 4_096,  # 1 B per weight + fp32 row scale (SCB)
    "fp8": 16_777_216 + 4 * 4_096,  # 1 B per weight + fp32 per-channel scale
    # groups of 128 inputs: 131,072 fp16 scales (262,144 B) + 4-bit zero points (65,536 B); AutoGPTQ also
    # stores g_idx int32 per input (4,096 x 4 = 16,384 B) and an fp16 bias per output (4,096 x 2 = 8,192 B)
    "gptq-4bit": 8_388_608 + 262_144 + 65_536 + 16_384 + 8_192,
    # 3 bits: 16,777,216 x 3 / 8 = 6,291,456 payload; zero points 131,072 x 3 / 8 = 49,152
    "gptq-3bit": 6_291_456 + 262_144 + 49_152 + 16_384 + 8_192,
    # 8 bits: 1 B per weight; zero points 131,072 x 1 B
    "gptq-8bit": 16_777_216 + 262_144 + 131_072 + 16_384 + 8_192,
    # compressed-tensors W4A16: int4 payload + bf16 scale per group of 128 (symmetric: no zero point) +
    # weight_shape int64[2] (16 B)
    "ct-w4a16": 8_388_608 + 262_144 + 16,
    # int8 / fp8 weights + one bf16 scale per output row ([out, 1])
    "ct-w8a8-int8": 16_777_216 + 2 * 4_096,
    "ct-fp8": 16_777_216 + 2 * 4_096,
    # NVFP4: e2m1 two per byte + one e4m3 scale per 16 inputs of each row (16,777,216 / 16 = 1,048,576 B) + an fp32
    # weight_global_scale per matrix, and an fp32 input_global_scale with fp4 activations (W4A4)
    "ct-nvfp4": 8_388_608 + 1_048_576 + 4 + 4,
    "ct-nvfp4a16": 8_388_608 + 1_048_576 + 4,
    # Model Optimizer's NVFP4: the same tensors (weight_scale_2 and input_scale fp32 [1] per linear)
    "modelopt-nvfp4": 8_388_608 + 1_048_576 + 4 + 4,
    # Model Optimizer's per-tensor FP8: 1 B per weight + an fp32 weight_scale and an fp32 input_scale
    "modelopt-fp8": 16_777_216 + 4 + 4,
    # per-tensor fp8 (AutoFP8 / transformers weight_block_size null): an fp32 weight_scale, + an fp32 input_scale when
    # static; compressed-tensors' strategy tensor: the same with bf16 scales
    "fp8-tensor": 16_777_216 + 4,
    "fp8-tensor-static": 16_777_216 + 4 + 4,
    "ct-fp8-tensor": 16_777_216 + 2,
    "ct-fp8-tensor-static": 16_777_216 + 2 + 2,
    "awq-4bit": 8_388_608 + 262_144 + 65_536,
    # MXFP4: 4-bit payload + one uint8 E8M0 scale per 32 inputs of each row: 4,096 x 128 = 524,288 B
    "mxfp4": 8_388_608 + 524_288,
    # block-wise fp8: 1 B per weight + one fp32 scale per 128 x 128 tile: 32 x 32 = 1,024 tiles x 4 B
    "fp8-block": 16_777_216 + 4 * 1_024,
    # HQQ (group 64): 16,777,216 / 64 = 262,144 groups, each one 16-bit scale and one 16-bit zero (1,048,576 B);
    # 4-bit codes two per uint8 (8,388,608 B) = 9,437,184 B; 8-bit one per uint8 (16,777,216 B) = 17,825,792 B
    "hqq-4bit": 8_388_608 + 262_144 * (2 + 2),
    "hqq-8bit": 16_777_216 + 262_144 * (2 + 2),
    # torchao Int4Tensor: int4 codes two per int8 + bf16 scale and bf16 zero_point per group of 128 inputs of each
    # row: 131,072 groups x 4 B = 524,288 B
    "ao-int4": 8_388_608 + 131_072 * (2 + 2),
    # torchao Float8Tensor (PerRow): 1 B e4m3 per weight + an fp32 scale per output row (4,096 x 4 = 16,384 B)
    "ao-fp8": 16_777_216 + 4 * 4_096,
    # torchao Int8Tensor (PerRow): 1 B per weight + an fp32 scale and an int8 zero point per output row
    "ao-int8": 16_777_216 + (4 + 1) * 4_096,
}


def test_constants_defined_once() -> None:
    from vramplan.trace import quant as trace_quant  # noqa: F401  (imports them from facts)

    assert (NF4_BLOCK, DQ_BLOCK) == (64, 256)
    assert quant_format("nf4-dq").scales.second_level is not None and quant_format("nf4-dq").double_quant


def test_schema_formats_have_rows() -> None:
    train = Train.model_fields["quantization"].annotation.__args__  # type: ignore[union-attr]
    infer = Inference.model_fields["quantization"].annotation.__args__  # type: ignore[union-attr]
    assert set(infer) - {"none"} == set(quant_names())
    assert {q.name for q in QUANT_FORMATS if q.trainable_base} == set(train) - {"none"}


@pytest.mark.parametrize("fmt", QUANT_FORMATS, ids=lambda q: q.name)
def test_every_consumer_knows_every_format(fmt: QuantFormat) -> None:
    # engine: the linear's bytes by hand, and an inference estimate with the format
    assert quantized_linear_bytes(N, 4096, fmt.name) == EXPECTED[fmt.name]
    # a format that stores only routed experts is estimated on an MoE model (a dense one is refused for it)
    model = "meta-llama/Llama-3.2-1B" if "linear" in fmt.quantized_roles else "Qwen/Qwen1.5-MoE-A2.7B-Chat"
    # (Model Optimizer's export has no transformers quantizer: it is estimated served by vLLM)
    task = "serve" if fmt.library == "modelopt" else "inference"
    section: dict[str, Any] = ({"max_model_len": 64, "quantization": fmt.name, "dtype": "fp16"} if task == "serve" else
                               {"batch_size": 1, "prompt_len": 64, "new_tokens": 8, "quantization": fmt.name,
                                "dtype": "fp16"})
    doc = {"model": model, "task": task, "hardware": {"gpu": "H100-SXM"}, task: section}
    dense = estimate({**doc, task: {**section, "quantization": "none"}})
    assert estimate(doc).per_gpu.breakdown["weights"] < dense.per_gpu.breakdown["weights"]
    # validate/rules.py: the payload bits
    from vramplan.catalog.resolve import resolve

    assert weights_bytes(resolve(doc)) > 0
    # step time: dequantization traffic only where the forward dequantizes the whole weight
    assert (dequant_bytes_per_weight_use(fmt.name) > 0) == (fmt.dequant == "whole_weight")
    # Hugging Face exporter: a BitsAndBytesConfig for bitsandbytes formats, an explicit refusal otherwise
    def setup() -> TrainSetup:
        return TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=128,
                          peft="qlora", quantization=fmt.name)

    if fmt.library == "bitsandbytes":
        kw = bnb_config_kwargs(setup())
        assert kw is not None and (kw.get("load_in_4bit") or kw.get("load_in_8bit"))
    else:
        # a training setup holds a validated scenario ``Train``, whose quantization admits only the formats
        # training can load (spec/scenario.py TrainQuant): an inference-only format never reaches the exporter
        with pytest.raises(ValueError, match="nf4"):
            setup()


@pytest.mark.parametrize("name", ["nf4", "nf4-dq", "fp4", "int8"])
def test_trace_quant_linear_stores_the_row(name: str) -> None:
    torch = pytest.importorskip("torch")
    from vramplan.trace.quant import QuantLinear

    q = QuantLinear(4096, 4096, False, name, torch.bfloat16, torch.bfloat16, "meta", {})
    stored = q.weight.numel() * q.weight.element_size() + sum(t.numel() * t.element_size() for t in q.state)
    # the row's bytes plus what bitsandbytes keeps beside them: the 16-entry fp32 code (64 B) for 4-bit,
    # and for double quantization the fp32 offset scalar (4 B) and the shared 256-entry fp32 map (1,024 B)
    extra = {"nf4": 64, "fp4": 64, "nf4-dq": 64 + 4 + 1024, "int8": 0}[name]
    assert stored == EXPECTED[name] + extra


def test_bnb_config_matches_the_rows() -> None:
    setup = TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=128,
                       peft="qlora", quantization="nf4-dq")
    assert bnb_config_kwargs(setup) == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                        "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}
    int8 = TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=128,
                      peft="qlora", quantization="int8")
    assert bnb_config_kwargs(int8) == {"load_in_8bit": True}
    assert dequant_bytes_per_weight_use("nf4") == 0.5 + 2.0  # read 4-bit payload, write bf16 copy
