"""From a scenario to a Report: the task's analytic model, chosen and turned into the report.

``estimate`` resolves the scenario (``vramplan.catalog.resolve``) and runs the model of its task:
the training step (``analytic.train``), the ``generate`` call (``analytic.inference``) or the serving engine's
start-up (``serve.report``, built on ``serve.vllm`` and ``serve.sglang``; ``serve.llamacpp`` for
``serve.engine: llamacpp``).  It sits above ``analytic`` and ``serve`` in
the layers (README, Architecture; ``[tool.importlinter]`` in pyproject.toml), so neither imports
the other's composition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vramplan.analytic import dpo, kto, openrlhf, orpo, ppo, rloo, verl
from vramplan.analytic.allocator import reserved_after_step, reserved_for, train_reserved_bytes
from vramplan.analytic.autoawq import autoawq_step
from vramplan.analytic.generate import generate_step
from vramplan.analytic.grpo import grpo_assumptions, grpo_problems, policy_scenario, reference_kind
from vramplan.analytic.lifecycle import (
    LIFECYCLE_ORDER,
    OPENRLHF_ORDER,
    VERL_ORDER,
    PhasePeak,
    job_lifecycle,
    packed_reserved,
)
from vramplan.analytic.lifecycle.evaluation import eval_forward_stream
from vramplan.analytic.lifecycle.hf_rollout import hf_generate_notes, hf_generate_parts, hf_generate_problems
from vramplan.analytic.lifecycle.openrlhf import CriticStep, critic_step
from vramplan.analytic.lifecycle.ppo import ppo_job
from vramplan.analytic.lifecycle.scoring import scoring_phase
from vramplan.analytic.lifecycle.steps import between_steps, first_step
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.overhead import cuda_context_for, nccl_bytes
from vramplan.analytic.ssm_state import split_product_excess_bytes
from vramplan.analytic.terms.context import communicators
from vramplan.analytic.train import StepWalks, TrainResult, step_peak, step_walks, train_step
from vramplan.catalog.gpus import bare_name_note
from vramplan.catalog.resolve import resolve
from vramplan.errors import Problem, ScenarioError
from vramplan.report import BREAKDOWN_KEYS, Host, PerGpu, Report, ServeBlock, managed_in_capacity
from vramplan.report.band import with_band
from vramplan.serve.llamacpp import LlamaCppDecision
from vramplan.serve.report import ServeResult, serve
from vramplan.serve.rollout import RolloutMemory, rollout_memory
from vramplan.spec.checks import (
    analytic_unmodelled_problems,
    capability_notes,
    every_token_expert_problems,
    ignored_sections,
    linear_mixer_analytic_problems,
    unused_settings,
)
from vramplan.spec.defaults import expandable_segments, rollout_engine
from vramplan.spec.load import Resolved
from vramplan.spec.scenario import Scenario
from vramplan.units import GiB

__all__ = ["ReservedModel", "StepWalks", "estimate", "train_step_floor_bytes", "train_step_walks"]


def context_at_start(r: Resolved) -> bool:
    """SGLang and llama.cpp size themselves from the memory free at start (``cuda_context_for``'s at_start)."""
    return r.scenario.task == "serve" and r.scenario.serve.engine in ("sglang", "llamacpp")


def _reserved(peak: Moment, expandable: bool = False) -> int:
    """Reserved = each part's tensors rounded into caching-allocator segments (expandable segments: mapped pages)."""
    sizes: list[tuple[int, int]] = []
    for part in peak.parts.values():
        for nbytes in part.values():
            sizes.append((nbytes, 1))
    return max(reserved_for(sizes, expandable_segments=expandable), peak.total)


def _report(r: Resolved, peak: Moment, moments: list[Moment], outside: dict[str, int], host: Host,
            serve_block: ServeBlock, assumptions: list[str], reserved: int | None = None,
            lifecycle: tuple[dict[str, dict[str, int]], str] = ({}, "")) -> Report:
    breakdown = {k: sum(peak.parts.get(k, {}).values()) for k in BREAKDOWN_KEYS}
    allocated = sum(breakdown.values())
    reserved = _reserved(peak) if reserved is None else reserved
    capacity = r.gpu.total_memory_bytes
    outside, paged_out = managed_in_capacity(outside, reserved, capacity)
    if paged_out:
        host = host.model_copy(update={"managed_paged_out_bytes": paged_out})
        assumptions = [*assumptions, (f"{paged_out / GiB:,.2f} GiB of the paged optimizer states do not fit beside the "
                       "rest and are paged out to host RAM by the unified-memory driver (slower steps, no OOM)")]
    used = reserved + sum(outside.values())
    phases: dict[str, int] = {}
    for mo in moments:
        phases[mo.phase] = max(phases.get(mo.phase, 0), mo.total)
    excess = split_product_excess_bytes(r.scenario, r.model)
    if excess:
        assumptions = [*assumptions, (
            f"reserved bytes: the caching allocator may split the freed segment of the Mamba2 scan's broadcast "
            f"product (transformers before 5.18) with tensors that outlive the layer, and the next layer's product "
            f"({excess:,} B) then needs a segment of its own: the high bounds of reserved and device-used bytes add "
            "it (analytic/ssm_state.py split_product_excess_bytes; an H100 run of Mamba-Codestral-7B ran out of "
            "memory this way, benchmarks/gpu/h100-2026-11-27e)")]
    per_gpu = PerGpu(
        capacity_bytes=capacity, peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
        device_used_bytes=used, headroom_bytes=capacity - used, peak_phase=peak.phase, breakdown=breakdown,
        breakdown_detail={k: dict(v) for k, v in peak.parts.items()}, outside_allocator=outside, phases=phases,
        lifecycle=lifecycle[0], lifecycle_peak_phase=lifecycle[1], reserved_excess_high_bytes=excess,
    )
    assumptions = [*r.assumptions, *assumptions, cuda_context_for(r.gpu, at_start=context_at_start(r)).assumption(),
                   *capability_notes(r.scenario, r.gpu), *ignored_sections(r.scenario),
                   *unused_settings(r.scenario)]
    if r.scenario.hardware.gpu and (note := bare_name_note(r.scenario.hardware.gpu)):
        assumptions.append(note)
    report = Report(
        engine="analytic", fits=used <= capacity, per_gpu=per_gpu, host=host, serve=serve_block,
        assumptions=assumptions, scenario=r.scenario.model_dump(mode="json"),
        model=r.model.summary(),
        gpu=r.gpu.report_block(),
    )
    report.check()
    return report


ReservedModel = Literal["replay", "packed"]


def _step_reserved(r: Resolved, tr: TrainResult, outside: dict[str, int], reserved: ReservedModel) -> tuple[int, str]:
    """The steady step's reserved bytes and the assumption that says how they were found."""
    expandable = expandable_segments(r.scenario)
    res, how = _step_reserved_by(r, tr, outside, reserved, expandable)
    if expandable:
        why = ("as given" if r.scenario.software.expandable_segments is not None else
               "torchtitan's run_train.sh exports PYTORCH_ALLOC_CONF=expandable_segments:True (pytorch/torchtitan#643); "
               "set software.expandable_segments false for a run launched without it")
        how += (f"; allocator with expandable_segments:True ({why}): the step's replay and the other phases' packing "
                "map pages instead of caching blocks (the load's replay keeps the plain allocator, an upper bound)")
    return res, how


def _step_reserved_by(r: Resolved, tr: TrainResult, outside: dict[str, int], reserved: ReservedModel,
                      expandable: bool) -> tuple[int, str]:
    packed = _reserved(tr.peak, expandable)
    if _replay_unbuilt(r):
        # the event stream (analytic/events.py) frees no gradient inside the backward
        return packed, ("reserved bytes: the tensors alive at the peak packed into empty allocator segments (the "
                        "allocator replay is not built for gradients freed in the backward)")
    if reserved == "replay" and tr.layout is not None:
        # the packing is a floor: the tensors alive at the peak must fit in some segments
        reservable = _reservable(r, outside)
        how = ("reserved bytes: the step's tensors replayed in order over two steps through "
               "PyTorch's caching-allocator rules (fragmentation between phases counted)")
        if tr.layout.grads_on_side_stream:
            how += ("; torch FSDP makes the sharded gradients on its reduce-scatter stream, whose blocks the "
                    "caching allocator never hands to the compute stream: the gradients are replayed as a pool of "
                    "their own and the reserved bytes are the two pools' sum (analytic/terms/sharding.py "
                    "grads_on_reduce_stream)")
            fw, pol = r.scenario.effective_framework, tr.context.pol if tr.context is not None else None
            if (fw not in ("accelerate", "hf-trainer", "torchtitan", "verl") and pol is not None
                    and pol.compute_bytes < pol.grad_bytes):
                # accelerate's reduce dtype (and so the HF Trainer's) is read, torchtitan's and verl's are fp32
                how += (f"; a {fw} job's FSDP reduce dtype is its script's: if below the gradients' (e.g. bf16), each "
                        "unit's reduce output is a block of that pool too, not counted here "
                        "(analytic/terms/sharding.py reduce_cast_ratio)")
        return (max(train_reserved_bytes(tr.layout, expandable_segments=expandable, capacity_bytes=reservable)[1],
                    packed), how)
    return packed, ("reserved bytes: the tensors alive at the peak packed into empty allocator "
                    "segments (fragmentation left by earlier phases not counted)")


def _train(r: Resolved, reserved: ReservedModel, ctx: int, walks: StepWalks | None = None) -> Report:
    """The training report: the steady step and the job's other phases (analytic/lifecycle), the peaks
    being the maxima over all of them.  ``walks``: the step's term records made before (``train_step_walks``)."""
    tr = train_step(r, walks=walks)
    outside = {"cuda_context": ctx, "workspaces": 0, "communication": nccl_bytes(tr.communicators),
               "managed": tr.managed_bytes}
    res_bytes, how = _step_reserved(r, tr, outside, reserved)
    host = Host(offloaded_bytes=tr.host_bytes, nvme_bytes=tr.nvme_bytes)
    steady = PhasePeak("training step", tr.peak, res_bytes)
    if tr.context is None or tr.layout is None:
        return _report(r, tr.peak, tr.moments, outside, host, ServeBlock(), [*tr.assumptions, how], reserved=res_bytes)
    job = job_lifecycle(tr.context, tr.layout, tr.terms, tr.moments)
    phases = sorted([steady, *_evaluation_after_step(r, tr, job.phases, outside, reserved)],
                    key=lambda p: LIFECYCLE_ORDER.index(p.name))
    table = {p.name: _phase_row(p, outside, r.gpu.total_memory_bytes) for p in phases}
    # the first highest in the job's order wins a tie, the steady step over the phases after it
    top = max(phases, key=lambda p: (p.moment.total, p is steady))
    used = max(phases, key=lambda p: (table[p.name]["device_used_bytes"], p is steady))
    job_reserved = max(p.reserved_bytes for p in phases)
    host = host.model_copy(update={"load_peak_bytes": job.host_load_bytes})
    return _report(r, top.moment, tr.moments, outside, host, ServeBlock(), [*tr.assumptions, how, *job.assumptions],
                   reserved=max(job_reserved, top.moment.total), lifecycle=(table, used.name))


def _evaluation_after_step(r: Resolved, tr: TrainResult, phases: list[PhasePeak], outside: dict[str, int],
                           reserved: ReservedModel) -> list[PhasePeak]:
    """The job's phases with the evaluation's reserved bytes replayed after the training steps (allocator replay
    only): its forward's tensors are allocated where the steps' cached blocks are large enough, in new segments
    otherwise (``analytic/allocator.py`` ``reserved_after_step``), never below its own packing."""
    if reserved != "replay" or tr.context is None or tr.layout is None or _replay_unbuilt(r):
        return phases
    out = []
    for p in phases:
        if p.name == "evaluation":
            tail = eval_forward_stream(tr.context, tr.layout)
            after = reserved_after_step(tr.layout, tail, expandable_segments(r.scenario), _reservable(r, outside))
            p = PhasePeak(p.name, p.moment, max(p.reserved_bytes, after), p.before_step)
        out.append(p)
    return out


def _reservable(r: Resolved, outside: dict[str, int]) -> int:
    """The device memory PyTorch may reserve: the total less what lives outside its allocator."""
    return max(0, r.gpu.total_memory_bytes - sum(outside.values()))


def _replay_unbuilt(r: Resolved) -> bool:
    """The step's event stream is not built for gradients freed in the backward (``_step_reserved_by``)."""
    t = r.scenario.train
    return t.optimizer_in_backward or t.torchao_cpu_offload == "optimizer+gradients"


def _rl_job(r: Resolved) -> tuple[Resolved, str, list[str]]:
    """An RL job's scenario (RLOO's with RLOOConfig's defaults filled in, analytic/rloo.py), its trainer's name and
    the assumptions it states; refused with every problem when it cannot be estimated."""
    s, rl = r.scenario, r.scenario.train.objective == "rloo"
    problems = rloo.rloo_problems(s) if rl else grpo_problems(s)
    if rollout_engine(s) == "hf-generate":
        problems += hf_generate_problems(r.model)
    if problems:
        raise ScenarioError(problems)
    if not rl:
        return r, "GRPO", grpo_assumptions(s)
    filled = Resolved(rloo.with_defaults(s), r.model, r.gpu, r.assumptions)
    return filled, "RLOO", rloo.rloo_assumptions(filled.scenario)


def _rl_train(r: Resolved, reserved: ReservedModel, ctx: int) -> Report:
    """A post-training job (train.objective: grpo | rloo): the policy's step (analytic/grpo.py, analytic/rloo.py),
    the reference model, and the colocated rollout engine (serve/rollout.py) in every phase after the load, with the
    rollout and the scoring (analytic/lifecycle/scoring.py) as phases of their own (docs/rl.md)."""
    r, method, rl_notes = _rl_job(r)
    pr = Resolved(policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    c = tr.context
    assert c is not None and tr.layout is not None  # one pipeline stage (grpo_problems refuses pp > 1)
    ref = c.rp.total * c.pol.param_bytes if reference_kind(pr.scenario) == "separate" else 0
    ro, gen = None, None
    if rollout_engine(pr.scenario) == "hf-generate":
        gen = hf_generate_parts(c, pr)
    elif pr.scenario.rl.rollout.colocate:
        # GRPOTrainer.__init__ loads the policy and the reference before it builds the engine
        ro = rollout_memory(pr, between_steps(tr.terms, "rollout").get(K.PARAMETERS) + ref, ctx, method)
    extra = _rl_extra(ref, ro)
    outside = {"cuda_context": ctx, "workspaces": 0, "communication": nccl_bytes(tr.communicators),
               "managed": tr.managed_bytes}
    res_bytes, how = _step_reserved(pr, tr, {**outside, "rollout": extra.total}, reserved)
    job = job_lifecycle(c, tr.layout, tr.terms, tr.moments)
    steady = PhasePeak("training step", _plus(tr.peak, extra), res_bytes + extra.total)
    scoring = scoring_phase(c, tr.layout, _plus(between_steps(tr.terms, "scoring"), extra))
    phases = [steady, _rollout_phase(tr, ref, ro, gen), PhasePeak("scoring", scoring, packed_reserved(scoring))] + [
        p if p.before_step else PhasePeak(p.name, _plus(p.moment, extra), p.reserved_bytes + extra.total)
        for p in job.phases]
    phases.sort(key=lambda p: LIFECYCLE_ORDER.index(p.name))
    table = {p.name: _phase_row(p, outside, r.gpu.total_memory_bytes) for p in phases}
    top = max(phases, key=lambda p: (p.moment.total, p is steady))
    used = max(phases, key=lambda p: (table[p.name]["device_used_bytes"], p is steady))
    host = Host(offloaded_bytes=tr.host_bytes + (ro.host_bytes if ro else 0), nvme_bytes=tr.nvme_bytes,
                load_peak_bytes=job.host_load_bytes)
    server = [(f"{method} rollout: vLLM server mode (rl.rollout.colocate: false): the engine runs on other GPUs"
               ", nothing of it on this one")] if gen is None else hf_generate_notes(c, method)
    notes = [*tr.assumptions, how, *job.assumptions, *rl_notes, *(ro.assumptions if ro else server)]
    rep = _report(pr, top.moment, [_plus(mo, extra) for mo in tr.moments], outside, host, ServeBlock(), notes,
                  reserved=max(p.reserved_bytes for p in phases), lifecycle=(table, used.name))
    return rep if ro is None or ro.starts else rep.model_copy(update={"fits": False})


def _ppo_train(r: Resolved, reserved: ReservedModel, ctx: int) -> Report:
    """A PPO job (train.objective: ppo, TRL v1.12.0 PPOTrainer): the policy's step (analytic/ppo.py) with the value
    model trained beside it, the reference and reward models, the kept generate scores and rollout buffers in every
    phase after the load, and the rollout and scoring as phases of their own (analytic/lifecycle/ppo.py)."""
    s = ppo.with_defaults(r.scenario)
    if problems := ppo.ppo_problems(s) + hf_generate_problems(r.model):
        raise ScenarioError(problems)
    pr = Resolved(ppo.policy_scenario(s), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    c = tr.context
    assert c is not None and tr.layout is not None  # one pipeline stage (ppo_problems refuses pp > 1)
    pj = ppo_job(pr, tr)
    outside = {"cuda_context": ctx, "workspaces": 0, "communication": nccl_bytes(tr.communicators),
               "managed": tr.managed_bytes}
    res_bytes, how = _step_reserved(pr, tr, {**outside, "ppo": pj.extra.total}, reserved)
    job = job_lifecycle(c, tr.layout, tr.terms, tr.moments)
    step_top = max(pj.moments, key=lambda mo: mo.total)
    steady = PhasePeak("training step", step_top, max(res_bytes + step_top.total - tr.peak.total,
                                                      packed_reserved(step_top)))
    phases = [steady, pj.rollout, pj.scoring]
    states = sum(between_steps(tr.terms, "first step").parts.get("optimizer_states", {}).values())
    for p in job.phases:
        if p.name == "first step":
            # the first step's highest moment of PPO's own moments, no optimizer states before its optimizer.step()
            first = first_step(pj.moments, states + pj.extra.get(K.VALUE_OPTIMIZER))
            phases.append(PhasePeak("first step", first, packed_reserved(first)))
        elif p.name == "load":
            phases.append(p if pj.loaded.total <= p.moment.total else
                          PhasePeak("load", pj.loaded, packed_reserved(pj.loaded), True))
        else:
            phases.append(p if p.before_step else
                          PhasePeak(p.name, _plus(p.moment, pj.extra), p.reserved_bytes + pj.extra.total))
    phases.sort(key=lambda p: LIFECYCLE_ORDER.index(p.name))
    table = {p.name: _phase_row(p, outside, r.gpu.total_memory_bytes) for p in phases}
    top = max(phases, key=lambda p: (p.moment.total, p is steady))
    used = max(phases, key=lambda p: (table[p.name]["device_used_bytes"], p is steady))
    host = Host(offloaded_bytes=tr.host_bytes, nvme_bytes=tr.nvme_bytes, load_peak_bytes=job.host_load_bytes)
    notes = [*tr.assumptions, how, *job.assumptions, *ppo.ppo_assumptions(s)]
    return _report(pr, top.moment, pj.moments, outside, host, ServeBlock(), notes,
                   reserved=max(p.reserved_bytes for p in phases), lifecycle=(table, used.name))


def _verl_phases(tr: TrainResult, v: verl.VerlSetup, ro: RolloutMemory, asleep: Moment) -> list[PhasePeak]:
    """verl's iteration (analytic/verl.py): weight sync, rollout, scoring, reference scoring, over what each phase
    keeps of the actor (its shards unless ``param_offload`` outside the phases that load them, the optimizer's
    states unless ``optimizer_offload``) and the engine (``asleep``: its share while it sleeps)."""
    c, lay = tr.context, tr.layout
    assert c is not None and lay is not None
    states = () if not v.optimizer_offload else (K.OPTIMIZER_STATES,)
    loaded = between_steps(tr.terms, "weight sync").without(*states)
    away = loaded.without(*((K.PARAMETERS,) if v.param_offload else ()))
    sync = _plus(loaded.copy("weight sync"), asleep).add(K.STATE_DICT_SHARDS, loaded.get(K.PARAMETERS))
    # the state dict is built while the engine sleeps; then its weights wake and the parameters go in one at a time
    building, feeding = verl.state_dict_bytes(c), ro.weights - ro.training_bytes["weights"]
    gather = verl.sync_gather_bytes(c)
    if building > feeding + gather:
        sync.add(K.STATE_DICT_UNSHARDED, building)
    else:
        sync.add(K.ROLLOUT_WEIGHTS, feeding).add(K.SYNC_PARAMETER, gather)
    rollout = away.copy("rollout").add(K.ROLLOUT_WEIGHTS, ro.weights).add(K.ROLLOUT_KV, ro.kv_cache)
    rollout.add(K.ROLLOUT_ACTIVATIONS, ro.activations).add(K.ROLLOUT_OTHER, ro.other)
    scoring = _plus(loaded.copy("scoring"), asleep).add(K.GATHERED, lay.gathered)
    scoring.add(K.SCORING_FORWARD, verl.log_prob_forward_bytes(c, lay, v.log_prob_micro_batch, entropy=True))
    phases = [PhasePeak(mo.phase, mo, packed_reserved(mo)) for mo in (sync, rollout, scoring)]
    if v.reference:
        # compute_log_prob offloads the actor again before the reference runs; the reference's FSDP1 units come
        # from host memory one at a time (CPUOffload), gathered in bf16 like the actor's
        ref = _plus(away.copy("reference scoring"), asleep).add(K.GATHERED, lay.gathered)
        ref.add(K.SCORING_FORWARD, verl.log_prob_forward_bytes(c, lay, v.ref_log_prob_micro_batch, entropy=False))
        phases.append(PhasePeak(ref.phase, ref, packed_reserved(ref)))
    return phases


def _verl_train(r: Resolved, reserved: ReservedModel, ctx: int) -> Report:
    """A verl GRPO job (framework: verl, analytic/verl.py): the actor's FSDP update as the training step, and the
    weight sync, rollout and scorings as phases of their own, each with what verl keeps on the GPU then."""
    if problems := verl.verl_problems(r.scenario):
        raise ScenarioError(problems)
    v = verl.verl_setup(r.scenario)
    pr = Resolved(verl.policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    assert tr.context is not None and tr.layout is not None  # one pipeline stage (verl_problems refuses pp > 1)
    actor = between_steps(tr.terms, "rollout").get(K.PARAMETERS)
    settings = (f"max_num_seqs vLLM's default (verl passes none), max_num_batched_tokens "
                f"{v.row.max_num_batched_tokens}, "
                f"max_model_len {v.prompt + v.response} (prompt + response), tensor_model_parallel_size "
                f"{v.tensor_parallel}, enforce_eager {v.enforce_eager}, dtype bfloat16")
    # init_model builds the actor (offloaded at once with param_offload; AdamW's states come at the first step),
    # then the engine, then the reference (its shards in host memory)
    built = (verl.rollout_scenario(r.scenario), v.sleep_level, settings)
    ro = rollout_memory(pr, 0 if v.param_offload else actor, ctx, "verl", built)
    asleep = _rl_extra(0, ro)
    outside = {"cuda_context": ctx, "workspaces": 0, "communication": nccl_bytes(tr.communicators),
               "managed": tr.managed_bytes}
    res_bytes, how = _step_reserved(pr, tr, {**outside, "rollout": asleep.total}, reserved)
    steady = PhasePeak("training step", _plus(tr.peak, asleep), res_bytes + asleep.total)
    phases = sorted([steady, *_verl_phases(tr, v, ro, asleep)], key=lambda p: VERL_ORDER.index(p.name))
    table = {p.name: _phase_row(p, outside, r.gpu.total_memory_bytes) for p in phases}
    top = max(phases, key=lambda p: (p.moment.total, p is steady))
    used = max(phases, key=lambda p: (table[p.name]["device_used_bytes"], p is steady))
    states = sum(between_steps(tr.terms, "rollout").parts.get(K.OPTIMIZER_STATES.part, {}).values())
    ref_host = tr.context.rp.total * 2 // r.scenario.hardware.num_gpus if v.reference else 0
    host = Host(offloaded_bytes=(actor if v.param_offload else 0) + (states if v.optimizer_offload else 0) + ref_host
                + ro.host_bytes)
    # the actor step is computed as accelerate's FSDP1 (analytic/verl.py): the report names verl
    actor_notes = [n.replace("framework behaviour: accelerate", "framework behaviour: verl (the actor's update as "
                             "accelerate's FSDP1 step)") for n in tr.assumptions]
    notes = [*actor_notes, how, *verl.verl_assumptions(r.scenario), *ro.assumptions]
    rep = _report(r, top.moment, [_plus(mo, asleep) for mo in tr.moments], outside, host, ServeBlock(), notes,
                  reserved=max(p.reserved_bytes for p in phases), lifecycle=(table, used.name))
    return rep if ro.starts else rep.model_copy(update={"fits": False})


@dataclass(frozen=True)
class _OpenRlhfGuests:
    """What OpenRLHF's other models keep on an actor GPU between their uses (analytic/openrlhf.py): the reference's
    parameters, the reward model's, the critic's engine (its states out under ``deepspeed_enable_sleep``), and the
    critic's step when colocated (None otherwise)."""

    ref: Moment
    reward: Moment
    critic: Moment
    critic_step: CriticStep | None

    @property
    def all(self) -> Moment:
        return _plus(_plus(self.ref, self.reward), self.critic)


def _openrlhf_phases(tr: TrainResult, o: openrlhf.OpenRlhfSetup, ro: RolloutMemory | None, g: _OpenRlhfGuests,
                     asleep: Moment) -> list[PhasePeak]:
    """OpenRLHF's iteration on an actor GPU (analytic/openrlhf.py): rollout, the reward model's, the actor's, the
    critic's and the reference's scorings, the critic's update and the weight sync over what the actor keeps there
    (its states in host memory under ``deepspeed_enable_sleep``), the other models' parameters when on this GPU
    (``g``) and the engine when colocated (``asleep``: what it keeps while it sleeps, or all of it awake)."""
    c, lay = tr.context, tr.layout
    assert c is not None and lay is not None
    away = between_steps(tr.terms, "rollout")
    if o.states_offloaded:
        # offload_deepspeed_states: optim_states, hp_params, contiguous_grad_buffer, lp_grads
        away = away.without(K.OPTIMIZER_STATES, K.MASTER, K.DS_REDUCE_BUCKETS)
    guests = g.all
    rollout = _plus(away, guests)
    if ro is not None:
        rollout.add(K.ROLLOUT_WEIGHTS, ro.weights).add(K.ROLLOUT_KV, ro.kv_cache)
        rollout.add(K.ROLLOUT_ACTIVATIONS, ro.activations).add(K.ROLLOUT_OTHER, ro.other)
    tokens = o.prompt + o.response
    forward = openrlhf.log_prob_forward_bytes(c, lay, o.micro_rollout, tokens)
    gathered = lay.gathered if o.zero_stage == 3 else 0
    scoring = _plus(_plus(away.copy("scoring"), guests), asleep).add(K.GATHERED, gathered)
    scoring.add(K.SCORING_FORWARD, forward)
    phases = [PhasePeak(mo.phase, mo, packed_reserved(mo)) for mo in (rollout, scoring)]
    if o.ref_on_actor_gpu:
        # the reference's own process: a ZeRO-3 engine gathers one layer at a time in bf16, like the actor's
        ref_scoring = _plus(_plus(away.copy("reference scoring"), guests), asleep).add(K.GATHERED, gathered)
        ref_scoring.add(K.SCORING_FORWARD, forward)
        phases.append(PhasePeak(ref_scoring.phase, ref_scoring, packed_reserved(ref_scoring)))
    # the reward model's and the critic's forwards (make_experience): a value head, no logits
    for name, here, response in (("reward scoring", o.reward_on_actor_gpu, 0),
                                 ("critic scoring", o.critic_on_actor_gpu, o.response)):
        if here:
            mo = _plus(_plus(away.copy(name), guests), asleep).add(K.GATHERED, gathered)
            mo.add(K.CRITIC_FORWARD, openrlhf.value_forward_bytes(c, lay, o.micro_rollout, tokens, response))
            phases.append(PhasePeak(name, mo, packed_reserved(mo)))
    if g.critic_step is not None:
        # ppo_train: the critic's fit (its states reloaded) before the actor's, awaited under colocate_all_models
        beside = _plus(_plus(away.copy("critic training step"), _plus(g.ref, g.reward)), asleep)
        step = max((_plus(beside, mo) for mo in g.critic_step.moments), key=lambda mo: mo.total)
        phases.append(PhasePeak(step.phase, step, packed_reserved(step)))
    # _broadcast_to_vllm: the engines woken whole (wake_up()), one parameter gathered and / or cloned at a time
    sync = _plus(away.copy("weight sync"), guests).add(K.SYNC_PARAMETER, openrlhf.sync_bytes(c, o))
    if ro is not None:
        sync.add(K.ROLLOUT_WEIGHTS, ro.weights).add(K.ROLLOUT_KV, ro.kv_cache).add(K.ROLLOUT_OTHER, ro.other)
    phases.append(PhasePeak(sync.phase, sync, packed_reserved(sync)))
    return phases


def _openrlhf_guests(pr: Resolved, tr: TrainResult, o: openrlhf.OpenRlhfSetup) -> tuple[_OpenRlhfGuests,
                                                                                        CriticStep | None]:
    """The other models' residents on an actor GPU, and the critic's step wherever it runs (None without one)."""
    c = tr.context
    assert c is not None
    n = pr.scenario.hardware.num_gpus
    cs = critic_step(pr) if o.critic else None
    ref = Moment("").add(K.REFERENCE_WEIGHTS, openrlhf.reference_bytes(c, o, n) if o.ref_on_actor_gpu else 0)
    reward = Moment("").add(K.REWARD_WEIGHTS, openrlhf.reward_bytes(c, o, n) if o.reward_on_actor_gpu else 0)
    critic = Moment("")
    if cs is not None and o.critic_on_actor_gpu:
        critic = (cs.resident.without(K.CRITIC_OPTIMIZER, K.CRITIC_MASTER, K.CRITIC_GRADIENTS)
                  if o.states_offloaded else cs.resident)
    return _OpenRlhfGuests(ref, reward, critic, cs if o.critic_on_actor_gpu else None), cs


def _openrlhf_apart_notes(tr: TrainResult, o: openrlhf.OpenRlhfSetup, cs: CriticStep | None, n: int) -> list[str]:
    """The critic's and the reward model's GPUs when not the actor's (``colocate_all_models`` false)."""
    c, lay = tr.context, tr.layout
    assert c is not None and lay is not None
    gathered = lay.gathered if o.zero_stage == 3 else 0
    tokens = o.prompt + o.response
    reward = openrlhf.reward_bytes(c, o, n)
    reward_scoring = reward + gathered + openrlhf.value_forward_bytes(c, lay, o.micro_rollout, tokens, 0)
    notes = []
    if cs is not None and not o.colocate_all:
        kept = cs.resident.total - (cs.offloadable if o.states_offloaded else 0)
        scoring = kept + gathered + openrlhf.value_forward_bytes(c, lay, o.micro_rollout, tokens, o.response)
        training = max(mo.total for mo in cs.moments)
        shared = o.reward and o.colocate_critic_reward
        if shared:
            scoring, training = max(scoring + reward, kept + reward_scoring), training + reward
        notes.append(f"OpenRLHF critic GPU (not this one): about {training / GiB:.2f} GiB at its training step, "
                     f"{scoring / GiB:.2f} GiB at its scorings (its DeepSpeed engine"
                     + (", the reward model's parameters and forward (colocate_critic_reward)" if shared else "")
                     + ") beside its CUDA context")
    if o.reward and not o.colocate_all and not (cs is not None and o.colocate_critic_reward):
        notes.append(f"OpenRLHF reward model GPU (not this one): about {reward_scoring / GiB:.2f} GiB at its scoring "
                     "forward (its parameters, a gathered layer at ZeRO-3, the forward's tensors)")
    return notes


def _openrlhf_train(r: Resolved, reserved: ReservedModel, ctx: int) -> Report:
    """An OpenRLHF GRPO or PPO job (framework: openrlhf, analytic/openrlhf.py) on one of the actor's GPUs: the
    actor's DeepSpeed update as the training step, the rollout, scorings, the critic's update and the weight sync as
    phases of their own."""
    s = r.scenario
    if problems := openrlhf.openrlhf_problems(s):
        raise ScenarioError(problems)
    o = openrlhf.openrlhf_setup(s)
    pr = Resolved(openrlhf.policy_scenario(s), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    assert tr.context is not None and tr.layout is not None  # one pipeline stage (the problems refuse pp > 1)
    settings = (f"max_num_seqs and max_num_batched_tokens vLLM's defaults (OpenRLHF passes neither), max_model_len "
                f"{o.prompt + o.response} (prompt_max_len + generate_max_len), tensor_parallel_size "
                f"{o.tensor_parallel}, enforce_eager {o.enforce_eager}, dtype bfloat16")
    built = (openrlhf.rollout_scenario(s), o.sleep_level, settings)
    # create_vllm_engines runs first in train(): the engines start before the actor and the reference load
    ro = rollout_memory(pr, 0, ctx, "OpenRLHF", built, usage="llm")
    colocated = ro if o.colocate_all else None
    asleep = _rl_extra(0, colocated) if colocated is not None else Moment("")
    ref_gpus = s.hardware.num_gpus
    guests, cs = _openrlhf_guests(pr, tr, o)
    extra = _plus(asleep, guests.all)
    processes = (1 + (1 if o.ref_on_actor_gpu else 0) + (1 if o.colocate_all else 0)
                 + (1 if o.critic_on_actor_gpu else 0) + (1 if o.reward_on_actor_gpu else 0))
    outside = {"cuda_context": ctx * processes, "workspaces": 0, "communication": nccl_bytes(tr.communicators),
               "managed": tr.managed_bytes}
    res_bytes, how = _step_reserved(pr, tr, {**outside, "openrlhf": extra.total}, reserved)
    steady = PhasePeak("training step", _plus(tr.peak, extra), res_bytes + extra.total)
    phases = sorted([steady, *_openrlhf_phases(tr, o, colocated, guests, asleep)],
                    key=lambda p: OPENRLHF_ORDER.index(p.name))
    table = {p.name: _phase_row(p, outside, r.gpu.total_memory_bytes) for p in phases}
    top = max(phases, key=lambda p: (p.moment.total, p is steady))
    used = max(phases, key=lambda p: (table[p.name]["device_used_bytes"], p is steady))
    between = between_steps(tr.terms, "rollout")
    offloaded = (between.get(K.MASTER) + between.get(K.DS_REDUCE_BUCKETS)
                 + sum(between.parts.get(K.OPTIMIZER_STATES.part, {}).values()) if o.states_offloaded else 0)
    ref_host = 2 * tr.context.rp.total // ref_gpus if o.reference and o.ref_offload and o.zero_stage == 3 else 0
    # the critic's and the reward model's host bytes when their processes share this GPU
    if guests.critic_step is not None:
        ref_host += guests.critic_step.host + (guests.critic_step.offloadable if o.states_offloaded else 0)
    if o.reward_on_actor_gpu and o.ref_offload and o.zero_stage == 3:
        ref_host += 2 * openrlhf.critic_params(tr.context) // ref_gpus
    host = Host(offloaded_bytes=tr.host_bytes + offloaded + ref_host + (ro.host_bytes if colocated else 0))
    actor_notes = [n.replace("framework behaviour: deepspeed", "framework behaviour: OpenRLHF (the actor's update as "
                             "a DeepSpeed ZeRO step)") for n in tr.assumptions if "TRL v1.12.0's PPOTrainer" not in n]
    notes = [*actor_notes, how, *openrlhf.openrlhf_assumptions(s)]
    if not o.colocate_all:
        notes.append(f"OpenRLHF engine GPU (not this one): about {ro.generating_bytes / GiB:.2f} GiB while generating "
                     f"(weights, KV cache, profile peak, CUDA graphs and non-torch) beside its CUDA context")
    if o.reference and not o.ref_on_actor_gpu:
        c = tr.context
        own = openrlhf.reference_bytes(c, o, ref_gpus) + openrlhf.log_prob_forward_bytes(
            c, tr.layout, o.micro_rollout, o.prompt + o.response) + (tr.layout.gathered if o.zero_stage == 3 else 0)
        notes.append(f"OpenRLHF reference GPU (not this one): about {own / GiB:.2f} GiB at its scoring forward "
                     "(its parameters, a gathered layer at ZeRO-3, the forward's logits)")
    notes += _openrlhf_apart_notes(tr, o, cs, ref_gpus)
    notes += ro.assumptions
    rep = _report(r, top.moment, [_plus(mo, extra) for mo in tr.moments], outside, host, ServeBlock(), notes,
                  reserved=max(p.reserved_bytes for p in phases), lifecycle=(table, used.name))
    return rep if ro.starts else rep.model_copy(update={"fits": False})


@dataclass(frozen=True)
class _Preference:
    """A preference trainer's pieces (TRL's DPOTrainer, analytic/dpo.py; KTOTrainer, analytic/kto.py; ORPOTrainer,
    analytic/orpo.py): its refusals,
    the step it runs, whether it loads a separate reference copy, and its report assumptions."""

    problems: Callable[[Scenario], list[Problem]]
    policy: Callable[[Scenario], Scenario]
    separate_reference: Callable[[Scenario], bool]
    assumptions: Callable[[Scenario], list[str]]


_DPO = _Preference(dpo.dpo_problems, dpo.policy_scenario, lambda s: dpo.reference_kind(s) == "separate",
                   dpo.dpo_assumptions)
# KTOTrainer.__init__ (TRL v1.16.0) has DPOTrainer's reference rule: none under PEFT, else a second copy
_KTO = _Preference(kto.kto_problems, kto.policy_scenario, lambda s: dpo.reference_kind(s) == "separate",
                   kto.kto_assumptions)
# ORPOTrainer (TRL v1.16.0, trl.experimental.orpo) loads no reference model
_ORPO = _Preference(orpo.orpo_problems, orpo.policy_scenario, lambda s: False, orpo.orpo_assumptions)


def _dpo_train(r: Resolved, reserved: ReservedModel, ctx: int, pref: _Preference = _DPO) -> Report:
    """A DPO, KTO or ORPO job (train.objective: dpo | kto | orpo): the policy's step with the reference forwards
    inside it (analytic/dpo.py, analytic/kto.py, analytic/orpo.py, analytic/terms/loss.py), and the reference copy,
    when TRL loads one, in every phase after the load (docs/rl.md).  The report echoes the scenario as given (DPO
    and ORPO: pairs, not sequences)."""
    if problems := pref.problems(r.scenario):
        raise ScenarioError(problems)
    pr = Resolved(pref.policy(r.scenario), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    c = tr.context
    assert c is not None and tr.layout is not None  # one pipeline stage (the problems refuse pp > 1)
    # DPOTrainer / KTOTrainer.__init__: create_model_from_path with the policy's model_init_kwargs: the policy's dtype
    ref = c.rp.total * c.pol.param_bytes if pref.separate_reference(pr.scenario) else 0
    extra = _rl_extra(ref, None)
    outside = {"cuda_context": ctx, "workspaces": 0, "communication": nccl_bytes(tr.communicators),
               "managed": tr.managed_bytes}
    res_bytes, how = _step_reserved(pr, tr, {**outside, "reference": ref}, reserved)
    job = job_lifecycle(c, tr.layout, tr.terms, tr.moments)
    steady = PhasePeak("training step", _plus(tr.peak, extra), res_bytes + ref)
    phases = [steady] + [_dpo_load(p, ref) if p.before_step else
                         PhasePeak(p.name, _plus(p.moment, extra), p.reserved_bytes + ref) for p in job.phases]
    phases.sort(key=lambda p: LIFECYCLE_ORDER.index(p.name))
    table = {p.name: _phase_row(p, outside, r.gpu.total_memory_bytes) for p in phases}
    top = max(phases, key=lambda p: (p.moment.total, p is steady))
    used = max(phases, key=lambda p: (table[p.name]["device_used_bytes"], p is steady))
    host = Host(offloaded_bytes=tr.host_bytes, nvme_bytes=tr.nvme_bytes, load_peak_bytes=job.host_load_bytes)
    notes = [*tr.assumptions, how, *job.assumptions, *pref.assumptions(r.scenario)]
    return _report(r, top.moment, [_plus(mo, extra) for mo in tr.moments], outside, host, ServeBlock(), notes,
                   reserved=max(p.reserved_bytes for p in phases), lifecycle=(table, used.name))


def _dpo_load(p: PhasePeak, ref: int) -> PhasePeak:
    """The load with DPO's (or KTO's) reference copy: DPOTrainer.__init__ (KTOTrainer.__init__ likewise) creates it
    after ``super().__init__`` (the Trainer)
    has put the policy on the GPU, so the copy's weights come on top of the policy's loaded parameters; the
    larger of that and the policy's own load peak."""
    if p.name != "load" or not ref:
        return p
    mo = Moment("load").add(K.PARAMETERS, p.moment.get(K.PARAMETERS)).add(K.REFERENCE_WEIGHTS, ref)
    return p if mo.total <= p.moment.total else PhasePeak("load", mo, packed_reserved(mo), True)


def _rl_extra(ref: int, ro: RolloutMemory | None) -> Moment:
    """What the reference model and the rollout engine hold on the GPU during the training step."""
    mo = Moment("").add(K.REFERENCE_WEIGHTS, ref)
    if ro is not None:
        held = ro.training_bytes
        mo.add(K.ROLLOUT_WEIGHTS, held["weights"]).add(K.ROLLOUT_KV, held["kv_cache"])
        mo.add(K.ROLLOUT_OTHER, held["other"])
    return mo


def _plus(mo: Moment, extra: Moment) -> Moment:
    """``mo`` with ``extra``'s parts added (the phase kept)."""
    out = mo.copy(mo.phase)
    for part, rows in extra.parts.items():
        for label, nbytes in rows.items():
            d = out.parts.setdefault(part, {})
            d[label] = d.get(label, 0) + nbytes
    return out


def _rollout_phase(tr: TrainResult, ref: int, ro: RolloutMemory | None,
                   gen: tuple[int, int, int] | None = None) -> PhasePeak:
    """The rollout: what the trainer keeps between steps (gradients set to None), the reference model, and the
    engine generating (its weights, KV cache, profiled peak, graphs and non-torch memory), or the policy's own
    generate call (``gen``: KV cache, other tensors, autocast weight copies; analytic/lifecycle/hf_rollout.py)."""
    mo = between_steps(tr.terms, "rollout").add(K.REFERENCE_WEIGHTS, ref)
    if gen is not None:
        mo.add(K.GENERATE_KV, gen[0]).add(K.GENERATE_TENSORS, gen[1]).add(K.GENERATE_CASTS, gen[2])
    if ro is not None:
        mo.add(K.ROLLOUT_WEIGHTS, ro.weights).add(K.ROLLOUT_KV, ro.kv_cache)
        mo.add(K.ROLLOUT_ACTIVATIONS, ro.activations).add(K.ROLLOUT_OTHER, ro.other)
    return PhasePeak("rollout", mo, packed_reserved(mo))


def _phase_row(p: PhasePeak, outside: dict[str, int], capacity_bytes: int) -> dict[str, int]:
    """A phase's allocated, reserved and device-used bytes (before the step: no communicators, workspaces
    outside the allocator yet; only the CUDA context)."""
    out = outside["cuda_context"] if p.before_step else sum(managed_in_capacity(outside, p.reserved_bytes,
                                                                                  capacity_bytes)[0].values())
    return {"allocated_bytes": p.moment.total, "reserved_bytes": p.reserved_bytes,
            "device_used_bytes": p.reserved_bytes + out}


def _llamacpp(r: Resolved, sr: ServeResult, d: LlamaCppDecision, ctx: int) -> Report:
    """llama.cpp's start-up (serve/llamacpp.py) as a report: its buffers, and what stays on the host."""
    block = ServeBlock(kv_cache_bytes=d.kv_bytes, max_concurrency=d.n_parallel if d.starts else 0,
                       max_model_len_that_fits=d.n_ctx_that_fits, weights_gpu_bytes=d.model_buffer_bytes,
                       weights_host_bytes=d.host_weights_bytes, compute_buffer_bytes=d.compute_buffer_bytes,
                       kv_cache_tokens=d.kv_size, engine="llamacpp",
                       weights_bytes=d.model_buffer_bytes,
                       host_bytes=d.host_weights_bytes + d.kv_host_bytes, starts=d.starts, start_problem=d.problem,
                       start_fix=d.fix)
    outside = {"cuda_context": ctx, "workspaces": 0, "communication": 0, "managed": 0}
    rep = _report(r, sr.peak, sr.moments, outside, Host(offloaded_bytes=d.host_weights_bytes + d.kv_host_bytes),
                  block, sr.assumptions, reserved=sr.peak.total)
    return rep if d.starts else rep.model_copy(update={"fits": False})


def _refuse_unmodelled(r: Resolved) -> None:
    """Raise what the analytic engine refuses for ``r`` (every problem at once), before any term is computed."""
    refused = (every_token_expert_problems(r.scenario, r.model) + linear_mixer_analytic_problems(r.scenario, r.model)
               + analytic_unmodelled_problems(r.scenario, r.model))
    if refused:
        raise ScenarioError(refused)


def _sizes_beyond(exc: OverflowError | RecursionError) -> ScenarioError:
    """The package's error for a combination of sizes the arithmetic cannot hold (the input bounds, spec/load.py and
    spec/hf_config.py MAX_SIZE, keep every byte count in 64 bits; should one still overflow, the caller gets this,
    not Python's error)."""
    return ScenarioError([Problem("scenario", f"sizes beyond what can be computed ({type(exc).__name__}: {exc})",
                                  "check the model's config.json and the scenario's counts")])


def train_step_walks(r: Resolved) -> StepWalks | None:
    """The steady step's term records of a plain training job (``analytic.train.step_walks``), which
    ``train_step_floor_bytes`` and ``estimate`` take so that a setup's floor and estimates make them once; None for
    a job of another kind.  Refuses what ``estimate`` refuses, with the same problems."""
    s = r.scenario
    if (s.task != "train" or s.effective_framework in ("verl", "openrlhf") or s.train.objective != "sft"):
        return None
    _refuse_unmodelled(r)
    try:
        return step_walks(r)
    except (OverflowError, RecursionError) as exc:
        raise _sizes_beyond(exc) from None


def train_step_floor_bytes(r: Resolved, walks: StepWalks | None = None) -> int | None:
    """A lower bound of a plain training job's ``device_used_bytes`` from its steady step alone (the planner's
    second screen, after ``plan/bound.py``'s static terms); None for a job of another kind.

    ``_train`` reports the maximum over the steady step and the job's other phases, with reserved bytes at least
    the steady step's peak moment, and device-used bytes = reserved + what ``managed_in_capacity`` keeps of the
    bytes outside the allocator, which grows with the reserved bytes; so the steady peak moment plus that is
    never above the estimate's figure.  It skips the moments' parts (``analytic.train.step_peak``: the totals
    only), the allocator model, the lifecycle phases, the report and the band.  Refuses what ``estimate``
    refuses, with the same problems.  ``walks``: ``train_step_walks(r)``, when made before."""
    if walks is None:
        walks = train_step_walks(r)
        if walks is None:
            return None
    try:
        peak, managed = step_peak(walks)
    except (OverflowError, RecursionError) as exc:
        raise _sizes_beyond(exc) from None
    outside = {"cuda_context": cuda_context_for(r.gpu).bytes, "workspaces": 0,
               "communication": nccl_bytes(communicators(r.scenario)), "managed": managed}
    kept, _ = managed_in_capacity(outside, peak, r.gpu.total_memory_bytes)
    return peak + sum(kept.values())


def estimate(source: str | Path | dict[str, Any] | Scenario | Resolved, reserved: ReservedModel = "replay",
             walks: StepWalks | None = None) -> Report:
    """Estimate per-GPU memory for a scenario (file path, mapping, Scenario or Resolved).

    ``reserved`` picks how a training step's reserved bytes are found: ``"replay"`` (default) runs
    the step's tensors, one by one in their order over two steps, through the caching-allocator
    model (``analytic/events.py``), so fragmentation left by earlier phases counts (4-13 ms for
    a new 7B-70B scenario: layer windows proven to repeat earlier ones are built, not replayed); ``"packed"`` packs only the tensors alive at the peak into empty segments (about
    1 ms, never above the replay's figure), which the planner uses to screen candidates before it
    confirms them with the replay.  Inference and serving always use the packing.  ``walks``: a plain training
    job's step term records from ``train_step_walks`` on the same ``Resolved`` (the planner's, made for its step
    floor), used instead of making them again.
    """
    try:
        return _estimate(source, reserved, walks)
    except (OverflowError, RecursionError) as exc:
        raise _sizes_beyond(exc) from None


def _estimate(source: str | Path | dict[str, Any] | Scenario | Resolved, reserved: ReservedModel,
              walks: StepWalks | None = None) -> Report:
    r = source if isinstance(source, Resolved) else resolve(source)
    _refuse_unmodelled(r)
    choice = cuda_context_for(r.gpu)
    ctx = choice.bytes
    task = r.scenario.task
    if task == "train":
        if r.scenario.effective_framework == "verl":
            return with_band(_verl_train(r, reserved, ctx))
        if r.scenario.effective_framework == "openrlhf":
            return with_band(_openrlhf_train(r, reserved, ctx))
        if r.scenario.train.objective == "dpo":
            return with_band(_dpo_train(r, reserved, ctx))
        if r.scenario.train.objective in ("kto", "orpo"):
            return with_band(_dpo_train(r, reserved, ctx, _KTO if r.scenario.train.objective == "kto" else _ORPO))
        if r.scenario.train.objective == "ppo":
            return with_band(_ppo_train(r, reserved, ctx))
        if r.scenario.train.objective != "sft":
            return with_band(_rl_train(r, reserved, ctx))
        return with_band(_train(r, reserved, ctx, walks))
    if task == "inference":
        # AutoAWQ's fused modules run their own attention and window cache (analytic/autoawq.py)
        ir = autoawq_step(r) if r.scenario.effective_framework == "autoawq" else generate_step(r)
        comm = nccl_bytes(1) if r.scenario.parallel.tp > 1 else 0
        outside = {"cuda_context": ctx, "workspaces": 0, "communication": comm, "managed": 0}
        cached = max(_reserved(ir.peak), ir.peak.total + ir.fragmentation_bytes)
        return with_band(_report(r, ir.peak, ir.moments, outside, Host(), ServeBlock(), ir.assumptions,
                                 reserved=cached))
    sr = serve(r)
    if isinstance(sr.decision, LlamaCppDecision):
        return with_band(_llamacpp(r, sr, sr.decision, ctx))
    block = ServeBlock(kv_cache_bytes=sr.kv_cache_bytes, num_gpu_blocks=sr.num_gpu_blocks,
                       max_concurrency=sr.max_concurrency, max_model_len_that_fits=sr.max_model_len_that_fits,
                       engine=sr.engine, weights_bytes=sr.weights_bytes, kv_cache_tokens=sr.kv_cache_tokens,
                       starts=sr.starts, start_problem=sr.problem, start_fix=sr.fix,
                       start_risk=sr.start_risk, start_risk_fix=sr.start_risk_fix)
    # the engine reserves what it profiled (vLLM) and the KV pool up front: reserved == allocated at the peak
    rep = _report(r, sr.peak, sr.moments, sr.outside, Host(), block, sr.assumptions, reserved=sr.peak.total)
    # a server that refuses to start does not fit, whatever the byte count says
    rep = rep if sr.starts else rep.model_copy(update={"fits": False})
    return with_band(rep, blocks_per_request=sr.blocks_per_request, kv_unmodelled_bytes=sr.kv_unmodelled_bytes)
