"""framework megatron: Megatron-Core's model states (bf16 parameters, the fp32 grad buffer, fp32 main parameters and
Adam's moments, sharded by the distributed optimizer), its recompute options, its refusals and its command-line
arguments (facts/megatron.py, spec/megatron.py, export/megatron.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.gradients import gradients
from vramplan.analytic.terms.resident import ddp_buckets
from vramplan.analytic.timeline import FORWARD
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.export.megatron import megatron_arguments
from vramplan.facts.megatron import ARGUMENTS, DIST_OPTIMIZER_TABLE, argument_names
from vramplan.spec.scenario import Scenario

LLAMA2_7B = 6_738_415_616  # Llama-2-7B's parameters (embedding and head untied)
MODEL_STATES = ("weights", "gradients", "optimizer_states", "master_weights")


def _doc(dist: bool | None = True, gpus: int = 8, **train: Any) -> dict[str, Any]:
    parallel: dict[str, Any] = {} if dist is None else {"megatron": {"use_distributed_optimizer": dist}}
    return {"model": "meta-llama/Llama-2-7b-hf", "task": "train", "framework": "megatron",
            "hardware": {"gpu": "H100-SXM", "num_gpus": gpus},
            "train": {"optimizer": "adamw-fused", "micro_batch_size": 1, "seq_len": 1024, **train},
            "parallel": parallel}


def _states(doc: dict[str, Any]) -> dict[str, int]:
    b = estimate(doc).to_json_dict()["per_gpu"]["breakdown"]
    return {k: b[k] for k in MODEL_STATES}


def test_distributed_optimizer_llama2_7b_dp8() -> None:
    # tp 1, dp 8, --bf16, --use-distributed-optimizer: per GPU
    #   bf16 parameters 2 x 6,738,415,616 = 13,476,831,232
    #   fp32 grad buffer 4 x 6,738,415,616 = 26,953,662,464 (whole on every rank)
    #   fp32 main parameters 4 x 6,738,415,616 / 8 = 3,369,207,808
    #   Adam's two fp32 moments 8 x 6,738,415,616 / 8 = 6,738,415,616
    # = (2 + 4 + 12/8) x 6,738,415,616 = 50,538,117,120
    got = _states(_doc())
    assert got == {"weights": 13_476_831_232, "gradients": 26_953_662_464, "optimizer_states": 6_738_415_616,
                   "master_weights": 3_369_207_808}
    assert sum(got.values()) == 50_538_117_120


def test_without_distributed_optimizer_is_the_default_18_bytes() -> None:
    # Megatron-LM's default (store_true, off): 2 + 4 + 4 + 8 = 18 B per parameter on every rank:
    # 18 x 6,738,415,616 = 121,291,481,088
    default, off = _states(_doc(dist=None)), _states(_doc(dist=False))
    assert default == off
    assert sum(off.values()) == 121_291_481_088
    assert off["master_weights"] == 26_953_662_464 and off["optimizer_states"] == 53_907_324_928


@pytest.mark.parametrize("row", DIST_OPTIMIZER_TABLE, ids=lambda r: f"{r.params}-{r.grads}")
def test_dist_optimizer_doc_table(row: Any) -> None:
    """docs/source/api-guide/dist_optimizer.md (core_v0.15.0) lines 9-11: bytes per parameter, non-distributed and
    ``fixed + sharded / d``; the bf16 and fp32 rows are the estimate's, the fp16 one is refused (--fp16's fp32 main
    gradient copies are not modelled)."""
    precision = {"bf16": "bf16-mixed", "fp32": "fp32", "fp16": "fp16-mixed"}[row.params]
    if row.params == "fp16":
        with pytest.raises(ScenarioError, match="train.precision"):
            estimate(_doc(precision=precision))
        return
    d = 8
    dist = sum(_states(_doc(dist=True, gpus=d, precision=precision)).values())
    whole = sum(_states(_doc(dist=False, gpus=d, precision=precision)).values())
    assert whole == row.non_distributed * LLAMA2_7B
    assert dist * d == (row.fixed * d + row.sharded) * LLAMA2_7B


def test_one_gpu_distributed_optimizer_shards_nothing() -> None:
    # dp 1: the shard is everything, 18 B per parameter either way
    assert _states(_doc(dist=True, gpus=1)) == _states(_doc(dist=False, gpus=1))


def test_tensor_parallel_shards_the_states_over_tp_then_dp() -> None:
    # tp 2 on 8 GPUs: dp 4; the states of this rank's half of the model, the optimizer's over 4
    tp1 = _states(_doc(dist=True, gpus=4))
    tp2 = _states({**_doc(dist=True, gpus=8), "parallel": {"tp": 2, "sequence_parallel": True,
                                                            "megatron": {"use_distributed_optimizer": True}}})
    assert tp2["master_weights"] < tp1["master_weights"] and tp2["weights"] < tp1["weights"]
    # the grad buffer holds exactly this rank's parameters in fp32: twice their bf16 bytes
    assert tp2["gradients"] == 2 * tp2["weights"]


def test_grad_buffer_resident_from_the_forward_and_no_ddp_bucket() -> None:
    s = resolve(Scenario.model_validate(_doc()))
    c = StepContext(s, 0, "flash", False)
    grads = gradients(c)
    # the whole fp32 buffer, 4 x 6,738,415,616 B, exists from the forward on
    assert sum(t.nbytes for t in grads) == 26_953_662_464
    assert all(t.born == FORWARD for t in grads if t.nbytes)
    # torch DDP's reducer buckets (a second copy of the gradients with dp > 1) are not Megatron's
    assert sum(t.nbytes for t in ddp_buckets(c)) == 0


def test_no_fp32_gradient_copy_at_the_step() -> None:
    # DeepSpeed's fp32 copy of its half gradients (optimizer.step.fp32_gradients) has no Megatron counterpart: the
    # main gradients are views of the fp32 buffer; adamw-fused has no step temporary, so the step adds nothing
    r = estimate(_doc()).to_json_dict()["per_gpu"]
    assert r["breakdown"]["temporaries"] < 2 * 10**9  # the loss's, not 4 x 842,301,952 B of gradient copy + it
    assert r["phases"]["optimizer"] == sum(_states(_doc()).values()) + r["breakdown"]["other"]


def test_selective_is_megatron_core_attn_and_full_is_uniform_one_layer() -> None:
    rep = estimate(_doc(gradient_checkpointing="selective")).to_json_dict()
    assert any("attention-core" in a for a in rep["assumptions"])
    sel = rep["per_gpu"]["breakdown"]["activations"]
    full = estimate(_doc(gradient_checkpointing="full")).to_json_dict()["per_gpu"]["breakdown"]["activations"]
    none = estimate(_doc(gradient_checkpointing="none")).to_json_dict()["per_gpu"]["breakdown"]["activations"]
    assert full < sel <= none


@pytest.mark.parametrize(("update", "where"), [
    ({"train": {"peft": {"method": "lora"}}}, "train.peft"),
    ({"train": {"optimizer": "adamw"}}, "train.optimizer"),
    ({"train": {"precision": "bf16-true"}}, "train.precision"),
    ({"train": {"loss": "liger-fused-linear-ce"}}, "train.loss"),
    ({"train": {"liger_kernels": True}}, "train.liger_kernels"),
    ({"train": {"objective": "dpo"}}, "train.objective"),
    ({"train": {"gradient_checkpointing": "full", "checkpoint_every_n_layers": 2}}, "train.checkpoint_every_n_layers"),
    ({"train": {"gradient_checkpointing": "op-sac"}}, "train.gradient_checkpointing"),
    ({"parallel": {"zero_stage": 1}}, "parallel.zero_stage"),
    ({"parallel": {"fsdp": "full_shard"}}, "parallel.fsdp"),
    ({"task": "inference"}, "framework"),
    ({"task": "serve"}, "framework"),
])
def test_refusals(update: dict[str, Any], where: str) -> None:
    doc = _doc()
    for key, value in update.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == where for p in exc.value.problems), [p.where for p in exc.value.problems]


def test_megatron_block_refused_under_another_framework() -> None:
    doc = {**_doc(), "framework": "hf-trainer"}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == "parallel.megatron" for p in exc.value.problems)


def test_arguments_tp2_sp_distributed_full_recompute() -> None:
    # 16 GPUs, tp 2: dp 8; global batch 2 x 4 x 8 = 64
    doc = {**_doc(gpus=16, gradient_checkpointing="full", micro_batch_size=2, grad_accum_steps=4, seq_len=4096),
           "parallel": {"tp": 2, "sequence_parallel": True, "megatron": {"use_distributed_optimizer": True}}}
    args = megatron_arguments(Scenario.model_validate(doc))
    assert args == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
                    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--sequence-parallel",
                    "--use-distributed-optimizer", "--micro-batch-size", "2", "--global-batch-size", "64",
                    "--seq-length", "4096", "--bf16", "--optimizer", "adam", "--recompute-granularity", "full",
                    "--recompute-method", "uniform", "--recompute-num-layers", "1"]


@pytest.mark.parametrize("g", ["none", "selective", "full"])
def test_every_argument_written_is_megatron_lm_s(g: str) -> None:
    args = megatron_arguments(Scenario.model_validate(_doc(gradient_checkpointing=g)))
    flags = [a for a in args if a.startswith("--")]
    assert set(flags) <= argument_names()
    table = {a.flag: a for a in ARGUMENTS}
    for i, a in enumerate(args[:-1]):
        if a in table and table[a].choices:
            assert args[i + 1] in table[a].choices
    # _doc sets the distributed optimizer; tp 1 writes no --sequence-parallel (validate_args turns it off)
    assert "--use-distributed-optimizer" in flags and "--sequence-parallel" not in flags


def test_arguments_refuse_another_framework() -> None:
    with pytest.raises(ScenarioError):
        megatron_arguments(Scenario.model_validate({**_doc(dist=None), "framework": "torchtitan"}))


@pytest.mark.parametrize("arg", ARGUMENTS, ids=lambda a: a.flag)
def test_argument_rows_are_flags(arg: Any) -> None:
    # each row: a Megatron-LM flag (lower-case words joined by '-') at a line of arguments.py (3,000-odd lines)
    assert re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*", arg.flag)
    assert 1 < arg.line < 4000


def test_trace_refuses_megatron() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.build import trace_policy

    with pytest.raises(ScenarioError, match="not traced"):
        trace_policy(resolve(Scenario.model_validate(_doc())))


def test_measure_refuses_megatron() -> None:
    from vramplan.measure.build import unsupported

    problems = unsupported(resolve(Scenario.model_validate(_doc(gpus=1))), "cuda")
    assert any(p.where == "framework" and "megatron" in p.message for p in problems)


def _pp_doc(schedule: str, accum: int) -> dict[str, Any]:
    return {**_doc(gpus=4, grad_accum_steps=accum),
            "parallel": {"pp": 4, "pp_schedule": schedule, "pp_virtual_stages": 2 if schedule != "1f1b" else 1}}


def test_interleaved_schedule_megatron_warmup() -> None:
    # pp 4, v 2, M 8 micro-batches, rank 0: Megatron's warmup 2 x (4 - 1 - 0) + (2 - 1) x 4 = 10 forwards, the 11th
    # before the first backward: 11 chunk-micro-batches in flight (schedules.py lines 728-729)
    rep = estimate(_pp_doc("interleaved-1f1b", 8)).to_json_dict()
    assert any("as Megatron-Core runs it: 11 chunk-micro-batches" in a for a in rep["assumptions"])
    args = megatron_arguments(Scenario.model_validate(_pp_doc("interleaved-1f1b", 8)))
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "4"


@pytest.mark.parametrize(("schedule", "accum", "where"), [
    ("gpipe", 8, "parallel.pp_schedule"),
    ("interleaved-1f1b", 6, "train.grad_accum_steps"),  # 6 is not a multiple of pp 4 (schedules.py lines 975-990)
])
def test_schedules_megatron_does_not_run(schedule: str, accum: int, where: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(_pp_doc(schedule, accum))
    assert any(p.where == where for p in exc.value.problems), [p.where for p in exc.value.problems]


def test_encoder_model_refused() -> None:
    doc = {**_doc(gpus=1), "model": "google-bert/bert-large-uncased"}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == "model" and "encoder-only" in p.message for p in exc.value.problems)


def test_moe_dispatcher_said_not_modelled() -> None:
    doc = {**_doc(gpus=8), "model": "mistralai/Mixtral-8x7B-v0.1", "parallel": {"ep": 8, "megatron": {
        "use_distributed_optimizer": True}}}
    rep = estimate(doc).to_json_dict()
    assert any(a.startswith("not modelled: Megatron-Core's MoE token dispatcher") for a in rep["assumptions"])
    dense = estimate(_doc()).to_json_dict()
    assert not any("MoE token dispatcher" in a for a in dense["assumptions"])
