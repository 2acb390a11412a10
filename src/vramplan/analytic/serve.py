"""Serving with vLLM: how much KV cache the engine allocates, and what that buys.

Modelled on vLLM's V1 engine (0.10-0.11 ``gpu_worker.determine_available_memory``):

    requested   = gpu_memory_utilization * total_memory
    non_kv      = weights + profile-run activation peak + non-torch increase
    kv_cache    = requested - non_kv
    num_blocks  = kv_cache // (block_size * kv bytes per token over all layers)

The profile run pushes ``max_num_batched_tokens`` tokens through the model; its peak is
the fused gated MLP (gate_up output 2I, SiluAndMul output I, per token, in the model
dtype) plus the residual and hidden states (2h), and the sampler's fp32 logits for
``max_num_seqs`` sequences.  CUDA graphs are captured after the KV cache is allocated
and are not inside ``gpu_memory_utilization`` in these versions.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic.kv_cache import kv_elem_bytes, layer_kv_bytes_per_token
from vramplan.analytic.layout import rank_params
from vramplan.analytic.overhead import nccl_bytes
from vramplan.analytic.train import Moment
from vramplan.analytic.weights import weights_bytes
from vramplan.spec.load import Resolved
from vramplan.units import ceil_div, dtype_bits

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass
class ServeResult:
    peak: Moment
    moments: list[Moment]
    kv_cache_bytes: int
    num_gpu_blocks: int
    max_concurrency: int
    max_model_len_that_fits: int
    requested_bytes: int
    non_kv_bytes: int
    max_model_len: int
    assumptions: list[str]


def serve(r: Resolved) -> ServeResult:
    s, m, gpu = r.scenario, r.model, r.gpu
    sv, tp = s.serve, s.parallel.tp
    c = dtype_bits(sv.dtype) // 8
    rp = rank_params(m, tp, s.parallel.pp, s.parallel.ep, 0, None)
    weights = weights_bytes(rp, c, sv.quantization)
    tokens = sv.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if m.moe is not None:
        inter = ceil_div(m.moe.expert_intermediate_size * m.moe.top_k + m.moe.shared_intermediate_size, tp)
    else:
        inter = ceil_div(max(ls.intermediate_size for ls in m.layers), tp)
    act = (3 * inter + 2 * m.hidden_size) * tokens * c
    sampler = sv.max_num_seqs * ceil_div(m.vocab_size, tp) * 4 * 2  # fp32 logits and probabilities
    activation_peak = act + sampler
    non_torch = nccl_bytes(1) if tp > 1 else 0
    requested = int(sv.gpu_memory_utilization * gpu.total_memory_bytes)
    non_kv = weights + activation_peak + non_torch
    kv = max(0, requested - non_kv)
    elem = kv_elem_bytes(sv.kv_cache_dtype, c)
    per_token_layer = layer_kv_bytes_per_token(m, elem, tp, sv.kv_cache_dtype)
    layers = m.num_layers
    block_bytes = sv.block_size * per_token_layer * layers
    blocks = kv // block_bytes if block_bytes else 0
    max_len = sv.max_model_len or m.max_position_embeddings
    tokens_capacity = blocks * sv.block_size
    # Sliding-window layers need at most window tokens; vLLM's hybrid allocator (V1) exploits this.
    concurrency = tokens_capacity // max_len if max_len else 0
    fits_len = min(tokens_capacity, m.max_position_embeddings)
    peak = Moment("serve")
    peak.add("weights", "parameters", weights)
    peak.add("kv_cache", "paged blocks", blocks * block_bytes)
    peak.add("activations", "profile run", activation_peak)
    assumptions = [
        "vLLM V1 (0.10-0.11) memory accounting: KV = utilization * total - weights - profile peak - non-torch",
        f"profile run of {tokens} batched tokens and {sv.max_num_seqs} sampled sequences",
        "CUDA graph memory is captured after the KV cache and is outside gpu_memory_utilization",
        "serving model is approximate until the serving engine lands (sliding windows not exploited)",
    ]
    return ServeResult(peak, [peak], blocks * block_bytes, blocks, concurrency, fits_len, requested, non_kv,
                       max_len, assumptions)
