"""Precision conventions: one keyword row per (precision, framework family), read by every consumer."""

from __future__ import annotations

import pytest

from vramplan import estimate
from vramplan.analytic.precision import framework_family, policy
from vramplan.facts.precisions import PRECISIONS, PrecisionConvention, PrecisionPolicy, precision_policy
from vramplan.spec.load import parse_scenario
from vramplan.spec.scenario import Train

# a scenario of each framework family (facts/precisions.py): the Trainer, FSDP, DeepSpeed ZeRO
_FAMILY_DOC = {
    "autocast": {"framework": "hf-trainer"},
    "fsdp": {"framework": "accelerate", "parallel": {"fsdp": "full_shard"}, "hardware": {"num_gpus": 2}},
    "deepspeed": {"framework": "deepspeed", "parallel": {"zero_stage": 1}, "hardware": {"num_gpus": 2}},
    "any": {"framework": "hf-trainer"},
    "megatron": {"framework": "megatron", "train": {"optimizer": "adamw-fused"}},
}


def _doc(row: PrecisionConvention) -> dict[str, object]:
    extra = _FAMILY_DOC[row.family]
    if row.precision in ("fp8-torchao", "mxfp8-torchao"):  # torchao's training is modelled as torchtitan's converter
        extra = {**extra, "framework": "torchtitan"}
    # MXFP8 needs compute capability 10.0 (torchtitan's MXLinearConverter)
    hw = {"gpu": "B200" if row.precision == "mxfp8-torchao" else "H100-SXM", **extra.get("hardware", {})}  # type: ignore[dict-item]
    return {"model": "gpt2", "hardware": hw, "framework": extra["framework"], "parallel": extra.get("parallel", {}),
            "train": {"micro_batch_size": 1, "seq_len": 128, "precision": row.precision, **extra.get("train", {})}}


def test_every_precision_of_the_schema_has_a_row_for_every_family() -> None:
    precisions = Train.model_fields["precision"].annotation.__args__  # type: ignore[union-attr]
    for prec in precisions:
        # fp8-torchao is modelled under torchtitan only (its FSDP row): the other families are refused
        # before a row is looked up (spec/load.py _float8_problems)
        # (mxfp8-torchao likewise, spec/load.py _mx_problems)
        for family in (("fsdp",) if prec in ("fp8-torchao", "mxfp8-torchao") else ("autocast", "fsdp", "deepspeed")):
            assert isinstance(precision_policy(prec, family), PrecisionPolicy)
    for prec in ("fp8-torchao", "mxfp8-torchao"):
        with pytest.raises(KeyError):
            precision_policy(prec, "autocast")
    # framework megatron: bf16-mixed only (--bf16); fp32 takes the any row, the rest are refused (spec/megatron.py)
    assert precision_policy("bf16-mixed", "megatron").grad_bytes == 4
    for prec in ("fp16-mixed", "fp8-mixed"):
        with pytest.raises(KeyError):
            precision_policy(prec, "megatron")
    assert len({(r.precision, r.family) for r in PRECISIONS}) == len(PRECISIONS) == 15


@pytest.mark.parametrize("row", PRECISIONS, ids=lambda r: f"{r.precision}/{r.family}")
def test_every_row_is_picked_and_estimated(row: PrecisionConvention) -> None:
    s = parse_scenario(_doc(row))
    if row.family != "any":
        assert framework_family(s) == row.family
    assert policy(s) == row.policy
    assert row.convention.startswith("docs/conventions.md#")
    rep = estimate(_doc(row))
    assert rep.per_gpu.breakdown["weights"] > 0
    # measure: the dtypes it builds with, or its refusal (fp8 needs Transformer Engine)
    from vramplan.measure.build import precision_dtypes

    if row.precision in ("fp8-mixed", "fp8-torchao", "mxfp8-torchao"):
        from vramplan.catalog.resolve import resolve
        from vramplan.measure.build import unsupported

        assert any(p.where == "train.precision" for p in unsupported(resolve(_doc(row)), "cpu"))
    else:
        base, _adapter, _autocast = precision_dtypes(row.precision, False)
        assert {"fp32": 4, "bf16": 2, "fp16": 2}[base] == row.policy.param_bytes or row.family != "autocast"


def test_model_states_per_parameter_follow_docs_conventions() -> None:
    # docs/conventions.md "Model states": weights + gradients + master per parameter (AdamW adds 8 or 4)
    hf = precision_policy("bf16-mixed", "autocast")
    ds = precision_policy("bf16-mixed", "deepspeed")
    true = precision_policy("bf16-true", "autocast")
    assert hf.param_bytes + hf.grad_bytes + hf.master_bytes + 2 * 4 == 16  # 4 + 4 + 0 + 8
    assert ds.param_bytes + ds.grad_bytes + ds.master_bytes + 2 * 4 == 16  # 2 + 2 + 4 + 8 (K = 12)
    assert true.param_bytes + true.grad_bytes + 2 * true.param_bytes == 8  # 2 + 2 + 4
    # the values the positional constructor calls had (analytic/precision.py before the table)
    assert hf == PrecisionPolicy(param_bytes=4, frozen_param_bytes=2, grad_bytes=4, master_bytes=0, compute_bytes=2,
                                 residual_bytes=4, autocast=True, weight_cast_bytes=2, linear_input_bytes=2,
                                 half="bf16")
    fp8 = precision_policy("fp8-mixed", "fsdp")
    assert (fp8.weight_cast_bytes, fp8.linear_input_bytes, fp8.residual_bytes, fp8.autocast) == (1, 1, 2, False)
    assert precision_policy("fp16-true", "deepspeed").half == "fp16"  # an "any" row holds for every family


def test_unknown_precision_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="no precision convention"):
        precision_policy("fp4-mixed", "autocast")


@pytest.mark.parametrize("framework", ["hf-trainer", "accelerate", "lightning"])
def test_deepspeed_zero_under_a_trainer_is_deepspeeds_half_module(framework: str) -> None:
    # the HF Trainer, accelerate and Lightning hand the model to deepspeed.initialize: no autocast (accelerate's
    # native_amp is off under DeepSpeed), the engine's half module and fp32 masters
    doc = {"model": "meta-llama/Llama-2-7b-hf", "framework": framework, "hardware": {"gpu": "A100-80GB", "num_gpus": 8},
           "parallel": {"zero_stage": 3}, "train": {"precision": "bf16-mixed", "seq_len": 512, "micro_batch_size": 1}}
    s = parse_scenario(doc)
    assert s.deepspeed_engine and framework_family(s) == "deepspeed"
    rep = estimate(doc)
    # Llama-2-7B, 6,738,415,616 parameters over 8 ranks: 842,301,952 each; fp32 masters 4 B each = 3,369,207,808 B;
    # no autocast weight cache (the autocast family kept 2 B per trainable linear weight, gathered whole under ZeRO-3)
    assert rep.per_gpu.breakdown["master_weights"] == 3_369_207_808
    assert not any(a.startswith("autocast keeps a half-precision copy") for a in rep.assumptions)
    # without ZeRO the trainer's own autocast runs, and the report says so
    doc["parallel"] = {"zero_stage": 0}
    assert framework_family(parse_scenario(doc)) == "autocast"
    assert any(a.startswith("autocast keeps a half-precision copy") for a in estimate(doc).assumptions)


def test_accelerate_turns_autocast_off_under_deepspeed() -> None:
    # the fact Scenario.deepspeed_engine cites, read off the installed accelerate: native_amp is set only when the
    # distributed type is not DEEPSPEED (fp16 and bf16 branches of Accelerator.__init__)
    import inspect

    from accelerate import Accelerator

    src = inspect.getsource(Accelerator.__init__)
    assert src.count("DistributedType.DEEPSPEED") >= 2 and "self.native_amp = True" in src
