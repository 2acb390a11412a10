"""The traced engine: resolve a scenario, trace one step on the meta device, report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.terms.encoder_decoder import source_len_note
from vramplan.catalog.resolve import resolve
from vramplan.errors import Problem, ScenarioError
from vramplan.report import Report
from vramplan.spec.checks import ignored_sections, unused_settings
from vramplan.spec.fields import changed_fields
from vramplan.spec.load import Resolved
from vramplan.spec.scenario import Scenario, Train
from vramplan.trace.fsdp import fake_world, fsdp_traced, world_shape
from vramplan.trace.parallel import apply_parallel
from vramplan.trace.report import to_report
from vramplan.trace.step import StepTrace, trace_inference, trace_train
from vramplan.trace.tensor import tp_traced, tp_world

__all__ = ["estimate", "trace"]


def _untraced_train_options(t: Train) -> list[Problem]:
    """The training options the traced engine cannot run (each refused with its reason): the loss kernels,
    Liger's kernels (triton, a GPU), activation offloading (CUDA streams and pinned host memory)."""
    out = [p for p in (_untraced_loss(t.loss),) if p is not None]
    if t.objective != "sft":
        # the traced step is transformers' causal-LM loss over the whole sequence; GRPO's completion-only loss,
        # its reference model and its rollout engine are the analytic engine's (analytic/grpo.py, serve/rollout.py)
        out.append(Problem("train.objective", f"objective {t.objective} is not traced (the trace runs the SFT "
                           "step only)", "use --engine analytic"))
    if t.liger_kernels:
        out.append(Problem("train.liger_kernels", "Liger's kernels are not traced: they are triton kernels, which "
                           "need a GPU and do not run on the meta device", "use --engine analytic"))
    if t.activation_offload != "none":
        out.append(Problem("train.activation_offload", "activation offloading is not traced: its hooks copy to pinned "
                           "host memory on a CUDA stream, which the meta device has not", "use --engine analytic"))
    if t.torchao_cpu_offload != "none":
        out.append(Problem("train.torchao_cpu_offload", "torchao's CPUOffloadOptimizer is not traced: it needs a CUDA "
                           "device, streams and pinned host memory (and torchao, not installed beside vramplan)",
                           "use --engine analytic"))
    return out


def _untraced_loss(loss: str) -> Problem | None:
    """The loss kernels the traced engine cannot run: Liger's and CCE's are triton kernels (a GPU, no meta
    tensors); torchtune's chunked loss needs torchtune's model (``chunked_output``), not transformers'."""
    if loss in ("liger-fused-linear-ce", "cut-cross-entropy"):
        return Problem("train.loss", f"loss {loss} is not traced: its kernels are triton kernels, which need a "
                       "GPU and do not run on the meta device", "use --engine analytic, or trace loss: standard")
    if loss == "chunked":
        return Problem("train.loss", "loss chunked is not traced: torchtune's CEWithChunkedOutputLoss reads the "
                       "chunked logits of torchtune's own model, and the traced engine builds transformers' model",
                       "use --engine analytic, or trace loss: standard")
    return None


def trace(source: str | Path | dict[str, Any] | Scenario | Resolved) -> tuple[Resolved, StepTrace]:
    """Resolve and trace; the raw events (for timelines and tests)."""
    r = source if isinstance(source, Resolved) else resolve(source)
    task = r.scenario.task
    if task == "serve":
        raise ScenarioError([Problem("task", "the traced engine covers train and inference",
                                     "use --engine analytic for serve (vLLM)")])
    if r.scenario.effective_framework == "autoawq":
        # the trace builds transformers' model on the meta device; AutoAWQ's fused blocks (their window cache, RoPE
        # tables, explicit-score attention) need its CUDA kernels and are not built there
        raise ScenarioError([Problem("framework", "the traced engine does not build AutoAWQ's fused modules "
                                     "(QuantAttentionFused's window cache and explicit scores need AutoAWQ's CUDA "
                                     "kernels, which do not run on the meta device)",
                                     "use --engine analytic (analytic/autoawq.py)")])
    vision = r.model.vision
    if vision is not None and vision.cross_attention_tokens_per_image:
        # spec.families.transformers_config builds a multimodal config's language model alone: for mllama
        # MllamaForCausalLM, whose cross-attention layers are skipped without images, so the trace would drop the
        # images' cache and the vision model without a word
        raise ScenarioError([Problem("engine", f"the traced engine does not build {r.model.name}'s cross-attention "
                                     "vision model: it would trace the language model alone (MllamaForCausalLM), "
                                     "without the vision model and the cross-attention layers' cache of the images",
                                     "use --engine analytic (analytic/cross_attention.py)")])
    if r.model.encoder_decoder is not None and task != "train":
        # the trace runs its own generate loop of a causal LM; an encoder-decoder model's encoder pass and
        # cross-attention cache are not traced (its training step is: trace/step.py trace_train)
        raise ScenarioError([Problem("engine", f"the traced engine does not run generate for {r.model.name}, an "
                                     "encoder-decoder model: it traces a causal LM's generate only (and the "
                                     "training step of both)", "use --engine analytic "
                                     "(analytic/encoder_decoder.py)")])
    if task == "inference" and r.scenario.inference.num_beams > 1:
        # the trace runs its own greedy loop (trace/step.py trace_inference); beam search's log-probabilities, its
        # token and index buffers and the cache reorder are the analytic engine's (analytic/inference.py)
        raise ScenarioError([Problem("inference.num_beams", "beam search is not traced: the trace runs a greedy "
                                     "loop of one sequence per prompt",
                                     "use --engine analytic (analytic/inference.py beam_state_bytes)")])
    par = r.scenario.parallel
    if max(par.pp, par.cp, par.ep) > 1:
        raise ScenarioError([Problem("parallel", "pipeline, context and expert parallelism are not traced",
                                     "use --engine analytic for pp/cp/ep > 1")])
    if task == "train" and (problems := _untraced_train_options(r.scenario.train)):
        raise ScenarioError(problems)
    if task == "train" and r.scenario.software.unsloth is not None:
        raise ScenarioError([Problem("software.unsloth", "Unsloth's patched model is not traced: its forward and "
                                     "loss are triton kernels, which need a GPU and the unsloth package",
                                     "use --engine analytic")])
    if tp_traced(r):
        try:
            with tp_world(r) as tensor:
                if task != "train":
                    return r, trace_inference(r, tensor=tensor)
                return r, trace_train(r, tensor=tensor)
        except (RuntimeError, KeyError, AssertionError, TypeError, NotImplementedError) as exc:
            # the model's own code under DTensor on meta tensors can fail where the real run does not (transformers
            # 5.24's apply_tensor_parallelism looks a tied head's weight up as a module: KeyError 'lm_head.weight';
            # a quantized base's shards meet unsharded tensors): the trace answers with the reason, never a traceback
            raise ScenarioError([Problem("parallel.tp", f"tensor parallelism could not be traced for {r.model.name} "
                                         f"({_first_line(exc)})",
                                         "use --engine analytic (tensor parallelism is estimated there)")]) from None
    if task != "train":
        return r, trace_inference(r)
    if fsdp_traced(r):
        try:
            with fake_world(world_shape(r)) as world:
                return r, trace_train(r, world=world)
        except (RuntimeError, AssertionError, TypeError, NotImplementedError) as exc:
            # a model (or a torch version) fully_shard does not run on meta tensors: derive the rank
            st = trace_train(r)
            st.notes.append(f"FSDP2 could not be traced for this model ({_first_line(exc)}); "
                            "sharding derived from the single-GPU trace instead")
            return r, st
    return r, trace_train(r)


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters of it), for a note or a problem."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def estimate(source: str | Path | dict[str, Any] | Scenario | Resolved) -> Report:
    return report_and_trace(source)[0]


def report_and_trace(source: str | Path | dict[str, Any] | Scenario | Resolved,
                     top: int = 10) -> tuple[Report, dict[str, Any]]:
    """The report and the timeline data (live bytes by category, the peak, its largest blocks)."""
    from vramplan.trace.timeline import timeline

    r, st = trace(source)
    events, marks, communicators, host, notes = apply_parallel(r, st)
    assumptions = _assumptions(r, st, notes)
    report = to_report(r, events, marks, assumptions, managed_bytes=st.managed_bytes,
                       communicators=communicators, host=host)
    return report, timeline(events, marks, top=top)


def _assumptions(r: Resolved, st: StepTrace, notes: list[str]) -> list[str]:
    s = r.scenario
    out = [("traced on the meta device: the real transformers/peft/torch code of one step, every tensor storage "
            "followed from allocation to release")]
    kernels = sorted({c.backend for c in st.sdpa})
    if kernels:
        cap = r.gpu.compute_capability or "9.0"
        out.append(f"attention kernel: {', '.join(kernels)} (as PyTorch's SDPA dispatcher picks on sm{cap.replace('.', '')})")
    if s.task == "train":
        out.append("steady-state step: optimizer states exist; gradients are set to None after the step")
        out.append("sequences are full length (no padding); MoE routing cost does not depend on balance "
                   "(grouped GEMM) or is balanced")
        if s.effective_framework in ("hf-trainer", "accelerate"):
            out.append("accelerate's autocast wrapper converts half outputs to fp32; gradients clipped to norm 1.0")
        if deepspeed_zero(s):
            out.append("not modelled by the traced engine: DeepSpeed ZeRO's own memory (its reduce buckets, ZeRO-3's "
                       "module-by-module fetching with stage3_prefetch_bucket_size, stage3_max_live_parameters, "
                       "stage3_max_reuse_distance and persistent parameters, its resident gradient partition; "
                       "parallel.deepspeed): ZeRO-3 is traced as FSDP2 (trace/fsdp.py); `vramplan estimate` models them")
    out.append("CUDA context 400 MiB; cuBLAS workspaces as analytic/overhead.py")
    if r.model.vision is not None:
        # spec.families.transformers_config builds the language model of a multimodal config alone
        out.append(f"not modelled: the vision tower and projector ({r.model.vision_parameters:,} parameters) and "
                   "the images: the traced engine builds and traces the language model alone (the vision tower's "
                   "weights and activations in this report's assumptions are the analytic engine's)")
    if held := r.model.traits.held_modules:
        # Qwen3-Omni: transformers_config builds the Thinker's language model alone (Family.nested_config)
        count = sum(p.total for p in r.model.params if p.name.startswith(tuple(prefix for prefix, _ in held)))
        logits = (" and the logits of every prompt position" if s.task == "inference" else "")
        out.append(f"not modelled: {', '.join(what for _, what in held)} ({count:,} parameters){logits}: the traced "
                   "engine builds the language model alone as a causal LM"
                   + (", whose generate computes the last position's logits only" if logits else "")
                   + " (the analytic engine counts " + ("both)" if logits else "their weights)"))
    out.extend(st.notes)
    out.extend(notes)
    if s.task == "train":
        out.extend(source_len_note(s.train.source_len, r.model))
    from vramplan.catalog.gpus import bare_name_note

    if s.hardware.gpu and (note := bare_name_note(s.hardware.gpu)):
        out.append(note)
    return list(dict.fromkeys([*out, *ignored_sections(s), *unused_settings(s), *_lifecycle_not_traced(s)]))


def _lifecycle_not_traced(s: Scenario) -> list[str]:
    """The job's phases around the step (load, evaluation, save) are the analytic engine's; lifecycle keys
    given to a traced training step describe phases this report leaves out (docs/conventions.md, No silent
    inputs).  Keys at their default say nothing, so reports that give none are unchanged."""
    if s.task != "train":
        return []  # unused_settings states them for the other tasks
    given = [f"lifecycle.{k}" for k in changed_fields(s.lifecycle)]
    return [(f"not modelled: {', '.join(given)} by the traced engine (it traces the steady step; `vramplan estimate` "
             "gives the job's load, evaluation and save phases)")] if given else []
