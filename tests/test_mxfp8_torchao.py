"""torchao MXFP8 training (``train.precision: mxfp8-torchao``): the backward's MX casts, the compute-capability
refusal, NVFP4's refusal, the torchtitan export (torchao v0.14.1 mx_formats; facts/mx_training.py).

torchao is not installed beside vramplan: the byte counts are checked by hand here, and against torchao's own eager
code on the CPU where it is importable (``pip download torchao==0.14.1 --no-deps``, unzip the wheel and put it on
PYTHONPATH): its dim0 cast (``to_mx``) and the whole backward of the emulated recipe, whose casts and gemm run on the
CPU.  The cuBLAS recipes' gemm and CUDA cast kernel need a compute-capability-10 GPU.
"""

from __future__ import annotations

import copy
import tomllib
from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.float8 import layer_cast_peaks
from vramplan.analytic.mx import backward_peak_bytes, cast_bytes, scale_layout_bytes
from vramplan.analytic.terms import StepContext, bytes_of, step_terms
from vramplan.analytic.timeline import LOSS, attention, layer_done, mlp
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.export.torchtitan import JOB_CONFIG_KEYS, job_config_tables, to_toml, torchtitan_config
from vramplan.facts.mx_training import MX_RECIPES, SAVED_FOR_BACKWARD, mx_recipe
from vramplan.plan.setup import TrainSetup
from vramplan.spec.scenario import MXTraining, Train

CUBLAS, RCEIL, EMULATED = (mx_recipe(n) for n in ("mxfp8_cublas", "mxfp8_cublas_rceil", "mxfp8_emulated"))


def _doc(precision: str = "mxfp8-torchao", mx: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    # Llama 3.2 1B: hidden 2048, MLP 8192, 16 layers, 32 query heads and 8 KV heads of 64; 32 tokens per step
    doc: dict[str, Any] = {
        "model": "meta-llama/Llama-3.2-1B", "task": "train", "framework": "torchtitan",
        "hardware": {"gpu": "B200", "num_gpus": 8}, "parallel": {"fsdp": "full_shard"},
        "train": {"micro_batch_size": 1, "seq_len": 32, "precision": precision, "attention": "flash",
                  "optimizer": "adamw-fused", "mx": mx or {}}}
    for key, value in over.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


@pytest.mark.parametrize(("name", "gemm", "dim1", "scaling"), [
    # torchao v0.14.1 config.py MXLinearConfig.from_recipe_name
    ("mxfp8_cublas", "cublas", "cuda", "floor"),  # CUBLAS, MXFP8Dim1CastKernelChoice.CUDA
    ("mxfp8_cublas_rceil", "cublas", "cuda", "rceil"),  # ... and ScaleCalculationMode.RCEIL
    ("mxfp8_emulated", "emulated", "torch", "floor"),  # MXLinearConfig(): EMULATED, TORCH, FLOOR
])
def test_each_recipe_row(name: str, gemm: str, dim1: str, scaling: str) -> None:
    row = mx_recipe(name)
    assert (row.gemm, row.dim1_cast, row.scaling) == (gemm, dim1, scaling)
    # to_mx's scale arithmetic per block of 32 at the cast's peak: FLOOR max_abs 4 + extracted_pow2 4 +
    # scale_e8m0_unbiased 4 + scale_e8m0_biased 1 + scale_fp32 4 = 17; RCEIL max_abs 4 + descale 4 + exponent 1 +
    # descale_fp 4 = 13
    assert row.scale_arithmetic_per_block == {"floor": 17, "rceil": 13}[scaling]
    assert len(MX_RECIPES) == 3
    with pytest.raises(KeyError):
        mx_recipe("mxfp4_cutlass")


def test_cast_and_scale_layout_bytes() -> None:
    # a cast leaves 1 B per element and 1 B per 32: 1,024 + 32
    assert cast_bytes(1024) == 1056
    # to_blocked: 32 rows of K / 32 = 1 scale, padded to 128 x 4 = 512; padding holds the zeros, the reshaped copy
    # and the result (3 x 512); 2048 rows x 256 columns need no padding: 524,288, twice while reshaping
    assert scale_layout_bytes(32, 32) == (1536, 512)
    assert scale_layout_bytes(2048, 8192) == (1_048_576, 524_288)


def test_backward_peak_worked_example() -> None:
    # T 32, in 64, out 32, W 2,048, mxfp8_cublas.  grad_output's dim0 cast: 12 x 1,024 + 17 x 32 = 12,832;
    # then 1,056 + 2,112 (the weight's dim1 cast) = 3,168; grad_input's gemm + 512 + 1,536 = 5,216;
    # grad_output's dim1 cast 3,168 + 1,056 = 4,224; the input's 4,224 + 2,112 = 6,336; grad_weight's gemm
    # 6,336 + 2,048 = 8,384 -> 12,832
    assert backward_peak_bytes(32, 64, 32, CUBLAS) == 12_832
    # RCEIL: 13 B per block: 12 x 1,024 + 13 x 32 = 12,704, still the largest
    assert backward_peak_bytes(32, 64, 32, RCEIL) == 12_704


def test_backward_peak_of_a_wide_weight() -> None:
    # T 32, in 4,096, out 32 (W 131,072): the first cast is 12,832, but the held casts grow past it.
    # held 1,056; + the weight's 131,072 + 4,096 = 136,224; grad_input's gemm: the weight's scales, 4,096 rows x
    # 1 column padded to 4: 16,384 (x 3 while padding), beside grad_output's 512: 136,224 + 512 + 49,152 = 185,888;
    # + 1,056 = 137,280; + the input's 135,168 = 272,448; grad_weight's gemm likewise + 49,664 = 322,112
    assert backward_peak_bytes(32, 4096, 32, CUBLAS) == 322_112


def test_backward_peak_emulated() -> None:
    # T 32, in 64, out 32, W 2,048, mxfp8_emulated (TORCH dim1 casts, bf16 gemm on dequantized operands).
    # 12,832; held 1,056; the weight's dim1 cast: its bf16 transpose 4,096 + 12 x 2,048 + 17 x 64 = 25,664:
    # 30,816; held 1,056 + 2,112 + 4,096 (weight_hp_t_c stays) = 7,264; grad_input's gemm: max(4 x 1,024,
    # 2 x 1,024 + 4 x 2,048) = 10,240: 17,504; grad_output's dim1 cast 2 x 1,024 + 12,832 = 14,880: 22,144;
    # held 8,320; the input's: 4,096 + 25,664 = 29,760: 38,080; held 10,432 + 10,240 = 20,672 -> 38,080
    assert backward_peak_bytes(32, 64, 32, EMULATED) == 38_080


def test_layer_peaks_of_llama_3_2_1b() -> None:
    r = resolve(_doc())
    s, m = r.scenario, r.model
    # MLP gate/up (in 2,048, out 8,192, W 16,777,216), T 32: held 262,144 + 8,192 = 270,336; + the weight's
    # 16,777,216 + 524,288 = 17,571,840; grad_input's gemm: grad_output's scales 32 x 256 padded to 128 x 256 =
    # 32,768, the weight's 2,048 x 256 = 524,288 (x 2 while reshaping): + 32,768 + 1,048,576 = 18,653,184
    # (down_proj's 18,425,856 is smaller); attention q/o (W 4,194,304): 67,584 + 4,325,376 + 8,192 + 262,144
    # = 4,663,296
    assert layer_cast_peaks(s, m, 0, 1, 32) == (18_653_184, 4_663_296)
    terms = step_terms(StepContext(r, 0, "flash", False))
    assert bytes_of(terms, "mx.mlp") == 16 * 18_653_184
    assert bytes_of(terms, "mx.attention") == 16 * 4_663_296
    assert bytes_of(terms, "mx.head") == 0  # torchtitan's filter_fqns default ["output"]
    assert bytes_of(terms, "float8.mlp") == 0
    mlp0 = next(t for t in terms if t.name == "mx.mlp" and t.layer == 0)
    attn0 = next(t for t in terms if t.name == "mx.attention" and t.layer == 0)
    assert (mlp0.born, mlp0.dies, attn0.born, attn0.dies) == (mlp(0), attention(0), attention(0), layer_done(0))
    assert mlp0.key.label == "MXFP8 casts (torchao)"


def test_converted_head_adds_its_backward_casts() -> None:
    r = resolve(_doc(mx={"convert_lm_head": True}))
    terms = step_terms(StepContext(r, 0, "flash", False))
    # the head (in 2,048, out 128,256; W 262,668,288), T 32: grad_output's dim0 cast 12 x 4,104,192 + 17 x 128,256
    # = 51,430,656; held 4,104,192 + 128,256 = 4,232,448; the weight's dim1 cast 262,668,288 + 8,208,384:
    # 275,109,120; grad_input's gemm: grad_output's scales 128 x 4,008 = 513,024, the weight's 2,048 x 4,008 =
    # 8,208,384 (x 2): 275,109,120 + 513,024 + 16,416,768 = 292,038,912
    assert bytes_of(terms, "mx.head") == 292_038_912
    head = next(t for t in terms if t.name == "mx.head")
    assert (head.born, head.dies) == (LOSS, mlp(15))


def test_saved_activations_and_states_are_bf16_mixed_ones() -> None:
    # torchao v0.14.1 mx_mm.forward: ctx.save_for_backward(input_hp, weight_hp)
    assert SAVED_FOR_BACKWARD == ("input_hp", "weight_hp")
    mx = estimate(_doc(train={"seq_len": 2048}))
    bf16 = estimate(_doc("bf16-mixed", train={"seq_len": 2048}))
    for part in ("activations", "optimizer_states", "weights", "gradients"):
        assert mx.per_gpu.breakdown[part] == bf16.per_gpu.breakdown[part], part
    assert any("MXFP8" in a and "recipe mxfp8_cublas" in a for a in mx.assumptions)


@pytest.mark.parametrize(("doc", "where", "fix"), [
    # torchtitan MXLinearConverter: has_cuda_capability(10, 0); the nearest: float8 on an fp8 GPU, else bf16
    (_doc(hardware={"gpu": "H100-SXM"}), "train.precision", "fp8-torchao"),
    (_doc(hardware={"gpu": "A100-80GB"}), "train.precision", "bf16-mixed"),
    (_doc(framework="hf-trainer"), "train.precision", "torchtitan"),
    (_doc(train={"peft": {"method": "lora"}}), "train.precision", "objective sft"),
    (_doc("bf16-mixed", mx={"recipe_name": "mxfp8_cublas_rceil"}), "train.mx", "mxfp8-torchao"),
    # 1 x 48 tokens: the dim1 casts block the tokens by 32
    (_doc(train={"seq_len": 48}), "train.seq_len", "multiple of 32"),
    # NVFP4 training is in neither torchao 0.14.1 nor 0.16.0
    (_doc("nvfp4-torchao"), "train.precision", "mxfp8-torchao"),
])
def test_refusals(doc: dict[str, Any], where: str, fix: str) -> None:
    with pytest.raises(ScenarioError) as e:
        estimate(copy.deepcopy(doc))
    hit = [p for p in e.value.problems if p.where == where]
    assert hit and fix in hit[0].hint + hit[0].message, e.value.problems


def test_nvfp4_refusal_names_what_torchao_has() -> None:
    with pytest.raises(ScenarioError, match="NVFP4 training is not modelled: torchao 0.14.1 and 0.16.0"):
        estimate(_doc("nvfp4"))


def test_nvfp4_refusal_names_the_stacks_checked() -> None:
    # the refusal names both stacks read, the releases and what is missing from each
    with pytest.raises(ScenarioError) as e:
        estimate(_doc("nvfp4-te"))
    msg = " ".join(p.message for p in e.value.problems if p.where == "train.precision")
    for part in ("torchao 0.14.1 and 0.16.0", "moe_training.nvfp4_training", "Transformer Engine 2.8+",
                 "NVFP4BlockScaling", "Megatron-Core is modelled with --bf16 or fp32 only"):
        assert part in msg, msg


def test_blackwell_gpus_run_it() -> None:
    # compute capability 10.0 (B200) and 12.0 (RTX 5090) pass has_cuda_capability(10, 0)
    for gpu in ("B200", "RTX-5090"):
        assert estimate(_doc(hardware={"gpu": gpu, "num_gpus": 8})).per_gpu.breakdown["temporaries"] > 0


def test_trace_refuses_mxfp8_torchao() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.build import trace_policy

    with pytest.raises(ScenarioError, match="not traced"):
        trace_policy(resolve(_doc()))


def _setup(**mx: Any) -> TrainSetup:
    return TrainSetup(framework="torchtitan", num_gpus=8, fsdp="full_shard",
                      train=Train(precision="mxfp8-torchao", mx=MXTraining(**mx)))


def test_torchtitan_export_writes_the_mx_converter() -> None:
    cfg = torchtitan_config(_setup(), "llama", 32, 4096)
    back = tomllib.loads(to_toml(cfg))
    assert back == cfg
    for section, table in job_config_tables(back):
        assert set(table) <= JOB_CONFIG_KEYS[section], section
    # the default layout, torchtitan v0.2.2 MXLinear: torchao's recipe name as it is; the recipe's CUDA dim1 kernel
    assert back["model"]["converters"] == ["quantize.linear.mx"]
    assert back["quantize"]["linear"]["mx"] == {"recipe_name": "mxfp8_cublas", "mxfp8_dim1_cast_kernel_choice": "cuda",
                                                "filter_fqns": ["output"]}
    head = torchtitan_config(_setup(convert_lm_head=True), "llama", 32, 4096)
    assert head["quantize"]["linear"]["mx"]["filter_fqns"] == []
    # v0.1.0's [mx] offers "mxfp8" (mxfp8_cublas) only
    with pytest.raises(ScenarioError, match="mxfp8_cublas_rceil"):
        torchtitan_config(_setup(recipe_name="mxfp8_cublas_rceil"), "llama", 32, 4096, release="0.1.0")


def _peak_of(fn: Any) -> tuple[int, int]:
    """(peak, end) of the CPU allocations ``fn`` makes, from the profiler's memory events in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, live


@pytest.mark.parametrize(("mode", "per_block"), [("FLOOR", 17), ("RCEIL", 13)])
def test_torchao_dim0_cast_peaks_at_12_bytes_per_element(mode: str, per_block: int) -> None:
    """``CAST_PEAK_PER_ELEMENT`` and the scale arithmetic against torchao's own ``to_mx`` where it is importable:
    a 1024 x 1024 bf16 tensor, 32,768 blocks.  FLOOR: 12 x 1,048,576 + 17 x 32,768 = 13,139,968; RCEIL:
    12 x 1,048,576 + 13 x 32,768 = 13,008,896; after it the e4m3 data and the e8m0 scales, 1,081,344 B."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao.prototype.mx_formats")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    from vramplan.facts.mx_training import CAST_PEAK_PER_ELEMENT

    x = torch.randn(1024, 1024, dtype=torch.bfloat16)
    kept: list[Any] = []  # the cast, kept past the profile
    peak, end = _peak_of(lambda: kept.append(MXTensor.to_mx(x, torch.float8_e4m3fn, 32,
                                                            scaling_mode=ScaleCalculationMode[mode])))
    assert peak == CAST_PEAK_PER_ELEMENT * 1024 * 1024 + per_block * 32_768
    assert end == cast_bytes(1024 * 1024) == 1_081_344


def test_torchao_emulated_backward_matches() -> None:
    """The whole ``mx_mm.backward`` of mxfp8_emulated (its casts and gemm run on the CPU) where torchao is importable:
    T 32, in 64, out 32.  Its peak is the input's dim1 cast (38,080, test_backward_peak_emulated) beside grad_input,
    the gemm's bf16 output (32 x 64 x 2 = 4,096), which the estimate counts as a gradient temporary: 42,176; what
    stays is grad_input and grad_weight, 4,096 + 4,096."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao.prototype.mx_formats")
    from torchao.prototype.mx_formats.config import MXLinearConfig
    from torchao.prototype.mx_formats.mx_linear import MXLinear

    lin = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    lin = MXLinear.from_float(lin, MXLinearConfig.from_recipe_name("mxfp8_emulated"))
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    y = lin(x)
    g = torch.randn_like(y)
    peak, end = _peak_of(lambda: y.backward(g))
    assert peak == backward_peak_bytes(32, 64, 32, EMULATED) + 32 * 64 * 2 == 42_176
    assert end == 2 * 32 * 64 * 2


def test_linears_of_16_but_not_32_are_refused(tmp_path: Any) -> None:
    # hidden 48 = 3 x 16: torchtitan's filter converts the 48 x 48 projections (multiples of 16), but torchao's
    # MX casts block them by 32 (48 / 32 is not whole): refused, naming them
    import json

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 48,
           "intermediate_size": 128, "num_attention_heads": 3, "num_key_value_heads": 1, "vocab_size": 1024,
           "max_position_embeddings": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ScenarioError) as e:
        estimate(_doc(model=str(tmp_path)))
    hit = [p for p in e.value.problems if p.where == "train.precision"]
    assert hit and "not of 32" in hit[0].message and "q_proj" in hit[0].message, e.value.problems
    # the same model in bf16: nothing to refuse
    assert estimate(_doc("bf16-mixed", model=str(tmp_path))).per_gpu.breakdown["weights"] > 0
