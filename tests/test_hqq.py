"""HQQ checkpoints (transformers ``HqqConfig``, the hqq library's ``HQQLinear``): read, sized, refused where
no engine holds them.

Bytes: hqq 0.2.8 ``Quantizer.quantize`` keeps one scale and one zero point per group of ``group_size``
consecutive values, cast to the compute dtype (``Quantizer.to_inplace``), and packs the codes two per uint8
at 4 bits, one per uint8 at 8 bits (``BitPack.pack_4bit_u8``/``pack_8bit_u8``).  The forward dequantizes
the whole weight (``HQQLinear.dequantize``: ``(W_r - zero) * scale``, three ``[out, in]`` copies at once).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.inference import hqq_dequant_bytes
from vramplan.catalog.models import list_models
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.quantization import quant_format
from vramplan.spec.families.base import read_quantization_config

LLAMA = list_models("meta-llama/Llama-2-7b-hf")[0].config
# HqqConfig().to_dict() as transformers 5.24 writes it (quant_config = hqq BaseQuantizeConfig(nbits=4,
# group_size=64, axis=1)); the hqq-only keys channel_wise/optimize/round_zero change no stored byte
WEIGHT_PARAMS = {"nbits": 4, "channel_wise": True, "group_size": 64, "optimize": True, "round_zero": True, "axis": 1,
                 "view_as_float": False}
HQQ = {"quant_config": {"weight_quant_params": WEIGHT_PARAMS, "scale_quant_params": None,
                        "zero_quant_params": None, "offload_meta": False},
       "quant_method": "hqq", "skip_modules": ["lm_head"]}
# Llama-2-7B: 32 layers x (4 x 4096^2 + 3 x 4096 x 11008) = 6,476,005,376 linear weights; embeddings, LM head
# (skipped) and norms in fp16: 2 x 32,000 x 4,096 x 2 + 65 x 4,096 x 2 = 524,820,480 B
LINEAR, DENSE_BYTES = 6_476_005_376, 524_820_480


def _qc(**weight: Any) -> dict[str, Any]:
    return {**HQQ, "quant_config": {**HQQ["quant_config"], "weight_quant_params": {**WEIGHT_PARAMS, **weight}}}


def _doc(qc: dict[str, Any] | None, task: str = "inference", **section: Any) -> dict[str, Any]:
    cfg = dict(LLAMA) if qc is None else {**LLAMA, "quantization_config": qc}
    inf = {"batch_size": 1, "prompt_len": 64, "new_tokens": 8, "dtype": "fp16", **section}
    return {"model": cfg, "task": task, "hardware": {"gpu": "H100"}, task: inf}


@pytest.mark.parametrize(("qc", "fmt"), [(HQQ, "hqq-4bit"), (_qc(nbits=8), "hqq-8bit"), (_qc(axis=0), "hqq-4bit"),
                                        (_qc(nbits=8.0), "hqq-8bit")])
def test_the_config_names_the_row(qc: dict[str, Any], fmt: str) -> None:
    cq = read_quantization_config({"quantization_config": qc})
    assert cq is not None and cq.format == fmt and cq.skip_modules == ("lm_head",)


def test_the_checkpoint_weights_by_hand() -> None:
    # 4 bits: 6,476,005,376 / 2 payload + 6,476,005,376 / 64 groups x 4 B (fp16 scale + zero)
    #       = 3,238,002,688 + 404,750,336 = 3,642,753,024 B of linears
    got = estimate(_doc(HQQ))
    assert got.per_gpu.breakdown["weights"] == LINEAR // 2 + LINEAR // 64 * 4 + DENSE_BYTES == 4_167_573_504
    assert got.scenario["inference"]["quantization"] == "hqq-4bit"
    # 8 bits: 1 B per weight + the same scales and zeros
    eight = estimate(_doc(_qc(nbits=8)))
    assert eight.per_gpu.breakdown["weights"] == LINEAR + LINEAR // 64 * 4 + DENSE_BYTES
    assert quant_format("hqq-8bit").linear_bytes(4096 * 4096, 4096) == 17_825_792


@pytest.mark.parametrize(("qc", "says"), [
    (_qc(group_size=128), "only HQQ 4-bit and 8-bit with group size 64"),
    (_qc(nbits=3), "only HQQ 4-bit and 8-bit with group size 64"),
    (_qc(nbits=1.58), "HQQ 1.58-bit"),
    (_qc(group_size=None), "group size None"),
    ({**HQQ, "quant_config": {**HQQ["quant_config"], "zero_quant_params": {"nbits": 8}}}, "quant_zero"),
    ({**HQQ, "quant_config": {"self_attn.q_proj": HQQ["quant_config"],
                              "mlp.down_proj": {**HQQ["quant_config"], "offload_meta": True}}}, "dynamic_config"),
])
def test_unmodelled_hqq_settings_are_refused(qc: dict[str, Any], says: str) -> None:
    with pytest.raises(ScenarioError, match=says) as err:
        resolve(_doc(qc))
    assert "HQQ 4-bit and 8-bit with group size 64" in str(err.value)  # the list of what is estimable


def test_a_dynamic_config_with_one_setting_is_read() -> None:
    # transformers integrations/hqq.py: a quant_config keyed by linear tags gives each tag its own config
    tags = ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj")
    cq = read_quantization_config({"quantization_config": {**HQQ, "quant_config": dict.fromkeys(
        tags, HQQ["quant_config"])}})
    assert cq is not None and cq.format == "hqq-4bit"


def test_skipped_linears_are_refused() -> None:
    with pytest.raises(ScenarioError, match="skipped linear modules"):
        resolve(_doc({**HQQ, "skip_modules": ["lm_head", "mlp.down_proj"]}))


def test_every_forward_dequantizes_the_largest_linear() -> None:
    # Llama-2-7B's largest quantized linear is the MLP's 11,008 x 4,096 (the LM head is skipped):
    # 45,088,768 x 3 copies x 2 B (fp16) = 270,532,608 B, at prefill and for a single token alike
    assert hqq_dequant_bytes(11_008 * 4_096, "fp16") == 270_532_608
    for prompt in (64, 1):
        hqq = estimate(_doc(None, prompt_len=prompt, quantization="hqq-4bit")).per_gpu.breakdown["temporaries"]
        gptq = estimate(_doc(None, prompt_len=prompt, quantization="gptq-4bit")).per_gpu.breakdown["temporaries"]
        assert hqq - gptq == 270_532_608  # GPTQ's kernel reads the packed weight
    assert any("HQQLinear" in a and "NotImplementedError" in a for a in estimate(_doc(HQQ)).assumptions)


def test_serving_is_refused_with_the_format_named() -> None:
    with pytest.raises(ScenarioError, match="vLLM cannot serve hqq-4bit weights"):
        resolve({"model": {**LLAMA, "quantization_config": HQQ}, "task": "serve", "hardware": {"gpu": "H100"}})
    from vramplan.export.vllm import vllm_engine_args
    from vramplan.plan.setup import ServeSetup

    with pytest.raises(ValueError, match="no --quantization value for hqq-8bit"):
        vllm_engine_args(ServeSetup(num_gpus=1, tp=1, pp=1, dtype="fp16", quantization="hqq-8bit",
                                    max_model_len=4096, max_num_seqs=8), "m")


def test_training_over_it_is_refused() -> None:
    with pytest.raises(ScenarioError, match="training over hqq-4bit weights is not modelled"):
        resolve({"model": {**LLAMA, "quantization_config": HQQ}, "task": "train", "hardware": {"gpu": "H100"}})


def test_the_traced_engine_refuses_it() -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as traced

    with pytest.raises(ScenarioError, match="hqq-4bit weights are not traced: transformers 5.24 cannot load HQQ"):
        traced(_doc(None, quantization="hqq-4bit"))
