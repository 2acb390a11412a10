"""Serving with vLLM, as the estimate reports it: vLLM's start-up decision as one moment.

The decision itself (requested memory, profile-run peak, available KV bytes, blocks,
concurrency, the largest ``max_model_len`` that fits, and vLLM's start-up errors) lives in
``vramplan.serve.vllm``; this module turns it into the report's moment and serve block
(``vramplan.engine.estimate`` builds the report).

At steady state the GPU holds the weights, the KV-cache blocks, room for the activation
peak vLLM profiled (re-used by every step), the captured CUDA graphs, and outside the
allocator the CUDA context, the non-torch increase of the first forward pass and, with
tp > 1, NCCL's buffers.  ``fits`` is False when vLLM would refuse to start.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic.moment import K, Moment
from vramplan.serve.vllm import VllmDecision, decide
from vramplan.spec.load import Resolved

__all__ = ["ServeResult", "serve"]


@dataclass
class ServeResult:
    peak: Moment
    moments: list[Moment]
    decision: VllmDecision
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


def serve(r: Resolved, version: str | None = None, subtract_cudagraphs: bool = False) -> ServeResult:
    """The serving memory of one GPU of a ``task: serve`` scenario, as vLLM allocates it.

    ``version`` overrides the scenario's ``serve.vllm_version``."""
    d = decide(r, version=version or r.scenario.serve.vllm_version, subtract_cudagraphs=subtract_cudagraphs)
    peak = Moment("serve")
    peak.add(K.PARAMETERS, d.parameters_bytes)
    peak.add(K.ROTARY_CACHE, d.rotary_cache_bytes)
    peak.add(K.KV_BLOCKS, d.kv_cache_bytes, blocks=d.num_gpu_blocks, block_size=d.block_size)
    if d.sampler_peak_bytes >= d.forward_peak_bytes:
        peak.add(K.PROFILE_SAMPLER, d.sampler_peak_bytes)
    else:
        peak.add(K.PROFILE_FORWARD, d.forward_peak_bytes)
    peak.add(K.CUBLAS, d.cublas_workspace_bytes)
    peak.add(K.CUDA_GRAPHS, d.cudagraph_bytes)
    outside = {"cuda_context": d.cuda_context_bytes, "workspaces": d.non_torch_bytes,
               "communication": d.nccl_bytes, "managed": 0}
    assumptions = list(d.assumptions)
    if d.problem:
        assumptions.insert(0, f"vLLM would not start: {d.problem}" + (f" (change {d.fix})" if d.fix else ""))
    return ServeResult(
        peak=peak, moments=[peak], decision=d, outside=outside, kv_cache_bytes=d.kv_cache_bytes,
        num_gpu_blocks=d.num_gpu_blocks, max_concurrency=int(d.max_concurrency),
        max_model_len_that_fits=d.max_model_len_that_fits, requested_bytes=d.requested_bytes,
        non_kv_bytes=d.non_kv_bytes, max_model_len=d.max_model_len, starts=d.starts, assumptions=assumptions,
    )
