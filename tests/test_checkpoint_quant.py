"""A config.json that carries ``quantization_config``: estimated as stored, or refused, never silently bf16.

transformers keeps a pre-quantized checkpoint's own format (``AutoHfQuantizer.merge_quantization_configs``),
so the checkpoint decides (spec/load.py ``checkpoint_quantization_for``).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.models import list_models, load_model
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.families.base import read_quantization_config

LLAMA = list_models("meta-llama/Llama-2-7b-hf")[0].config
NF4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
       "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16", "llm_int8_skip_modules": None}


def _doc(qc: dict[str, Any] | None, task: str = "inference", gpu: str = "A100-80GB", **section: Any) -> dict[str, Any]:
    cfg = dict(LLAMA) if qc is None else {**LLAMA, "quantization_config": qc}
    return {"model": cfg, "task": task, "hardware": {"gpu": gpu}, task: section}


@pytest.mark.parametrize(("qc", "fmt"), [
    (NF4, "nf4-dq"),
    ({**NF4, "bnb_4bit_use_double_quant": False}, "nf4"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "fp4"),  # BitsAndBytesConfig's default quant type
    ({"quant_method": "bitsandbytes", "_load_in_8bit": True, "load_in_8bit": True}, "int8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "gptq-4bit"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "awq-4bit"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "fp8"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8-tensor-static"),  # AutoFP8's layout
    ({"quant_method": "fp8", "weight_block_size": None}, "fp8-tensor"),  # transformers' per-tensor FineGrainedFP8
    # HqqConfig(nbits=8).to_dict(): hqq BaseQuantizeConfig under quant_config, skip_modules lm_head
    ({"quant_method": "hqq", "skip_modules": ["lm_head"],
      "quant_config": {"weight_quant_params": {"nbits": 8, "group_size": 64, "axis": 1}, "scale_quant_params": None,
                       "zero_quant_params": None, "offload_meta": False}}, "hqq-8bit"),
    # TorchAoConfig(Int4WeightOnlyConfig()).to_dict(): torchao config_to_dict under quant_type["default"]
    ({"quant_method": "torchao", "quant_type": {"default": {"_type": "Int4WeightOnlyConfig", "_version": 2, "_data": {
        "group_size": 128, "int4_packing_format": {"_type": "Int4PackingFormat", "_data": "PLAIN"}}}}}, "ao-int4"),
])
def test_a_prequantized_checkpoint_is_estimated_as_stored(qc: dict[str, Any], fmt: str) -> None:
    # the checkpoint's format gives the same estimate as naming that format in the scenario; on an H100
    # (transformers' FbgemmFp8 needs compute capability >= 9.0, so fp8 on an A100 is refused: spec/checks.py)
    got = estimate(_doc(qc, gpu="H100"))
    named = estimate(_doc(None, gpu="H100", quantization=fmt))
    assert got.per_gpu.peak_allocated_bytes == named.per_gpu.peak_allocated_bytes
    assert got.scenario["inference"]["quantization"] == fmt
    assert any("quantization_config" in a and f"as stored (inference.quantization {fmt}" in a for a in got.assumptions)
    # and never the bf16 estimate: a 4-bit or 8-bit checkpoint of 6.7e9 parameters holds far fewer bytes
    assert got.per_gpu.peak_allocated_bytes < estimate(_doc(None, gpu="H100")).per_gpu.peak_allocated_bytes


def test_the_bnb_compute_dtype_and_double_quant_are_read() -> None:
    cq = read_quantization_config({"quantization_config": NF4})
    assert cq is not None and cq.format == "nf4-dq"
    assert cq.description == "bitsandbytes 4-bit nf4 with double quantization, compute dtype bf16"


@pytest.mark.parametrize(("qc", "says"), [
    ({"quant_method": "gptq", "bits": 2, "group_size": 128}, "GPTQ 2-bit, group size 128"),  # 3, 4, 8 have rows
    ({"quant_method": "awq", "bits": 4, "group_size": 64}, "AWQ 4-bit, group size 64"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, "4-bit fp4 with double"),
    # block-wise fp8 has a row for e4m3 with 128 x 128 tiles only; MXFP4 has a row (tests/test_mx_fp8_block.py)
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "block-wise scales (64 x 64)"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "fp8 e5m2 with block-wise"),
    # per tensor has rows for e4m3 (fp8-tensor, fp8-tensor-static: tests/test_prequantized_bytes.py)
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": None}, "only e4m3 has a per-tensor row"),
    ({"quant_method": "torchao", "quant_type": {"default": {"_type": "Float8WeightOnlyConfig", "_version": 2,
                                                            "_data": {}}}}, "torchao Float8WeightOnlyConfig"),
    # HqqConfig.from_dict reads config["quant_config"]: without it no HQQ setting is known (rows: tests/test_hqq.py)
    ({"quant_method": "hqq"}, "its quant_config is not a mapping"),
])
def test_a_format_without_a_row_is_refused_naming_it(qc: dict[str, Any], says: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(_doc(qc))
    assert says in str(exc.value) and "GPTQ and AWQ 4-bit with group size 128" in str(exc.value)


def test_a_scenario_format_that_contradicts_the_checkpoint_is_refused() -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(_doc(NF4, quantization="int8"))
    assert "inference.quantization is int8" in str(exc.value) and "stored as nf4-dq" in str(exc.value)
    # the same format in both is accepted
    assert resolve(_doc(NF4, quantization="nf4-dq")).scenario.inference.quantization == "nf4-dq"


def test_skipped_linear_modules_are_refused() -> None:
    # lm_head is never quantized here, so skipping it changes nothing; skipping a decoder linear is not modelled
    assert resolve(_doc({**NF4, "llm_int8_skip_modules": ["lm_head"]})).scenario.inference.quantization == "nf4-dq"
    with pytest.raises(ScenarioError, match="skipped linear modules"):
        resolve(_doc({**NF4, "llm_int8_skip_modules": ["down_proj"]}))


def test_training_takes_the_bnb_checkpoint_and_refuses_gptq() -> None:
    qlora = {"peft": {"method": "qlora", "rank": 16}}
    r = resolve(_doc(NF4, task="train", **qlora))
    assert r.scenario.train.quantization == "nf4-dq"
    with pytest.raises(ScenarioError, match="training over gptq-4bit weights is not modelled"):
        resolve(_doc({"quant_method": "gptq", "bits": 4, "group_size": 128}, task="train", **qlora))
    # without an adapter a quantized base cannot be trained (the existing check, now reached from the checkpoint)
    with pytest.raises(ScenarioError, match="cannot be trained without an adapter"):
        resolve(_doc(NF4, task="train"))


def test_catalog_checkpoints_with_quantization_config() -> None:
    # gpt-oss (MXFP4) and DeepSeek-V3 (block-wise fp8) carry a quantization_config in the catalog
    oss, ds = load_model("openai/gpt-oss-20b").checkpoint_quant, load_model("deepseek-ai/DeepSeek-V3").checkpoint_quant
    assert oss is not None and oss.method == "mxfp4" and oss.format == "mxfp4" and oss.trained_dequantized
    assert ds is not None and ds.method == "fp8" and ds.format == "fp8-block" and ds.trained_dequantized
    # training loads them dequantized (transformers cannot train either as stored): said in the report
    rep = estimate({"model": "openai/gpt-oss-20b", "hardware": {"gpu": "H100"}, "train": {"precision": "bf16-true"}})
    assert any("Mxfp4Config(dequantize=True)" in a for a in rep.assumptions)
    # inference and serving run the stored format, which now has a row
    for task in ("inference", "serve"):
        r = resolve({"model": "deepseek-ai/DeepSeek-V3", "task": task, "hardware": {"gpu": "H100", "num_gpus": 8},
                     "parallel": {"tp": 8}})
        assert getattr(r.scenario, task).quantization == "fp8-block"


def test_the_checkpoints_bnb_compute_dtype_is_used() -> None:
    # from_pretrained takes the checkpoint's BitsAndBytesConfig, bnb_4bit_compute_dtype included
    assert resolve(_doc(NF4)).scenario.inference.bnb_compute_dtype == "bf16"
    assert resolve(_doc(NF4, bnb_compute_dtype="fp16")).scenario.inference.bnb_compute_dtype == "fp16"
