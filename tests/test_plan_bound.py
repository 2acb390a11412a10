"""The planner's lower bound (plan/bound.py) is the engine's static terms (analytic.terms.STATIC_TERMS)
evaluated on the candidate's scenario, plus the CUDA context and the NCCL buffers: it equals what the
estimate's own records hold and never exceeds what the estimate reports."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramplan.analytic.overhead import cuda_context_bytes, nccl_bytes
from vramplan.analytic.terms import STATIC_TERMS, StepContext, static_bytes, step_terms
from vramplan.analytic.train import train_step
from vramplan.plan import TrainJob, TrainSetup
from vramplan.plan.bound import PER_BATCH
from vramplan.plan.context import PlanContext, make_context
from vramplan.plan.space import train_candidates
from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS
from vramplan.spec.load import Resolved

MODELS = ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "google/gemma-2-2b", "meta-llama/Llama-3.1-8B"]
GPUS = ["A100-80GB", "H100-SXM", "RTX-4090", "L4"]
_CONTEXTS: dict[tuple[str, str], PlanContext] = {}


def _ctx(model: str, gpu: str) -> PlanContext:
    if (model, gpu) not in _CONTEXTS:
        _CONTEXTS[model, gpu] = make_context(model, gpu, 0.1, DEFAULT_ASSUMPTIONS, "train")
    return _CONTEXTS[model, gpu]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), n=st.sampled_from([1, 2, 8]),
       seq=st.sampled_from([512, 4096]), data=st.data())
def test_the_bound_is_the_static_terms_and_never_exceeds_the_estimate(model: str, gpu: str, n: int, seq: int,
                                                                       data: st.DataObject) -> None:
    ctx = _ctx(model, gpu)
    cands = list(train_candidates(ctx.model, ctx.gpu, n, TrainJob(seq_len=seq, global_batch=4 * n, peft="allow")))
    for s in data.draw(st.lists(st.sampled_from(cands), min_size=1, max_size=6)):
        r = Resolved(ctx.scenario(s), ctx.model, ctx.gpu)
        tr = train_step(r)
        # the bound reads the same records the estimate sweeps: the static terms among the step's terms
        static_names = {t.name for t in step_terms(StepContext(r, 0, "sdpa", False), STATIC_TERMS)}
        on_device = sum(t.nbytes for t in tr.terms if t.name in static_names and t.where == "device")
        if s.pp == 1:
            assert static_bytes(r) == on_device + tr.managed_bytes, s.label()
        comm = nccl_bytes(tr.communicators)
        rest = static_bytes(r) - tr.managed_bytes + cuda_context_bytes(ctx.gpu) + comm
        if s.pp == 1:
            # managed (paged) states fill at most what the rest leaves of the capacity
            assert ctx.lower_bound(s) == rest + min(tr.managed_bytes, max(0, ctx.gpu.total_memory_bytes - rest))
        rep = ctx.estimate(s, reserved="packed")
        pg = rep.per_gpu
        managed = pg.outside_allocator["managed"] + rep.host.managed_paged_out_bytes
        assert static_bytes(r) <= pg.peak_allocated_bytes + managed, s.label()
        assert ctx.lower_bound(s) <= pg.device_used_bytes, s.label()


def test_a_bound_by_hand() -> None:
    """Qwen2.5-0.5B (494,032,768 parameters), full fine-tuning in bf16-mixed with fused AdamW on one A100.

    parameters 4 x 494,032,768 = 1,976,131,072; two fp32 moments 8 x 494,032,768 = 3,952,262,144; two
    cuBLAS workspaces 2 x 8,519,680 = 17,039,360 (analytic/overhead.py); no DDP buckets on one GPU:
    static 5,945,432,576 B, plus the CUDA context and no NCCL buffer (one rank, no communicator).
    """
    ctx = _ctx("Qwen/Qwen2.5-0.5B", "A100-80GB")
    s = TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=1024,
                   optimizer="adamw-fused", precision="bf16-mixed")
    assert ctx.model.num_parameters == 494_032_768
    assert static_bytes(Resolved(ctx.scenario(s), ctx.model, ctx.gpu)) == 5_945_432_576
    assert ctx.lower_bound(s) == 5_945_432_576 + cuda_context_bytes(ctx.gpu)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), n=st.sampled_from([1, 8]), data=st.data())
def test_the_batch_fields_leave_the_static_terms_unchanged(model: str, n: int, data: st.DataObject) -> None:
    """The planner computes one bound per setup without its ``PER_BATCH`` fields: they must not move it."""
    assert PER_BATCH == {"micro_batch_size", "grad_accum_steps", "seq_len", "gradient_checkpointing", "attention"}
    ctx = _ctx(model, "A100-80GB")
    cands = list(train_candidates(ctx.model, ctx.gpu, n, TrainJob(seq_len=1024, global_batch=4 * n, peft="allow")))
    s = data.draw(st.sampled_from(cands))
    other = dataclasses.replace(s, micro_batch_size=data.draw(st.sampled_from([1, 3, 16])),
                                grad_accum_steps=data.draw(st.sampled_from([1, 4])),
                                seq_len=data.draw(st.sampled_from([128, 8192])),
                                checkpointing=data.draw(st.sampled_from(["none", "full", "selective"])),
                                attention=data.draw(st.sampled_from(["sdpa", "eager"])))
    assert static_bytes(Resolved(ctx.scenario(s), ctx.model, ctx.gpu)) == \
        static_bytes(Resolved(ctx.scenario(other), ctx.model, ctx.gpu)), (s.label(), other.label())


def test_setups_with_module_lists_are_bounded_apart() -> None:
    """Adapter targets given as a list (no hash) key the bound by value: two lists, two bounds."""
    ctx = _ctx("meta-llama/Llama-3.2-1B", "A100-80GB")
    qv = TrainSetup(framework="hf-trainer", num_gpus=1, peft="lora", target_modules=["q_proj", "v_proj"])
    qvo = TrainSetup(framework="hf-trainer", num_gpus=1, peft="lora", target_modules=["q_proj", "v_proj", "o_proj"])
    for s in (qv, qvo):
        assert ctx.lower_bound(s) == static_bytes(Resolved(ctx.scenario(s), ctx.model, ctx.gpu)) + \
            cuda_context_bytes(ctx.gpu)
    assert ctx.lower_bound(qvo) > ctx.lower_bound(qv)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), n=st.sampled_from([1, 2, 8]),
       seq=st.sampled_from([512, 4096]), data=st.data())
def test_the_step_floor_is_the_steady_peak_and_never_exceeds_the_estimate(model: str, gpu: str, n: int, seq: int,
                                                                          data: st.DataObject) -> None:
    """The planner's second screen (engine.train_step_floor_bytes): the steady step's peak moment plus the bytes
    outside the allocator, at or below the replayed estimate's device-used bytes, at or above the static bound."""
    ctx = _ctx(model, gpu)
    cands = list(train_candidates(ctx.model, ctx.gpu, n, TrainJob(seq_len=seq, global_batch=4 * n, peft="allow")))
    for s in data.draw(st.lists(st.sampled_from(cands), min_size=1, max_size=6)):
        floor = ctx.step_floor(s)
        assert floor is not None
        tr = train_step(Resolved(ctx.scenario(s), ctx.model, ctx.gpu))
        rest = tr.peak.total + cuda_context_bytes(ctx.gpu) + nccl_bytes(tr.communicators)
        assert floor == rest + min(tr.managed_bytes, max(0, ctx.gpu.total_memory_bytes - rest)), s.label()
        for reserved in ("packed", "replay"):
            assert floor <= ctx.estimate(s, reserved=reserved).per_gpu.device_used_bytes, s.label()
        assert ctx.lower_bound(s) <= floor, s.label()


def test_the_step_floor_answers_only_the_plain_step() -> None:
    """Another objective runs other engines (DPO's reference forwards, GRPO's rollout): no floor, the estimate
    decides."""
    ctx = _ctx("Qwen/Qwen2.5-0.5B", "A100-80GB")
    s = TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=1024,
                   optimizer="adamw-fused", precision="bf16-mixed")
    from vramplan.engine import train_step_floor_bytes

    r = ctx._resolved(s)
    assert train_step_floor_bytes(r) is not None
    dpo = r.scenario.model_copy(update={"train": r.scenario.train.model_copy(update={"objective": "dpo"})})
    assert train_step_floor_bytes(Resolved(dpo, r.model, r.gpu)) is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS[:3]), gpu=st.sampled_from(GPUS), n=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([512, 2048]), peft=st.sampled_from(["allow", "none"]), data=st.data())
def test_the_step_floor_never_falls_as_the_micro_batch_grows(model: str, gpu: str, n: int, seq: int, peft: str,
                                                             data: st.DataObject) -> None:
    """The planner's split screen (plan/context.py ``micro_batch_key``): among setups that differ only in how the same
    global batch is split into micro-batches (accumulation on in all or in none), the smallest micro-batch's step floor
    is at most every other's, so its floor above the memory rejects them all."""
    ctx = _ctx(model, gpu)
    from vramplan.errors import VramplanError
    from vramplan.plan.context import micro_batch_key

    cands = list(train_candidates(ctx.model, ctx.gpu, n, TrainJob(seq_len=seq, global_batch=16 * n, peft=peft)))
    groups: dict[tuple[object, ...], list[TrainSetup]] = {}
    for s in cands:
        groups.setdefault(micro_batch_key(s), []).append(s)
    split = [g for g in groups.values() if len(g) > 1]
    assert split  # the candidates hold splits of one strategy (else the screen is never used and this tests nothing)
    for g in data.draw(st.lists(st.sampled_from(split), min_size=1, max_size=3)):
        floors = []
        for s in sorted(g, key=lambda x: x.train.micro_batch_size):
            try:
                floors.append((s.train.micro_batch_size, ctx.step_floor(s)))
            except VramplanError:
                continue
        got = [f for _, f in floors if f is not None]
        assert got == sorted(got), floors
