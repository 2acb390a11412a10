"""Pre-quantized checkpoints: the weight bytes each format stores, against published checkpoint sizes.

The rows of ``facts/quantization.py`` give each quantized linear's tensors as the library that writes the
checkpoint lays them out (AutoGPTQ ``QuantLinear``; compressed-tensors ``pack-quantized`` and
``int-/float-quantized``); everything else (embeddings, LM head, norms) stays in the checkpoint's 16-bit dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramplan.analytic.layout import rank_params
from vramplan.analytic.weights import weights_bytes
from vramplan.catalog.models import list_models, load_model
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.quantization import QuantFormat, quant_format
from vramplan.spec.families.base import read_quantization_config

LLAMA2_13B = load_model("meta-llama/Llama-2-13b-hf")
LLAMA2_7B = list_models("meta-llama/Llama-2-7b-hf")[0].config


def _checkpoint_bytes(fmt: QuantFormat) -> int:
    """Every tensor of a Llama-2-13B checkpoint in ``fmt``: its linears by the row, the rest in fp16."""
    rp = rank_params(LLAMA2_13B, 1, 1, 1, 0, None)
    quantized = sum(fmt.matrix_bytes(i, o) * n for role, i, o, _, n in rp.linear_shapes if role in fmt.quantized_roles)
    numel = sum(each * n for role, _, _, each, n in rp.linear_shapes if role in fmt.quantized_roles)
    return quantized + (rp.total - numel) * 2


# TheBloke/Llama-2-13B-GPTQ README.md, "Provided files" table (revision b7db471d1789802a3a8e3b93cdd66a9f046f17c3,
# as mirrored at beta-index.hf-mirror.com/TheBloke/Llama-2-13B-GPTQ/resolve/b7db471.../README.md): "main | 4 |
# 128 | False | 7.26 GB | ... AutoGPTQ", "gptq-4bit-32g-actorder_True | 4 | 32 | True | 8.00 GB",
# "gptq-4bit-64g-actorder_True | 4 | 64 | True | 7.51 GB": single model.safetensors files, sizes in GB (10^9)
# rounded to 0.01 GB, so the tolerance is 0.005 GB (the safetensors JSON header, some 70 KB, is inside it).
#
# Llama-2-13B: 40 layers, hidden 5120, intermediate 13824, vocab 32000, untied head.  Linear weights per layer
# 4 x 5120 x 5120 + 3 x 5120 x 13824 = 317,194,240; x 40 = 12,687,769,600.  Per layer g_idx (int32 per input
# feature: q, k, v, o, gate, up read 5120, down 13824) (6 x 5120 + 13824) x 4 = 178,176 B and the fp16 bias that
# AutoGPTQ's make_quant adds to every QuantLinear (4 x 5120 + 2 x 13824 + 5120) x 2 = 106,496 B; x 40 =
# 7,127,040 + 4,259,840.  Dense fp16: embeddings + head 2 x 32000 x 5120 x 2 = 655,360,000, norms
# 81 x 5120 x 2 = 829,440.
_DENSE = 655_360_000 + 829_440
_EXTRA = 7_127_040 + 4_259_840
_W = 12_687_769_600
PUBLISHED_GPTQ_13B = [
    # group size, published GB, predicted bytes = payload W/2 + fp16 scales W/g x 2 + 4-bit zeros W/g / 2 + rest
    (128, 7.26, _W // 2 + _W // 128 * 2 + _W // 128 // 2 + _EXTRA + _DENSE),  # 7,259,269,120
    (64, 7.51, _W // 2 + _W // 64 * 2 + _W // 64 // 2 + _EXTRA + _DENSE),  # 7,507,077,120
    (32, 8.00, _W // 2 + _W // 32 * 2 + _W // 32 // 2 + _EXTRA + _DENSE),  # 8,002,693,120
]


@pytest.mark.parametrize(("group", "published_gb", "by_hand"), PUBLISHED_GPTQ_13B)
def test_gptq_checkpoint_bytes_match_the_published_files(group: int, published_gb: float, by_hand: int) -> None:
    row = quant_format("gptq-4bit")  # group 128 is the row; 32 and 64 check the same layout at other group sizes
    fmt = dataclasses.replace(row, scales=dataclasses.replace(row.scales, size=group))
    got = _checkpoint_bytes(fmt)
    assert got == by_hand
    assert abs(got - published_gb * 1e9) <= 0.005e9
    # the check can fail: without g_idx and the bias the file would be 11,386,880 B smaller (7,247,882,240 B for
    # group 128, 7.25 GB), outside the 0.005 GB the rounding allows
    bare = dataclasses.replace(fmt, per_input_bits=0, per_output_bits=0)
    assert _checkpoint_bytes(bare) == by_hand - _EXTRA
    if group == 128:
        assert abs(_checkpoint_bytes(bare) - published_gb * 1e9) > 0.005e9


def test_the_engine_holds_the_gptq_checkpoint_bytes() -> None:
    rp = rank_params(LLAMA2_13B, 1, 1, 1, 0, None)
    assert weights_bytes(rp, 2, "gptq-4bit") == PUBLISHED_GPTQ_13B[0][2]


def test_gptq_3_and_8_bit_bytes_by_hand() -> None:
    # the same AutoGPTQ tensors at 3 and 8 bits (qweight [in/32 x bits, out], qzeros [groups, out/32 x bits]):
    # 3 bits: W x 3/8 = 4,757,913,600 + scales 198,246,400 + zeros W/128 x 3/8 = 37,171,200 + g_idx/bias + dense
    assert _checkpoint_bytes(quant_format("gptq-3bit")) == 4_757_913_600 + 198_246_400 + 37_171_200 + _EXTRA + _DENSE
    # 8 bits: W = 12,687,769,600 + scales 198,246,400 + zeros W/128 = 99,123,200 + g_idx/bias + dense
    assert _checkpoint_bytes(quant_format("gptq-8bit")) == _W + 198_246_400 + 99_123_200 + _EXTRA + _DENSE


# compressed-tensors configs as llm-compressor writes them (config_groups / ignore / format)
_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
          "quantization_status": "compressed", "kv_cache_scheme": None, "sparsity_config": {},
          "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                        "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                    "strategy": "group", "group_size": 128, "dynamic": False,
                                                    "actorder": "weight"}}}}
_CHANNEL = {"strategy": "channel", "symmetric": True, "dynamic": False, "group_size": None}
_TOKEN = {"strategy": "token", "symmetric": True, "dynamic": True}
_W8A8 = {**_W4A16, "format": "int-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"],
                                       "weights": {"num_bits": 8, "type": "int", **_CHANNEL},
                                       "input_activations": {"num_bits": 8, "type": "int", **_TOKEN}}}}
_FP8 = {**_W4A16, "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", **_CHANNEL},
                                      "input_activations": {"num_bits": 8, "type": "float", **_TOKEN}}}}


# llm-compressor's NVFP4 scheme (compressed-tensors quantization/quant_scheme.py NVFP4): fp4 weights and activations,
# tensor_group of 16, the activations' local scales dynamic; NVFP4A16 drops the activations
_FP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
_NVFP4 = {**_W4A16, "format": "nvfp4-pack-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {**_FP4, "dynamic": False},
                                        "input_activations": {**_FP4, "dynamic": "local"}}}}
_NVFP4A16 = {**_NVFP4, "config_groups": {"group_0": {"targets": ["Linear"], "weights": {**_FP4, "dynamic": False},
                                                     "input_activations": None}}}


def _doc(qc: dict[str, Any] | None, **section: Any) -> dict[str, Any]:
    cfg = dict(LLAMA2_7B) if qc is None else {**LLAMA2_7B, "quantization_config": qc}
    return {"model": cfg, "task": "inference", "hardware": {"gpu": "H100"}, "inference": section}


@pytest.mark.parametrize(("qc", "fmt"), [
    (_W4A16, "ct-w4a16"), (_W8A8, "ct-w8a8-int8"), (_FP8, "ct-fp8"), (_NVFP4, "ct-nvfp4"), (_NVFP4A16, "ct-nvfp4a16"),
    ({**_FP8, "config_groups": {"g": {**_FP8["config_groups"]["group_0"], "input_activations": None}}}, "ct-fp8"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128, "desc_act": True, "sym": True}, "gptq-3bit"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "desc_act": False, "sym": True}, "gptq-8bit"),
])
def test_a_config_is_read_as_its_row_and_estimated_as_stored(qc: dict[str, Any], fmt: str) -> None:
    cq = read_quantization_config({**LLAMA2_7B, "quantization_config": qc})
    assert cq is not None and cq.format == fmt, cq
    got = estimate(_doc(qc))
    assert got.scenario["inference"]["quantization"] == fmt
    assert got.per_gpu.peak_allocated_bytes == estimate(_doc(None, quantization=fmt)).per_gpu.peak_allocated_bytes


def test_compressed_tensors_bytes_by_hand() -> None:
    # Llama-2-7B: 32 layers of 4 x 4096^2 + 3 x 4096 x 11008 = 202,375,168 linear weights (6,476,005,376 in all),
    # 7 matrices per layer; dense fp16 2 x 32000 x 4096 x 2 (embeddings, head) + 65 x 4096 x 2 (norms) = 524,820,480
    rp = rank_params(load_model("meta-llama/Llama-2-7b-hf"), 1, 1, 1, 0, None)
    w, dense, matrices = 6_476_005_376, 524_820_480, 7 * 32
    out_rows = 32 * (4 * 4096 + 2 * 11008 + 4096)  # 1,310,720 output rows (weight_scale [out, 1])
    # W4A16: W/2 payload + a bf16 scale per 128 + weight_shape int64[2] per matrix
    assert weights_bytes(rp, 2, "ct-w4a16") == w // 2 + w // 128 * 2 + 16 * matrices + dense
    # W8A8 int8 / FP8: 1 B per weight + a bf16 scale per output row
    assert weights_bytes(rp, 2, "ct-w8a8-int8") == w + 2 * out_rows + dense
    assert weights_bytes(rp, 2, "ct-fp8") == w + 2 * out_rows + dense
    # NVFP4: W/2 e2m1 + an e4m3 scale per 16 + fp32 global scales per matrix (weight; input too for W4A4)
    assert weights_bytes(rp, 2, "ct-nvfp4") == w // 2 + w // 16 + 8 * matrices + dense
    assert weights_bytes(rp, 2, "ct-nvfp4a16") == w // 2 + w // 16 + 4 * matrices + dense


def test_nvfp4_against_a_published_checkpoint() -> None:
    # weiweiz1/llama3.1-8b-nvfp (compressed-tensors NVFP4 of Llama 3.1 8B, commit ef1b0a1): the Hub's file listing
    # (https://huggingface.co/weiweiz1/llama3.1-8b-nvfp/tree/main) shows model-00001-of-00002.safetensors 4.98 GB and
    # model-00002-of-00002.safetensors 1.05 GB: 6.03 GB, each rounded to 10 MB.  Llama 3.1 8B: 32 layers of 4096 x
    # (4096 + 1024 + 1024 + 4096) + 3 x 4096 x 14336 = 218,103,808 linear weights, 6,979,321,856 in all, 224
    # matrices; the embeddings and the untied head 2 x 128,256 x 4096 x 2 = 2,101,346,304 and 65 norms x 4096 x 2 =
    # 532,480 stay bf16.  NVFP4: 3,489,660,928 + 436,207,616 + 224 x 8 = 3,925,870,336, in all 6,027,749,120 B
    # (weight-only: 1,792 B fewer), within the listing's rounding plus the shards' JSON headers; an NVFP4 head
    # (llm-compressor's recipes ignore it) would be 5.57 GB
    rp = rank_params(load_model("meta-llama/Llama-3.1-8B"), 1, 1, 1, 0, None)
    got = weights_bytes(rp, 2, "ct-nvfp4")
    assert got == 3_489_660_928 + 436_207_616 + 224 * 8 + 2_101_346_304 + 532_480 == 6_027_749_120
    assert 4.975e9 + 1.045e9 <= got <= 4.985e9 + 1.055e9


@pytest.mark.parametrize(("change", "says"), [
    ({"symmetric": False}, "asymmetric weights store zero points"),
    ({"group_size": 64}, "only group size 128"),
    ({"actorder": "group"}, "actorder group stores weight_g_idx"),
    ({"num_bits": 2}, "rows exist for W4A16"),
])
def test_a_compressed_tensors_scheme_without_a_row_is_refused(change: dict[str, Any], says: str) -> None:
    g = _W4A16["config_groups"]["group_0"]  # type: ignore[index]
    qc = {**_W4A16, "config_groups": {"group_0": {**g, "weights": {**g["weights"], **change}}}}
    with pytest.raises(ScenarioError) as exc:
        resolve(_doc(qc))
    assert says in str(exc.value) and "compressed-tensors W4A16 (pack-quantized" in str(exc.value)


@pytest.mark.parametrize(("qc", "says"), [
    ({**_FP8, "config_groups": {"g": {**_FP8["config_groups"]["group_0"],
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                            "dynamic": False}}}}, "static activation scales"),
    ({**_W4A16, "kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme"),
    ({**_W4A16, "config_groups": {"a": _W4A16["config_groups"]["group_0"],  # type: ignore[index]
                                  "b": _W4A16["config_groups"]["group_0"]}}, "2 config groups"),  # type: ignore[index]
])
def test_what_the_rows_do_not_store_is_refused(qc: dict[str, Any], says: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(_doc(qc))
    assert says in str(exc.value)


def test_an_ignore_pattern_that_names_a_quantized_linear_is_refused() -> None:
    # llm-compressor recipes may leave e.g. the MLP down projections unquantized: "re:.*down_proj"
    with pytest.raises(ScenarioError) as exc:
        resolve(_doc({**_W4A16, "ignore": ["lm_head", "re:.*down_proj"]}))
    assert "re:.*down_proj" in str(exc.value)
    # lm_head and a pattern matching no linear (a MoE router) are what vramplan leaves unquantized anyway
    assert resolve(_doc({**_W4A16, "ignore": ["lm_head", "re:.*mlp.gate$"]})).scenario.inference.quantization == "ct-w4a16"


def test_transformers_decompression_of_compressed_tensors_is_stated_not_modelled() -> None:
    notes = estimate(_doc(_W4A16)).assumptions
    assert any(a.startswith("not modelled: ct-w4a16 under transformers") for a in notes)
    assert not any("CompressedLinear" in a for a in estimate(_doc(None, quantization="gptq-4bit")).assumptions)


def test_vllm_skips_autogptq_extra_biases() -> None:
    from vramplan.serve.vllm import serve_weights_bytes

    doc = {"model": "meta-llama/Llama-2-7b-hf", "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"quantization": "gptq-4bit"}}
    rp = rank_params(load_model("meta-llama/Llama-2-7b-hf"), 1, 1, 1, 0, None)
    # the checkpoint's fp16 bias per output row of every quantized linear: 32 x (4 x 4096 + 2 x 11008 + 4096) x 2
    # = 2,719,744 B that vLLM's llama.py load_weights skips ("Skip loading extra bias for GPTQ models")
    assert serve_weights_bytes(resolve(doc))[0] == weights_bytes(rp, 2, "gptq-4bit") - 2_719_744


@given(st.sampled_from(["gptq-3bit", "gptq-4bit", "gptq-8bit", "ct-w4a16", "ct-w8a8-int8", "ct-fp8"]),
       st.integers(1, 64), st.integers(1, 64))
def test_one_matrix_sizes_the_same_either_way(name: str, in_groups: int, out_32: int) -> None:
    # whole groups of 128 inputs and 32-row multiples (AutoGPTQ packs 32 values into `bits` int32 words): the
    # matrix-by-matrix size equals the flattened one, and fewer payload bits never store more
    fmt = quant_format(name)
    i, o = 128 * in_groups, 32 * out_32
    assert fmt.matrix_bytes(i, o) == fmt.linear_bytes(i * o, o)
    assert fmt.matrix_bytes(i, o) < i * o * 2  # always below the 16-bit weight


def test_a_gptqmodel_checkpoint_says_the_bias_is_counted() -> None:
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, "meta": {"quantizer": ["gptqmodel:2.2.0"]}}
    cq = read_quantization_config({**LLAMA2_7B, "quantization_config": qc})
    assert cq is not None and cq.format == "gptq-4bit" and "written by GPTQModel" in cq.description
    assert any("written by GPTQModel" in a for a in estimate(_doc(qc)).assumptions)


_MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"],
             "kv_cache_quant_algo": None, "producer": {"name": "modelopt", "version": "0.35.0"}}


@pytest.mark.parametrize("qc", [_MODELOPT, {"quantization": _MODELOPT}])  # config.json's, hf_quant_config.json's
def test_modelopt_nvfp4_is_read(qc: dict[str, Any]) -> None:
    cq = read_quantization_config({**LLAMA2_7B, "quantization_config": {"quant_method": "modelopt", **qc}})
    assert cq is not None and (cq.format, cq.skip_modules) == ("modelopt-nvfp4", ("lm_head",))


@pytest.mark.parametrize(("change", "says"), [
    ({"group_size": 32}, "groups of 32"), ({"quant_algo": "W4A8_AWQ"}, "W4A8_AWQ algorithm has no row"),
    ({"quant_algo": "MIXED_PRECISION"}, "MIXED_PRECISION"),
])
def test_modelopt_other_algorithms_are_refused_by_name(change: dict[str, Any], says: str) -> None:
    cq = read_quantization_config({**LLAMA2_7B, "quantization_config": {**_MODELOPT, **change}})
    assert cq is not None and cq.format is None and says in cq.why_not


def test_modelopt_nvfp4_bytes_and_engines() -> None:
    # the bytes of ct-nvfp4 (test_nvfp4_against_a_published_checkpoint): Llama 3.1 8B 6,027,749,120 B.  Published:
    # nvidia/Llama-3.1-8B-Instruct-NVFP4 (Model Optimizer 0.35.0, lm_head excluded), "On-disk ~6.0 GB (4.98 + 1.05 GB
    # safetensors)" as a research digest in the code index quotes the checkpoint's Hub page (its source [1],
    # huggingface.co/nvidia/Llama-3.1-8B-Instruct-NVFP4; the digest's repository is not named by the index): the
    # same shard sizes as the compressed-tensors checkpoint, each rounded to 10 MB
    rp = rank_params(load_model("meta-llama/Llama-3.1-8B"), 1, 1, 1, 0, None)
    got = weights_bytes(rp, 2, "modelopt-nvfp4")
    assert got == weights_bytes(rp, 2, "ct-nvfp4") == 6_027_749_120
    assert 4.975e9 + 1.045e9 <= got <= 4.985e9 + 1.055e9
    cfg = {**LLAMA2_7B, "quantization_config": _MODELOPT}
    served = estimate({"model": cfg, "task": "serve", "hardware": {"gpu": "B200"}, "serve": {"max_model_len": 4096}})
    assert served.scenario["serve"]["quantization"] == "modelopt-nvfp4"
    # transformers has no Model Optimizer quantizer: generate is refused, naming vLLM's method
    with pytest.raises(ScenarioError, match="modelopt_fp4"):
        estimate(_doc(_MODELOPT))


def test_modelopt_fp8_is_read_per_tensor() -> None:
    # nvidia/*-FP8 (Model Optimizer quant_algo FP8): an e4m3 weight, an fp32 weight_scale and an fp32 input_scale per
    # linear.  Llama-2-7B: 6,476,005,376 linear weights in 224 matrices + the dense 524,820,480 B
    cq = read_quantization_config({**LLAMA2_7B, "quantization_config": {**_MODELOPT, "quant_algo": "FP8"}})
    assert cq is not None and cq.format == "modelopt-fp8"
    rp = rank_params(load_model("meta-llama/Llama-2-7b-hf"), 1, 1, 1, 0, None)
    assert weights_bytes(rp, 2, "modelopt-fp8") == 6_476_005_376 + 8 * 224 + 524_820_480


# per-tensor FP8.  AutoFP8's config (README, Checkpoint structure): no weight_block_size; transformers'
# FineGrainedFP8Config writes null for one scale per tensor; llm-compressor's FP8 scheme: strategy tensor, static
# per-tensor activations
_AUTOFP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
_CT_TENSOR = {"strategy": "tensor", "symmetric": True, "dynamic": False, "group_size": None}
_CT_FP8_STATIC = {**_FP8, "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", **_CT_TENSOR},
    "input_activations": {"num_bits": 8, "type": "float", **_CT_TENSOR}}}}
_CT_FP8_TENSOR_DYN = {**_FP8, "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", **_CT_TENSOR},
    "input_activations": {"num_bits": 8, "type": "float", **_TOKEN}}}}


@pytest.mark.parametrize(("qc", "fmt"), [
    (_AUTOFP8, "fp8-tensor"), ({**_AUTOFP8, "activation_scheme": "static"}, "fp8-tensor-static"),
    ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": None}, "fp8-tensor"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8-block"),
    (_CT_FP8_STATIC, "ct-fp8-tensor-static"), (_CT_FP8_TENSOR_DYN, "ct-fp8-tensor"),
])
def test_per_tensor_fp8_is_read_as_its_row(qc: dict[str, Any], fmt: str) -> None:
    cq = read_quantization_config({**LLAMA2_7B, "quantization_config": qc})
    assert cq is not None and cq.format == fmt, cq
    # AutoFP8's layout (no key) is named as such, because transformers would read it with 128 x 128 blocks
    assert ("AutoFP8" in cq.description) == ("weight_block_size" not in qc and qc["quant_method"] == "fp8")


def test_per_tensor_fp8_bytes_by_hand() -> None:
    # Llama-2-7B: 6,476,005,376 linear weights in 224 matrices, the dense fp16 524,820,480 B (as above)
    rp = rank_params(load_model("meta-llama/Llama-2-7b-hf"), 1, 1, 1, 0, None)
    w, dense = 6_476_005_376, 524_820_480
    assert weights_bytes(rp, 2, "fp8-tensor") == w + 4 * 224 + dense
    assert weights_bytes(rp, 2, "fp8-tensor-static") == w + 8 * 224 + dense
    assert weights_bytes(rp, 2, "ct-fp8-tensor") == w + 2 * 224 + dense
    assert weights_bytes(rp, 2, "ct-fp8-tensor-static") == w + 4 * 224 + dense


def test_static_activations_other_than_per_tensor_are_refused() -> None:
    g = _CT_FP8_STATIC["config_groups"]["group_0"]  # type: ignore[index]
    qc = {**_CT_FP8_STATIC, "config_groups": {"group_0": {
        **g, "input_activations": {**g["input_activations"], "strategy": "channel"}}}}
    with pytest.raises(ScenarioError, match="static channel activation scales"):
        resolve(_doc(qc))


@pytest.mark.parametrize(("scheme", "printed_gib"), [("dynamic", 8.4595), ("static", 8.4596)])
def test_autofp8_against_vllm_published_load(scheme: str, printed_gib: float) -> None:
    # AutoFP8's README (github.com/neuralmagic/AutoFP8/blob/505a7ed/README.md), vLLM 0.4.2 logs of
    # Meta-Llama-3-8B-Instruct quantized per tensor: its own dynamic quantization "Loading model weights took 8.4595
    # GB", neuralmagic/Meta-Llama-3-8B-Instruct-FP8 (static) "8.4596 GB"; vLLM prints memory / 2**30 there.
    # Llama 3 8B: 6,979,321,856 e4m3 weights in 224 matrices + fp32 weight_scale (and static input_scale) per matrix;
    # embeddings and untied head 2 x 128,256 x 4,096 x 2 = 2,101,346,304, norms 65 x 4,096 x 2 = 532,480, vLLM's
    # rotary cos/sin cache 8,192 x 128 x 2 = 2,097,152 (bf16): 9,083,297,792 (dynamic) / 9,083,299,584 (static) B.
    # vLLM measured the load with the caching allocator, which rounds every tensor up to 512 B (kMinBlockSize):
    # the 224 (448) four-byte scales take at most 224 (448) x 512 B there, so the printed figure lies between the
    # engine's bytes and those plus 512 B per scale tensor, each side widened by the print's rounding (0.00005 GiB)
    cfg = {**list_models("meta-llama/Meta-Llama-3-8B-Instruct")[0].config,
           "quantization_config": {**_AUTOFP8, "activation_scheme": scheme}}
    got = estimate({"model": cfg, "task": "serve", "hardware": {"gpu": "H100"},
                    "serve": {"max_model_len": 8192, "vllm_version": "0.6.0"}})
    scales = 224 * (2 if scheme == "static" else 1)
    assert got.scenario["serve"]["quantization"] == f"fp8-tensor{'-static' if scheme == 'static' else ''}"
    weights = got.per_gpu.breakdown["weights"]
    assert weights == 6_979_321_856 + 4 * scales + 2_101_346_304 + 532_480 + 2_097_152
    assert weights / 2**30 - 0.00005 <= printed_gib <= (weights + 512 * scales) / 2**30 + 0.00005
