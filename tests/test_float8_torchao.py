"""torchao float8 training (``train.precision: fp8-torchao``): the backward's casts, the float8 all-gather,
the refusals, the torchtitan export (torchao v0.14.1 float8_linear.py; facts/float8_training.py).

torchao's float8 linear needs ``torch._scaled_mm`` on an sm89+ GPU (its CPU path is ``emulate=True``, a different
computation), and torchao is not installed beside vramplan: the saved-tensor list is checked against the source
as read (``SAVED_FOR_BACKWARD``) and through its consequence, bf16-mixed's saved activations.
"""

from __future__ import annotations

import copy
import tomllib
from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.float8 import backward_peak_bytes, converted_layer_linears, layer_cast_peaks
from vramplan.analytic.terms import StepContext, bytes_of, static_bytes, step_terms
from vramplan.analytic.timeline import LOSS, attention, layer_done, mlp
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.export.torchtitan import JOB_CONFIG_KEYS, job_config_tables, to_toml, torchtitan_config
from vramplan.facts.float8_training import SAVED_FOR_BACKWARD, float8_recipe
from vramplan.plan.setup import TrainSetup
from vramplan.spec.scenario import Float8Training, Train

TENSORWISE, ROWWISE, GW_HP = (float8_recipe(n) for n in ("tensorwise", "rowwise", "rowwise_with_gw_hp"))


def _doc(precision: str = "fp8-torchao", float8: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    # Llama 3.2 1B: hidden 2048, MLP 8192, 16 layers, 32 query heads and 8 KV heads of 64; 16 tokens per step
    doc: dict[str, Any] = {
        "model": "meta-llama/Llama-3.2-1B", "task": "train", "framework": "torchtitan",
        "hardware": {"gpu": "H100-SXM", "num_gpus": 8}, "parallel": {"fsdp": "full_shard"},
        "train": {"micro_batch_size": 1, "seq_len": 16, "precision": precision, "attention": "flash",
                  "optimizer": "adamw-fused", "float8": float8 or {}}}
    for key, value in over.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


def test_backward_peak_worked_example() -> None:
    # T 4, in 32, out 16, W 512, tensorwise: instants 9 x 64 = 576; 68 + 9 x 512 = 4,676 (the weight's cast);
    # 68 + 516 + 512 = 1,096; 68 + 516 + 576 = 1,160; 68 + 516 + 68 + 1,152 = 1,804; 68 + 516 + 68 + 132 + 64
    # + 128 = 976
    assert backward_peak_bytes(4, 32, 16, TENSORWISE, weight_in_float8=False) == 4_676
    # the weight gathered in float8: no weight cast, but grad_input's mm still copies it (512):
    # 576; 68 + 512 = 580; 68 + 576 = 644; 68 + 68 + 1,152 = 1,288; 68 + 68 + 132 + 192 = 460 -> 1,288
    assert backward_peak_bytes(4, 32, 16, TENSORWISE, weight_in_float8=True) == 1_288


def test_backward_peak_rowwise_recipes() -> None:
    # many tokens (T 1024, in 64, out 32, W 2,048) so that the activations' casts dominate.
    # rowwise: go0 = 32,768 + 4 x 1,024 = 36,864; w = 2,048 + 4 x 64 = 2,304; go1 = 32,768 + 4 x 32 = 32,896;
    # the input's cast 9 x 65,536 = 589,824: 36,864 + 2,304 + 32,896 + 589,824 = 661,888; grad_weight's mm:
    # 36,864 + 2,304 + 32,896 + (65,536 + 256) + 32,768 + 65,536 = 236,160; the first cast 9 x 32,768 = 294,912
    assert backward_peak_bytes(1024, 64, 32, ROWWISE, weight_in_float8=False) == 661_888
    # rowwise_with_gw_hp: grad_weight in bf16, no cast: max(294,912; 36,864 + 18,432; 36,864 + 2,052 + 2,048)
    assert backward_peak_bytes(1024, 64, 32, GW_HP, weight_in_float8=False) == 294_912


def test_layer_peaks_of_llama_3_2_1b() -> None:
    r = resolve(_doc())
    s, m = r.scenario, r.model
    # every decoder linear is converted (2048, 512 and 8192 are multiples of 16): q, k, v, o, gate, up, down
    assert len(converted_layer_linears(m, 0, 1)) == 7
    # MLP: gate/up (in 2,048, out 8,192, W 16,777,216), T 16: the weight's cast 16 x 8,192 + 4 + 9 x 16,777,216 =
    # 131,076 + 150,994,944 = 151,126,020 (down: 32,772 + 150,994,944 is smaller);
    # attention: q/o (W 4,194,304): 16 x 2,048 + 4 + 9 x 4,194,304 = 32,772 + 37,748,736 = 37,781,508
    assert layer_cast_peaks(s, m, 0, 1, 16) == (151_126_020, 37_781_508)
    c = StepContext(r, 0, "flash", False)
    terms = step_terms(c)
    assert bytes_of(terms, "float8.mlp") == 16 * 151_126_020
    assert bytes_of(terms, "float8.attention") == 16 * 37_781_508
    assert bytes_of(terms, "float8.head") == 0  # torchtitan leaves the head ("output") unconverted
    # lifetimes: each part's peak from its point to the next (terms/transients.py's points)
    mlp0 = next(t for t in terms if t.name == "float8.mlp" and t.layer == 0)
    attn0 = next(t for t in terms if t.name == "float8.attention" and t.layer == 0)
    assert (mlp0.born, mlp0.dies, attn0.born, attn0.dies) == (mlp(0), attention(0), attention(0), layer_done(0))


def test_saved_activations_are_bf16_mixed_ones() -> None:
    # torchao v0.14.1 matmul_with_hp_or_float8_args.forward: ctx.save_for_backward(input_hp, weight_hp_t)
    assert SAVED_FOR_BACKWARD == ("input_hp", "weight_hp_t")
    # 2048 tokens: at 1024 the step peaks at torchtitan's root reduce-scatter, after the backward, with no
    # activation left (analytic/terms/gradients.py fsdp2_reduce_scatter)
    f8 = estimate(_doc(train={"seq_len": 2048}))
    bf16 = estimate(_doc("bf16-mixed", train={"seq_len": 2048}))
    assert f8.per_gpu.breakdown["activations"] == bf16.per_gpu.breakdown["activations"] > 0
    assert f8.per_gpu.breakdown["optimizer_states"] == bf16.per_gpu.breakdown["optimizer_states"]


def test_float8_all_gather_halves_the_converted_weights_in_the_buffers() -> None:
    # two gathered layers (current + prefetched); one layer's converted linears: q 2048 x 2048 + k, v 2048 x 512 x 2
    # + o 2048 x 2048 + gate, up, down 2048 x 8192 x 3 = 4,194,304 x 2 + 1,048,576 x 2 + 16,777,216 x 3
    # = 60,817,408 elements: 2 x 60,817,408 B fewer (1 B each instead of 2); the tied embedding is not a linear
    on = estimate(_doc(float8={"enable_fsdp_float8_all_gather": True}))
    # read off the records: at 16 tokens the step peaks at torchtitan's root reduce-scatter, when no layer is
    # gathered (analytic/terms/sharding.py)
    gathered_on, gathered_off = (bytes_of(step_terms(StepContext(resolve(d), 0, "flash", False)), "gathered")
                                 for d in (_doc(float8={"enable_fsdp_float8_all_gather": True}), _doc()))
    assert gathered_off - gathered_on == 2 * 60_817_408
    with_scales = estimate(_doc(float8={"enable_fsdp_float8_all_gather": True,
                                        "precompute_float8_dynamic_scale_for_fsdp": True}))
    # one fp32 scale per converted weight: 16 layers x 7 linears x 4 B = 448 B
    assert with_scales.per_gpu.breakdown["weights"] - on.per_gpu.breakdown["weights"] == 448
    # a static term: the planner's lower bound sees it too
    scales_doc = _doc(float8={"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True})
    assert static_bytes(resolve(scales_doc)) - static_bytes(resolve(_doc(float8={"enable_fsdp_float8_all_gather": True}))) == 448


def test_converted_head_adds_its_backward_casts() -> None:
    r = resolve(_doc(float8={"convert_lm_head": True}))
    terms = step_terms(StepContext(r, 0, "flash", False))
    # the head (in 2,048, out 128,256; W 262,668,288), T 16: the weight's cast 16 x 128,256 + 4 + 9 x 262,668,288
    # = 2,052,100 + 2,364,014,592 = 2,366,066,692
    assert bytes_of(terms, "float8.head") == 2_366_066_692
    head = next(t for t in terms if t.name == "float8.head")
    assert (head.born, head.dies) == (LOSS, mlp(15))


@pytest.mark.parametrize(("doc", "where"), [
    (_doc(hardware={"gpu": "A100-80GB"}), "train.precision"),  # sm80: torchtitan needs has_cuda_capability(8, 9)
    (_doc(framework="hf-trainer"), "train.precision"),
    (_doc(float8={"recipe_name": "rowwise", "enable_fsdp_float8_all_gather": True}),
     "train.float8.enable_fsdp_float8_all_gather"),
    (_doc(float8={"enable_fsdp_float8_all_gather": True}, parallel={"fsdp": "none"}),
     "train.float8.enable_fsdp_float8_all_gather"),
    (_doc(float8={"precompute_float8_dynamic_scale_for_fsdp": True}),
     "train.float8.precompute_float8_dynamic_scale_for_fsdp"),
    (_doc(float8={"recipe_name": "rowwise", "force_recompute_fp8_weight_in_bwd": True}),
     "train.float8.force_recompute_fp8_weight_in_bwd"),
    (_doc("bf16-mixed", float8={"recipe_name": "rowwise"}), "train.float8"),
    (_doc(train={"peft": {"method": "lora"}}), "train.precision"),
])
def test_refusals(doc: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as e:
        estimate(copy.deepcopy(doc))
    assert where in [p.where for p in e.value.problems]


def test_trace_refuses_fp8_torchao() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.build import trace_policy

    with pytest.raises(ScenarioError, match="not traced"):
        trace_policy(resolve(_doc()))


def _setup(**f8: Any) -> TrainSetup:
    return TrainSetup(framework="torchtitan", num_gpus=8, fsdp="full_shard",
                      train=Train(precision="fp8-torchao", float8=Float8Training(**f8)))


def test_torchtitan_export_writes_the_float8_converter() -> None:
    cfg = torchtitan_config(_setup(enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True),
                            "llama", 32, 4096)
    back = tomllib.loads(to_toml(cfg))
    assert back == cfg
    for section, table in job_config_tables(back):
        assert set(table) <= JOB_CONFIG_KEYS[section], section
    # the default layout, torchtitan v0.2.2 (facts/torchtitan_releases.py; v0.1.0: tests/test_torchtitan_releases.py)
    assert back["model"]["converters"] == ["quantize.linear.float8"]
    # tensorwise is torchtitan's recipe_name unset (a recipe_name refuses the all-gather); the head filtered
    assert back["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
                                                    "precompute_float8_dynamic_scale_for_fsdp": True}
    rowwise = torchtitan_config(_setup(recipe_name="rowwise"), "llama", 32, 4096)
    assert rowwise["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"], "recipe_name": "rowwise"}
    plain = torchtitan_config(TrainSetup(framework="torchtitan", num_gpus=8, fsdp="full_shard"), "llama", 32, 4096)
    assert "quantize" not in plain and "converters" not in plain["model"]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_torchao_saves_the_bf16_input_and_weight(recipe: str) -> None:
    """Against torchao itself where it is importable (torchao's Python float8 code runs on the CPU with
    ``emulate=True``; the saved set does not depend on the kernel): e.g. ``pip download torchao==0.14.1 --no-deps``,
    unzip the wheel and put it on PYTHONPATH.  Each tensor packed for the backward is recorded."""
    torch = pytest.importorskip("torch")
    f8 = pytest.importorskip("torchao.float8")
    base = f8.Float8LinearConfig.from_recipe_name(recipe)
    cfg = f8.Float8LinearConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "emulate": True})
    model = torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False)).to(torch.bfloat16)
    f8.convert_to_float8_training(model, config=cfg)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    saved: list[tuple[tuple[int, ...], Any]] = []

    def pack(t: Any) -> Any:
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    y.sum().backward()
    # SAVED_FOR_BACKWARD = (input_hp, weight_hp_t): the bf16 input (T x in) and the weight's transpose (in x out)
    assert saved == [((4, 32), torch.bfloat16), ((32, 16), torch.bfloat16)]


def test_torchao_eager_cast_peaks_at_9_bytes_per_element() -> None:
    """``CAST_PEAK_PER_ELEMENT`` against torchao's own cast where it is importable: the CPU profiler's allocation
    events of ``hp_tensor_to_float8_dynamic`` on a 1024 x 1024 bf16 tensor, summed in time order.  Peak: the fp32
    product and its clamp (4 + 4 B) beside the float8 result (1 B), 9,437,184 B plus the 4-B scale; after it, the
    float8 data and its scale (1,048,580 B)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao.float8")
    from torch.profiler import ProfilerActivity, profile
    from torchao.float8.config import e4m3_dtype
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    from vramplan.analytic.float8 import CAST_PEAK_PER_ELEMENT

    x = torch.randn(1024, 1024, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = hp_tensor_to_float8_dynamic(x, e4m3_dtype, LinearMMConfig())
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    assert y._data.dtype == e4m3_dtype
    assert peak == CAST_PEAK_PER_ELEMENT * 1024 * 1024 + 4
    assert live == 1024 * 1024 + 4
