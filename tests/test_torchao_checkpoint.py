"""torchao checkpoints (transformers ``TorchAoConfig``): Int4WeightOnlyConfig as stored, every other config refused.

transformers 5.24 ``TorchAoConfig.to_dict`` writes ``quant_type`` as ``{"default": config_to_dict(cfg)}``
(torchao 0.18 ``core/config.py``); torchao 0.18 ``Int4Tensor.from_hp`` keeps ``qdata`` int8 ``[out, in / 2]``,
``scale`` and ``zero_point`` ``[in / 128, out]`` in the weight's dtype.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.models import list_models
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.families.base import read_quantization_config

LLAMA = list_models("meta-llama/Llama-2-7b-hf")[0].config
PLAIN = {"_type": "Int4PackingFormat", "_data": "PLAIN"}


def _ao(type_: str, version: int = 2, **data: Any) -> dict[str, Any]:
    return {"quant_method": "torchao", "modules_to_not_convert": None, "include_input_output_embeddings": False,
            "untie_embedding_weights": False, "quant_type": {"default": {"_type": type_, "_version": version,
                                                                         "_data": data}}}


INT4 = _ao("Int4WeightOnlyConfig", group_size=128, int4_packing_format=PLAIN, set_inductor_config=True)
# Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()) after __post_init__: [activation, weight]
PER_ROW = {"_type": "PerRow", "_version": 1, "_data": {"dim": -1}}
E4M3 = {"_type": "torch.dtype", "_data": "float8_e4m3fn"}
FP8 = _ao("Float8DynamicActivationFloat8WeightConfig", activation_dtype=E4M3, weight_dtype=E4M3,
          granularity=[PER_ROW, PER_ROW])


def _doc(qc: dict[str, Any] | None, task: str = "inference", **section: Any) -> dict[str, Any]:
    cfg = dict(LLAMA) if qc is None else {**LLAMA, "quantization_config": qc}
    return {"model": cfg, "task": task, "hardware": {"gpu": "H100"},
            task: {"batch_size": 1, "prompt_len": 64, "new_tokens": 8, "dtype": "bf16", **section}}


def test_int4_weight_only_is_the_row() -> None:
    cq = read_quantization_config({"quantization_config": INT4})
    assert cq is not None and cq.format == "ao-int4"
    assert cq.description == "torchao Int4WeightOnlyConfig (group size 128, plain packing)"
    # the packing format left out is Int4WeightOnlyConfig's default (plain)
    bare = read_quantization_config({"quantization_config": _ao("Int4WeightOnlyConfig", group_size=128)})
    assert bare is not None and bare.format == "ao-int4"


def test_the_checkpoint_weights_by_hand() -> None:
    # Llama-2-7B: 6,476,005,376 linear weights / 2 = 3,238,002,688 B of codes + 6,476,005,376 / 128 = 50,593,792
    # groups x (2 B scale + 2 B zero point) = 202,375,168 B; embeddings, LM head and norms in bf16: 524,820,480 B
    got = estimate(_doc(INT4))
    assert got.per_gpu.breakdown["weights"] == 3_238_002_688 + 202_375_168 + 524_820_480
    assert got.scenario["inference"]["quantization"] == "ao-int4"
    assert any("Int4Tensor" in a and "bf16i4bf16_rowwise" in a for a in got.assumptions)


def test_float8_per_row_is_the_row() -> None:
    cq = read_quantization_config({"quantization_config": FP8})
    assert cq is not None and cq.format == "ao-fp8"
    assert cq.description == "torchao Float8DynamicActivationFloat8WeightConfig (PerRow / PerRow, float8_e4m3fn)"
    # Llama-2-7B: 6,476,005,376 linear weights x 1 B + one fp32 scale per output row of each linear:
    # 32 layers x (4 x 4,096 + 2 x 11,008 + 4,096 = 42,496) = 1,359,872 rows x 4 B = 5,439,488 B; 524,820,480 B dense
    got = estimate(_doc(FP8))
    assert got.per_gpu.breakdown["weights"] == 6_476_005_376 + 5_439_488 + 524_820_480
    assert any("Float8Tensor" in a and "f8f8bf16_rowwise" in a for a in got.assumptions)


def test_int8_weight_only_is_the_row_and_copies_the_weight_at_every_forward() -> None:
    qc = _ao("Int8WeightOnlyConfig", granularity=PER_ROW, set_inductor_config=True)
    cq = read_quantization_config({"quantization_config": qc})
    assert cq is not None and cq.format == "ao-int8"
    # Llama-2-7B: 6,476,005,376 B of int8 + 1,359,872 output rows x (4 B scale + 1 B zero point) = 6,799,360 B
    got = estimate(_doc(qc))
    assert got.per_gpu.breakdown["weights"] == 6_476_005_376 + 6_799_360 + 524_820_480
    # the weight-only linear casts the largest quantized weight (the MLP's 11,008 x 4,096) to bf16 for torch.mm:
    # 45,088,768 x 2 B = 90,177,536 B more than ao-fp8, whose kernel reads the fp8 weight, at prefill and decode
    for prompt in (64, 1):
        int8 = estimate(_doc(None, prompt_len=prompt, quantization="ao-int8")).per_gpu.breakdown["temporaries"]
        fp8 = estimate(_doc(None, prompt_len=prompt, quantization="ao-fp8")).per_gpu.breakdown["temporaries"]
        assert int8 - fp8 == 90_177_536


@pytest.mark.parametrize(("qc", "says"), [
    # the default granularity is PerTensor (torchao float8/inference.py _normalize_granularity(None))
    (_ao("Float8DynamicActivationFloat8WeightConfig"), "(PerTensor, float8_e4m3fn)"),
    (_ao("Float8DynamicActivationFloat8WeightConfig", granularity=[{"_type": "PerTensor", "_data": {}}] * 2),
     "(PerTensor / PerTensor, float8_e4m3fn)"),
    (_ao("Float8DynamicActivationFloat8WeightConfig", granularity=[PER_ROW, PER_ROW],
         weight_dtype={"_type": "torch.dtype", "_data": "float8_e5m2"}), "float8_e5m2"),
    (_ao("Int4WeightOnlyConfig", group_size=32), "torchao Int4WeightOnlyConfig (group size 32, plain packing)"),
    (_ao("Int4WeightOnlyConfig", group_size=128,
         int4_packing_format={"_type": "Int4PackingFormat", "_data": "TILE_PACKED_TO_4D"}), "tile_packed_to_4d"),
    (_ao("Int4WeightOnlyConfig", version=1, group_size=128), "torchao Int4WeightOnlyConfig"),
    (_ao("Int8WeightOnlyConfig", granularity={"_type": "PerGroup", "_version": 1, "_data": {"group_size": 128}}),
     "torchao Int8WeightOnlyConfig (PerGroup)"),
    (_ao("Float8WeightOnlyConfig"), "torchao Float8WeightOnlyConfig"),
    ({"quant_method": "torchao", "quant_type": "int4_weight_only"}, "is not a serialized AOBaseConfig"),
])
def test_other_configs_are_refused_with_the_modelled_list(qc: dict[str, Any], says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        resolve(_doc(qc))
    text = str(err.value)
    assert says in text and "torchao Int4WeightOnlyConfig, version 2, plain packing, group size 128 (ao-int4)" in text
    assert "torchao Int8WeightOnlyConfig, version 2, PerRow (ao-int8)" in text


def test_serving_and_training_are_refused() -> None:
    with pytest.raises(ScenarioError, match="vLLM cannot serve ao-int4 weights here: how its torchao method"):
        resolve({"model": {**LLAMA, "quantization_config": INT4}, "task": "serve", "hardware": {"gpu": "H100"}})
    with pytest.raises(ScenarioError, match="training over ao-int4 weights is not modelled"):
        resolve({"model": {**LLAMA, "quantization_config": INT4}, "task": "train", "hardware": {"gpu": "H100"}})


def test_the_traced_engine_refuses_it() -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as traced

    with pytest.raises(ScenarioError, match="ao-int4 weights are not traced"):
        traced(_doc(None, quantization="ao-int4"))
