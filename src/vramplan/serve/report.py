"""Serving, as the estimate reports it: the engine's start-up decision as one moment.

``serve.engine`` picks the engine (dispatch in ``serve``): vLLM (``vramplan.serve.vllm``:
requested memory, profile-run peak, available KV bytes, blocks, concurrency, the largest
``max_model_len`` that fits, vLLM's start-up errors) or SGLang (``vramplan.serve.sglang``:
``mem_fraction_static`` of the free memory, the token pool, SGLang's errors) or llama.cpp
(``vramplan.serve.llamacpp``: model, KV and compute buffers; also chosen when llama.cpp's options
are set, which ``decide`` then refuses for another engine).  This module turns the decision into the
report's moment and serve block (``vramplan.engine.estimate`` builds the report); every engine fills
the same ``ServeResult``.  ``serve_outcome`` and ``serve_document`` are what ``vramplan serve`` and the
web page's ``/api/serve`` show: one dispatch point for the three engines.

At steady state the GPU holds the weights, the KV-cache blocks, room for the activation
peak vLLM profiled (re-used by every step), the captured CUDA graphs, and outside the
allocator the CUDA context, the non-torch increase of the first forward pass and, with
tp > 1, NCCL's buffers.  ``fits`` is False when vLLM would refuse to start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vramplan.analytic.moment import K, Moment
from vramplan.errors import Problem, ScenarioError
from vramplan.serve.llamacpp import LlamaCppDecision, uses_other_engine
from vramplan.serve.llamacpp import decide as decide_llamacpp
from vramplan.serve.llamacpp import moment as llamacpp_moment
from vramplan.serve.sglang import SglangDecision, decide_sglang
from vramplan.serve.vllm import VllmDecision, decide
from vramplan.spec.load import Resolved
from vramplan.units import ceil_div

__all__ = ["ServeResult", "serve", "serve_document", "serve_outcome"]


@dataclass
class ServeResult:
    peak: Moment
    moments: list[Moment]
    decision: VllmDecision | SglangDecision | LlamaCppDecision
    outside: dict[str, int]
    kv_cache_bytes: int
    num_gpu_blocks: int
    max_concurrency: int
    max_model_len_that_fits: int
    requested_bytes: int
    non_kv_bytes: int
    max_model_len: int
    starts: bool
    assumptions: list[str]
    engine: str = "vllm"
    weights_bytes: int = 0
    kv_cache_tokens: int = 0
    blocks_per_request: int = 0  # KV blocks (pages) one request of max_model_len needs
    problem: str = ""
    fix: str = ""
    # starts by the point estimate, but may not: what could run out of memory, and the change that avoids it
    # (vLLM: the CUDA-graph capture after the KV cache, serve/vllm.py _start_risk)
    start_risk: str = ""
    start_risk_fix: str = ""
    # an upper bound of what the KV pool may lose to a part of the start-up that is not modelled (vLLM: a
    # multimodal profile run, serve/vllm_mm.py encoder_bound): lowers the KV band's low end (report/band.py)
    kv_unmodelled_bytes: int = 0


def serve(r: Resolved, version: str | None = None, subtract_cudagraphs: bool = False) -> ServeResult:
    """The serving memory of one GPU of a ``task: serve`` scenario, as ``serve.engine`` allocates it.

    ``version`` overrides the scenario's ``serve.vllm_version`` (vLLM only); ``subtract_cudagraphs``
    (``--subtract-cudagraphs``) is an option of vLLM only."""
    engine = r.scenario.serve.engine
    if subtract_cudagraphs and engine != "vllm":
        raise ScenarioError([Problem("--subtract-cudagraphs", "is an option of engine vllm only",
                                     "SGLang keeps CUDA graphs in the reserve outside mem_fraction_static")])
    if uses_other_engine(r):
        return _llamacpp(r)
    if engine == "sglang":
        return _sglang(r)
    if engine != "vllm":
        raise ScenarioError([Problem("serve.engine", f"the {engine} engine is not modelled yet",
                                     "use engine vllm, sglang or llamacpp")])
    return _vllm(r, version, subtract_cudagraphs)


def serve_outcome(r: Resolved, subtract_cudagraphs: bool = False) -> ServeResult:
    """``serve`` as ``vramplan serve`` and ``/api/serve`` show it: the vLLM or SGLang decision with what the
    GPU's generation changes (``spec.checks.capability_notes``: bf16 before Ampere, say) and the settings it
    does not read (``unused_settings``) after its own assumptions; llama.cpp's decision as it is."""
    from vramplan.spec.checks import capability_notes, unused_settings

    sr = serve(r, subtract_cudagraphs=subtract_cudagraphs)
    if isinstance(sr.decision, LlamaCppDecision):
        return sr
    # settings the engine does not read, as the estimate's report states them (docs/conventions.md, No silent inputs)
    notes = [*capability_notes(r.scenario, r.gpu), *unused_settings(r.scenario)]
    return replace(sr, decision=replace(sr.decision, assumptions=[*sr.decision.assumptions, *notes]))


def serve_document(sr: ServeResult) -> dict[str, Any]:
    """The ``vramplan serve --json`` document (also ``/api/serve``'s) of a ``serve_outcome``: the engine's
    decision under its name, whether it fits (starts, and the device holds it) and, for llama.cpp, the log
    lines it would print, else the breakdown, memory outside the allocator and the engine's name."""
    d = sr.decision
    fits = d.starts and d.device_used_bytes + d.in_use_by_others_bytes <= d.total_memory_bytes
    if isinstance(d, LlamaCppDecision):
        return {"llamacpp": d.to_dict(), "log_lines": d.log_lines(), "fits": fits}
    doc = {sr.engine: d.to_dict(), "breakdown": {k: dict(v) for k, v in sr.peak.parts.items()},
           "outside_allocator": sr.outside, "fits": fits, "engine": sr.engine}
    if sr.start_risk:
        # beside "fits" (the point estimate's answer): the start-up may still run out of memory
        doc["may_not_start"] = True
    return doc


def _llamacpp(r: Resolved) -> ServeResult:
    """llama.cpp's buffers as the report's moment: the GPU model buffer, KV buffer and compute buffer; the
    CUDA context outside them.  It starts with a fixed ``n_ctx`` (no pool sized to fill the device)."""
    d = decide_llamacpp(r)
    peak = llamacpp_moment(d)
    outside = {"cuda_context": d.cuda_context_bytes, "workspaces": 0, "communication": 0, "managed": 0}
    problem = [f"llama.cpp would not start: {d.problem} (change {d.fix})"] if d.problem else []
    return ServeResult(
        peak=peak, moments=[peak], decision=d, outside=outside, kv_cache_bytes=d.kv_bytes, num_gpu_blocks=0,
        max_concurrency=d.n_parallel if d.starts else 0, max_model_len_that_fits=d.n_ctx_that_fits,
        requested_bytes=peak.total, non_kv_bytes=d.model_buffer_bytes + d.compute_buffer_bytes,
        max_model_len=d.kv_size, starts=d.starts, assumptions=[*problem, *d.assumptions], engine="llamacpp",
        weights_bytes=d.model_buffer_bytes, kv_cache_tokens=d.kv_size, problem=d.problem, fix=d.fix,
    )


def _vllm(r: Resolved, version: str | None, subtract_cudagraphs: bool) -> ServeResult:
    d = decide(r, version=version or r.scenario.serve.vllm_version, subtract_cudagraphs=subtract_cudagraphs)
    peak = Moment("serve")
    # the same terms as VllmDecision.device_used_bytes: the parameters less what cpu_offload_gb keeps on the host,
    # the LoRA slots (inside the budget or not) and the proposer's weights and buffers
    peak.add(K.PARAMETERS, d.parameters_bytes - d.cpu_offload_bytes)
    peak.add(K.ROTARY_CACHE, d.rotary_cache_bytes)
    peak.add(K.LORA_SLOTS, d.lora_bytes)
    peak.add(K.PROPOSER_WEIGHTS, d.speculative_weights_bytes)
    peak.add(K.KV_BLOCKS, d.kv_cache_bytes, blocks=d.num_gpu_blocks, block_size=d.block_size)
    peak.add(K.PROPOSER_BUFFERS, d.speculative_buffers_bytes)
    # the rejection sampler runs inside the dummy sampler run, the proposer's forward inside the dummy forward
    sampler = max(d.sampler_peak_bytes, d.rejection_sampler_peak_bytes)
    forward = max(d.forward_peak_bytes, d.proposer_forward_peak_bytes)
    if sampler >= forward:
        peak.add(K.PROFILE_SAMPLER, sampler)
    else:
        peak.add(K.PROFILE_FORWARD, forward)
    peak.add(K.CUBLAS, d.cublas_workspace_bytes)
    peak.add(K.CUDA_GRAPHS, d.cudagraph_bytes)
    # communication: NCCL's buffers and, at tp > 1, the all-reduce buffers (facts/vllm_tp_comm.py)
    outside = {"cuda_context": d.cuda_context_bytes, "workspaces": d.non_torch_bytes,
               "communication": d.nccl_bytes + d.tp_comm_bytes, "managed": 0}
    assumptions = list(d.assumptions)
    if d.problem:
        assumptions.insert(0, f"vLLM would not start: {d.problem}" + (f" (change {d.fix})" if d.fix else ""))
    elif d.start_risk:
        assumptions.insert(0, f"{d.start_risk} (change {d.start_risk_fix})")
    return ServeResult(
        peak=peak, moments=[peak], decision=d, outside=outside, kv_cache_bytes=d.kv_cache_bytes,
        num_gpu_blocks=d.num_gpu_blocks, max_concurrency=int(d.max_concurrency),
        max_model_len_that_fits=d.max_model_len_that_fits, requested_bytes=d.requested_bytes,
        non_kv_bytes=d.non_kv_bytes, max_model_len=d.max_model_len, starts=d.starts, assumptions=assumptions,
        engine="vllm", weights_bytes=d.weights_bytes, kv_cache_tokens=d.kv_cache_tokens,
        blocks_per_request=d.blocks_per_request, problem=d.problem, fix=d.fix, start_risk=d.start_risk,
        start_risk_fix=d.start_risk_fix, kv_unmodelled_bytes=d.encoder_bound_bytes,
    )


def _sglang(r: Resolved) -> ServeResult:
    """SGLang's start-up as the report's moment: weights, the token pool and the request-to-token table.

    Activations and CUDA graphs live in the reserve SGLang leaves outside ``mem_fraction_static``; SGLang
    does not profile them and neither does this model (an assumption of the decision)."""
    d = decide_sglang(r)
    peak = Moment("serve")
    peak.add(K.PARAMETERS, d.parameters_bytes)
    peak.add(K.ROTARY_CACHE, d.rotary_cache_bytes)
    peak.add(K.PROPOSER_WEIGHTS, d.draft_weights_bytes)
    peak.add(K.KV_BLOCKS, d.kv_cache_bytes, blocks=d.num_pages, block_size=d.page_size)
    peak.add(K.DRAFT_KV, d.draft_kv_bytes)
    peak.add(K.REQ_TO_TOKEN, d.req_to_token_bytes)
    outside = {"cuda_context": d.cuda_context_bytes, "workspaces": 0, "communication": d.nccl_bytes, "managed": 0}
    assumptions = list(d.assumptions)
    if d.problem:
        assumptions.insert(0, f"SGLang would not start: {d.problem}" + (f" (change {d.fix})" if d.fix else ""))
    largest = min(r.model.max_position_embeddings, d.max_total_num_tokens)
    return ServeResult(
        peak=peak, moments=[peak], decision=d, outside=outside, kv_cache_bytes=d.kv_cache_bytes,
        num_gpu_blocks=d.num_pages, max_concurrency=int(d.max_concurrency), max_model_len_that_fits=largest,
        requested_bytes=d.static_budget_bytes, non_kv_bytes=d.weights_bytes, max_model_len=d.context_len,
        starts=d.starts, assumptions=assumptions, engine="sglang", weights_bytes=d.weights_bytes,
        kv_cache_tokens=d.max_total_num_tokens, blocks_per_request=ceil_div(d.context_len, d.page_size),
        problem=d.problem, fix=d.fix,
    )
