"""How vLLM decides its KV cache at start-up, term by term.

Modelled: every vLLM release from 0.6 to 0.33 (``serve.vllm_version``, default ``"0.11"``), each
by its row of ``facts/vllm_releases.py`` (``behaviour``): the budget rule (what
``gpu_memory_utilization x total`` is charged with), the default batch limits, an eager (V0) or
compiled (V1) profile run, the sampler, whether the CUDA-graph estimate is subtracted, and which
options the release has.  The options that change the budget (``kv_cache_memory_bytes``,
``cpu_offload_gb``, LoRA slots, a speculative proposer) are checked and sized in ``_options``.
The decision of the V1 releases from 0.9.1 (V0 from 0.6.5 is the same sum), following
``vllm/v1/worker/gpu_worker.py`` (``init_device`` and ``determine_available_memory``) and
``vllm/utils/mem_utils.py`` (``memory_profiling``):

1. After the CUDA context and NCCL are initialised, a snapshot is taken and
   ``requested = gpu_memory_utilization * total_memory`` (from 0.11.0; 0.9.1-0.10.x take it before
   NCCL and the all-reduce buffers, which then come out of the budget: ``facts/vllm_tp_comm.py``).  If less than that is free,
   start-up fails ("Free memory on device ... is less than desired GPU memory utilization").
2. The weights are loaded (``model_memory_usage``): parameters in their stored formats
   plus the rotary cos/sin cache (``max_position_embeddings x rotary_dim`` in the model
   dtype, one buffer shared by all layers).
3. ``profile_run`` pushes ``max_num_batched_tokens`` dummy tokens (spread over
   ``min(max_num_seqs, max_num_batched_tokens)`` dummy requests) through the model with
   attention skipped (no KV cache exists yet), then samples one token per request.  The
   torch peak increase is the larger of the forward pass peak and the sampler peak.
4. ``non_kv = weights + torch peak increase + non-torch increase``; the KV cache gets
   ``available = requested - non_kv``.  CUDA graphs are captured after the KV cache is
   allocated and are *outside* ``gpu_memory_utilization`` in these versions (newer ones
   subtract an estimate when ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is set; the
   ``subtract_cudagraphs`` option models that).  Their bytes come from the capture mechanism
   with a band (``serve/cudagraphs.py``); when the room left outside the budget holds the
   expected bytes but not the band's high end, the decision says vLLM *may not start*
   (``_start_risk``).
5. ``vllm/v1/core/kv_cache_utils.py``: layers are grouped by attention type (one group for
   uniform models; equal-size groups of full and sliding-window layers for hybrids), a
   block holds ``block_size`` tokens of one layer (the page), and
   ``num_gpu_blocks = available // page // layers_per_group``.  "GPU KV cache size" is
   ``num_gpu_blocks // groups * block_size`` tokens; the maximum concurrency divides the
   blocks by those one request of ``max_model_len`` needs; if one request does not fit,
   start-up fails with the needed and available GiB and a binary-searched estimate of the
   largest ``max_model_len`` that fits.

Pipeline parallelism (V1): every rank runs steps 1-5 over its own layers (``pp_stage_layers``) and the engine keeps
the fewest blocks of any rank (``decide``; docs/serving.md).

Worked example (vLLM 0.19.0 log, Llama-3.1-8B on an H100, utilisation 0.95): requested
0.95 * 79.19 GiB = 75.23 GiB; weights 14.99 GiB; torch peak 1.89 GiB; non-torch 0.25 GiB;
KV 58.11 GiB; page 16 * 4,096 B = 65,536 B, 32 layers -> 2 MiB per block -> 29,751 blocks
= 476,016 tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from vramplan.analytic.kv_cache import KVSpec, attention_layers, kv_spec
from vramplan.analytic.layout import RankParams, rank_params
from vramplan.analytic.overhead import cublas_workspace_bytes, cuda_context_bytes, nccl_bytes
from vramplan.analytic.weights import weights_bytes
from vramplan.catalog.models import load_model, model_config
from vramplan.errors import Problem, ScenarioError, VramplanError
from vramplan.facts.quantization import quant_format
from vramplan.facts.vllm_cudagraphs import USER_MAX_FROM, USER_MODE_FROM
from vramplan.facts.vllm_mla import ABSORB_FROM, ABSORB_UNTIL, KV_B_FP32_UNTIL
from vramplan.facts.vllm_mtp import (
    MTP_HEAD_SHARED_FROM,
    MTP_METHOD_FROM,
    VLLM_MTP_ARCHS,
    mtp_arch,
)
from vramplan.facts.vllm_multimodal import MM_PROFILE_FROM, MM_PROFILE_RULES, MM_V0_RULES
from vramplan.facts.vllm_releases import (
    LINEAR_MIXER_PROFILE_READ_BEFORE,
    LINEAR_MIXER_V1_FROM,
    MAMBA1_V1_FROM,
    MAMBA_CAPTURE_CAP_FROM,
    MAMBA_HYBRID_FIRST,
    MAMBA_HYBRID_PREFIX_CACHING_FROM,
    MAMBA_HYBRID_REMOVED,
    MAMBA_SEQS_CHECK_FROM,
    MAMBA_SSM_DTYPE_DEFAULT,
    MAMBA_SSM_DTYPE_FROM_CONFIG,
    MXFP4_HOPPER_SWIZZLE_FROM,
    NEWEST,
    OLDEST,
    SPECULATIVE_PROFILE_FROM,
    STATE_SPACE_V1_FROM,
    V0_ENGINE_STANDIN,
    V0_ENGINE_UNTIL,
    V2_GUMBEL_BLOCK,
    V2_GUMBEL_BYTES_PER_BLOCK,
    VLLM_RELEASES,
    BatchDefaults,
    MambaHybridRule,
    ModelRunnerRule,
    Release,
    V0FallbackCause,
    VllmRelease,
    mamba_hybrid_rule,
    model_runner_rule,
    parse_release,
    release_row,
    release_text,
    v0_fallback_rule,
)
from vramplan.facts.vllm_tp_comm import (
    COMM_OUTSIDE_FROM,
    CUSTOM_AR_RANK_DATA_BYTES,
    custom_all_reduce_bytes,
    custom_all_reduce_on,
    nccl_high_bytes,
    symm_mem_bytes,
)
from vramplan.serve.cudagraphs import CudagraphEstimate, cudagraph_estimate
from vramplan.serve.mamba_pages import (
    HybridLayout,
    extra_groups_for_head_shards,
    hybrid_layout,
    mixer_profile_width,
    mixer_tp_problem,
    mixer_weights_tp_delta,
    shared_block_tp_problem,
    state_space_layout,
)
from vramplan.serve.sglang_options import mtp_layer_bytes
from vramplan.serve.vllm_mm import (
    EncoderBound,
    MmProfile,
    MmV0Batch,
    encoder_bound,
    mm_profile,
    mm_profile_modelled,
    mm_profile_v0,
    mm_v0_modelled,
)
from vramplan.spec.gpu import GpuSpec, cuda_capability
from vramplan.spec.load import Resolved, vllm_mxfp4_triton
from vramplan.spec.model import ModelSpec
from vramplan.units import DTYPE_BITS, GiB, MiB, ceil_div, dtype_bits, round_up

__all__ = [
    "DEFAULT_VERSION",
    "VLLM_BEHAVIOURS",
    "KVGroup",
    "VllmBehaviour",
    "VllmDecision",
    "VllmStage",
    "behaviour",
    "decide",
    "default_batch_limits",
    "engine_choice",
    "forward_peak_bytes",
    "hopper_swizzle_bytes",
    "kv_groups",
    "lora_slot_bytes",
    "multimodal_architecture",
    "pp_stage_layers",
    "proposer_buffer_bytes",
    "proposer_forward_peak_bytes",
    "rejection_sampler_peak_bytes",
    "rotary_cache_bytes",
    "sampler_class",
    "sampler_path",
    "sampler_peak_bytes",
    "serve_weights_bytes",
    "v0_fallback_causes",
]


@dataclass(frozen=True)
class VllmBehaviour:
    """The start-up rules of one vLLM release: its row of ``facts/vllm_releases.py`` ``VLLM_RELEASES``.

    ``version`` is the release asked for; ``row`` the first release of the row that holds for it and
    ``exact`` whether that release's own source was read (False: the nearest earlier row is assumed)."""

    version: str
    sampler: Literal["native", "flashinfer"]
    non_torch_tp1_bytes: int
    non_torch_tp_bytes: int  # tensor parallel > 1
    cudagraph_bytes: int  # the release row's printed 0.84 GiB figure; the decision derives the graphs (serve/cudagraphs.py)
    sources: tuple[str, ...]
    release: VllmRelease | None = None
    exact: bool = True

    @property
    def rules(self) -> VllmRelease:
        return self.release if self.release is not None else release_row(self.version)[0]


def behaviour(version: str) -> VllmBehaviour:
    """The behaviour of a vLLM release string (``facts/vllm_releases.py`` ``release_row``); a release
    outside the modelled range, or not a release, is a ScenarioError naming the range and the nearest."""
    try:
        row, exact = release_row(version)
    except ValueError as exc:
        raise ScenarioError([Problem("serve.vllm_version", str(exc),
                                     f"use a vLLM release from {release_text(OLDEST)} to {release_text(NEWEST)}")]) from exc
    return VllmBehaviour(version=version, sampler=row.sampler, non_torch_tp1_bytes=row.non_torch_tp1_bytes,
                         non_torch_tp_bytes=row.non_torch_tp_bytes, cudagraph_bytes=row.cudagraph_bytes,
                         sources=row.sources, release=row, exact=exact)


# Non-torch increase: memory that appears outside PyTorch's allocator during the first
# forward pass (lazily loaded kernel images of attention/GEMM/Triton kernels and, with
# tp > 1, NCCL and custom all-reduce buffers allocated at the first collective).  vLLM
# prints it ("non-torch forward increase memory"); the values are those printed, kept per
# release in ``facts/vllm_releases.py``.  The two releases the model began with:
VLLM_BEHAVIOURS: dict[str, VllmBehaviour] = {v: behaviour(v) for v in ("0.11", "0.19")}
DEFAULT_VERSION = "0.11"

# Bytes per (dummy request, vocabulary entry) at the sampler's peak, beyond the logits in
# the model dtype.  vLLM's ``_dummy_sampler_run`` samples with temperature 0.5,
# top_p 0.9 and top_k = vocab - 1, so the top-k/top-p path runs.
#   native (PyTorch sort): fp32 copy of the logits 4 + sorted values 4 + int64 indices 8
#     + the segmented radix sort's scratch (second key buffer 4, second index buffer 8,
#     int64 source iota 8) = 36.  Check: vLLM 0.11.0 printed a torch peak of 4.76 GiB for
#     Llama-3.1-8B (1024 requests x 128,256 entries x (2 + 36) B = 4.65 GiB + hidden
#     states) and 5.56 GiB for Qwen3-0.6B (1024 x 151,936 x 38 B = 5.51 GiB + ...).
#   flashinfer: fp32 copy 4 + top-k masked logits 4 + probabilities 4 = 12 (flashinfer
#     ``top_k_top_p_sampling_from_logits``: top_k_mask_logits, then softmax).
#   FlashInfer's path holds the same 12 in every V1 release that has it: 0.8.x forward_cuda keeps the fp32
#     copy 4, its softmax probs 4, and flashinfer 0.2.1's top_k_top_p_sampling_from_probs (filter_apply_order
#     "top_k_first") the top_k_renorm_probs output 4 (flashinfer/sampling.py, flashinfer-python 0.2.1.post2,
#     the vllm/vllm-openai 0.8 image's); 0.9.0 on, top_k_top_p_sampling_from_logits: masked logits 4 + probs 4.
SAMPLER_EXTRA_BYTES = {"native": 36, "flashinfer": 12}


def sampler_path(row: VllmRelease, choice: str) -> Literal["native", "flashinfer"]:
    """The top-k/top-p path vLLM's ``TopKTopPSampler`` takes for ``serve.vllm_sampler``: ``auto`` is a plain
    ``pip install vllm`` with no ``VLLM_USE_FLASHINFER_SAMPLER`` (FlashInfer only where the release's default
    is FlashInfer, ``facts/vllm_releases.py`` ``flashinfer_sampler == "default"``, 0.24.0 on)."""
    if choice == "auto":
        return "flashinfer" if row.flashinfer_sampler == "default" else "native"
    return "flashinfer" if choice == "flashinfer" else "native"


def sampler_class(row: VllmRelease, path: str) -> Literal["native", "flashinfer"]:
    """The ``SAMPLER_EXTRA_BYTES`` class of a path: the PyTorch path sorts before 0.17.0 (36 B per entry) and
    runs ``apply_top_k_top_p_triton`` from 0.17.0 (``native_sorts`` False: the 12 B class)."""
    return "native" if path == "native" and row.native_sorts else "flashinfer"


def default_batch_limits(gpu_total_bytes: int, gpu_name: str, usage: str = "serve",
                         rule: BatchDefaults = "v1-70gib-not-a100", max_model_len: int = 0) -> tuple[int, int]:
    """vLLM's defaults for (max_num_batched_tokens, max_num_seqs) when the user gives none.

    ``rule`` is the release's (``facts/vllm_releases.py`` ``batch_defaults``).  V1
    (``vllm/engine/arg_utils.py`` ``_set_default_args_v1``, 0.9+): on GPUs with >= 70 GiB that are
    not A100s, 8192 tokens and 1024 sequences for ``vllm serve`` (16384 for the offline ``LLM``
    class); otherwise 2048 tokens (8192 offline) and 256 sequences.  0.8.5 had no A100 exception;
    0.8.0-0.8.4 chose by the device name (h100/h200) and always 1024 sequences.  From 0.28 a device of
    >= 160 GiB gets 16384 tokens (serve and offline) and 1024 sequences; 0.33 keeps a GB10 at the small ones.  V0
    (``vllm/config.py`` ``SchedulerConfig``): ``max(max_model_len, 2048)`` tokens, or with chunked
    prefill (on by default above 32,768 tokens) 512 (to 0.6.4) or 2048 (from 0.6.5); 256 sequences.
    """
    if rule.startswith("v0"):
        chunked = max_model_len > 32768
        return ((512 if rule == "v0-512" else 2048) if chunked else max(max_model_len, 2048)), 256
    name = gpu_name.lower()
    if rule.startswith("v1-160gib") and gpu_total_bytes >= 160 * GiB:
        return 16384, 1024
    if rule == "v1-160gib-not-gb10" and "gb10" in name:
        return (2048 if usage == "serve" else 8192), 256
    if rule == "v1-h100-name":
        big_name = "h100" in name or "h200" in name
        return ((8192 if usage == "serve" else 16384) if big_name else (2048 if usage == "serve" else 8192)), 1024
    big = gpu_total_bytes >= 70 * GiB and (rule == "v1-70gib" or "a100" not in name)
    if big:
        return (8192 if usage == "serve" else 16384), 1024
    return (2048 if usage == "serve" else 8192), 256


def rotary_cache_bytes(m: ModelSpec, dtype_bytes: int) -> int:
    """vLLM's ``RotaryEmbedding.cos_sin_cache``: max_position x rotary_dim in the model dtype.

    One buffer shared by all layers (``get_rope`` caches instances).  Llama-3.1-8B:
    131,072 x 128 x 2 B = 32 MiB, the difference between 8,030,261,248 x 2 B = 14.96 GiB
    and the 14.99 GiB vLLM prints as weights.
    """
    if m.position != "rope":
        return 0
    # vLLM's Bamba reads the config's partial_rotary_factor (vllm/model_executor/models/bamba.py
    # BambaAttentionDecoderLayer: rotary_dim = head_dim * partial_rotary_factor)
    rot = m.mla.qk_rope_head_dim if m.mla is not None else int(m.head_dim * m.partial_rotary_factor)
    return m.max_position_embeddings * rot * dtype_bytes


def pp_stage_layers(num_layers: int, pp: int, stage: int) -> tuple[int, ...]:
    """The decoder layers vLLM gives pipeline rank ``stage`` of ``pp`` (``vllm/distributed/utils.py``
    ``get_pp_indices``, ``VLLM_PP_LAYER_PARTITION`` unset): ``num_layers // pp`` each, and the remainder one
    layer each to the ranks before the last, from the second-to-last backwards (``partitions[-i] += 1`` for
    ``i`` in ``2 .. remainder + 1``), so neither the first rank (the embedding) nor the last (the final norm and
    the LM head) takes one while pp > 2 and the remainder is at most pp - 2.

    >>> [len(pp_stage_layers(61, 4, s)) for s in range(4)], [len(pp_stage_layers(94, 4, s)) for s in range(4)]
    ([15, 15, 16, 15], [23, 24, 24, 23])
    """
    base, rest = divmod(num_layers, pp)
    sizes = [base] * pp
    for i in range(2, rest + 2):
        sizes[-i] += 1
    start = sum(sizes[:stage])
    return tuple(range(start, start + sizes[stage]))


def _tied_head_elements(r: Resolved) -> int:
    """Elements of the word embeddings a last pipeline rank holds again as its LM head when the model ties them
    (vllm/model_executor/models/llama.py ``LlamaModel.__init__``: ``embed_tokens`` is built on the first rank "or
    (config.tie_word_embeddings and get_pp_group().is_last_rank)", and ``lm_head.tie_weights(embed_tokens)``;
    the parameter list counts tied weights once, at the embedding)."""
    return ceil_div(r.model.vocab_size, r.scenario.parallel.tp) * r.model.hidden_size


def moe_split(r: Resolved) -> tuple[int, int]:
    """(expert-parallel ranks, ranks each routed expert's intermediate dimension is split over) of the serving
    engine's MoE layers, for one GPU of a tp x dp job.

    vLLM (0.11.0 model_executor/layers/fused_moe/config.py ``FusedMoEParallelConfig.make``): the MoE layers see
    ``dp_size x tp_size`` devices (``flatten_tp_across_dp``); without --enable-expert-parallel every expert is
    split over all of them (``tp_size = dp_size x tp_size``, ep 1), with it each device holds whole experts
    (``ep_size = tp_size`` flattened, MoE tp 1); ``parallel.ep`` is 1 or tp x serve.dp (refused otherwise,
    ``decide``).  SGLang (0.5.3 distributed/parallel_state.py ``initialize_model_parallel``: ``moe_tp_size =
    tensor_model_parallel_size // moe_ep_size``): --ep-size experts groups inside the tp group, each expert split
    over tp / ep ranks; its --dp-size replicas (and DP attention's ranks) do not enter the MoE layers' split."""
    par, sv = r.scenario.parallel, r.scenario.serve
    if sv.engine == "sglang":
        return par.ep, max(1, par.tp // par.ep)
    if par.ep > 1:
        return par.tp * sv.dp, 1
    return 1, par.tp * sv.dp


def serve_weights_bytes(r: Resolved, stage: int | None = None) -> tuple[int, int]:
    """(parameters on one rank in their stored format, rotary cache) as vLLM counts weights.  ``stage``: the
    pipeline rank with vLLM's layer split (``pp_stage_layers``); None: rank 0 of ``rank_params``' split."""
    s, m = r.scenario, r.model
    c = dtype_bits(s.serve.dtype) // 8
    pp = s.parallel.pp
    layers = None if stage is None else pp_stage_layers(m.num_layers, pp, stage)
    ep, expert_tp = moe_split(r)
    rp = rank_params(m, s.parallel.tp, pp, ep, stage or 0, None, layers=layers, expert_tp=expert_tp)
    params = weights_bytes(rp, c, s.serve.quantization)
    if m.mamba is not None and s.parallel.tp > 1:
        # vLLM's mixers shard tensors transformers' keep whole, and copy Mamba2's extra groups to every rank
        # (serve/mamba_pages.py mixer_weights_tp_delta; quantization is refused beside mixers)
        params += mixer_weights_tp_delta(m, s.parallel.tp, rp.layers) * c
    if stage is not None and pp > 1 and stage == pp - 1 and m.tie_word_embeddings:
        params += _tied_head_elements(r) * c
    if s.serve.engine == "vllm" and s.serve.quantization in KV_REPLICA_BYTES:
        # (SGLang's QKVParallelLinear replicates alike, over its attention tp, tp / dp under dp attention: not added
        # there, and its report says so: serve/sglang.py _data_expert_notes)
        params += replicated_kv_elements(m, s.parallel.tp, rp.layers) * KV_REPLICA_BYTES[s.serve.quantization](c)
    if s.serve.quantization == "mxfp4":
        params += mxfp4_layout_bytes(r, rp) + hopper_swizzle_bytes(r, rp.layers)
    if s.serve.quantization != "none" and (fmt := quant_format(s.serve.quantization)).per_output_bits:
        # AutoGPTQ writes an fp16 bias for every quantized linear; vLLM's model loaders skip a bias the model does
        # not declare ("Skip loading extra bias for GPTQ models", models/llama.py load_weights), and the biases a
        # model declares are counted among its dense parameters already
        params -= sum(ceil_div(o * fmt.per_output_bits, 8) * n for role, _, o, _, n in rp.linear_shapes
                      if role in fmt.quantized_roles)
    return params, rotary_cache_bytes(m, c)


def mla_after_load_bytes(r: Resolved, layers: int) -> int:
    """What vLLM's MLA attention keeps on one rank after loading the weights, over its ``layers`` (facts/vllm_mla.py):
    ``serve.vllm_version`` as asked (a V1 release's V0 fallback runs the same code), heads split over tp.

    0.7.1-0.7.3: ``W_QR`` s Rin N r, ``W_Q_UK`` Rin N L and ``W_UV_O`` N L H (one byte each element for an fp8
    checkpoint, its fp32 scales left out; s otherwise), and a quantized ``kv_b_proj``'s dequantized copy L N (P + V)
    (fp32 before 0.7.3, s after); from 0.8.0 only that copy.  Worked example, DeepSeek-Coder-V2-Lite (H 2,048, 16 heads,
    L 512, P 128, r 64, V 128, no q_lora_rank) in fp16 on one GPU at 0.7.2: 2 x 2,048 x 16 x (64 + 512) + 2 x 16 x 512 x
    2,048 = 71,303,168 B per layer, 27 layers 1,925,185,536 B (1.79 GiB)."""
    m, sv = r.model, r.scenario.serve
    a = m.mla
    if a is None or sv.engine != "vllm" or layers <= 0:
        return 0
    v = parse_release(sv.vllm_version)
    s = dtype_bits(sv.dtype) // 8
    n = ceil_div(m.num_attention_heads, r.scenario.parallel.tp)
    rin = a.q_lora_rank or m.hidden_size
    quantized = sv.quantization != "none"
    kv_b = a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)
    copy = kv_b * (4 if v < KV_B_FP32_UNTIL else s) if quantized else 0
    if not (ABSORB_FROM <= v < ABSORB_UNTIL):
        return layers * copy
    absorbed = 1 if sv.quantization == "fp8" else s
    per_layer = s * rin * n * a.qk_rope_head_dim + absorbed * (rin * n * a.kv_lora_rank + n * a.kv_lora_rank * m.hidden_size)
    return layers * (per_layer + copy)


def mla_after_load_notes(r: Resolved) -> list[str]:
    """The report's line on ``mla_after_load_bytes`` (none without MLA or without bytes)."""
    nbytes = mla_after_load_bytes(r, r.model.num_layers)
    if not nbytes:
        return []
    v = parse_release(r.scenario.serve.vllm_version)
    what = ("W_QR, and the absorbed W_Q_UK and W_UV_O (VLLM_MLA_PERFORM_MATRIX_ABSORPTION at its default 1)"
            if ABSORB_FROM <= v < ABSORB_UNTIL else "no absorbed matrices (removed in 0.8.0)")
    quant = (", and the quantized kv_b_proj's dequantized copy" if r.scenario.serve.quantization != "none" else "")
    return [(f"vLLM {r.scenario.serve.vllm_version}'s MLA backend keeps {what}{quant} after loading the weights "
             f"(process_weights_after_loading, inside the weights' profile): {nbytes / GiB:.2f} GiB over the model's "
             f"layers, counted in the weights (facts/vllm_mla.py)")]


# Bytes per element of the K and V projections' replicated heads, by the weights' format: unquantized in the serving
# dtype, fp8 one byte (per-tensor scales aside).  Other formats' packed codes and group scales per replicated head
# were not derived: their reports say the replication is not added (``replicated_kv_note``).
KV_REPLICA_BYTES: dict[str, Callable[[int], int]] = {"none": lambda c: c, "fp8": lambda c: 1}


def replicated_kv_elements(m: ModelSpec, tp: int, layers: tuple[int, ...]) -> int:
    """K and V weight elements one rank holds beyond the dense split's ``1 / tp`` when tp exceeds the KV heads.

    vLLM's ``QKVParallelLinear`` (vllm/model_executor/layers/linear.py:938 at 0.10.0, :904 at 0.11.0, :1068 at 0.33.0,
    ``__init__``: ``if tp_size >=
    self.total_num_kv_heads: self.num_kv_heads = 1; self.num_kv_head_replicas = divide(tp_size,
    self.total_num_kv_heads)``; the same from 0.2 to 0.33) gives every rank ``max(1, kv_heads / tp)`` whole KV heads:
    with 4 KV heads at tp 8 each rank holds one K head and one V head (``head_dim x hidden`` each), twice the
    ``4 / 8`` of a head the column split gives.  Per attention layer among ``layers``:
    ``2 x head_dim x hidden x (max(1, kv // tp) - kv / tp)`` (the dense split rounds up; the K and V biases, of
    ``head_dim`` per head where a model has them, are left out).  Zero for tp <= KV heads and for MLA (one latent
    projection, replicated in full already: ``ReplicatedLinear`` for ``kv_a_proj_with_mqa``)."""
    kv = m.num_kv_heads
    if m.mla is not None or kv <= 0 or tp <= kv:
        return 0
    keep = frozenset(layers)
    att = sum(1 for layer in attention_layers(m) if layer.index in keep)
    whole = m.head_dim * m.hidden_size
    return att * 2 * (max(1, kv // tp) * whole - ceil_div(kv * whole, tp))


def replicated_kv_notes(r: Resolved) -> list[str]:
    """What the weights say of the K and V heads a dense (attention-only) model's ranks replicate when tp exceeds its
    KV heads (``replicated_kv_elements``); a model with mixers says it in its own tensor-parallel note."""
    m, tp, quant = r.model, r.scenario.parallel.tp, r.scenario.serve.quantization
    if m.mamba is not None or m.mla is not None or m.num_kv_heads <= 0 or tp <= m.num_kv_heads:
        return []
    if quant not in KV_REPLICA_BYTES:
        return [(f"not modelled: tensor parallel {tp} over {m.num_kv_heads} KV heads replicates them (vLLM's "
                 f"QKVParallelLinear: one whole KV head per rank), whose {quant} codes and scales per replicated head "
                 "are not added to the weights")]
    elems = replicated_kv_elements(m, tp, tuple(layer.index for layer in m.layers))
    return [(f"tensor parallel {tp} over {m.num_kv_heads} KV heads: each rank holds max(1, {m.num_kv_heads} // {tp}) "
             f"whole K and V heads (vLLM's QKVParallelLinear replicates them), {elems:,} elements more than the "
             "dense split's 1/tp, counted in the weights")]


# Mxfp4MoEMethod.create_weights (vLLM quantization/mxfp4.py, commit 007d500): the Triton backend (compute
# capability 9.x and 10.x) rounds each expert's intermediate slice up to 64; the Marlin backend (other CUDA
# GPUs from 8.0) rounds it up to 128 and the hidden size up to 256, and prepare_moe_fp4_layer_for_marlin
# repacks the payload (same bytes), keeps one E8M0 byte per scale and casts the biases to the model dtype,
# where the Triton path casts them to fp32 (process_weights_after_loading).
_TRITON_PAD, _MARLIN_PAD, _MARLIN_HIDDEN_PAD = 64, 128, 256


def _mxfp4_expert_bytes(h: int, inter: int, bias_bytes: int) -> int:
    """One expert as vLLM allocates it: w13 [2I, h/2] + scales [2I, h/32], w2 [h, I/2] + scales [h, I/32],
    biases w13 [2I] and w2 [h] (``create_weights``'s floor divisions)."""
    return 2 * inter * (h // 2 + h // 32) + h * (inter // 2 + inter // 32) + bias_bytes * (2 * inter + h)


def mxfp4_layout_bytes(r: Resolved, rp: RankParams) -> int:
    """vLLM's MXFP4 experts on this rank minus what ``weights_bytes`` counts for them (the row's bytes and
    fp32 biases): the backend's padding and bias dtype, chosen by the GPU's compute capability and, on Hopper and
    Blackwell, by the release (Marlin before 0.12.0: facts/vllm_releases.py ``mxfp4_triton_installed``).

    gpt-oss-20b, tp 1: 2880 is a multiple of 64, so 0 on an H100 from vLLM 0.12.0 (Triton); on an A100, or on an
    H100 before 0.12.0 (Marlin), each expert is 2 x 2944 x (1536 + 96) + 3072 x (1472 + 92) + 2 x (5888 + 3072)
    = 14,431,744 B against the row's 2 x 2880 x 1530 + 2880 x 1530 + 4 x 8640 = 13,253,760 B: 1,177,984 B more
    x 768 experts = 904,691,712 B.
    """
    m = r.model
    if m.moe is None:
        return 0
    mx = quant_format("mxfp4")
    counted = sum(mx.matrix_bytes(i, o) * n for role, i, o, _, n in rp.linear_shapes if role == "expert")
    counted += rp.expert_bias * DTYPE_BITS[mx.expert_bias_dtype or "fp32"] // 8
    ep, expert_tp = moe_split(r)
    local = ceil_div(m.moe.expert_intermediate_size, expert_tp)
    cap = cuda_capability(r.gpu.compute_capability or "9.0")
    if cap is None:
        # an AMD GPU (compute capability "gfx942"): vLLM's ROCm MXFP4 backends lay the experts out their own way,
        # which is not read here
        raise _refuse("hardware.gpu", f"{m.name}'s MXFP4 experts on {r.gpu.name} ({r.gpu.compute_capability}): the "
                      "layout of vLLM's ROCm MXFP4 backends is not modelled (the CUDA backends' is: Triton on "
                      "compute capability 9.x-10.x, Marlin from 8.0)", "estimate it on an NVIDIA GPU")
    # Marlin on a plain install before 0.12.0, which lacks triton_kernels (spec/load.py vllm_mxfp4_triton)
    triton = (9, 0) <= cap < (11, 0) and vllm_mxfp4_triton(r.scenario)
    if triton:
        each = _mxfp4_expert_bytes(m.hidden_size, round_up(local, _TRITON_PAD), 4)
    else:
        each = _mxfp4_expert_bytes(round_up(m.hidden_size, _MARLIN_HIDDEN_PAD), round_up(local, _MARLIN_PAD),
                                   dtype_bits(r.scenario.serve.dtype) // 8)
    moe_layers = sum(1 for i in rp.layers if m.layers[i].moe)
    return ceil_div(m.moe.num_experts, ep) * moe_layers * each - counted


# triton_kernels' Hopper layouts as vLLM vendors them from 0.12.0 (vllm/third_party/triton_kernels, triton v3.5.0's;
# read at 0.12.0, 0.14.0, 0.14.1, 0.17.0, 0.20.0, 0.24.0, 0.28.0, 0.33.0), applied by _swizzle_mxfp4 on compute
# capability 9.0 with torch >= 2.8.1, num_warps 8: tensor_details/layout_details/hopper_scale.py HopperMXScaleLayout
# pads the scales' rows to SWIZZLE_ALIGN_M = 2 x num_warps x 2 x 8 = 256 and their columns to SWIZZLE_ALIGN_K = 2;
# hopper_value.py HopperMXValueLayout.swizzle_data pads the packed weights' rows to 1 x 2 x 4 x 2 x 1 = 16 and columns
# to 4 x 2 x 4 x 1 x 1 = 32 (mma_version 3)
_HOPPER_SCALE_ROWS, _HOPPER_SCALE_COLS, _HOPPER_VALUE_ROWS, _HOPPER_VALUE_COLS = 256, 2, 16, 32


def hopper_swizzle_bytes(r: Resolved, layers: tuple[int, ...] | None = None) -> int:
    """What vLLM's Triton MXFP4 backend adds to the experts on Hopper from 0.12.0 (0 before, off compute capability
    9.0 or without MXFP4 experts), counted in the weights (``serve_weights_bytes``): the swizzled scales are a new
    tensor beside the loaded ones, which stay registered (quantization/mxfp4.py ``process_weights_after_loading``,
    TRITON branch: ``del layer.w13_weight`` / ``w2_weight`` only, ``layer.w13_weight_scale`` kept, 0.12.0-0.17.0;
    0.20.0-0.33.0 fused_moe/oracle/mxfp4.py ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` and mxfp4.py
    ``self.w13_precision_config = w13_scale`` without ``replace_parameter`` of the scales), and the packed weights
    are padded in place of the loaded ones (facts/vllm_releases.py ``MXFP4_HOPPER_SWIZZLE_FROM``).

    Each expert's w13 is a (K = hidden, N = 2 I) matmul and w2 a (K = I, N = hidden) one; after the layouts' transpose
    the packed weights are N by K / 2 and the scales N by K / 32.  gpt-oss-120b, one H100 (h 2880, I 2880): scale
    copies 5,888 x 90 + 3,072 x 90 = 806,400 B per expert and no weight padding (5,760 and 2,880 are multiples of 16,
    1,440 of 32), x 128 experts x 36 layers = 3,715,891,200 B (3.46 GiB): 60.86 + 3.46 = 64.32 GiB against the 64.38 GiB
    vLLM 0.14.1 printed ("Model loading took 64.38 GiB", "Using Triton backend": vllm-project/vllm#33155).
    """
    s, m = r.scenario, r.model
    if s.serve.quantization != "mxfp4" or m.moe is None or (r.gpu.compute_capability or "") != "9.0":
        return 0
    if s.effective_framework != "vllm":
        return 0
    try:
        if parse_release(s.serve.vllm_version) < MXFP4_HOPPER_SWIZZLE_FROM:
            return 0
    except ValueError:  # refused by ``behaviour`` with the accepted range
        return 0
    par = s.parallel
    ep, expert_tp = moe_split(r)
    local = ceil_div(m.moe.expert_intermediate_size, expert_tp)
    inter, h = round_up(local, _TRITON_PAD), m.hidden_size
    block = quant_format("mxfp4").scales.size
    extra = 0
    for k, n in ((h, 2 * inter), (inter, h)):
        packed, scale_cols = k // 2, k // block
        extra += round_up(n, _HOPPER_VALUE_ROWS) * round_up(packed, _HOPPER_VALUE_COLS) - n * packed
        extra += round_up(n, _HOPPER_SCALE_ROWS) * round_up(scale_cols, _HOPPER_SCALE_COLS)
    held = layers if layers is not None else rank_params(m, par.tp, par.pp, par.ep, 0, None).layers
    moe_layers = sum(1 for i in held if m.layers[i].moe)
    return ceil_div(m.moe.num_experts, ep) * moe_layers * extra


# vLLM 0.11.0 envs.py: VLLM_FUSED_MOE_CHUNK_SIZE defaults to 32768; fused_moe.py fused_experts_impl sizes its
# intermediate caches for M = min(num_tokens, CHUNK_SIZE) tokens and loops over the chunks
FUSED_MOE_CHUNK_TOKENS = 32768


def _mlp_width_per_token(m: ModelSpec, tp: int, moe_tp: int | None = None) -> int:
    """Elements alive per token inside the MLP at its peak, on one rank.

    Dense gated MLP (vLLM ``MergedColumnParallelLinear`` + ``SiluAndMul``): the gate_up
    output (2I) and the activated product (I) coexist: 3I.  Fused MoE
    (``fused_moe`` intermediate caches): per routed copy of a token, the w13 output
    (2I_e, sharing its buffer with the w2 output h) and the activation (I_e), plus the
    router logits (one per expert); I_e is the expert's slice over ``moe_tp`` ranks (``moe_split``: tp x dp
    without expert parallelism, 1 with it; None: tp).
    """
    if m.moe is not None:
        return max(_routed_width(m, tp if moe_tp is None else moe_tp), 3 * ceil_div(m.moe.shared_intermediate_size, tp))
    inter = max(ls.intermediate_size for ls in m.layers)
    i = ceil_div(inter, tp)
    return 3 * i if m.mlp_gated else 2 * i


def _routed_width(m: ModelSpec, moe_tp: int) -> int:
    """Elements of the fused-MoE caches per token (``_mlp_width_per_token``)."""
    assert m.moe is not None
    ie = ceil_div(m.moe.expert_intermediate_size, moe_tp)
    # plain experts (Nemotron 3: vllm/model_executor/models/nemotron_h.py runs FusedMoE with a non-gated "_no_mul"
    # activation, fused_moe/utils.py activation_without_mul): the w1 output is I wide, not 2 I
    return m.moe.top_k * (max((2 if m.moe.gated else 1) * ie, m.hidden_size) + ie) + m.moe.num_experts


def _moe_gathered_bytes(m: ModelSpec, tokens: int, dtype_bytes: int, tp: int, moe_tp: int, dp: int) -> int:
    """The MoE layer's peak over its own MLP width when ``dp`` > 1 data-parallel engines share the MoE layers
    (vLLM 0.11.0 fused_moe/layer.py ``forward_impl``: ``do_naive_dispatch_combine`` when ``dp_size > 1``, and
    ``get_ep_group().dispatch`` all-gathers every DP rank's hidden states and router logits, all2all.py
    ``AgRsAll2AllManager.dispatch``, the default VLLM_ALL2ALL_BACKEND allgather_reducescatter, or the naive
    manager's multicast): the profile runs every rank at ``tokens``, so the experts see dp x tokens rows: the
    gathered hidden states (h each) and the fused caches of min(dp x tokens, ``FUSED_MOE_CHUNK_TOKENS``) rows.
    The shared experts run on the rank's own tokens.  Elements per local token are not enough here: the
    chunk cap bounds the gathered rows, so this returns bytes."""
    assert m.moe is not None
    gathered = dp * tokens
    routed = (_routed_width(m, moe_tp) * min(gathered, FUSED_MOE_CHUNK_TOKENS) + gathered * m.hidden_size)
    shared = 3 * ceil_div(m.moe.shared_intermediate_size, tp) * tokens
    return max(routed, shared) * dtype_bytes


def forward_peak_bytes(m: ModelSpec, tokens: int, dtype_bytes: int, tp: int, compiled: bool,
                       moe_tp: int | None = None, dp: int = 1) -> int:
    """Peak of the profile run's forward pass over ``tokens`` tokens (attention skipped).

    Per token: the MLP's intermediates (``_mlp_width_per_token``) plus hidden-size tensors.
    Eager (custom fused add+RMSNorm, in place): the residual and the normalised MLP input, 2h.
    Compiled (torch.compile piecewise graphs, vLLM's default): the piece's inputs (attention
    output and incoming residual) are held by the caller while the new residual and the
    normalised input are alive, 4h.  Check: CodeLlama-7B, 8192 tokens, bf16:
    (4 * 4096 + 3 * 11008) * 8192 * 2 B = 0.754 GiB; vLLM 0.19.0 printed 0.77 GiB.
    """
    hidden = (4 if compiled else 2) * m.hidden_size
    if m.moe is not None and dp > 1:
        # data-parallel engines: the MoE layers see every DP rank's tokens (``_moe_gathered_bytes``)
        mlp = _moe_gathered_bytes(m, tokens, dtype_bytes, tp, tp * dp if moe_tp is None else moe_tp, dp)
        if m.mamba is not None:
            mlp = max(mlp, mixer_profile_width(m.mamba, m.hidden_size, tp) * tokens * dtype_bytes)
        return hidden * tokens * dtype_bytes + mlp
    width = _mlp_width_per_token(m, tp, moe_tp)
    if m.mamba is not None:
        # a hybrid model's mixer layers peak on their own tensors (serve/mamba_pages.py mixer_profile_width)
        width = max(width, mixer_profile_width(m.mamba, m.hidden_size, tp))
    return (hidden + width) * tokens * dtype_bytes


def sampler_peak_bytes(m: ModelSpec, tokens: int, requests: int, dtype_bytes: int, sampler: str) -> int:
    """Peak of the dummy sampler run: logits of ``requests`` rows, plus the hidden states.

    The logits are gathered to the full vocabulary on every tensor-parallel rank.  Alive:
    the forward output (tokens x h), the last-token rows and their random replacement
    (2 x requests x h), the logits in the model dtype and the sampler's own tensors
    (``SAMPLER_EXTRA_BYTES`` per entry).
    """
    per_entry = dtype_bytes + SAMPLER_EXTRA_BYTES[sampler]
    hidden = (tokens + 2 * requests) * m.hidden_size * dtype_bytes
    return requests * m.vocab_size * per_entry + hidden


def v2_sampler_peak_bytes(m: ModelSpec, tokens: int, requests: int, dtype_bytes: int, fp32_copy: bool) -> int:
    """Peak of Model Runner V2's dummy sampler run (``vllm/v1/worker/gpu/model_runner.py`` ``_dummy_sampler_run``,
    0.22.0-0.32.0): the dummy requests keep the sampling states' defaults (temperature 0, top_k = vocab, top_p = 1),
    so no top-k/top-p runs.  Alive: the forward output (tokens x h) and its last-token rows (requests x h: no random
    replacement as V1 has), the logits in the model dtype, their fp32 copy where the release makes one
    (``facts/vllm_releases.py`` ``ModelRunnerRule.sampler``), and ``gumbel_sample``'s per-block partials (an int64
    argmax and an fp32 max per request and block of 1024 entries).  Check, Qwen3-0.6B (h 1024, vocab 151,936), 8192
    tokens, 1024 requests, bf16, fp32 copy: 1024 x 151,936 x (2 + 4) = 933,494,784 + 1024 x 149 x 12 = 1,830,912 +
    (8192 + 1024) x 1024 x 2 = 18,874,368: 954,200,064 B."""
    per_entry = dtype_bytes + (4 if fp32_copy else 0)
    blocks = ceil_div(m.vocab_size, V2_GUMBEL_BLOCK)
    hidden = (tokens + requests) * m.hidden_size * dtype_bytes
    return requests * m.vocab_size * per_entry + requests * blocks * V2_GUMBEL_BYTES_PER_BLOCK + hidden


def rejection_sampler_peak_bytes(m: ModelSpec, tokens: int, requests: int, dtype_bytes: int, sampler: str) -> int:
    """Peak of the profile run's rejection-sampler dummy run (speculative decoding, vLLM 0.17.0-0.33.0).

    ``GPUModelRunner._dummy_sampler_run`` gives each of the ``requests`` dummy requests one draft token and
    calls the rejection sampler on ``randn(2 x requests, vocab)`` logits in the model dtype (the sampler's
    own logits are released when the name is rebound).  ``RejectionSampler.forward`` indexes the bonus rows
    (a copy, ``requests x vocab`` in the model dtype) and samples them with ``max_num_logprobs=-1`` in
    ``raw_logits`` mode, which keeps an fp32 copy of them until it returns.  Per (request, vocabulary entry):
    3 x dtype bytes throughout, then the larger of two stages:

    * the bonus sampling: the raw fp32 copy 4 + the sampler's own tensors (``SAMPLER_EXTRA_BYTES``);
    * the recovered-token sampling: the raw fp32 copy 4 + the target rows in fp32 4 and their clone 4
      (top-k/top-p applied in place) + ``softmax`` probabilities 4 (``rejection_sample``) + q 4 and 1/q 4
      (``sample_recovered_tokens``, fp32 unless ``use_fp64_gumbel``) = 24.

    Plus the hidden states alive as for the sampler: (tokens + 2 x requests) x h.  Check: Qwen3-8B (h 4096,
    vocab 151,936), 2048 tokens, 128 requests, bf16, flashinfer: 128 x 151,936 = 19,447,808 entries x
    (6 + max(4 + 12, 24)) = x 30 B = 583,434,240 B; hidden (2048 + 256) x 4096 x 2 = 18,874,368 B; 602,308,608 B.
    """
    stage = max(4 + SAMPLER_EXTRA_BYTES[sampler], 24)
    hidden = (tokens + 2 * requests) * m.hidden_size * dtype_bytes
    return requests * m.vocab_size * (3 * dtype_bytes + stage) + hidden


def proposer_forward_peak_bytes(target: ModelSpec, draft: ModelSpec, tokens: int, dtype_bytes: int, tp: int,
                                compiled: bool) -> int:
    """Peak of the proposer's forward in the profile run: ``GPUModelRunner._dummy_run`` calls
    ``drafter.dummy_run(num_tokens)`` (``SpecDecodeBaseProposer.dummy_run``: one forward per speculative token,
    one after the other) while the target's output (tokens x target h) is held; each forward peaks as
    ``forward_peak_bytes`` of the proposer.  Qwen3-0.6B (h 1024, intermediate 3072) beside Qwen3-8B, 2048 tokens,
    bf16, compiled: 2048 x 4096 x 2 = 16,777,216 + (4 x 1024 + 3 x 3072) x 2048 x 2 = 54,525,952 -> 71,303,168 B."""
    return tokens * target.hidden_size * dtype_bytes + forward_peak_bytes(draft, tokens, dtype_bytes, tp, compiled)


def mtp_forward_peak_bytes(m: ModelSpec, tokens: int, dtype_bytes: int, tp: int, compiled: bool,
                           moe_tp: int | None = None, dp: int = 1) -> int:
    """Peak of an MTP proposer's forward in the profile run (``drafter.dummy_run``, the EAGLE path): the target's
    output (tokens x h) held, and the larger of the MTP layer's prologue and its decoder layer.  The prologue
    (``DeepSeekMultiTokenPredictorLayer.forward``) holds per token the embedding, its masked copy, ``enorm`` and
    ``hnorm`` outputs (h each), their ``cat`` (2h) and ``eh_proj``'s output (h): 6h; the decoder layer is one of
    the target's (``forward_peak_bytes``, its MoE width), which for DeepSeek and GLM-4.5 is the larger.
    DeepSeek-V3 (h 7168, 8 of 256 experts of 2048), tp 8, 2048 tokens, bf16, compiled: layer (4 x 7168 +
    8 x (max(2 x 256, 7168) + 256) + 256) x 2048 x 2 = (28,672 + 59,648) x 4096 = 361,758,720; held
    2048 x 7168 x 2 = 29,360,128; 391,118,848 B."""
    prologue = 6 * m.hidden_size * tokens * dtype_bytes
    layer = forward_peak_bytes(m, tokens, dtype_bytes, tp, compiled, moe_tp, dp)
    return tokens * m.hidden_size * dtype_bytes + max(prologue, layer)


def proposer_buffer_bytes(draft: ModelSpec, tokens: int, seqs: int, dtype_bytes: int, draft_model: bool) -> int:
    """The proposer's persistent device buffers (``SpecDecodeBaseProposer.__init__``), allocated with the model
    runner before the weights are measured, so in vLLM's "weights + non-torch" (``total_consumed``), not in
    "Model loading took".  ``tokens`` is max_num_batched_tokens, ``seqs`` max_num_seqs: input_ids int32, positions
    int64, the slot-mapping buffer int64 (20 B per token), ``arange`` int32 of max(seqs + 1, tokens), the
    ``backup_next_token_ids`` int32 of seqs, ``hidden_states`` and ``inputs_embeds`` (tokens x the proposer's h in
    the model dtype), and for a draft model (no hidden states passed: ``needs_extra_input_slots``) two bool masks
    of tokens.  Qwen3-0.6B, 2048 tokens, 128 sequences, bf16: 40,960 + 8192 + 512 + 8,388,608 + 4096 = 8,442,368 B."""
    ints = tokens * (4 + 8 + 8) + max(seqs + 1, tokens) * 4 + seqs * 4
    masks = 2 * tokens if draft_model else 0
    return ints + masks + 2 * tokens * draft.hidden_size * dtype_bytes


def lora_slot_bytes(m: ModelSpec, rank: int, max_loras: int, tp: int, dtype_bytes: int) -> int:
    """vLLM's preallocated LoRA slots (``vllm/lora/layers``: ``create_lora_weights``), for all linears.

    Each supported linear holds, per slice of a packed layer (qkv: q, k, v; gate_up: gate, up),
    ``lora_a_stacked[max_loras, 1, rank, in]`` and ``lora_b_stacked[max_loras, 1, out, rank]`` in the
    model dtype.  Column-parallel layers (qkv, gate_up) split ``out`` over tp and keep ``in`` whole;
    row-parallel ones (o, down) split ``in`` and keep ``out`` whole.  Llama-3.1-8B, rank 16, one
    adapter, tp 1, per layer: qkv 3 x 16 x 4096 + 16 x (4096 + 1024 + 1024) = 294,912; o 16 x 4096
    x 2 = 131,072; gate_up 2 x 16 x 4096 + 16 x 2 x 14,336 = 589,824; down 16 x (14,336 + 4096) =
    294,912; 1,310,720 elements x 32 layers x 2 B = 83,886,080 B.
    """
    h, q_out, kv_out = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
    kv_local = max(1, m.num_kv_heads // tp) * m.head_dim if kv_out else 0
    per_layer_fixed = (3 * rank * h + rank * (q_out // tp + 2 * kv_local)  # qkv (column parallel)
                       + rank * (q_out // tp) + rank * h)  # o_proj (row parallel)
    total = 0
    for la in m.layers:
        inter = la.intermediate_size
        slices = 2 if m.mlp_gated else 1
        mlp = slices * rank * h + rank * slices * (inter // tp) + rank * (inter // tp) + rank * h
        total += per_layer_fixed + mlp
    return total * max_loras * dtype_bytes


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: layers of one attention type sharing a block table."""

    kind: str  # full | sliding | mla | mamba (a hybrid model's Mamba2 mixers: one state page per request)
    window: int | None
    layers: int  # real layers in the group (the group is padded to the group size)


def kv_groups(spec: KVSpec) -> tuple[list[KVGroup], int]:
    """vLLM's grouping of layers (``get_kv_cache_groups``): (groups, layers per group).

    Uniform models: one group of all layers.  Hybrid models (full + sliding-window): split
    each type into groups of ``group_size`` layers, ``group_size`` being the smallest type's
    count, or the largest's when that is below 1.5x the smallest (padding the remainder).
    Gemma-3-27B (52 sliding, 10 full layers): group size 10 -> 6 sliding groups (8 layers of
    padding) + 1 full group.
    """
    by_type: dict[tuple[str, int | None], int] = {}
    for la in spec.layers:
        key = (la.kind, la.window)
        by_type[key] = by_type.get(key, 0) + 1
    if len(by_type) <= 1:
        (kind, window), n = next(iter(by_type.items())) if by_type else (("full", None), 0)
        return [KVGroup(kind, window, n)], n
    smallest, largest = min(by_type.values()), max(by_type.values())
    size = largest if largest < smallest * 1.5 else smallest
    groups: list[KVGroup] = []
    for (kind, window), n in by_type.items():
        full_groups, rest = divmod(n, size)
        groups.extend(KVGroup(kind, window, size) for _ in range(full_groups))
        if rest:
            groups.append(KVGroup(kind, window, rest))
    return groups, size


def _blocks_per_request(groups: list[KVGroup], block_size: int, max_len: int, batched_tokens: int) -> int:
    """Blocks one request of ``max_len`` tokens needs across all groups (``max_memory_usage_bytes``).

    Full attention: ceil(max_len / block_size).  Sliding window W: during chunked prefill the
    last W-1 computed tokens plus the newly scheduled ones are held, never more than max_len,
    plus one block because the window need not start on a block boundary.
    """
    total = 0
    for g in groups:
        if g.kind == "mamba":
            total += 1
        elif g.window:
            tokens = min(g.window - 1 + batched_tokens, max_len)
            total += ceil_div(tokens, block_size) + 1
        else:
            total += ceil_div(max_len, block_size)
    return total


@dataclass(frozen=True)
class VllmStage:
    """One pipeline rank of a vLLM engine with pp > 1 (``decide``)."""

    stage: int
    first_layer: int
    layers: int  # decoder layers on this rank (vLLM's get_pp_indices)
    weights_bytes: int
    activation_peak_bytes: int
    non_kv_bytes: int
    available_kv_bytes: int  # this rank's KV budget
    own_blocks: int  # the blocks its budget holds
    kv_cache_bytes: int  # what it allocates: the engine's blocks (the fewest of any rank) x page x its layers
    cudagraph_bytes: int
    nccl_bytes: int

    def to_dict(self) -> dict[str, int]:
        return {"stage": self.stage, "first_layer": self.first_layer, "layers": self.layers,
                "weights_bytes": self.weights_bytes, "activation_peak_bytes": self.activation_peak_bytes,
                "non_kv_bytes": self.non_kv_bytes, "available_kv_bytes": self.available_kv_bytes,
                "own_blocks": self.own_blocks, "kv_cache_bytes": self.kv_cache_bytes,
                "cudagraph_bytes": self.cudagraph_bytes, "nccl_bytes": self.nccl_bytes}


@dataclass
class VllmDecision:
    """Every number vLLM computes at start-up, and whether it starts."""

    version: str
    model: str
    gpu: str
    tp: int
    total_memory_bytes: int
    gpu_memory_utilization: float
    requested_bytes: int
    weights_bytes: int
    parameters_bytes: int
    rotary_cache_bytes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    dummy_requests: int
    forward_peak_bytes: int
    sampler_peak_bytes: int
    cublas_workspace_bytes: int
    activation_peak_bytes: int  # "torch peak memory increase"
    non_torch_bytes: int  # "non-torch forward increase memory"
    non_kv_bytes: int
    cudagraph_bytes: int
    cudagraph_subtracted: bool
    cuda_context_bytes: int
    nccl_bytes: int
    available_kv_bytes: int  # may be <= 0
    kv_spec: KVSpec
    block_size: int
    page_bytes: int  # one block of one layer
    groups: list[KVGroup]
    layers_per_group: int
    num_gpu_blocks: int
    kv_cache_bytes: int  # what is allocated: blocks x page x layers per group
    kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    max_model_len: int
    blocks_per_request: int
    needed_kv_bytes: int  # one request of max_model_len
    max_concurrency: float
    max_model_len_that_fits: int
    starts: bool
    problem: str = ""
    fix: str = ""
    assumptions: list[str] = field(default_factory=list)
    lora_bytes: int = 0  # LoRA slots, inside weights_bytes (outside it where ``lora_outside_budget``)
    speculative_weights_bytes: int = 0  # the proposer's weights, inside weights_bytes
    cpu_offload_bytes: int = 0  # weights in host memory, outside weights_bytes
    kv_cache_memory_bytes: int | None = None  # the explicit KV budget given, if any
    host_swap_bytes: int = 0  # V0's pinned CPU KV cache (--swap-space), host RAM per GPU
    host_lora_cache_bytes: int = 0  # the host LRU of max_cpu_loras adapters at max_lora_rank: an upper bound
    sleep_level: int = 0  # serve.sleep_level: the figures while the engine sleeps (asleep_*_bytes)
    lora_outside_budget: bool = False  # the release leaves the LoRA slots outside gpu_memory_utilization
    in_use_by_others_bytes: int = 0  # hardware.memory_in_use_gib: other processes' share of total_memory_bytes
    rejection_sampler_peak_bytes: int = 0  # speculative decoding: the rejection sampler's dummy run
    proposer_forward_peak_bytes: int = 0  # speculative decoding: the proposer's forward in the dummy run
    speculative_buffers_bytes: int = 0  # the proposer's persistent buffers, inside non_kv_bytes
    mamba_state_page_bytes: int = 0  # a hybrid model: one mixer layer's state per request, before padding to page_bytes
    mamba_layers: int = 0  # a hybrid model's Mamba2 mixer layers (their groups are among ``groups``)
    cudagraph_bytes_low: int = 0  # the graphs' band (serve/cudagraphs.py); cudagraph_bytes is its point
    cudagraph_bytes_high: int = 0
    cudagraph_pool_bytes: int = 0  # the one pool all graphs share: the largest size's forward intermediates
    cudagraph_capture_sizes: tuple[int, ...] = ()  # the batch sizes captured, ascending
    cudagraph_graphs: int = 0  # graphs captured (piecewise pieces counted one by one)
    start_risk: str = ""  # "may not start": the graphs' band outgrows the room outside gpu_memory_utilization
    start_risk_fix: str = ""
    tp_comm_bytes: int = 0  # tp > 1: custom all-reduce and symmetric-memory buffers (facts/vllm_tp_comm.py)
    tp_comm_bytes_high: int = 0  # tp > 1: those plus NCCL's buffers up to their band's high end, beyond nccl_bytes
    tp_comm_outside_budget: bool = True  # the communicators are created before the memory snapshot (0.11.0 on)
    pp: int = 1  # pipeline-parallel size; the figures above are the binding stage's when pp > 1
    stages: tuple[VllmStage, ...] = ()  # pp > 1: every pipeline rank
    binding_stage: int = 0  # pp > 1: the rank with the fewest blocks of its own
    mm_profile: MmProfile | None = None  # a multimodal model: the encoder's part of the profile run (serve/vllm_mm.py)
    # a multimodal model whose profile run is not modelled: an upper bound of what it takes from the KV pool
    # (serve/vllm_mm.py encoder_bound), by which the KV band's low end is lowered (report/band.py)
    encoder_bound_bytes: int = 0
    dp: int = 1  # --data-parallel-size: engine cores, each with its own tp x pp GPUs and KV pool
    ep: int = 1  # the MoE layers' expert-parallel ranks (moe_split): 1, or tp x dp with --enable-expert-parallel

    @property
    def may_not_start(self) -> bool:
        """Starts by the point estimate, but the CUDA-graph capture may run out of memory (``start_risk``)."""
        return self.starts and bool(self.start_risk)

    @property
    def device_used_bytes(self) -> int:
        """What nvidia-smi shows once serving: context, NCCL, the budget's contents, graphs."""
        return (self.cuda_context_bytes + self.nccl_bytes + self.tp_comm_bytes + self.weights_bytes
                + self.activation_peak_bytes
                + self.non_torch_bytes + self.kv_cache_bytes + self.cudagraph_bytes
                + (self.lora_bytes if self.lora_outside_budget else 0) + self.speculative_buffers_bytes)

    @property
    def asleep_device_bytes(self) -> int:
        """What stays on the GPU while the engine sleeps (``serve.sleep_level`` 1 or 2): everything but the
        allocations vLLM's ``CuMemAllocator`` tags "weights" and "kv_cache", which ``sleep`` unmaps (level 1 after
        copying the weights to the host): the CUDA context, NCCL, non-torch memory, the CUDA graphs and the torch
        allocator's cached activations stay (vllm/v1/worker/gpu_worker.py ``Worker.sleep``, 0.9.0 and 0.33.0)."""
        return self.device_used_bytes - self.weights_bytes - self.kv_cache_bytes if self.sleep_level else 0

    @property
    def asleep_host_bytes(self) -> int:
        """Host RAM the sleeping engine holds: level 1 the weights (``offload_tags=("weights",)``), level 2 the
        model's buffers (``buffer.cpu().clone()`` before discarding them: the rotary cache)."""
        return {1: self.weights_bytes, 2: self.rotary_cache_bytes}.get(self.sleep_level, 0)

    def log_lines(self) -> list[str]:
        """The start-up lines vLLM would print, for comparison with a real log."""
        def g(n: int) -> str:
            return f"{n / GiB:.2f}"
        out = [
            f"Requested memory: {self.gpu_memory_utilization:f} (util), {g(self.requested_bytes)} GiB",
            f"Model loading took {g(self.weights_bytes)} GiB memory",
            (f"Total non KV cache memory: {g(self.non_kv_bytes)}GiB; torch peak memory increase: "
            f"{g(self.activation_peak_bytes)}GiB; non-torch forward increase memory: {g(self.non_torch_bytes)}GiB; "
            f"weights memory: {g(self.weights_bytes)}GiB."),
            f"Available KV cache memory: {g(self.available_kv_bytes)} GiB",
        ]
        if self.starts or self.num_gpu_blocks:
            out.append(f"GPU KV cache size: {self.kv_cache_tokens:,} tokens")
            out.append(f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x")
        if self.problem:
            out.append(f"ValueError: {self.problem}")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "vllm_version_modelled": self.version, "model": self.model, "gpu": self.gpu, "tp": self.tp,
            "total_memory_bytes": self.total_memory_bytes, "gpu_memory_utilization": self.gpu_memory_utilization,
            "requested_bytes": self.requested_bytes, "weights_bytes": self.weights_bytes,
            "parameters_bytes": self.parameters_bytes, "rotary_cache_bytes": self.rotary_cache_bytes,
            "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
            "profile_forward_peak_bytes": self.forward_peak_bytes, "profile_sampler_peak_bytes": self.sampler_peak_bytes,
            "activation_peak_bytes": self.activation_peak_bytes, "non_torch_bytes": self.non_torch_bytes,
            "non_kv_bytes": self.non_kv_bytes, "cudagraph_bytes": self.cudagraph_bytes,
            "cudagraph_subtracted": self.cudagraph_subtracted, "cuda_context_bytes": self.cuda_context_bytes,
            "nccl_bytes": self.nccl_bytes, "available_kv_bytes": self.available_kv_bytes,
            "kv_bytes_per_token": self.kv_spec.bytes_per_token, "block_size": self.block_size,
            "page_bytes": self.page_bytes, "kv_groups": len(self.groups), "layers_per_group": self.layers_per_group,
            "num_gpu_blocks": self.num_gpu_blocks, "kv_cache_bytes": self.kv_cache_bytes,
            "kv_cache_tokens": self.kv_cache_tokens, "max_model_len": self.max_model_len,
            "needed_kv_bytes": self.needed_kv_bytes, "max_concurrency": round(self.max_concurrency, 4),
            "max_model_len_that_fits": self.max_model_len_that_fits, "starts": self.starts,
            "problem": self.problem, "fix": self.fix, "device_used_bytes": self.device_used_bytes,
            **({"in_use_by_others_bytes": self.in_use_by_others_bytes} if self.in_use_by_others_bytes else {}),
            "assumptions": list(self.assumptions), **self._option_keys(), **self._graph_keys(),
            **({"pp": self.pp, "binding_stage": self.binding_stage, "stages": [st.to_dict() for st in self.stages]}
               if self.stages else {}),
            **({"dp": self.dp, "max_concurrency_all_dp_ranks": round(self.max_concurrency * self.dp, 4)}
               if self.dp > 1 else {}),
            **({"ep": self.ep} if self.ep > 1 else {}),
        }

    def _graph_keys(self) -> dict[str, object]:
        """The captured graphs' keys (their band, pool and sizes) and the start-up risk they carry."""
        keys: dict[str, object] = {"may_not_start": self.may_not_start}
        if self.tp > 1:
            keys.update({"tp_comm_bytes": self.tp_comm_bytes, "tp_comm_bytes_high": self.tp_comm_bytes_high,
                         "tp_comm_outside_budget": self.tp_comm_outside_budget})
        if self.start_risk:
            keys["start_risk"], keys["start_risk_fix"] = self.start_risk, self.start_risk_fix
        if self.cudagraph_capture_sizes:
            keys.update({"cudagraph_bytes_low": self.cudagraph_bytes_low,
                         "cudagraph_bytes_high": self.cudagraph_bytes_high,
                         "cudagraph_pool_bytes": self.cudagraph_pool_bytes,
                         "cudagraph_capture_sizes": list(self.cudagraph_capture_sizes),
                         "cudagraph_graphs": self.cudagraph_graphs})
        return keys

    def _option_keys(self) -> dict[str, object]:
        """The budget options' keys, present only when an option is set (the report of a plain engine keeps
        its keys)."""
        keys: dict[str, object] = {}
        if self.lora_bytes:
            keys["lora_bytes"] = self.lora_bytes
            if self.lora_outside_budget:
                keys["lora_outside_budget"] = True
        if self.speculative_weights_bytes:
            keys["speculative_weights_bytes"] = self.speculative_weights_bytes
        if self.rejection_sampler_peak_bytes:
            keys["profile_rejection_sampler_peak_bytes"] = self.rejection_sampler_peak_bytes
        if self.proposer_forward_peak_bytes:
            keys["profile_proposer_forward_peak_bytes"] = self.proposer_forward_peak_bytes
        if self.speculative_buffers_bytes:
            keys["speculative_buffers_bytes"] = self.speculative_buffers_bytes
        if self.cpu_offload_bytes:
            keys["cpu_offload_bytes"] = self.cpu_offload_bytes
            keys["host_weights_bytes"] = self.cpu_offload_bytes
        if self.kv_cache_memory_bytes is not None:
            keys["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.host_swap_bytes:
            keys["host_swap_bytes"] = self.host_swap_bytes
        if self.host_lora_cache_bytes:
            keys["host_lora_cache_bytes"] = self.host_lora_cache_bytes
        if self.sleep_level:
            keys.update({"sleep_level": self.sleep_level, "asleep_device_bytes": self.asleep_device_bytes,
                         "asleep_host_bytes": self.asleep_host_bytes})
        if self.encoder_bound_bytes:
            keys["encoder_bound_bytes"] = self.encoder_bound_bytes
        if self.mm_profile is not None:
            mm = self.mm_profile
            keys.update({"encoder_budget_tokens": mm.budget_tokens, "encoder_profile_items": mm.items,
                         "encoder_profile_modality": mm.modality, "encoder_tokens_per_item": mm.tokens_per_item,
                         "encoder_outputs_bytes": mm.output_bytes, "profile_encoder_peak_bytes": mm.encoder_peak_bytes})
        if self.mamba_layers:
            keys["mamba_layers"] = self.mamba_layers
            keys["mamba_state_page_bytes"] = self.mamba_state_page_bytes
            keys["mamba_groups"] = sum(1 for g in self.groups if g.kind == "mamba")
        return keys


def _fits_len(length: int, groups: list[KVGroup], size: int, page: int, block: int, batched: int, avail: int) -> bool:
    return size * page * _blocks_per_request(groups, block, length, batched) <= avail


def _largest_len(groups: list[KVGroup], size: int, page: int, block: int, batched: int, avail: int,
                 upper: int) -> int:
    """Binary search as ``_estimate_max_model_len_from_groups``: 0 if not even one token fits."""
    if page <= 0 or not _fits_len(1, groups, size, page, block, batched, avail):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if _fits_len(mid, groups, size, page, block, batched, avail):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _limits(r: Resolved, usage: str, rule: BatchDefaults) -> tuple[int, int, int]:
    """(max_num_batched_tokens, max_num_seqs, max_model_len): the scenario's, else vLLM's defaults."""
    sv, m = r.scenario.serve, r.model
    max_len = sv.max_model_len or m.max_position_embeddings
    d_tokens, d_seqs = default_batch_limits(r.gpu.device_total_bytes, r.gpu.name, usage, rule, max_len)
    batched = sv.max_num_batched_tokens or d_tokens
    seqs = sv.max_num_seqs or d_seqs
    if max_len > m.max_position_embeddings:
        raise ScenarioError([Problem(
            "serve.max_model_len", f"max_model_len={max_len} is greater than the model's "
            f"max_position_embeddings={m.max_position_embeddings}",
            f"use serve.max_model_len <= {m.max_position_embeddings} (vLLM refuses it unless "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")])
    return batched, seqs, max_len


@dataclass(frozen=True)
class _Options:
    """The serve options that change the budget (``serve.kv_cache_memory_bytes``, ``cpu_offload_gb``,
    ``max_loras``/``max_lora_rank``, ``speculative``), resolved for one release."""

    offloaded: int = 0
    lora: int = 0
    host_lora: int = 0  # max_cpu_loras adapters in host RAM (an upper bound)
    draft_weights: int = 0
    draft_layer_bytes_per_token: tuple[int, ...] = ()  # the proposer's KV layers, bytes per token each
    notes: tuple[str, ...] = ()
    draft_model: ModelSpec | None = None  # the proposer's model, when its profile run is modelled (speculative_profile)
    draft_is_model: bool = False  # method draft (a separate model, no hidden states passed)
    speculative_profile: bool = False  # the release's rejection-sampler dummy run is modelled
    draft_layers: int = 0  # the proposer's own layers (draft model, EAGLE head): its graphs are captured too
    mtp_layers: int = 0  # method mtp: the target's MTP layers (the proposer's model is the target itself)


def _refuse(where: str, message: str, fix: str) -> ScenarioError:
    return ScenarioError([Problem(where, message, fix)])


# How each release comes to FlashInfer's top-k/top-p path (facts/vllm_releases.py ``flashinfer_sampler``)
_FLASHINFER_HOW = {
    "installed": "flashinfer installed, as in the vllm/vllm-openai image (unset VLLM_USE_FLASHINFER_SAMPLER)",
    "env": "VLLM_USE_FLASHINFER_SAMPLER=1",
    "default": "vLLM's default on a GPU FlashInfer supports",
}
_NATIVE_HOW = {
    "v0-env": "VLLM_USE_FLASHINFER_SAMPLER unset (V0 sampler, vllm/model_executor/layers/sampler.py)",
    "installed": "flashinfer not installed (a plain pip install) or VLLM_USE_FLASHINFER_SAMPLER=0",
    "env": "VLLM_USE_FLASHINFER_SAMPLER unset",
    "default": "VLLM_USE_FLASHINFER_SAMPLER=0",
}


def _sampler_note(row: VllmRelease, choice: str) -> str:
    """The tail of the first assumption: the path asked for and how vLLM comes to it; for ``auto`` on a release
    whose Docker image takes another path than pip (``installed``), that ambiguity and the key that settles it.
    Empty for ``auto`` elsewhere (the pip default, as the report said before the key existed)."""
    fs = row.flashinfer_sampler
    if choice == "auto":
        if fs != "installed":
            return ""
        gate = " (< 0.2.3)" if row.first < (0, 9, 0) else ""
        return ("; a plain pip install: flashinfer is not a dependency, so vLLM sorts. The vllm/vllm-openai image "
                f"installs flashinfer{gate} and vLLM then takes FlashInfer's path (it logs \"Using FlashInfer for "
                "top-p & top-k sampling\"), 12 B instead of 36 B per dummy request and vocabulary entry: set "
                "serve.vllm_sampler: flashinfer for it")
    how = (_FLASHINFER_HOW if choice == "flashinfer" else _NATIVE_HOW)[fs]
    return f": serve.vllm_sampler {choice}, the {sampler_path(row, choice)} path, taken with {how}"


def _check_sampler(r: Resolved, row: VllmRelease, version: str) -> None:
    """Refuse ``serve.vllm_sampler: flashinfer`` where vLLM cannot take FlashInfer's path, or where it is not
    modelled (a ScenarioError naming the reason)."""
    if r.scenario.serve.vllm_sampler != "flashinfer":
        return
    if row.flashinfer_sampler == "v0-env":
        raise _refuse("serve.vllm_sampler", f"vLLM {version} (V0 engine) takes FlashInfer's sampler only with "
                      "VLLM_USE_FLASHINFER_SAMPLER=1 (vllm/model_executor/layers/sampler.py "
                      "_top_k_top_p_multinomial_with_flashinfer, with its logprobs); that path is not modelled",
                      "use serve.vllm_sampler: auto or a vLLM release >= 0.8.0")
    cc = r.gpu.compute_capability
    if _checks_capability(row) and cc and not _flashinfer_capability(cc):
        # 0.12.0-0.23.x raise RuntimeError ("FlashInfer does not support compute capability ..."); 0.24.0 on,
        # flashinfer_sampler_supported() returns False and the PyTorch path runs
        raise _refuse("serve.vllm_sampler", f"vLLM {version} has no FlashInfer sampler on {r.gpu.name} (compute "
                      f"capability {cc}; vllm/v1/attention/backends/flashinfer.py "
                      "FlashInferBackend.supports_compute_capability: 7.5 to 12.1)",
                      "use serve.vllm_sampler: auto")


def _checks_capability(row: VllmRelease) -> bool:
    """The release checks the GPU before FlashInfer's sampler (0.12.0 on, ``TopKTopPSampler.__init__``)."""
    return row.flashinfer_sampler in ("env", "default")


def _flashinfer_capability(cc: str) -> bool:
    cap = cuda_capability(cc)
    return cap is None or (7, 5) <= cap <= (12, 1)  # an unreadable capability is not refused


def _draft_rotary_bytes(target: ModelSpec, draft: ModelSpec, dtype_bytes: int) -> int:
    """The proposer's own rotary cos/sin cache: none when ``get_rope`` returns the target's cached instance
    (``vllm/model_executor/layers/rotary_embedding/__init__.py`` ``_ROPE_DICT``, keyed by head size, rotary dim,
    max position, rope parameters and dtype; ``rotary_embedding.py`` in 0.6.0-0.10); compared here by position
    type, head size and max position, the rope parameters are assumed equal.  Llama-3.2-1B (head size 64) beside
    Llama-3.1-8B (128), 131,072 positions, bf16: its own 131,072 x 64 x 2 = 16,777,216 B."""
    key = (draft.position, draft.head_dim, draft.max_position_embeddings)
    if key == (target.position, target.head_dim, target.max_position_embeddings):
        return 0
    return rotary_cache_bytes(draft, dtype_bytes)


def _architectures(r: Resolved) -> tuple[str, ...]:
    """The ``architectures`` of the model's config.json (vLLM's ``ModelConfig.architectures``); () if unreadable."""
    try:
        cfg = model_config(r.scenario.model, offline=True, copy_=False)
    except (VramplanError, OSError):
        return ()
    return tuple(a for a in cfg.get("architectures") or [] if isinstance(a, str))


def model_runner(r: Resolved, version: str, draft: ModelSpec | None = None) -> tuple[ModelRunnerRule | None, str]:
    """Which model runner ``vllm serve`` of ``version`` runs for the scenario on CUDA: (the release's Model Runner V2
    row, or None for the V1 ``GPUModelRunner``; the reason, "" before V2 could be a default).  The rule of
    ``VllmConfig.use_v2_model_runner`` (facts/vllm_releases.py ``MODEL_RUNNER_RULES``), with
    ``VLLM_USE_V2_MODEL_RUNNER`` unset; ``draft`` is the proposer's model (a heterogeneous vocabulary keeps V1 from
    0.32.0)."""
    rule = model_runner_rule(version)
    if rule is None:
        return None, ""
    m, sv, pp = r.model, r.scenario.serve, r.scenario.parallel.pp
    archs = _architectures(r)
    arch = archs[0] if archs else "this model"
    listed = any(a in rule.architectures for a in archs)
    moe, hybrid = m.moe is not None, m.mamba is not None
    quantized = sv.quantization != "none" or m.checkpoint_quantization is not None
    default = {"listed-dense": listed and not moe and not quantized, "listed": listed,
               "dense-or-listed": listed or not moe, "all": True}[rule.models]
    why_not = ""
    if hybrid and not rule.hybrid_v2:
        why_not = "a hybrid attention + Mamba model"
    elif not default:
        why_not = {"listed-dense": "not a listed dense unquantized architecture",
                   "listed": "not a listed architecture",
                   "dense-or-listed": "a MoE model of an architecture not listed"}[rule.models]
    spec = sv.speculative
    if not why_not and spec is not None:
        if spec.method not in rule.speculative:
            why_not = f"speculative method {spec.method!r} is not supported by V2"
        elif spec.method == "eagle3" and pp > 1 and not rule.eagle3_pp:
            why_not = "EAGLE3 with pipeline parallelism is not supported by V2"
        elif rule.draft_same_vocab and draft is not None and draft.vocab_size != m.vocab_size:
            why_not = "a draft model of another vocabulary is not supported by V2"
    where = "VllmConfig.use_v2_model_runner, facts/vllm_releases.py MODEL_RUNNER_RULES"
    if why_not:
        return None, (f"model runner: V1 (vLLM {version} defaults to Model Runner V2 only where it applies; {arch}: " \
                     f"{why_not}; {where})")
    return rule, f"model runner: V2 (vLLM {version} defaults to Model Runner V2 for {arch}; {where})"


def v2_input_buffer_bytes(tokens: int, seqs: int) -> int:
    """Model Runner V2's persistent input buffers on the device (``vllm/v1/worker/gpu/input_batch.py``
    ``InputBuffers.__init__``, 0.29.0): input_ids int32, positions int64 and is_padding bool per batched token (13 B),
    query_start_loc int32 (seqs + 1), seq_lens and dcp_local_seq_lens int32 per sequence.  8192 tokens, 1024
    sequences: 8192 x 13 + 1025 x 4 + 2 x 1024 x 4 = 106,496 + 4,100 + 8,192 = 118,788 B."""
    return tokens * (4 + 8 + 1) + (seqs + 1) * 4 + 2 * seqs * 4


def _runner_notes(r: Resolved, runner: ModelRunnerRule | None, why: str, b: _Budget, batched: int,
                  seqs: int) -> list[str]:
    """What the decision says of the model runner, and what of Model Runner V2 is not modelled (widens the band)."""
    if not why:
        return []
    notes = [why]
    if r.gpu.vendor != "nvidia":
        # vllm/config/vllm.py (0.28.0 on): ROCm keeps V1 for ROCM_DEFAULT_MRV1_ARCHITECTURES, a rule not read here
        notes.append(f"not modelled: the model runner vLLM picks on {r.gpu.vendor.upper()} GPUs (the rule above is CUDA's; "
                     "ROCm defaults some architectures to V1)")
    if runner is None:
        return notes
    notes.append("Model Runner V2's profile run forwards the same max_num_batched_tokens over min(tokens, max_num_seqs) "
                 "dummy requests as V1 (vllm/v1/worker/gpu/model_runner.py _dummy_run, profile_run): the forward "
                 "peak is V1's")
    if runner.sampler == "warmup-pass":
        notes.append("not modelled: Model Runner V2's second dummy sampler pass (SamplingParams.for_sampler_warmup: "
                     "fp32 logits, penalties, logit bias, top-k/top-p, logprobs, watermarking); the V1 sampler's "
                     "bytes are used in its place")
    else:
        copy = "and their fp32 copy " if runner.sampler == "fp32-copy" else ""
        notes.append(f"Model Runner V2's dummy sampler run: logits {copy}with the sampling defaults (no top-k/top-p), "
                     f"{b.sampler / GiB:.2f} GiB (serve/vllm.py v2_sampler_peak_bytes)")
    notes.append(f"Model Runner V2's persistent input buffers ({v2_input_buffer_bytes(batched, seqs) / MiB:.2f} MiB, "
                 "input_batch.py InputBuffers) are not counted, as V1's are not")
    if b.cudagraphs is not None:
        # stated, not widened to the widest class: what is uncertain is bounded by the graphs' own term, which is
        # small beside the budget (a whole-band widening would call every default 0.22+ server MAY NOT FIT)
        g = b.cudagraphs
        notes.append(f"Model Runner V2 captures and estimates its CUDA graphs by its own code "
                     "(vllm/v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory: piecewise graphs measured in full, "
                     "full graphs extrapolated from samples), whose capture sizes and modes were not read: the graphs "
                     f"are counted by V1's capture mechanism, {g.bytes / GiB:.2f} GiB (band {g.low_bytes / GiB:.2f} to "
                     f"{g.high_bytes / GiB:.2f}); the KV pool moves by at most about that term if V2 captures otherwise")
    if b.mm is not None:
        notes.append("not modelled: Model Runner V2's encoder profile (vllm/v1/worker/gpu/model_runner.py profile_run: "
                     "encoder_runner.profile_encoder_cache); V1's encoder terms are used")
    if r.scenario.serve.speculative is not None:
        notes.append("not modelled: Model Runner V2's speculator in the profile run (vllm/v1/worker/gpu/spec_decode); "
                     "V1's proposer and rejection-sampler terms are used")
    return notes


def speculative_profile_modelled(version: str) -> bool:
    """Whether the proposer's profile-run terms of ``version`` were read (``SPECULATIVE_PROFILE_FROM`` on)."""
    return parse_release(version) >= SPECULATIVE_PROFILE_FROM


def _mtp_draft(r: Resolved, version: str) -> tuple[int, tuple[int, ...], str, ModelSpec | None]:
    """vLLM's MTP proposer (facts/vllm_mtp.py): the target's ``num_nextn_predict_layers`` MTP layers, each a
    decoder layer shaped like the target's last with ``eh_proj`` and three norms (``mtp_layer_bytes``, shared with
    SGLang's NEXTN draft), its attention a KV layer of the target's size; the embedding is the target's, and each
    layer's ``shared_head.head`` too from 0.16.0 (before, ``ceil(vocab / tp) x h`` in the model dtype each stays).
    DeepSeek-V3, tp 8, fp8-block, bf16, 0.17.0: one MTP layer; the model returned is the target, whose layer
    shapes the proposer's forward (``_speculative_terms``)."""
    sv, m, par = r.scenario.serve, r.model, r.scenario.parallel
    spec = sv.speculative
    assert spec is not None
    rel = parse_release(version)
    first = ".".join(map(str, MTP_METHOD_FROM))
    if rel < MTP_METHOD_FROM:
        raise _refuse("serve.speculative.method", f"vLLM {version}'s MTP proposer (method 'deepseek_mtp' in 0.9-0.10) "
                      f"is not modelled: vLLM's method 'mtp' was read from {first} (facts/vllm_mtp.py)",
                      f"use serve.vllm_version >= {first}")
    if spec.model:
        raise _refuse("serve.speculative.model", "vLLM's method 'mtp' reads the target's own MTP layers (the "
                      "speculative model defaults to the target); a separate MTP checkpoint is not modelled",
                      "remove serve.speculative.model")
    if par.pp > 1:
        raise _refuse("serve.speculative.method", "an MTP proposer with pipeline parallelism is not modelled (vLLM "
                      "then loads the proposer's embedding separately, EagleProposer._maybe_share_embeddings)",
                      "use parallel.pp 1")
    try:
        cfg = model_config(r.scenario.model, offline=True, copy_=False)
    except (VramplanError, OSError):
        cfg = {}
    archs = cfg.get("architectures") or []
    arch = mtp_arch(archs[0]) if isinstance(archs, list) and archs else None
    nextn = cfg.get("num_nextn_predict_layers")
    if not isinstance(nextn, int) or nextn < 1 or arch is None:
        known = ", ".join(a.architecture for a in VLLM_MTP_ARCHS)
        what = ("has no MTP layers (num_nextn_predict_layers)" if not isinstance(nextn, int) or nextn < 1 else
                f"is a {archs[0]}, whose MTP layers are not modelled for vLLM")
        raise _refuse("serve.speculative.method", f"{m.name} {what}; vLLM's MTP proposer is modelled for {known}",
                      "use method eagle, eagle3, draft or ngram, or a model with MTP layers such as "
                      "deepseek-ai/DeepSeek-V3")
    k = spec.num_speculative_tokens
    if k > nextn and k % nextn:
        raise _refuse("serve.speculative.num_speculative_tokens", f"vLLM raises 'num_speculative_tokens:{k} must be "
                      f"divisible by n_predict={nextn}' (vllm/config/speculative.py, MTP layer reuse)",
                      f"use a multiple of {nextn}, or at most {nextn}")
    c, tp = dtype_bits(sv.dtype) // 8, par.tp
    ep, expert_tp = moe_split(r)
    layers_bytes = nextn * mtp_layer_bytes(m, tp, ep, expert_tp, c, sv.quantization)
    heads = 0 if rel >= MTP_HEAD_SHARED_FROM else nextn * ceil_div(m.vocab_size, tp) * m.hidden_size * c
    weights = layers_bytes + heads
    tspec = kv_spec(m, sv.kv_cache_dtype, c, tp)
    layers = (tspec.layer_bytes_per_token(tspec.layers[-1]),) * nextn
    shared_from = ".".join(map(str, MTP_HEAD_SHARED_FROM))
    head_note = (f"the embedding and LM head are the target's (EagleProposer shares both from {shared_from}; the "
                 "copies it loads are freed before the weights are measured)" if not heads else
                 f"the embedding is the target's; each layer keeps its own shared_head.head ({heads / GiB:.2f} GiB: "
                 f"vLLM {version} does not replace it by the target's, which it does from {shared_from})")
    read = speculative_profile_modelled(version)
    profile = ("its profile run (the MTP layer's forward, rejection sampler) and buffers are sized from vLLM's source "
               "(see below)" if read else "its profile run is assumed to peak below the target's")
    if model_runner(r, version)[0] is not None:
        profile += (f" (vLLM {version} runs Model Runner V2 for this setup, facts/vllm_releases.py MODEL_RUNNER_RULES; "
                    "its MTP speculator's profile run was not read: the V1 runner's EagleProposer is assumed)")
    note = (f"speculative mtp proposer ({arch.draft}, the target's own {nextn} MTP layer(s), num_nextn_predict_layers): "
            f"{weights / GiB:.2f} GiB of weights, each layer a decoder layer shaped like the target's last (stored "
            f"as the target's, {sv.quantization}) with eh_proj and norms ({layers_bytes / GiB:.2f} GiB); {head_note}; "
            f"the rotary cache is the target's; {nextn} KV layer(s) of the target's size in the same block pool; "
            f"{profile}; num_speculative_tokens {k} changes no start-up memory (above {nextn} the layers run again)")
    return weights, layers, note, m


def _draft(r: Resolved, version: str) -> tuple[int, tuple[int, ...], str, ModelSpec | None]:
    """(weights, KV bytes per token of each layer, note, model) of a draft model or EAGLE head from the catalog."""
    sv = r.scenario.serve
    spec = sv.speculative
    assert spec is not None
    if spec.method == "ngram":
        return 0, (), "speculative n-gram proposer: no GPU weights, no KV layers (it matches the prompt on the host)", None
    if spec.method == "mtp":
        return _mtp_draft(r, version)
    if not spec.model:
        raise _refuse("serve.speculative.model", f"speculative method {spec.method!r} needs a model",
                      "give serve.speculative.model as a catalog name (vramplan models)")
    draft = load_model(spec.model, where="serve.speculative.model")
    c, tp = dtype_bits(sv.dtype) // 8, r.scenario.parallel.tp
    rotary = _draft_rotary_bytes(r.model, draft, c)
    weights = weights_bytes(rank_params(draft, tp, 1, 1, 0, None), c, "none") + rotary
    dspec = kv_spec(draft, sv.kv_cache_dtype, c, tp)
    layers = tuple(dspec.layer_bytes_per_token(la) for la in dspec.layers)
    shared = (f" (with its own rotary cache, {rotary / GiB:.2f} GiB)" if rotary else
              " (the rotary cache is the target's: same head size and max position)")
    read = speculative_profile_modelled(version)
    profile = ("its profile run (forward, rejection sampler) and buffers are sized from vLLM's source (see below)"
               if read else "its profile run is assumed to peak below the target's")
    return weights, layers, (f"speculative {spec.method} proposer {draft.name}: {weights / GiB:.2f} GiB of weights "
                             f"({sv.dtype}, unquantized){shared} and {len(layers)} "
                             f"KV layers in the same block pool; {profile}; num_speculative_tokens changes no "
                             "start-up memory"), draft


def _cudagraph_option_notes(r: Resolved, row: VllmRelease, version: str) -> list[str]:
    """Check ``serve.cudagraph_capture_sizes``, ``max_cudagraph_capture_size`` and ``cudagraph_mode`` against the
    release (facts/vllm_cudagraphs.py, "The user's sizes and modes"); the report's note, or a ScenarioError."""
    sv = r.scenario.serve
    sizes, top, mode = sv.cudagraph_capture_sizes, sv.max_cudagraph_capture_size, sv.cudagraph_mode
    given = ([k for k, v in (("cudagraph_capture_sizes", sizes), ("max_cudagraph_capture_size", top)) if v is not None]
             + (["cudagraph_mode"] if mode != "auto" else []))
    if not given:
        return []
    where = f"serve.{given[0]}"
    if not sv.cuda_graphs:
        raise _refuse(where, f"{where} is read only with CUDA graphs, and serve.cuda_graphs is false (--enforce-eager)",
                      f"remove {where}, or set serve.cuda_graphs: true")
    rel = parse_release(version)
    if row.engine != "v1":
        first_v1 = next(x.name for x in VLLM_RELEASES if x.engine == "v1")
        raise _refuse(where, f"vLLM {version} runs the V0 engine, whose graph sizes follow max_num_seqs; {where} is "
                      "modelled for the V1 engine", f"use serve.vllm_version >= {first_v1}, or remove {where}")
    if top is not None and rel < USER_MAX_FROM:
        raise _refuse("serve.max_cudagraph_capture_size", f"vLLM {version} has no option for the largest capture size "
                      "(--cuda-graph-sizes N came in 0.9.0, --max-cudagraph-capture-size in 0.12.0)",
                      "use serve.cudagraph_capture_sizes (the exact list), or serve.vllm_version >= 0.9")
    if mode != "auto" and rel < USER_MODE_FROM:
        raise _refuse("serve.cudagraph_mode", f"vLLM {version} has no cudagraph_mode (CUDAGraphMode came in 0.11.0; "
                      "0.10's full_cuda_graph is not modelled)", "use serve.vllm_version >= 0.11, or remove serve.cudagraph_mode")
    if sizes is not None and top is not None:
        raise _refuse("serve.max_cudagraph_capture_size", "serve.cudagraph_capture_sizes and "
                      "max_cudagraph_capture_size are both given (vLLM 0.12+ raises 'customized "
                      "max_cudagraph_capture_size ... should be consistent with the max value of cudagraph_capture_sizes' "
                      "unless they agree; before 0.12 the list wins)", "give one of them")
    if sizes is not None and (not sizes or min(sizes) < 1):
        raise _refuse("serve.cudagraph_capture_sizes", f"capture sizes must be positive and at least one ({sizes})",
                      "give sizes such as 1,2,4,8,16")
    if mode == "NONE" and (sizes is not None or top is not None):
        raise _refuse(where, "serve.cudagraph_mode NONE captures no graph, so capture sizes have no effect",
                      "remove the capture sizes, or choose another serve.cudagraph_mode")
    if mode in ("FULL", "FULL_DECODE_ONLY") and sv.speculative is not None and sv.speculative.method != "ngram":
        raise _refuse("serve.cudagraph_mode", f"a speculative proposer under cudagraph_mode {mode} is not modelled "
                      "(its graphs are piecewise only: vllm/v1/spec_decode initialize_cudagraph_keys)",
                      "use cudagraph_mode PIECEWISE or FULL_AND_PIECEWISE (auto), or method ngram")
    if mode == "NONE":
        return [("serve.cudagraph_mode NONE: no CUDA graph is captured; the model is still compiled (the profile run's "
                "forward as compiled)")]
    told = ", ".join(f"serve.{k} {getattr(sv, k)}" for k in given)
    return [(f"CUDA graphs as given ({told}; facts/vllm_cudagraphs.py, the user's sizes and modes of vLLM "
            f"{version}); an attention backend without full-graph support would capture fewer graphs "
            "(vLLM downgrades the mode with a warning): not modelled")]


# the first release without --swap-space (CacheConfig.swap_space: 0.15.1, 0.16.0 and 0.17.0 have it, 0.18.0 has not)
SWAP_SPACE_GONE = (0, 18, 0)
SWAP_SPACE_DEFAULT_GIB = 4  # CacheConfig.swap_space default (0.6.0-0.15.1)


def _swap_gib(r: Resolved) -> float:
    """``serve.swap_space_gib``, or vLLM's default where it is not given."""
    given = r.scenario.serve.swap_space_gib
    return SWAP_SPACE_DEFAULT_GIB if given is None else given


def _swap_space_notes(r: Resolved, row: VllmRelease, version: str) -> list[str]:
    """``serve.swap_space_gib`` against the release: V0 allocates it (``host_swap_bytes``), V1 does not."""
    sv = r.scenario.serve
    if sv.swap_space_gib is not None and parse_release(version) >= SWAP_SPACE_GONE:
        raise _refuse("serve.swap_space_gib", f"vLLM {version} has no --swap-space (CacheConfig.swap_space is gone "
                      f"from {'.'.join(map(str, SWAP_SPACE_GONE))}; V1 recomputes preempted requests)",
                      "remove serve.swap_space_gib, or use an earlier serve.vllm_version")
    if row.engine == "v0":
        gib = _swap_gib(r)
        return [(f"serve.swap_space_gib {gib:g} (--swap-space): pinned host RAM per GPU for swapped-out KV blocks "
                 "(V0 CacheEngine's CPU cache; host_swap_bytes), none of it on the GPU")]
    if sv.swap_space_gib is not None:
        return [(f"serve.swap_space_gib {sv.swap_space_gib:g}: the V1 engine of vLLM {version} allocates no swap "
                 "space (it recomputes preempted requests); it only checks that swap x tp stays under 70% of host RAM "
                 "(CacheConfig.verify_with_parallel_config)")]
    return []


def _host_swap_bytes(r: Resolved, row: VllmRelease, block_bytes: int) -> int:
    """V0's CPU cache: ``num_cpu_blocks = int(swap_space_bytes // cache_block_size)`` blocks of every layer
    (vllm/worker/worker.py ``determine_num_available_blocks``, 0.6-0.7), pinned host memory.  Llama-3.1-8B, block
    16, bf16: a block is 16 x 131,072 B = 2,097,152 B; 4 GiB holds 2,048 blocks = 4 GiB."""
    if row.engine != "v0" or block_bytes <= 0:
        return 0
    return int(_swap_gib(r) * GiB) // block_bytes * block_bytes


SLEEP_MODE_FROM = (0, 9, 0)  # the first release whose Worker.sleep was read (V1); 0.33.0 read too


def _sleep_notes(r: Resolved, row: VllmRelease, version: str) -> list[str]:
    """``serve.sleep_level`` against the release: V1 from 0.9.0 (``Worker.sleep`` read in 0.9.0 and 0.33.0)."""
    level = r.scenario.serve.sleep_level
    if not level:
        return []
    if row.engine != "v1" or parse_release(version) < SLEEP_MODE_FROM:
        raise _refuse("serve.sleep_level", f"vLLM {version}'s sleep mode was not read (V1 Worker.sleep read from "
                      f"{'.'.join(map(str, SLEEP_MODE_FROM))})", "use serve.vllm_version >= 0.9, or serve.sleep_level 0")
    what = ("weights copied to host RAM, KV cache discarded" if level == 1 else
            "weights and KV cache discarded, the model's buffers copied to host RAM")
    return [(f"serve.sleep_level {level}: start-up memory as without sleep mode; while asleep ({what}) the CUDA context, "
            "NCCL, non-torch memory, CUDA graphs and the torch allocator's cached blocks stay on the GPU "
            "(asleep_device_bytes, asleep_host_bytes; CuMemAllocator.sleep)")]


def _host_lora_bytes(r: Resolved, row: VllmRelease, version: str, notes: list[str]) -> int:
    """``serve.max_cpu_loras``: vLLM's host LRU of adapters (``LoRAConfig.max_cpu_loras``, default max_loras;
    ``vllm/lora/worker_manager.py`` ``LRUCacheWorkerLoRAManager``: adapters loaded to the CPU, whole in each
    worker).  Bounded by that many adapters of max_lora_rank on every linear (``lora_slot_bytes`` at tp 1)."""
    sv, m = r.scenario.serve, r.model
    if sv.max_cpu_loras is None:
        return 0
    if not sv.max_loras:
        raise _refuse("serve.max_cpu_loras", "serve.max_cpu_loras is read only with LoRA serving (max_loras 0)",
                      "set serve.max_loras >= 1, or remove serve.max_cpu_loras")
    if sv.max_cpu_loras < sv.max_loras:
        raise _refuse("serve.max_cpu_loras", f"vLLM raises 'max_cpu_loras ({sv.max_cpu_loras}) must be >= max_loras "
                      f"({sv.max_loras})' (vllm/config/lora.py)", f"set serve.max_cpu_loras >= {sv.max_loras}")
    host = lora_slot_bytes(m, sv.max_lora_rank, sv.max_cpu_loras, 1, dtype_bits(sv.dtype) // 8)
    notes.append(f"serve.max_cpu_loras {sv.max_cpu_loras}: up to {host / GiB:.2f} GiB of host RAM per GPU worker "
                 f"(that many adapters of rank {sv.max_lora_rank} on every linear, whole in each worker; an adapter "
                 "of lower rank or fewer modules takes less); host_lora_cache_bytes")
    return host


def _options(r: Resolved, row: VllmRelease, version: str, params: int) -> _Options:
    """Check the options against the release and size them (ScenarioError for a bad combination)."""
    sv, m, tp = r.scenario.serve, r.model, r.scenario.parallel.tp
    notes: list[str] = []
    if sv.kv_cache_memory_bytes is not None:
        if not row.kv_cache_memory_bytes:
            first = next(x.name for x in VLLM_RELEASES if x.kv_cache_memory_bytes)
            raise _refuse("serve.kv_cache_memory_bytes", f"vLLM {version} has no kv_cache_memory_bytes option",
                          f"use serve.vllm_version >= {first} or remove serve.kv_cache_memory_bytes")
        notes.append(f"kv_cache_memory_bytes: the KV cache gets {sv.kv_cache_memory_bytes / GiB:.2f} GiB as given; "
                     "gpu_memory_utilization does not size it (the profile run still runs)")
    notes += _cudagraph_option_notes(r, row, version)
    notes += replicated_kv_notes(r)
    notes += mla_after_load_notes(r)
    offloaded = min(params, int(sv.cpu_offload_gb * GiB))
    if offloaded:
        notes.append(f"cpu_offload_gb: {offloaded / GiB:.2f} GiB of weights in pinned host memory, streamed to the GPU "
                     "in each forward pass (whole parameters: vLLM may move up to one parameter more)")
    lora = 0
    if sv.max_loras:
        if sv.max_lora_rank not in row.lora_ranks:
            raise _refuse("serve.max_lora_rank", f"vLLM {version} accepts max_lora_rank in "
                          f"{', '.join(map(str, row.lora_ranks))}, not {sv.max_lora_rank}",
                          "use one of those ranks")
        if m.moe is not None or m.mla is not None:
            raise _refuse("serve.max_loras", f"LoRA slots for {m.name} (MoE or MLA layers) are not modelled",
                          "set serve.max_loras: 0")
        lora = lora_slot_bytes(m, sv.max_lora_rank, sv.max_loras, tp, dtype_bits(sv.dtype) // 8)
        notes.append(f"LoRA: {sv.max_loras} slots of rank {sv.max_lora_rank} on every attention and MLP linear, "
                     f"{lora / GiB:.2f} GiB preallocated with the weights" + ("" if row.lora_in_budget else
                     f"; vLLM {version} allocates them after measuring the weights and before profiling, so they "
                     "are outside gpu_memory_utilization and do not shrink the KV cache "
                     "(facts/vllm_releases.py lora_in_budget)"))
    host_lora = _host_lora_bytes(r, row, version, notes)
    notes += _swap_space_notes(r, row, version)
    notes += _sleep_notes(r, row, version)
    draft, draft_layers, draft_model = 0, tuple[int, ...](), None
    if sv.speculative is not None:
        draft, draft_layers, note, draft_model = _draft(r, version)
        if draft_layers and kv_spec(m, sv.kv_cache_dtype, dtype_bits(sv.dtype) // 8, tp).has_sliding:
            raise _refuse("serve.speculative", "a proposer's KV layers beside a hybrid (sliding-window) model are not "
                          "modelled", "use method ngram or a model without sliding-window layers")
        notes.append(note)
        if sv.cuda_graphs and row.cudagraph_subtracted:
            # the estimate vLLM subtracts is measured on graphs whose sizes follow the speculative query length
            notes.append(f"not modelled: with speculative decoding vLLM {version} captures its CUDA graphs at sizes "
                         "rounded up to multiples of num_speculative_tokens + 1 (vllm/config/compilation.py "
                         "CompilationConfig.adjust_cudagraph_sizes_for_spec_decode, 0.12.0 on; 0.29.0 adds request-count "
                         "decode sizes), while the sizes counted here are the grid scaled by the query length "
                         "(facts/vllm_cudagraphs.py), so the estimate it subtracts from the KV budget differs")
    modelled = sv.speculative is not None and speculative_profile_modelled(version)
    mtp = sv.speculative is not None and sv.speculative.method == "mtp"
    return _Options(offloaded=offloaded, lora=lora, host_lora=host_lora, draft_weights=draft, draft_layer_bytes_per_token=draft_layers,
                    notes=tuple(notes), draft_model=draft_model if modelled else None,
                    draft_is_model=sv.speculative is not None and sv.speculative.method == "draft",
                    speculative_profile=modelled, draft_layers=len(draft_layers) if mtp else
                    len(draft_model.layers) if draft_model else 0, mtp_layers=len(draft_layers) if mtp else 0)


@dataclass(frozen=True)
class _Budget:
    """Step 1-4 of the module docstring: what is requested, what the profile run takes, what is left."""

    total: int
    requested: int
    params: int
    rotary: int
    forward: int
    sampler: int
    cublas: int
    non_torch: int
    graphs: int
    subtracted: bool
    context: int
    nccl: int
    charged: int = 0  # CUDA context / NCCL bytes the release's rule takes from the budget (``budget``)
    comm: int = 0  # tp > 1: custom all-reduce and symmetric-memory buffers (facts/vllm_tp_comm.py)
    comm_high_extra: int = 0  # tp > 1: NCCL buffers up to the band's high end beyond ``nccl``, outside the budget
    comm_outside: bool = True  # the communicators are created before the memory snapshot (0.11.0 on)
    extra_weights: int = 0  # LoRA slots and the speculative proposer, loaded with the model
    offloaded: int = 0  # weights kept in host memory (cpu_offload_gb)
    explicit_kv: int | None = None  # kv_cache_memory_bytes: the KV budget, the utilisation rule skipped
    lora_outside: int = 0  # LoRA slots the release leaves outside the budget (``lora_in_budget`` False)
    others: int = 0  # what other processes hold on the device (hardware.memory_in_use_gib)
    rejection_peak: int = 0  # the rejection sampler's dummy run (speculative decoding)
    proposer_peak: int = 0  # the proposer's forward in the dummy run (draft model, EAGLE head)
    proposer_buffers: int = 0  # the proposer's persistent buffers (in "weights + non-torch", not in the weights)
    cudagraphs: CudagraphEstimate | None = None  # the captured graphs (serve/cudagraphs.py); None: eager
    mm: MmProfile | None = None  # a multimodal model's encoder profile (serve/vllm_mm.py)

    @property
    def weights(self) -> int:
        return self.params - self.offloaded + self.rotary + self.extra_weights

    @property
    def activations(self) -> int:
        """vLLM's "torch peak memory increase": the larger of the forward, the sampler and (speculative
        decoding) the proposer's forward or the rejection sampler, plus cuBLAS'.  A multimodal model's encoder
        outputs are alive through them, and its encoder's forward on the dummy items is a moment of its own
        (``GPUModelRunner.profile_run``, serve/vllm_mm.py)."""
        lm = max(self.forward, self.sampler, self.rejection_peak, self.proposer_peak)
        if self.mm is not None:
            lm = max(self.mm.encoder_peak_bytes, lm + self.mm.output_bytes)
        return lm + self.cublas

    @property
    def non_kv(self) -> int:
        return self.weights + self.activations + self.non_torch + self.charged + self.proposer_buffers

    @property
    def available(self) -> int:
        """What the KV cache gets (may be <= 0)."""
        if self.explicit_kv is not None:
            return self.explicit_kv
        return self.requested - self.non_kv - (self.graphs if self.subtracted else 0)


def _charged(rule: str, context: int, nccl: int, others: int = 0, comm: int = 0, comm_outside: bool = True) -> int:
    """What of the CUDA context, NCCL's buffers, the all-reduce buffers (``comm``) and other processes' memory the
    release's budget rule takes from the budget (``facts/vllm_releases.py``): ``peak_plus_non_torch`` counts every
    non-torch byte on the device, other processes' too (vLLM 0.6.4 ``Worker.determine_num_available_blocks``:
    ``peak_memory = total_gpu_memory - free_gpu_memory`` less torch's share); ``free_delta`` what appeared after the
    first snapshot (NCCL and the all-reduce buffers; what others held at the worker's start is in that snapshot);
    ``profiled_increase`` the communicators' buffers when they are created after the snapshot (before 0.11.0:
    facts/vllm_tp_comm.py ``COMM_OUTSIDE_FROM``), else none.  The caller leaves out of ``comm`` what V1's
    ``memory_profiling`` does not see: custom all-reduce's torch-allocated ``rank_data``, neither a non-torch
    increase nor in the profile's torch peak (counted from after the weights load), so outside the budget."""
    if rule == "peak_plus_non_torch":
        return context + nccl + comm + others
    if rule == "free_delta" or not comm_outside:
        return nccl + comm
    return 0


def _budget(r: Resolved, beh: VllmBehaviour, batched: int, requests: int, subtract_cudagraphs: bool,
            opt: _Options, sampler: str, seqs: int = 0, stage: int = 0,
            runner: ModelRunnerRule | None = None, weights: tuple[int, int] | None = None) -> _Budget:
    """One GPU's budget; ``stage``: its pipeline rank (pp > 1: ``pp_stage_layers``' layers, the intermediate
    tensors on every rank but the first, the sampler on the last only: ``_stage_activations``); ``weights``: the
    rank's ``serve_weights_bytes`` where the caller has them."""
    sv, m, gpu, tp, pp = r.scenario.serve, r.model, r.gpu, r.scenario.parallel.tp, r.scenario.parallel.pp
    c = dtype_bits(sv.dtype) // 8
    params, rotary = weights if weights is not None else serve_weights_bytes(r, stage)
    params += mla_after_load_bytes(r, len(pp_stage_layers(m.num_layers, pp, stage)))
    row = beh.rules
    # one NCCL communicator per group of more than one rank: the tensor-parallel group and the pipeline group
    # (vllm/distributed/parallel_state.py initialize_model_parallel, a PyNcclCommunicator each)
    # data parallelism adds the expert-parallel group's communicator (dp x tp ranks) that the MoE layers' dispatch
    # and combine run on (vLLM 0.11.0 distributed/parallel_state.py initialize_model_parallel ``_EP``); a dense
    # model's DP ranks only exchange token counts (on the CPU group, forward_context.py DPMetadata)
    context = cuda_context_bytes(gpu)
    nccl = nccl_bytes((tp > 1) + (pp > 1) + (sv.dp > 1 and m.moe is not None))
    comm, comm_high_extra, comm_outside = _tp_comm(r, beh, nccl)
    # an explicit KV budget skips the profiling, and with it the graphs' estimate: they are captured outside it
    # (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory returns kv_cache_memory_bytes first, 0.20-0.33)
    captures = sv.cuda_graphs and sv.cudagraph_mode != "NONE"  # NONE: compiled, no graph
    subtract = (subtract_cudagraphs or row.cudagraph_subtracted) and captures and sv.kv_cache_memory_bytes is None
    # gpu_memory_utilization is a fraction of the device's whole memory (``init_snapshot.total_memory``),
    # whatever other processes hold of it
    total, others = gpu.device_total_bytes, gpu.in_use_by_others_bytes
    layers = len(pp_stage_layers(m.num_layers, pp, stage))
    graphs = _cudagraphs(r, beh, batched, seqs, opt, layers) if captures else None
    _, moe_tp = moe_split(r)
    forward = forward_peak_bytes(m, batched, c, tp, compiled=sv.cuda_graphs and row.profile_compiled,
                                 moe_tp=moe_tp, dp=sv.dp)
    return _Budget(
        total=total, requested=int(total * sv.gpu_memory_utilization), others=others,
        params=params, rotary=rotary, forward=forward + (_intermediate_bytes(m, batched, c) if stage > 0 else 0),
        sampler=(0 if stage != pp - 1 else
                 v2_sampler_peak_bytes(m, batched, requests, c, runner.sampler == "fp32-copy")
                 if runner is not None and runner.sampler != "warmup-pass" else
                 sampler_peak_bytes(m, batched, requests, c, sampler)),
        cublas=cublas_workspace_bytes(gpu, handles=1),
        non_torch=beh.non_torch_tp1_bytes if tp == 1 else beh.non_torch_tp_bytes,
        graphs=graphs.bytes if graphs else 0, subtracted=subtract, cudagraphs=graphs,
        context=context, nccl=nccl,
        charged=_charged(row.budget, context, nccl, others,
                         comm - (_custom_ar_torch_bytes(tp, r.gpu) if row.engine == "v1" else 0), comm_outside),
        comm=comm, comm_high_extra=comm_high_extra, comm_outside=comm_outside,
        extra_weights=(opt.lora if row.lora_in_budget else 0) + opt.draft_weights, offloaded=opt.offloaded,
        explicit_kv=sv.kv_cache_memory_bytes, lora_outside=0 if row.lora_in_budget else opt.lora,
        **_speculative_terms(r, beh, opt, batched, requests, seqs, sampler), mm=_mm_profile(r, beh, batched, seqs),
    )


def _intermediate_bytes(m: ModelSpec, batched: int, dtype_bytes: int) -> int:
    """The buffers a pipeline rank after the first receives the previous rank's output in, allocated in the
    profile run and kept (vllm/v1/worker/gpu_model_runner.py ``_dummy_run``: ``self.intermediate_tensors =
    self.model.make_empty_intermediate_tensors(batch_size=self.max_num_tokens, ...)`` when not
    ``get_pp_group().is_first_rank``): "hidden_states" and "residual", each max_num_batched_tokens x h in the
    model dtype (``make_empty_intermediate_tensors_factory``).  Qwen3-235B-A22B (h 4096), 8192 tokens, bf16:
    2 x 8192 x 4096 x 2 B = 134,217,728 B."""
    return 2 * batched * m.hidden_size * dtype_bytes


def _mm_profile(r: Resolved, beh: VllmBehaviour, batched: int, seqs: int) -> MmProfile | None:
    """The encoder's part of the profile run where it is modelled (serve/vllm_mm.py ``mm_profile_modelled``, V0's
    ``mm_v0_modelled``)."""
    sv = r.scenario.serve
    max_len = sv.max_model_len or r.model.max_position_embeddings
    release = parse_release(beh.version)
    if mm_v0_modelled(release, r.model):
        return mm_profile_v0(r.model, max_len, batched, seqs, dtype_bits(sv.dtype) // 8, sv.limit_mm_per_prompt,
                             release)
    if not mm_profile_modelled(release, r.model):
        return None
    return mm_profile(r.model, max_len, batched, seqs, dtype_bits(sv.dtype) // 8, sv.limit_mm_per_prompt,
                      parse_release(beh.version))


def _custom_ar_torch_bytes(tp: int, gpu: GpuSpec) -> int:
    """Custom all-reduce's ``rank_data``, the one buffer of it torch allocates (facts/vllm_tp_comm.py)."""
    return CUSTOM_AR_RANK_DATA_BYTES if custom_all_reduce_on(tp, gpu.interconnect.startswith("nvlink")) else 0


def _tp_comm(r: Resolved, beh: VllmBehaviour, nccl: int) -> tuple[int, int, bool]:
    """(all-reduce buffers, NCCL bytes from the point up to the band's high end, created before the snapshot) on one
    TP rank (facts/vllm_tp_comm.py); (0, 0, True) at tp = 1.

    H100 SXM (NVLink, 9.0), tp 2, vLLM 0.14: custom all-reduce 8 + 8 + 8 MiB = 25,165,824 B and symmetric memory
    64 MiB = 67,108,864 B: 92,274,688 B; NCCL's high end 616,562,688 B less the point 134,217,728 B = 482,344,960 B."""
    tp = r.scenario.parallel.tp
    if tp == 1:
        return 0, 0, True
    rel = parse_release(beh.version)
    nvlink = r.gpu.interconnect.startswith("nvlink")
    cap = r.gpu.compute_capability or None
    comm = custom_all_reduce_bytes(rel, tp, nvlink, cap) + symm_mem_bytes(rel, tp, cap)
    return comm, max(0, nccl_high_bytes(nvlink) - nccl), rel >= COMM_OUTSIDE_FROM


def _cudagraphs(r: Resolved, beh: VllmBehaviour, batched: int, seqs: int, opt: _Options,
                layers: int) -> CudagraphEstimate:
    """The graphs vLLM captures on one GPU (serve/cudagraphs.py): the pool is the largest size's decode forward
    peak, as the profile run's forward (compiled in V1, eager in V0) over that many tokens; with speculative
    decoding a decode step carries 1 + num_speculative_tokens tokens per sequence, and a proposer with layers is
    captured beside the target.  ``layers``: the decoder layers on this GPU (its pipeline stage's)."""
    m, tp, spec = r.model, r.scenario.parallel.tp, r.scenario.serve.speculative
    c = dtype_bits(r.scenario.serve.dtype) // 8
    compiled = beh.rules.profile_compiled
    blackwell = (r.gpu.compute_capability or "").startswith("10.")
    query_len = 1 + (spec.num_speculative_tokens if spec is not None else 0)
    sv = r.scenario.serve
    explicit = tuple(sv.cudagraph_capture_sizes) if sv.cudagraph_capture_sizes is not None else None
    _, moe_tp = moe_split(r)
    return cudagraph_estimate(parse_release(beh.version), seqs, batched, layers,
                              lambda tokens: forward_peak_bytes(m, tokens, c, tp, compiled, moe_tp, sv.dp), blackwell,
                              query_len, opt.draft_layers, explicit, sv.max_cudagraph_capture_size,
                              None if sv.cudagraph_mode == "auto" else sv.cudagraph_mode)


def _speculative_terms(r: Resolved, beh: VllmBehaviour, opt: _Options, batched: int, requests: int,
                       seqs: int, sampler: str) -> dict[str, int]:
    """``rejection_peak``, ``proposer_peak`` and ``proposer_buffers`` of ``_Budget`` for a release whose speculative profile run was
    read (``facts/vllm_releases.py`` ``SPECULATIVE_PROFILE_FROM``); none otherwise (the keys keep their defaults)."""
    if not opt.speculative_profile:
        return {}
    sv, m, tp = r.scenario.serve, r.model, r.scenario.parallel.tp
    c = dtype_bits(sv.dtype) // 8
    # the bonus-token stage samples through the path the scenario takes (serve.vllm_sampler)
    terms = {"rejection_peak": rejection_sampler_peak_bytes(m, batched, requests, c, sampler)}
    if opt.draft_model is not None:
        compiled = sv.cuda_graphs and beh.rules.profile_compiled
        if opt.mtp_layers:
            _, moe_tp = moe_split(r)
            terms["proposer_peak"] = mtp_forward_peak_bytes(m, batched, c, tp, compiled, moe_tp, sv.dp)
        else:
            terms["proposer_peak"] = proposer_forward_peak_bytes(m, opt.draft_model, batched, c, tp, compiled)
        terms["proposer_buffers"] = proposer_buffer_bytes(opt.draft_model, batched, seqs, c, opt.draft_is_model)
    return terms


@dataclass(frozen=True)
class _Blocks:
    """Step 5: the KV cache's blocks, and what one request of ``max_model_len`` needs."""

    spec: KVSpec
    groups: list[KVGroup]
    size: int  # layers per group
    page: int
    blocks: int
    tokens: int
    per_request: int
    needed: int
    fits_len: int
    block_size: int = 0  # the attention block vLLM uses, when it raises the scenario's (a hybrid model); 0: as given
    hybrid: HybridLayout | None = None  # a hybrid attention + Mamba2 model's layout (serve/mamba_pages.py)

    @property
    def kv_bytes(self) -> int:
        return self.blocks * self.page * self.size

    @property
    def concurrency(self) -> float:
        return self.blocks / self.per_request if self.per_request else 0.0


def _with_draft(size: int, page: int, block_size: int, draft: tuple[int, ...]) -> tuple[int, int]:
    """(layers per group, page) once a proposer's KV layers join the single group of a uniform model: layers of
    the same page add to the group (``get_kv_cache_groups``); layers of another size make one page of all
    layers' bytes (``UniformTypeKVCacheSpecs``: a block holds every layer's slice)."""
    if not draft:
        return size, page
    if all(block_size * d == page for d in draft):
        return size + len(draft), page
    return 1, size * page + block_size * sum(draft)


def _largest_by(fits: Callable[[int], bool], upper: int) -> int:
    """Binary search as vLLM's ``estimate_max_model_len``: the largest length ``fits``, 0 if not even one token."""
    if not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _ssm_bytes(m: ModelSpec, version: str) -> int | None:
    """The SSM state's bytes per element where vLLM takes its dtype from the config (``facts/vllm_releases.py``
    ``MAMBA_SSM_DTYPE_FROM_CONFIG``); None: the model dtype."""
    first = MAMBA_SSM_DTYPE_FROM_CONFIG.get(m.model_type)
    if first is None or m.mamba is None or parse_release(version) < first:
        return None
    return dtype_bits(m.mamba.ssm_cache_dtype or MAMBA_SSM_DTYPE_DEFAULT) // 8


def _hybrid_blocks(r: Resolved, available: int, max_len: int, rule: MambaHybridRule, version: str) -> _Blocks:
    """Step 5 for a hybrid attention + Mamba2 model: the attention block raised to hold a state page, the state
    page padded to it, attention and mixer groups of one size (``serve/mamba_pages.py``)."""
    sv, m = r.scenario.serve, r.model
    assert m.mamba is not None
    c = dtype_bits(sv.dtype) // 8
    spec = kv_spec(m, sv.kv_cache_dtype, c, r.scenario.parallel.tp)
    if not spec.layers:
        return _state_space_blocks(r, spec, available, max_len, rule, version)
    align = 32 if rule.blackwell_head256 and m.head_dim == 256 and (r.gpu.compute_capability or "").startswith("10.") else 16
    lay = hybrid_layout(m.mamba, len(spec.layers), spec.uniform_layer_bytes_per_token, c, sv.block_size, rule, align,
                        _ssm_bytes(m, version), r.scenario.parallel.tp)
    groups = ([KVGroup("full", None, lay.group_size)] * lay.attention_groups
              + [KVGroup("mamba", None, lay.group_size)] * lay.mamba_groups)
    blocks = max(0, available // lay.page // lay.group_size)
    per_req = lay.blocks_per_request(max_len)
    if rule.tokens_from_concurrency:
        tokens = int(blocks / per_req * max_len)
    else:
        # min over the groups' block sizes: the mixers' is mamba_block_size = max_model_len
        tokens = blocks // lay.groups * min(lay.block_size, max_len)
    avail = max(available, 0)
    return _Blocks(spec=spec, groups=groups, size=lay.group_size, page=lay.page, blocks=blocks, tokens=tokens,
                   per_request=per_req, needed=lay.needed(max_len, rule),
                   fits_len=_largest_by(lambda n: lay.needed(n, rule) <= avail, m.max_position_embeddings),
                   block_size=lay.block_size, hybrid=lay)


def _state_space_blocks(r: Resolved, spec: KVSpec, available: int, max_len: int, rule: MambaHybridRule,
                        version: str) -> _Blocks:
    """Step 5 for a model whose every layer is a mixer: one group of every layer, the state page, one block per
    request of ``max_model_len`` tokens (``serve/mamba_pages.py`` ``state_space_layout``)."""
    m = r.model
    assert m.mamba is not None
    lay = state_space_layout(m.mamba, dtype_bits(r.scenario.serve.dtype) // 8, max_len, _ssm_bytes(m, version),
                             r.scenario.parallel.tp)
    blocks = max(0, available // lay.page // lay.group_size)
    # "GPU KV cache size": num_blocks // 1 group x min block size (max_model_len), or from 0.24.0
    # int(max_concurrency x max_model_len) with max_concurrency = num_blocks / 1: the same tokens either way
    tokens = blocks * max_len
    needed = lay.needed(max_len, rule)  # every rule: the layers' pages for one request, group_size x page
    return _Blocks(spec=spec, groups=[KVGroup("mamba", None, lay.group_size)], size=lay.group_size, page=lay.page,
                   blocks=blocks, tokens=tokens, per_request=1, needed=needed,
                   fits_len=m.max_position_embeddings if needed <= max(available, 0) else 0,
                   block_size=max_len, hybrid=lay)


def _blocks(r: Resolved, available: int, batched: int, max_len: int, draft: tuple[int, ...] = (),
            hybrid: MambaHybridRule | None = None, version: str = DEFAULT_VERSION,
            layers: tuple[int, ...] | None = None) -> _Blocks:
    """``layers``: a pipeline stage's layers (their KV cache only, ``pp_stage_layers``); None: all."""
    if hybrid is not None:
        return _hybrid_blocks(r, available, max_len, hybrid, version)
    sv, m = r.scenario.serve, r.model
    spec = kv_spec(m, sv.kv_cache_dtype, dtype_bits(sv.dtype) // 8, r.scenario.parallel.tp)
    if layers is not None:
        spec = replace(spec, layers=tuple(spec.layers[i] for i in layers))
    groups, size = kv_groups(spec)
    page = sv.block_size * spec.uniform_layer_bytes_per_token
    size, page = _with_draft(size, page, sv.block_size, draft)
    blocks = max(0, available // page // size) if page and size else 0
    per_req = _blocks_per_request(groups, sv.block_size, max_len, batched)
    return _Blocks(
        spec=spec, groups=groups, size=size, page=page, blocks=blocks,
        tokens=blocks // max(1, len(groups)) * sv.block_size, per_request=per_req, needed=size * page * per_req,
        fits_len=_largest_len(groups, size, page, sv.block_size, batched, max(available, 0),
                              m.max_position_embeddings),
    )


def _start_problem(r: Resolved, b: _Budget, kv: _Blocks, max_len: int) -> tuple[str, str]:
    """vLLM's start-up error and the option to change, or ("", "") when it starts."""
    util, total, requested, available = r.scenario.serve.gpu_memory_utilization, b.total, b.requested, b.available
    free_at_start = total - b.context - b.nccl - b.others - (b.comm if b.comm_outside else 0)
    if free_at_start < requested:
        return ((f"Free memory on device ({free_at_start / GiB:.2f}/{total / GiB:.2f} GiB) on startup is less than "
                 f"desired GPU memory utilization ({util}, {requested / GiB:.2f} GiB). "
                 "Decrease GPU memory utilization or reduce GPU memory used by other processes."),
                f"serve.gpu_memory_utilization <= {int(free_at_start / total * 100) / 100:.2f}")
    if available <= 0:
        return (("No available memory for the cache blocks: weights, activation peak and non-torch memory "
                 f"({b.non_kv / GiB:.2f} GiB) exceed the requested {requested / GiB:.2f} GiB "
                 f"({util} x {total / GiB:.2f} GiB). Try increasing `gpu_memory_utilization`."),
                _weights_fix(r, b.weights, b.non_kv, total, requested))
    if kv.needed > available:
        fits_len = kv.fits_len
        est = f"Based on the available memory, the estimated maximum model length is {fits_len}. " if fits_len else ""
        return ((f"To serve at least one request with the models's max seq len ({max_len}), "
                 f"({kv.needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
                 f"({available / GiB:.2f} GiB). {est}Try increasing `gpu_memory_utilization` or decreasing "
                 "`max_model_len` when initializing the engine."),
                f"serve.max_model_len <= {fits_len}" if fits_len else "raise serve.gpu_memory_utilization")
    outside = (b.context + b.nccl + b.comm + b.others - b.charged + (0 if b.subtracted else b.graphs)
               + b.lora_outside)
    if b.explicit_kv is not None and b.non_kv + b.explicit_kv + outside > total:
        room = total - b.non_kv - outside
        return ((f"CUDA out of memory allocating the KV cache: kv_cache_memory_bytes ({b.explicit_kv / GiB:.2f} GiB) "
                 f"and the rest of the engine ({(b.non_kv + outside) / GiB:.2f} GiB) exceed the device's "
                 f"{total / GiB:.2f} GiB."),
                f"serve.kv_cache_memory_bytes <= {max(0, room)}")
    if requested + outside > total:
        ctx, comm, graphs = b.context, b.nccl, b.graphs
        # the fix leaves room for the graphs' high bound, so that following it gives a start, not a "may not"
        room = (total - ctx - comm - _graphs_outside(b, high=True) - b.others
                - (b.comm if b.comm_outside else 0) - b.comm_high_extra)
        others = f", other processes {b.others / GiB:.2f} GiB" if b.others else ""
        ar = f", all-reduce buffers {b.comm / GiB:.2f} GiB" if b.comm else ""
        return ((f"vLLM starts, but memory outside gpu_memory_utilization (CUDA context {ctx / GiB:.2f} GiB, "
                 f"NCCL {comm / GiB:.2f} GiB{ar}, CUDA graphs {graphs / GiB:.2f} GiB{others}) does not fit in the "
                 f"{(total - requested) / GiB:.2f} GiB left: CUDA graph capture runs out of memory."),
                f"serve.gpu_memory_utilization <= {max(0.0, int(room / total * 100) / 100):.2f} or --enforce-eager")
    return "", ""


def _graphs_outside(b: _Budget, high: bool = False) -> int:
    """The CUDA graphs' bytes outside gpu_memory_utilization (none when the release subtracts its estimate)."""
    if b.subtracted or b.cudagraphs is None:
        return 0
    return b.cudagraphs.high_bytes if high else b.graphs


def _graphs_note(b: _Budget, tp: int = 1) -> str:
    """The assumption that says how the graphs' bytes were found and where they sit."""
    g = b.cudagraphs
    assert g is not None
    where = ("vLLM profiles their capture and subtracts its estimate from the KV budget "
             "(vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_cudagraph_memory); the estimate here "
             "stands in for it" if b.subtracted else
             "captured after the KV cache is allocated, outside gpu_memory_utilization")
    read = "" if g.exact else "; this release's capture code was not read, the nearest earlier rule is assumed"
    comm = ("; tp > 1: the graphs capture the all-reduces too, each rank its own: the all-reduce kernels are among "
            "each segment's and their outputs in the pool; custom all-reduce registers the graphs' buffers by IPC "
            "handles of the peers' memory (vllm/distributed/device_communicators/custom_all_reduce.py "
            "register_graph_buffers, into its 8 MiB rank_data allocated at start-up), which maps the peers' memory "
            "and allocates none; NCCL's buffers that the captured collectives connect are in NCCL's band (tp > 1 "
            "assumption)" if tp > 1 else "")
    return f"{g.describe()}; {where}{read}{comm}"


def _tp_comm_note(b: _Budget, version: str) -> str:
    """The tp > 1 assumption: the communicators' buffers, where they sit, and NCCL's band."""
    where = ("created before the memory snapshot, outside gpu_memory_utilization" if b.comm_outside else
             "created after the memory snapshot, so vLLM takes them from the KV budget (non-torch increase; V1: "
             "all but custom all-reduce's torch-allocated 8 MiB rank_data)")
    return (f"tp > 1, vLLM {version}: NCCL {b.nccl / GiB:.2f} GiB (16 channels x 2 x NCCL_BUFFSIZE 4 MiB) and "
            f"all-reduce buffers {b.comm / GiB:.2f} GiB (custom all-reduce: 8 MiB meta + IPC buffer + 8 MiB "
            "rank_data, CustomAllreduce.__init__; torch symmetric memory SYMM_MEM_ALL_REDUCE_MAX_SIZES on compute "
            f"capability 9.0/10.0 from 0.11.0), {where} (vllm/v1/worker/gpu_worker.py Worker.init_device, "
            "facts/vllm_tp_comm.py); NCCL's buffers depend on its version and the topology: up to "
            f"{b.comm_high_extra / GiB:.2f} GiB more (every protocol on NCCL's 32 channels, connected at first use "
            "after the profile run, NCCL_RUNTIME_CONNECT) is the band's high end, which the start-up verdict uses; "
            "custom all-reduce assumes the GPUs pass vLLM's P2P check")


def _start_risk(r: Resolved, b: _Budget) -> tuple[str, str]:
    """("may not start" message, fix) when vLLM starts by the point estimate but the high ends of what is allocated
    after the KV cache do not fit in the room left outside gpu_memory_utilization: the graphs' band (captured after
    the KV cache is allocated: V0 ``capture_model``, V1 ``Worker.compile_or_warm_up_model``) and, at tp > 1, NCCL's
    buffers connected after the profile run up to their band's high end (facts/vllm_tp_comm.py ``nccl_high_bytes``).
    ("", "") otherwise; the graphs do not count when the release subtracts their estimate from the KV budget."""
    g = None if b.subtracted else b.cudagraphs
    if g is None and not b.comm_high_extra:
        return "", ""
    rest = b.context + b.nccl + b.comm + b.others - b.charged + b.lora_outside
    kv_side = b.non_kv + b.explicit_kv if b.explicit_kv is not None else b.requested
    room = b.total - kv_side - rest
    need = (g.high_bytes if g is not None else 0) + b.comm_high_extra
    if need <= room:
        return "", ""
    nccl = (f"NCCL's buffers may take up to {b.comm_high_extra / GiB:.2f} GiB more than the "
            f"{b.nccl / GiB:.2f} GiB assumed (every protocol on 32 channels, connected after the profile run)")
    if g is not None:
        message = (f"vLLM may not start: its CUDA graphs are captured after the KV cache and need "
                   f"{g.low_bytes / GiB:.2f} to {g.high_bytes / GiB:.2f} GiB ({g.bytes / GiB:.2f} GiB expected)"
                   f"{', and ' + nccl if b.comm_high_extra else ''}, while {room / GiB:.2f} GiB is left outside "
                   f"gpu_memory_utilization: the capture may run out of memory")
    else:
        message = (f"vLLM may not start: {nccl}, while {room / GiB:.2f} GiB is left outside "
                   "gpu_memory_utilization: an all-reduce may run out of memory")
    if b.explicit_kv is not None:
        lower = f"serve.kv_cache_memory_bytes <= {max(0, b.explicit_kv - (need - room))}"
    else:
        util = max(0.0, int((b.requested - (need - room)) / b.total * 100) / 100)
        lower = f"serve.gpu_memory_utilization <= {util:.2f}"
    if g is None:
        return message, f"{lower}, or NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS set lower"
    # V0 sizes its captures by max_num_seqs alone; V1 also takes compilation_config.cudagraph_capture_sizes
    option = "" if g.rule.sizes == "v0" else f", or vLLM's cudagraph_capture_sizes below {g.largest}"
    return message, (f"{lower}, or serve.cuda_graphs: false (--enforce-eager), or fewer capture sizes (a lower "
                     f"serve.max_num_seqs{option})")


def _decision_assumptions(r: Resolved, beh: VllmBehaviour, b: _Budget, kv: _Blocks, batched: int,
                          requests: int, runner: ModelRunnerRule | None = None, usage: str = "serve") -> list[str]:
    sv, tp = r.scenario.serve, r.scenario.parallel.tp
    # either limit given (a null is vLLM's default; a saved scenario carries the nulls)
    given = sv.max_num_batched_tokens is not None or sv.max_num_seqs is not None
    row = beh.rules
    sampler = sampler_class(row, sampler_path(row, sv.vllm_sampler))
    sampling = (f"{sampler} top-k/top-p sampler in the profile run{_sampler_note(row, sv.vllm_sampler)}"
                if runner is None or runner.sampler == "warmup-pass" else
                "Model Runner V2: no top-k/top-p in the profile run's sampling")
    assumptions = [
        f"vLLM {row.engine.upper()} engine, behaviour of vLLM {beh.version} ({sampling})",
        (f"profile run: {batched} batched tokens, {requests} dummy requests "
        f"({('defaults of vllm serve' if usage == 'serve' else 'the LLM class defaults') + ' on this GPU' if not given else 'as given'})"),
        (f"non-torch increase {b.non_torch / GiB:.2f} GiB as printed by vLLM {row.non_torch_release} on H100 "
        f"({'tp=1' if tp == 1 else 'tp>1'}); CUDA context {b.context / GiB:.2f} GiB "
        f"{'and NCCL buffers are' if b.comm_outside else 'is'} outside the budget"),
        "CUDA graphs: not captured (eager)" if b.cudagraphs is None else _graphs_note(b, tp),
        "attention workspace is not profiled by vLLM (attention is skipped in the profile run)",
    ]
    if not beh.exact:
        assumptions.insert(1, f"vLLM {beh.version}: its source was not read; the rules of vLLM {row.name}, the "
                              "nearest earlier modelled release, are assumed to hold")
    if tp > 1:
        assumptions.append(_tp_comm_note(b, beh.version))
    if b.charged:
        assumptions.append(f"vLLM {beh.version} takes {b.charged / GiB:.2f} GiB of CUDA context and NCCL buffers from "
                           f"the budget ({row.budget.replace('_', ' ')} rule, facts/vllm_releases.py)")
    if kv.spec.has_sliding:
        assumptions.append(f"hybrid KV cache manager: {len(kv.groups)} groups of {kv.size} layers "
                           "(sliding-window layers keep only their window)")
    assumptions += _mm_notes(r, beh, b, batched)
    return assumptions


def _mm_notes(r: Resolved, beh: VllmBehaviour, b: _Budget, batched: int) -> list[str]:
    """The multimodal encoder's profile run as modelled (serve/vllm_mm.py), or why it is not."""
    sv = r.scenario.serve
    limit = sv.limit_mm_per_prompt
    if b.mm is not None and b.mm.v0 is not None:
        return _mm_v0_notes(r, beh, b, b.mm, b.mm.v0, batched)
    if b.mm is not None:
        mm, c = b.mm, dtype_bits(sv.dtype) // 8
        lm = max(b.forward, b.sampler, b.rejection_peak, b.proposer_peak) + mm.output_bytes
        moment = "the encoder's forward" if mm.encoder_peak_bytes > lm else "the language model's dummy batch"
        frames = (f" (encoded as {mm.frames} frame(s), {mm.encoded_tokens_per_item:,} tokens: the dummy video is built "
                  f"for a shorter sequence)" if mm.encoded_tokens_per_item < mm.tokens_per_item and mm.fixed is None
                  else f" ({mm.frames} frames)" if mm.modality == "video" else "")
        if mm.fixed is not None and mm.encoded_tokens_per_item < mm.tokens_per_item:
            frames = (f" (the whole placeholder: {mm.encoded_tokens_per_item:,} embeddings and "
                      f"{mm.tokens_per_item - mm.encoded_tokens_per_item} begin/end-of-image and newline tokens)")
        rule = mm.rule
        first = ".".join(map(str, rule.first)) if rule is not None else beh.version
        if mm.fixed is not None:
            first = ".".join(map(str, mm.fixed.first))
        vision = r.model.vision
        size = (f"one {vision.image_size} x {vision.image_size} image an item, pan-and-scan off (the processor's "
                "default; --mm-processor-kwargs not modelled)" if vision is not None and vision.fixed_image_profile
                else f"max_pixels {vision.checkpoint_max_pixels if vision else 0:,} of the released "
                     "preprocessor_config.json, not read")
        read = "" if mm.exact else f", this release not read: the rules from {first} on (the nearest earlier) are assumed"
        kept = mm.items * mm.encoded_tokens_per_item * r.model.hidden_size * c
        zeros = (f", with the zeros each is scattered into ({(mm.output_bytes - kept) / GiB:.2f} GiB more)"
                 if mm.output_bytes > kept else "")
        note = (f"multimodal profile run (vLLM {beh.version}, facts/vllm_multimodal.py{read}): encoder budget "
                f"{mm.budget_tokens:,} tokens, {mm.items} {mm.modality} item(s) of {mm.tokens_per_item:,} tokens"
                f"{frames} and {mm.patches_per_item:,} patches each ({size}; limit_mm_per_prompt "
                f"{limit if limit is not None else f'not set: {mm.limit_default}'} per modality); the encoder's "
                "forward peaks at "
                f"{mm.encoder_peak_bytes / GiB:.2f} GiB ({mm.patches:,} patches x ({mm.held_per_patch:,} B held + "
                f"max(attention {mm.attention_per_patch:,} B, MLP {mm.mlp_per_patch:,} B)), a bound without the "
                f"attention kernel's workspace); its outputs, {kept / GiB:.2f} GiB "
                f"({mm.items} x {mm.encoded_tokens_per_item:,} x {r.model.hidden_size} x {c} B){zeros}, stay alive "
                f"through the language model's dummy batch; the profile peaks in {moment}")
        if r.scenario.parallel.tp > 1:
            note += "; tp > 1: the whole tower's working set is taken on each rank (its split is not modelled)"
        notes = [note]
        if mm.fixed is not None:
            if parse_release(beh.version) not in mm.fixed.tower_read_at:
                at = ", ".join(".".join(map(str, x)) for x in mm.fixed.tower_read_at)
                notes.append(f"not modelled: the vision tower's forward of vLLM {beh.version} (not read): its bytes "
                             f"per patch are assumed as read at {at} (facts/vllm_multimodal.py GEMMA3_MM_ROWS)")
        elif rule is not None and not rule.tower_read(parse_release(beh.version)):
            tower_at = [r for row in MM_PROFILE_RULES if row.tower == rule.tower and row.first <= rule.first
                        for r in (row.read_at if row.tower_read_at is None else row.tower_read_at)]
            at = ", ".join(".".join(map(str, r)) for r in tower_at) or "no release"
            notes.append(f"not modelled: the vision tower's forward of vLLM {beh.version} (not read): its bytes per "
                         f"patch are assumed as read at {at} (facts/vllm_multimodal.py, tower '{rule.tower}')")
        return notes
    multimodal = multimodal_architecture(r)
    if multimodal and limit == 0 and mm_v0_modelled(parse_release(beh.version), r.model):
        return [(f"serve.limit_mm_per_prompt 0: every modality of {multimodal} is disabled, the registry counts no "
                 "multimodal token and vLLM's V0 dummy sequences carry no item (vllm/worker/model_runner.py "
                 "_dummy_run): the profile run encodes nothing")]
    if multimodal and limit == 0 and parse_release(beh.version) >= MM_PROFILE_FROM:
        return [(f"serve.limit_mm_per_prompt 0: every modality of {multimodal} is disabled, vLLM profiles no "
                 "encoder (\"Encoder cache will not be initialized\")")]
    if not multimodal:
        return ([] if limit is None else
                ["serve.limit_mm_per_prompt changes nothing: the model has no multimodal encoder"])
    # a family adapter with a vision tower (spec/families/gemma3.py, qwen2_5_vl.py) puts the tower's weights
    # in the parameter count; any other multimodal config is flattened to its language model
    counted = ("the encoder's weights are counted (the vision tower), its profile run and cache are not"
               if r.model.vision is not None else "only the language model is counted here")
    bound = _mm_bound(r, beh, b, batched)
    widened = ("; no bound can be derived without the tower's shape: the KV band is widened to the calibration's "
               "widest class only" if bound is None else
               f"; an upper bound of what the profile run takes, {bound.bytes / GiB:.2f} GiB (at most "
               f"{bound.tokens:,} tokens of items, {bound.patches:,} patches x {bound.per_patch:,} B, the largest "
               "working set a patch of the towers read holds, plus twice their rows of outputs: serve/vllm_mm.py "
               "encoder_bound), lowers the KV band's low end")
    return [
        (f"not modelled: the multimodal encoder of {multimodal}: vLLM loads its weights with the language model "
        "and its profile run first encodes the largest dummy image or video items of the encoder-cache budget "
        "(vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run, 0.8.0-0.33.0; the V0 engine's "
        "vllm/worker/model_runner.py _dummy_run, in its dummy sequences), both taken from the "
        f"KV budget; {counted}, so the KV pool is overestimated{widened}"
        + " (limit the "
        "modalities to 0 with --limit-mm-per-prompt to serve text only)")]


def _mm_bound(r: Resolved, beh: VllmBehaviour, b: _Budget, batched: int) -> EncoderBound | None:
    """The encoder's upper bound (serve/vllm_mm.py ``encoder_bound``) of a multimodal model whose profile run is
    not modelled; None where it is modelled or the model has no multimodal encoder."""
    if b.mm is not None or mm_v0_modelled(parse_release(beh.version), r.model) or not multimodal_architecture(r):
        return None
    sv = r.scenario.serve
    return encoder_bound(r.model, sv.max_model_len or r.model.max_position_embeddings, batched,
                         dtype_bits(sv.dtype) // 8, sv.limit_mm_per_prompt,
                         beh.rules.engine == "v0")


def _mm_v0_notes(r: Resolved, beh: VllmBehaviour, b: _Budget, mm: MmProfile, v0: MmV0Batch,
                 batched: int) -> list[str]:
    """The V0 engine's multimodal profile run as modelled (serve/vllm_mm.py ``mm_profile_v0``)."""
    sv = r.scenario.serve
    limit = sv.limit_mm_per_prompt
    lm = max(b.forward, b.sampler, b.rejection_peak, b.proposer_peak) + mm.output_bytes
    moment = "the encoder's forward" if mm.encoder_peak_bytes > lm else "the language model's dummy batch"
    first = ".".join(map(str, v0.rule.first))
    read = "" if v0.exact else f", this release not read: the rules from {first} on (the nearest earlier) are assumed"
    vision = r.model.vision
    cap = (f", capped at {v0.rule.max_pixels_cap:,} by qwen2_vl.py _get_max_image_info" if v0.rule.max_pixels_cap
           else "")
    dropped = v0.seqs - v0.seqs_with_items
    if v0.seqs_with_items == 0:
        return [(f"multimodal profile run (vLLM {beh.version}, V0 engine, facts/vllm_multimodal.py MM_V0_RULES{read}): "
                 f"the registry counts {v0.max_mm_tokens:,} multimodal tokens a prompt, so {v0.seqs} dummy "
                 f"sequence(s) share {batched:,} tokens, each too short for its items (the longest prompt "
                 f"{v0.longest_seq:,} tokens): vLLM drops them (\"The context length ... is too short to hold the "
                 "multi-modal embeddings\", multimodal/profiling.py) and the profile run encodes nothing, so the KV "
                 "pool leaves no room for the encoder; an image served later runs the tower outside the profile "
                 "(raise max_num_batched_tokens to at least the longest prompt to have it profiled)")]
    videos = (f" and {v0.videos} video(s) ({v0.video_tokens:,} tokens, {v0.video_patches:,} patches in all)"
              if v0.videos else " (no dummy video)")
    note = (f"multimodal profile run (vLLM {beh.version}, V0 engine, facts/vllm_multimodal.py MM_V0_RULES{read}): the "
            f"registry counts {v0.max_mm_tokens:,} multimodal tokens a prompt, so {v0.seqs} dummy sequence(s) share "
            f"{batched:,} tokens; {v0.seqs_with_items} of them carry "
            f"{limit if limit is not None else f'(limit_mm_per_prompt not set) {mm.limit_default}'} image(s) of "
            f"{mm.tokens_per_item:,} tokens and {mm.patches_per_item:,} patches each (max_pixels "
            f"{vision.checkpoint_max_pixels if vision else 0:,} of the released preprocessor_config.json, not read"
            f"{cap}){videos}"
            + (f"; {dropped} sequence(s) too short for their items carry none (vLLM's warning \"The context length "
               "... is too short to hold the multi-modal embeddings\")" if dropped else "")
            + f"; the tower runs on all {v0.images} image(s) at once: {v0.image_moment_bytes / GiB:.2f} GiB "
            f"({v0.image_patches:,} patches x ({mm.held_per_patch:,} B held + max(attention {mm.attention_per_patch:,} B, "
            f"MLP {mm.mlp_per_patch:,} B))"
            + (f" + inputs_embeds {v0.embeds_bytes / GiB:.2f} GiB" if v0.embeds_bytes else "")
            + (" + the videos' float32 pixels" if v0.video_patches else "") + ")"
            + (f", then on the {v0.videos} video(s): {v0.video_moment_bytes / GiB:.2f} GiB (with the images' pixels "
               "and outputs)" if v0.video_patches else "")
            + f", a bound without the attention kernel's workspace; {mm.output_bytes / GiB:.2f} GiB (the float32 pixel "
            "values" + (" and the images' outputs" if v0.rule.outputs_kept else "")
            + f") stay alive through the language model's dummy batch; the profile peaks in {moment}")
    if v0.longest_seq > batched // max(v0.seqs, 1) + 1:
        note += (f"; a dummy prompt of {v0.longest_seq:,} tokens is longer than its share (vLLM 0.6.6 logs a warning "
                 "and keeps it)")
    if r.scenario.parallel.tp > 1:
        note += "; tp > 1: the whole tower's working set is taken on each rank (its split is not modelled)"
    notes = [note]
    if v0.longest_seq > batched // max(v0.seqs, 1) + 1:
        notes.append(f"not modelled: the language model's dummy forward over the {v0.longest_seq:,}-token prompt "
                     "beyond max_num_batched_tokens (the forward is taken over max_num_batched_tokens)")
    release = parse_release(beh.version)
    if release not in v0.rule.tower_read_at:
        at = ", ".join(".".join(map(str, x)) for row in MM_V0_RULES for x in row.tower_read_at)
        notes.append(f"not modelled: the vision tower's forward of vLLM {beh.version} (not read for its bytes): its "
                     f"bytes per patch are assumed as read at {at} and 0.8.0 (facts/vllm_multimodal.py, tower 'torch')")
    return notes


def multimodal_architecture(r: Resolved) -> str:
    """The model's multimodal architecture name when its config.json describes one (a ``vision_config`` or
    ``audio_config``, or a ``...ForConditionalGeneration`` class as vLLM's vision-language models are named:
    Qwen2_5_VLForConditionalGeneration, Gemma3ForConditionalGeneration, LlavaForConditionalGeneration), else "".

    vLLM builds such a model with its encoder (``vllm/model_executor/models/qwen2_5_vl.py``: ``self.visual`` and
    a ``language_model`` of architecture Qwen2ForCausalLM), while the spec holds the language model only."""
    try:
        cfg = model_config(r.scenario.model, offline=True, copy_=False)
    except (VramplanError, OSError):
        return ""
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    if "vision_config" in cfg or "audio_config" in cfg:
        return archs[0] if archs else str(cfg.get("model_type", "a multimodal model"))
    return next((a for a in archs if a.endswith("ForConditionalGeneration")), "")


def _check_data_expert_parallel(r: Resolved, beh: VllmBehaviour) -> None:
    """vLLM's expert parallel size is not an option of its own: --enable-expert-parallel makes the experts' group
    the whole tp x dp group (0.11.0 model_executor/layers/fused_moe/config.py ``FusedMoEParallelConfig.make``:
    ``ep_size = tp_size`` after ``flatten_tp_across_dp`` set ``tp_size = dp_size * tp_size``), so parallel.ep
    is 1 or tp x serve.dp; hardware.num_gpus, where given, must hold the dp x tp x pp GPUs."""
    par, sv = r.scenario.parallel, r.scenario.serve
    group = par.tp * sv.dp
    if sv.dp > 1 and beh.rules.engine != "v1":
        first = next(x.name for x in VLLM_RELEASES if x.engine == "v1")
        raise _refuse("serve.dp", f"vLLM {beh.version} runs the V0 engine; data-parallel serving "
                      "(--data-parallel-size, one engine core per DP rank) is modelled for the V1 engine, read at 0.11.0",
                      f"use a V1 release (from {first}), or serve.dp 1 with separate vllm serve replicas")
    if par.ep not in (1, group):
        raise _refuse("parallel.ep", f"vLLM's expert parallel size is tensor x data parallel (--enable-expert-parallel"
                      f" spreads the experts over every GPU of the tp x dp group): parallel.tp {par.tp} x serve.dp "
                      f"{sv.dp} = {group}, not {par.ep}",
                      f"set parallel.ep {group} (--enable-expert-parallel) or 1 (experts split over the {group} "
                      "GPU(s) in their intermediate dimension)")
    world = group * par.pp
    if sv.dp > 1 and 1 < r.scenario.hardware.num_gpus < world:
        raise _refuse("hardware.num_gpus", f"serve.dp {sv.dp} x parallel.tp {par.tp} x parallel.pp {par.pp} needs "
                      f"{world} GPUs, hardware.num_gpus is {r.scenario.hardware.num_gpus}",
                      f"set hardware.num_gpus {world}, or lower serve.dp")


def _data_expert_notes(r: Resolved, concurrency: float) -> list[str]:
    """What data and expert parallelism change, said in the report (``moe_split``)."""
    par, sv, m = r.scenario.parallel, r.scenario.serve, r.model
    out: list[str] = []
    ep, expert_tp = moe_split(r)
    if (sv.dp > 1 or ep > 1) and m.moe is not None and r.scenario.serve.vllm_version.split(".")[:2] != ["0", "11"]:
        out.append("the MoE layers' data/expert-parallel split (FusedMoEParallelConfig.make, determine_expert_map, the "
                   "DP dispatch) was read at vLLM 0.11.0 and is assumed for this release")
    if sv.dp > 1:
        out.append(f"data parallel (--data-parallel-size {sv.dp}): {sv.dp} engine cores, each on its own "
                   f"{par.tp * par.pp} GPU(s) profiling and sizing its own KV pool; the figures are one GPU's, and "
                   f"the {sv.dp} ranks together hold {sv.dp} x these blocks: maximum concurrency "
                   f"{concurrency:.2f}x per rank, {concurrency * sv.dp:.2f}x across the DP ranks")
        if m.moe is None:
            out.append("dense model: the DP ranks share no layer, each is a full copy at tensor parallel "
                       f"{par.tp} (attention and MLP as with serve.dp 1)")
        else:
            out.append(f"MoE layers across the DP ranks: the profile run's experts see dp x tokens rows (every "
                       f"rank's hidden states all-gathered, fused_moe/layer.py forward_impl dispatch; fused caches "
                       f"of at most {FUSED_MOE_CHUNK_TOKENS} rows, VLLM_FUSED_MOE_CHUNK_SIZE's default at 0.11.0); "
                       "one more NCCL communicator (the expert-parallel group); attention, embedding and head stay "
                       f"at tensor parallel {par.tp} within each rank")
    if m.moe is not None and (ep > 1 or expert_tp != par.tp):
        if ep > 1:
            per, extra = divmod(m.moe.num_experts, ep)
            held = f"{per + 1} on ranks 0-{extra - 1}, {per} on the others" if extra else f"{per} on every rank"
            out.append(f"expert parallel (--enable-expert-parallel): {m.moe.num_experts} whole experts per MoE layer "
                       f"over {ep} ranks (fused_moe/layer.py determine_expert_map, linear placement: {held}); "
                       f"this GPU is counted with {-(-m.moe.num_experts // ep)}, the largest rank's"
                       + ("; a GPU with fewer experts has that much more free memory: within one engine core the "
                          "pool takes the fewest blocks of its ranks (v1/core/kv_cache_utils.py "
                          "get_kv_cache_configs), while another DP rank's pool may be larger than this one"
                          if extra else ""))
        else:
            out.append(f"MoE experts split in their intermediate dimension over tp x dp = {expert_tp} GPUs "
                       "(FusedMoEParallelConfig.make without --enable-expert-parallel)")
    return out


# _is_v1_supported_oracle's causes that raise NotImplementedError under VLLM_USE_V1=1 (``_raise_or_fallback``); LoRA
# and pipeline parallelism in 0.8.0 go through ``_warn_or_fallback`` (V1 with a warning under VLLM_USE_V1=1)
_RAISING_CAUSES = frozenset({"cc", "kv_fp8", "cpu_offload", "dtype", "bnb"})


def v0_fallback_causes(r: Resolved, version: str) -> list[tuple[V0FallbackCause, str]]:
    """(cause, why) for each setting of the scenario on which a V1 release of 0.8.0-0.10.1 falls back to its V0
    engine (``facts/vllm_releases.py`` ``V0_FALLBACK_RULES``); [] outside that range or when none holds.

    vLLM 0.8.5 on a T4 (compute capability 7.5): [("cc", "on this GPU (compute capability 7.5 < 8.0,
    vllm/engine/arg_utils.py 0.8.5:1354)")]."""
    rule = v0_fallback_rule(parse_release(version))
    if rule is None:
        return []
    sv, cc = r.scenario.serve, r.gpu.compute_capability or ""
    major = cc.partition(".")[0]
    read = release_text(rule.read_at[0])
    lines = dict(rule.lines)

    def cite(cause: V0FallbackCause) -> str:
        return f"vllm/engine/arg_utils.py {read}:{lines[cause]}"

    out: list[tuple[V0FallbackCause, str]] = []
    if major.isdigit() and int(major) < 8:
        out.append(("cc", f"on this GPU (compute capability {cc} < 8.0, {cite('cc')})"))
    if sv.kv_cache_dtype == "fp8" and not rule.fp8_v1_cc:
        out.append(("kv_fp8", f"with kv_cache_dtype fp8 (no fp8 KV cache on V1, {cite('kv_fp8')})"))
    elif sv.kv_cache_dtype == "fp8" and cc and major not in rule.fp8_v1_cc and cc not in rule.fp8_v1_cc:
        out.append(("kv_fp8", (f"with kv_cache_dtype fp8 (V1 holds an fp8 KV cache only at compute capability "
                              f"{' or '.join(c if '.' in c else c + '.x' for c in rule.fp8_v1_cc)}, this GPU's is "
                              f"{cc}: {cite('kv_fp8')})")))
    if "cpu_offload" in lines and sv.cpu_offload_gb > 0:
        out.append(("cpu_offload", (f"with cpu_offload_gb {sv.cpu_offload_gb:g} (no CPU offloading on V1, "
                                   f"{cite('cpu_offload')})")))
    if "dtype" in lines and sv.dtype == "fp32":
        out.append(("dtype", f"with dtype fp32 (V1 runs bf16 and fp16 only, {cite('dtype')})"))
    if "bnb" in lines and sv.quantization != "none" and quant_format(sv.quantization).library == "bitsandbytes":
        out.append(("bnb", f"with bitsandbytes weights ({sv.quantization}: not on V1, {cite('bnb')})"))
    if "lora" in lines and sv.max_loras > 0:
        out.append(("lora", (f"with LoRA (max_loras {sv.max_loras}: experimental on V1 unless VLLM_USE_V1=1, "
                            f"{cite('lora')})")))
    if "pp" in lines and r.scenario.parallel.pp > 1:
        out.append(("pp", (f"with pipeline parallelism (pp {r.scenario.parallel.pp}: experimental on V1 unless "
                          f"VLLM_USE_V1=1, {cite('pp')})")))
    if out and parse_release(version) not in rule.read_at:
        out[-1] = (out[-1][0], out[-1][1] + f"; {version} not read: the oracle of {read} is assumed")
    return out


def engine_choice(r: Resolved, version: str) -> tuple[Literal["v0", "v1"], str]:
    """(the engine vLLM ``version`` runs for this scenario, why it is not the release's default: "" when it is).

    ``serve.vllm_engine`` auto: the release's engine (``facts/vllm_releases.py`` ``engine``), with the V0
    fallback of 0.8.0-0.10.1 (``v0_fallback_causes``); v0 (VLLM_USE_V1=0) up to the last release with a V0 engine
    (``V0_ENGINE_UNTIL``); v1 (VLLM_USE_V1=1) from 0.8.0, refused where vLLM raises instead of falling back."""
    row = behaviour(version).rules
    choice = r.scenario.serve.vllm_engine
    causes = v0_fallback_causes(r, version) if row.engine == "v1" else []
    first_v1 = next(x.name for x in VLLM_RELEASES if x.engine == "v1")
    if choice == "v1":
        if row.engine != "v1":
            raise _refuse("serve.vllm_engine", f"vLLM {version} runs the V0 engine; its V1 engine (VLLM_USE_V1=1, "
                          "an alpha before 0.8.0) is not modelled",
                          f"use serve.vllm_engine: auto, or serve.vllm_version >= {first_v1}")
        raising = [why for cause, why in causes if cause in _RAISING_CAUSES]
        if raising:
            raise _refuse("serve.vllm_engine", f"vLLM {version} with VLLM_USE_V1=1 raises NotImplementedError "
                          f"(arg_utils.py _raise_or_fallback) {'; '.join(raising)}",
                          "use serve.vllm_engine: auto (the V0 engine), or change the setting named")
        return "v1", ""
    if choice == "v0":
        if row.engine == "v0":
            return "v0", ""
        if parse_release(version) >= V0_ENGINE_UNTIL:
            raise _refuse("serve.vllm_engine", f"vLLM {version} has no V0 engine (vllm/worker/worker.py is gone "
                          f"from {release_text(V0_ENGINE_UNTIL)})",
                          "use serve.vllm_engine: auto, or a serve.vllm_version up to 0.10.2")
        return "v0", f"serve.vllm_engine v0: vLLM {version} runs its V0 engine (VLLM_USE_V1=0)"
    if causes:
        return "v0", f"vLLM {version} falls back to the V0 engine " + "; ".join(why for _, why in causes)
    return row.engine, ""


def decide(r: Resolved, version: str = DEFAULT_VERSION, usage: str = "serve",
           subtract_cudagraphs: bool = False) -> VllmDecision:
    """vLLM's start-up decision for a resolved ``task: serve`` scenario on one GPU of the job (module docstring).

    A V1 release that runs its V0 engine (``engine_choice``) is decided by the rules of ``V0_ENGINE_STANDIN``
    (0.7.3), which its V0 code follows (``facts/vllm_releases.py``), and says so first among its assumptions."""
    _, why = engine_choice(r, version)
    if not why:
        return _decide(r, version, usage, subtract_cudagraphs)
    try:
        d = _decide(r, V0_ENGINE_STANDIN, usage, subtract_cudagraphs)
    except ScenarioError as exc:
        raise ScenarioError([Problem(p.where, f"{why}, modelled by the V0 rules of vLLM {V0_ENGINE_STANDIN}: "
                                     f"{p.message}", p.hint) for p in exc.problems]) from exc
    note = (f"{why}; its V0 engine follows the rules of vLLM {V0_ENGINE_STANDIN} (vllm/worker/worker.py "
            "Worker.determine_num_available_blocks, the V0 CUDA-graph sizes of VllmConfig._set_cudagraph_sizes and "
            "SchedulerConfig's defaults read alike at 0.7.3, 0.8.0 and 0.10.1): the profile run, sampler, graphs and "
            f"blocks below are vLLM {V0_ENGINE_STANDIN}'s")
    return replace(d, version=version, assumptions=[note, *d.assumptions])


def _decide(r: Resolved, version: str, usage: str, subtract_cudagraphs: bool) -> VllmDecision:
    beh = behaviour(version)
    sv = r.scenario.serve
    par = r.scenario.parallel
    _check_data_expert_parallel(r, beh)
    hybrid = _hybrid_rule(r, version)
    batched, seqs, max_len = _limits(r, usage, beh.rules.batch_defaults)
    requests = min(seqs, batched)
    # one rank's weights, read once (at pp = 1 the only rank's, which _budget reads again otherwise)
    weights = serve_weights_bytes(r)
    opt = _options(r, beh.rules, version, weights[0])
    _check_sampler(r, beh.rules, version)
    sampler = sampler_class(beh.rules, sampler_path(beh.rules, sv.vllm_sampler))
    if par.pp > 1:
        _check_pipeline(r, beh.rules, version)
    # each pipeline rank profiles and sizes its KV pool on its own (one rank when pp = 1); the engine keeps the
    # fewest blocks of any rank (vllm/v1/core/kv_cache_utils.py get_kv_cache_configs: "Change the num_blocks of
    # each rank to the smallest among all ranks"; unify_kv_cache_configs before 0.11)
    runner, runner_why = model_runner(r, version, opt.draft_model)
    ranks: list[tuple[_Budget, _Blocks]] = []
    for stage in range(par.pp):
        sb = _budget(r, beh, batched, requests, subtract_cudagraphs, opt, sampler, seqs, stage, runner,
                     weights if par.pp == 1 else None)
        layers = pp_stage_layers(r.model.num_layers, par.pp, stage) if par.pp > 1 else None
        ranks.append((sb, _blocks(r, sb.available, batched, max_len, opt.draft_layer_bytes_per_token, hybrid,
                                  version, layers)))
    binding = min(range(par.pp), key=lambda i: ranks[i][1].blocks)
    b, kv = ranks[binding]
    problem, fix = "", ""
    for stage, (sb, skv) in enumerate(ranks):
        problem, fix = _start_problem(r, sb, skv, max_len)
        if problem:
            problem = f"pipeline stage {stage}: {problem}" if par.pp > 1 else problem
            break
    if not problem and hybrid is not None:
        problem, fix = _mamba_seqs_problem(r, kv, seqs, version)
    risk, risk_fix = "", ""
    for stage, (sb, _) in enumerate(ranks):
        risk, risk_fix = ("", "") if problem else _start_risk(r, sb)
        if risk:
            risk = f"pipeline stage {stage}: {risk}" if par.pp > 1 else risk
            break
    stages = tuple(_stage_row(pp_stage_layers(r.model.num_layers, par.pp, stage), stage, sb, skv, kv.blocks)
                   for stage, (sb, skv) in enumerate(ranks)) if par.pp > 1 else ()
    g = b.cudagraphs
    bound = _mm_bound(r, beh, b, batched)
    return VllmDecision(
        version=beh.version, model=r.model.name, gpu=r.gpu.name, tp=r.scenario.parallel.tp,
        total_memory_bytes=b.total, gpu_memory_utilization=sv.gpu_memory_utilization, requested_bytes=b.requested,
        weights_bytes=b.weights, parameters_bytes=b.params, rotary_cache_bytes=b.rotary,
        max_num_batched_tokens=batched, max_num_seqs=seqs, dummy_requests=requests, forward_peak_bytes=b.forward,
        sampler_peak_bytes=b.sampler, cublas_workspace_bytes=b.cublas, activation_peak_bytes=b.activations,
        non_torch_bytes=b.non_torch, non_kv_bytes=b.non_kv, cudagraph_bytes=b.graphs,
        cudagraph_subtracted=b.subtracted, cuda_context_bytes=b.context, nccl_bytes=b.nccl,
        available_kv_bytes=b.available, kv_spec=kv.spec, block_size=kv.block_size or sv.block_size, page_bytes=kv.page,
        groups=kv.groups, layers_per_group=kv.size, num_gpu_blocks=kv.blocks, kv_cache_bytes=kv.kv_bytes,
        kv_cache_tokens=kv.tokens, max_model_len=max_len, blocks_per_request=kv.per_request,
        needed_kv_bytes=kv.needed, max_concurrency=kv.concurrency,
        max_model_len_that_fits=min(skv.fits_len for _, skv in ranks),
        starts=not problem, problem=problem, fix=fix,
        assumptions=(_decision_assumptions(r, beh, b, kv, batched, requests, runner, usage) + list(opt.notes)
                     + _speculative_notes(b) + _hybrid_notes(r, kv, hybrid, version)
                     + (_mamba_capture_notes(r, kv, version, max(g.sizes) if g and g.sizes else 0, seqs)
                        if hybrid is not None else [])
                     + _pipeline_notes(stages, binding)
                     + _data_expert_notes(r, kv.concurrency) + _runner_notes(r, runner, runner_why, ranks[-1][0], batched, seqs)),
        lora_bytes=opt.lora, speculative_weights_bytes=opt.draft_weights, cpu_offload_bytes=opt.offloaded,
        lora_outside_budget=b.lora_outside > 0, in_use_by_others_bytes=b.others,
        kv_cache_memory_bytes=sv.kv_cache_memory_bytes, rejection_sampler_peak_bytes=b.rejection_peak,
        proposer_forward_peak_bytes=b.proposer_peak, speculative_buffers_bytes=b.proposer_buffers,
        encoder_bound_bytes=bound.bytes if bound is not None else 0,
        mamba_state_page_bytes=kv.hybrid.state_page if kv.hybrid else 0,
        mamba_layers=kv.hybrid.mamba_layers if kv.hybrid else 0,
        cudagraph_bytes_low=g.low_bytes if g else 0, cudagraph_bytes_high=g.high_bytes if g else 0,
        cudagraph_pool_bytes=g.pool_bytes if g else 0, cudagraph_capture_sizes=g.sizes if g else (),
        cudagraph_graphs=g.graphs if g else 0, start_risk=risk, start_risk_fix=risk_fix,
        tp_comm_bytes=b.comm, tp_comm_bytes_high=b.comm + b.comm_high_extra, tp_comm_outside_budget=b.comm_outside,
        pp=par.pp, stages=stages, binding_stage=binding, dp=sv.dp, ep=moe_split(r)[0],
        mm_profile=b.mm, host_swap_bytes=_host_swap_bytes(r, beh.rules, kv.page * kv.size),
        host_lora_cache_bytes=opt.host_lora, sleep_level=sv.sleep_level,
    )


def _stage_row(layers: tuple[int, ...], stage: int, b: _Budget, kv: _Blocks, blocks: int) -> VllmStage:
    """One pipeline rank's figures, its KV pool cut to the engine's ``blocks`` (the fewest of any rank)."""
    return VllmStage(stage=stage, first_layer=layers[0], layers=len(layers), weights_bytes=b.weights,
                     activation_peak_bytes=b.activations, non_kv_bytes=b.non_kv, available_kv_bytes=b.available,
                     own_blocks=kv.blocks, kv_cache_bytes=blocks * kv.page * kv.size,
                     cudagraph_bytes=b.graphs, nccl_bytes=b.nccl)


def _check_pipeline(r: Resolved, row: VllmRelease, version: str) -> None:
    """Refuse what pipeline parallelism is not modelled with (ScenarioError naming the option to change)."""
    m, sv, pp = r.model, r.scenario.serve, r.scenario.parallel.pp
    spec = kv_spec(m, sv.kv_cache_dtype, dtype_bits(sv.dtype) // 8, r.scenario.parallel.tp)
    single = f"parallel.pp 1 (or parallel.tp {r.scenario.parallel.tp * pp}, parallel.pp 1)"
    v0 = (f"vLLM {version} runs the V0 engine, whose pipeline-parallel start-up (the executor's "
          "determine_num_available_blocks) is not modelled")
    groups = (f"pipeline parallelism with {m.name}'s several KV-cache groups (sliding-window or Mamba2 layers: vLLM "
              "groups the whole model's layers and projects the groups onto each rank) is not modelled")
    spec_what = "speculative decoding with pipeline parallelism (the proposer on the last rank) is not modelled"
    problems = [
        (pp > m.num_layers, "parallel.pp", f"pp {pp} is more than the model's {m.num_layers} layers",
         f"set parallel.pp <= {m.num_layers}"),
        (row.engine != "v1", "serve.vllm_version", v0,
         f"use a V1 release (from {next(x.name for x in VLLM_RELEASES if x.engine == 'v1')})"),
        (m.mamba is not None or len(kv_groups(spec)[0]) > 1 or len(spec.layers) != m.num_layers, "parallel.pp",
         groups, f"use {single}"),
        (sv.speculative is not None, "serve.speculative", spec_what, "remove serve.speculative or set parallel.pp 1"),
        (bool(sv.max_loras), "serve.max_loras", "LoRA slots with pipeline parallelism are not modelled",
         "set serve.max_loras: 0 or parallel.pp 1"),
        (sv.cpu_offload_gb > 0, "serve.cpu_offload_gb", "cpu_offload_gb with pipeline parallelism is not modelled",
         "set serve.cpu_offload_gb: 0 or parallel.pp 1"),
        (m.vision is not None, "parallel.pp", (f"pipeline parallelism with {m.name}'s vision encoder (which rank "
                                               "holds the tower and profiles the encoder) is not modelled"),
         f"use {single}"),
    ]
    for bad, where, what, fix in problems:
        if bad:
            raise _refuse(where, what, fix)


def _pipeline_notes(stages: tuple[VllmStage, ...], binding: int) -> list[str]:
    """What the report says of the pipeline ranks (none at pp = 1)."""
    if not stages:
        return []
    rows = "; ".join(f"stage {s.stage}: {s.layers} layers, weights {s.weights_bytes / GiB:.2f} GiB, activation peak "
                     f"{s.activation_peak_bytes / GiB:.2f} GiB, KV budget {s.available_kv_bytes / GiB:.2f} GiB, "
                     f"{s.own_blocks:,} blocks of its own" for s in stages)
    return [(f"pipeline parallelism, {len(stages)} stages split as vLLM's get_pp_indices (VLLM_PP_LAYER_PARTITION "
             f"unset): {rows}; the engine keeps the fewest blocks, stage {binding}'s (the binding stage, whose figures "
             "this report shows), on every rank (vllm/v1/core/kv_cache_utils.py get_kv_cache_configs)"),
            ("pipeline parallelism: the embedding on the first stage, the final norm and LM head on the last "
             "(PPMissingLayer elsewhere; with tied embeddings the last stage holds the embedding again as its head); "
             "every stage after the first keeps the intermediate tensors it receives (hidden states and residual, "
             "max_num_batched_tokens x h each) from the profile run; only the last stage runs the dummy sampler "
             "(gpu_model_runner.py profile_run: get_pp_group().is_last_rank); every stage holds the rotary cache and "
             "one NCCL communicator for the pipeline group; assumed: the forward pass peaks per layer as without "
             "pipeline parallelism, the non-torch increase is the one measured at the same tp without pipeline "
             "parallelism, and "
             "each stage captures its CUDA graphs over its own layers")]


_HYBRID_RANGE = f"{release_text(MAMBA_HYBRID_FIRST)} to 0.25"


def _mamba_first(m: ModelSpec, attention: bool) -> Release:
    """The first release whose V1 serving of ``m``'s mixers is modelled (``facts/vllm_releases.py``)."""
    assert m.mamba is not None
    first = MAMBA_HYBRID_FIRST if attention else max(MAMBA_HYBRID_FIRST, STATE_SPACE_V1_FROM)
    first = max(first, LINEAR_MIXER_V1_FROM.get(m.mamba.kind, first))
    return max(first, MAMBA1_V1_FROM) if m.mamba.kind == "mamba1" else first


# the mixers of the kinds that are neither Mamba's, as the reports name them
_MIXER_NAMES = {"gated_deltanet": "Gated DeltaNet linear-attention", "short_conv": "gated short-convolution"}


def _mamba_what(m: ModelSpec, attention: bool) -> str:
    ms = m.mamba
    assert ms is not None
    if ms.kind in _MIXER_NAMES:
        return f"a hybrid attention + {_MIXER_NAMES[ms.kind]} model"
    kind = "Mamba2" if ms.kind == "mamba2" else "Mamba"
    if ms.shared_attention_layers:
        return f"a hybrid Mamba2 model with shared attention blocks in {len(ms.shared_attention_layers)} layers"
    return (f"a hybrid attention + {kind} model" if attention else
            f"a state-space model ({len(ms.layers)} {kind} mixer layers, no attention)")


def _hybrid_rule(r: Resolved, version: str) -> MambaHybridRule | None:
    """The hybrid-model row for a model with Mamba2 or Mamba-1 mixers, beside attention or alone (None for any other
    model); a ScenarioError where vLLM does not serve it as modelled (``facts/vllm_releases.py``
    ``MAMBA_HYBRID_RULES``, ``MAMBA1_V1_FROM``, ``STATE_SPACE_V1_FROM``) or an option is not modelled beside the
    mixers' state."""
    m, sv = r.model, r.scenario.serve
    if m.mamba is None:
        return None
    attention = bool(kv_spec(m, sv.kv_cache_dtype, dtype_bits(sv.dtype) // 8).layers)
    what = _mamba_what(m, attention)
    first = _mamba_first(m, attention)
    span = f"{release_text(first)} to 0.25"
    rule = mamba_hybrid_rule(version)
    rel = parse_release(version)
    if rule is None or rel < first:
        if m.mamba.kind in LINEAR_MIXER_V1_FROM and rel < first:
            why = (f"vLLM {version} has no model class for it (the {_MIXER_NAMES[m.mamba.kind]} family's class is "
                   f"first registered in {release_text(first)}: vllm/model_executor/models/registry.py; "
                   "facts/vllm_releases.py LINEAR_MIXER_V1_FROM)")
        elif rel < MAMBA_HYBRID_FIRST:
            why = (f"vLLM {version} runs hybrid Mamba models on its V0 engine (0.10.0-0.10.1 fall back to V0 for a "
                   "model with inner state, vllm/engine/arg_utils.py _is_v1_supported_oracle; V0's "
                   "MambaCacheManager), which is not modelled")
        elif rel < first:
            why = (f"vLLM {version}'s serving of such a model was not read: it is modelled from "
                   f"{release_text(first)} (facts/vllm_releases.py "
                   + ("MAMBA1_V1_FROM; vLLM 0.10.0's JambaForCausalLM is SupportsV0Only)" if attention else
                      "STATE_SPACE_V1_FROM)"))
        elif attention:
            why = (f"vLLM {version} turns prefix caching on for hybrid models by default (from "
                   f"{release_text(MAMBA_HYBRID_PREFIX_CACHING_FROM)}: ModelConfig.is_prefix_caching_supported), so "
                   "the mixers keep state pages per block (mamba_cache_mode 'all' or 'align'), which is not modelled")
        else:
            why = (f"vLLM {version}'s layout of attention-free models was not read beyond 0.25 (facts/vllm_releases.py "
                   "STATE_SPACE_V1_FROM)")
        raise _refuse("serve.vllm_version", f"{m.name} is {what}; {why}", f"use serve.vllm_version from {span}")
    unread = LINEAR_MIXER_PROFILE_READ_BEFORE.get(m.mamba.kind)
    if unread is not None and rel >= unread:
        raise _refuse("serve.vllm_version", f"{m.name} is {what}; from vLLM {release_text(unread)} its profile run "
                      "computes the Gated DeltaNet layers' input projections, concatenated q|k|v, zeroed core output "
                      "and gated norm in the compiled graph (qwen3_next.py Qwen3NextGatedDeltaNet.forward), whose "
                      "tensors' lifetimes were not read (facts/vllm_releases.py LINEAR_MIXER_PROFILE_READ_BEFORE)",
                      f"use serve.vllm_version from {release_text(first)} below {release_text(unread)} (e.g. 0.11.0)")
    if m.mamba.shared_attention_layers and m.num_kv_heads != m.num_attention_heads:
        # Zamba2Attention builds qkv_proj and each Attention with num_attention_heads KV heads (zamba2.py:149-177 at
        # 0.10.2), while the block size is sized from the config's num_key_value_heads (get_num_kv_heads)
        raise _refuse("model", f"{m.name} is {what} with {m.num_kv_heads} KV heads of {m.num_attention_heads} heads: "
                      "vLLM's Zamba2Attention has as many KV heads as heads (zamba2.py), so such a checkpoint does not "
                      "load there", "use a Zamba2 config whose num_key_value_heads equals num_attention_heads")
    removed = MAMBA_HYBRID_REMOVED.get(m.model_type)
    if removed is not None and parse_release(version) >= removed:
        raise _refuse("serve.vllm_version", f"vLLM {version} no longer serves {m.model_type} models (removed in "
                      f"{release_text(removed)}: vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS)",
                      f"use serve.vllm_version from {release_text(first)} below {release_text(removed)}")
    tp = r.scenario.parallel.tp
    if tp > 1:
        _mixer_tp_check(r, what, tp)
    problems = [(sv.quantization != "none", "serve.quantization", "quantized weights", "use serve.quantization: none"),
                (bool(sv.max_loras), "serve.max_loras", "LoRA slots", "set serve.max_loras: 0"),
                (sv.speculative is not None, "serve.speculative", ("speculative decoding (the mixers' extra state "
                 "blocks, MambaSpec.num_speculative_blocks)"), "remove serve.speculative")]
    for bad, where, text, fix in problems:
        if bad:
            raise _refuse(where, f"{text} for {what} ({m.name}) are not modelled", fix)
    if not attention and not sv.max_model_len:
        # vllm/config/model.py _get_and_verify_max_len: no length key in config.json -> the tokenizer_config's
        # model_max_length where it has one, else 2048 ("Assuming the model's maximum length is 2048")
        raise _refuse("serve.max_model_len", f"{m.name} is {what}: its config.json has no maximum length, so vLLM "
                      "takes the tokenizer_config's model_max_length, else 2048, and vramplan does not read the "
                      "tokenizer_config", "set serve.max_model_len (vLLM's --max-model-len)")
    return rule


def _mixer_tp_check(r: Resolved, what: str, tp: int) -> None:
    """A ScenarioError where tensor parallelism of a model with mixers is not modelled: Falcon-H1's parallel attention
    and muP multipliers (falcon_h1.py) were not read at tp > 1 (its serving is refused before: spec/checks.py); an
    uneven split is refused by vLLM itself (``mixer_tp_problem``, ``shared_block_tp_problem``)."""
    m = r.model
    assert m.mamba is not None
    if m.mamba.parallel_attention:
        raise _refuse("parallel.tp", f"tensor parallelism for {what} ({m.name}) is not modelled: how vLLM shards its "
                      "attention beside the mixer in every layer (Falcon-H1's FalconH1ParallelHybrid, muP multipliers) "
                      "over the ranks was not read", "set parallel.tp to 1")
    ms = m.mamba

    def problem_at(t: int) -> str:
        return mixer_tp_problem(ms, t) or (shared_block_tp_problem(m, t) if ms.shared_attention_layers else "")

    problem = problem_at(tp)
    if problem:
        below = max(t for t in range(1, tp) if not problem_at(t))
        raise _refuse("parallel.tp", f"vLLM cannot shard the mixers of {m.name} ({what}) over {tp} ranks: {problem}",
                      f"use parallel.tp {below} (the largest below {tp} that splits the mixers)")


def _full_graphs(r: Resolved) -> bool:
    """Whether vLLM captures FULL graphs: cudagraph_mode auto is FULL_AND_PIECEWISE for a model with mixers
    (``MambaModelConfig``)."""
    sv = r.scenario.serve
    return sv.cuda_graphs and sv.cudagraph_mode not in ("NONE", "PIECEWISE")


def _mamba_seqs_problem(r: Resolved, kv: _Blocks, seqs: int, version: str) -> tuple[str, str]:
    """0.21.0 on: under FULL graphs a model with mixers needs a state block per decode request, and vLLM refuses
    ``max_num_seqs`` above the blocks (``facts/vllm_releases.py`` ``MAMBA_SEQS_CHECK_FROM``)."""
    if parse_release(version) < MAMBA_SEQS_CHECK_FROM or not _full_graphs(r) or seqs <= kv.blocks or not kv.blocks:
        return "", ""
    return ((f"max_num_seqs ({seqs}) exceeds available Mamba cache blocks ({kv.blocks}). Each decode sequence requires "
             "one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most "
             f"{kv.blocks} or increase gpu_memory_utilization."), f"serve.max_num_seqs <= {kv.blocks}")


def _mamba_capture_notes(r: Resolved, kv: _Blocks, version: str, top: int, seqs: int) -> list[str]:
    """What FULL graphs do beside fewer state blocks than the largest capture size ``top`` (0.18.0) or than
    ``max_num_seqs`` (0.21.0 on, ``_mamba_seqs_problem``), in the releases where the check above does not apply."""
    rel = parse_release(version)
    if (r.model.mamba is None or not _full_graphs(r) or rel < MAMBA_CAPTURE_CAP_FROM or rel >= MAMBA_SEQS_CHECK_FROM
            or kv.blocks >= max(top, seqs)):
        return []
    if rel < (0, 19, 0):
        if kv.blocks >= top:
            return []
        return [(f"vLLM {version} caps the CUDA graph capture sizes to the {kv.blocks} state blocks where they are "
                 "fewer than the largest size (vllm/config/compilation.py adjust_cudagraph_sizes_for_mamba_cache); the "
                 "graph estimate keeps the uncapped sizes")]
    return [(f"not read: whether vLLM {version} caps the CUDA graph capture sizes to the {kv.blocks} state blocks "
             "(0.18.0) or refuses max_num_seqs above them (0.21.0); neither is applied")]


def _tp_note(r: Resolved, attention_layers: int) -> list[str]:
    """What a model with mixers keeps per rank under tensor parallelism (``serve/mamba_pages.py``); where tp exceeds
    the KV heads, the K and V weights vLLM's ``QKVParallelLinear`` replicates beyond the dense split's ``1 / tp``."""
    m = r.model
    assert m.mamba is not None
    tp = r.scenario.parallel.tp
    if tp == 1:
        return []
    extra = extra_groups_for_head_shards(m.mamba.n_groups, tp) if m.mamba.kind == "mamba2" else 0
    copied = (f"; its {m.mamba.n_groups} B/C group(s) become {m.mamba.n_groups + extra}, every rank holding the group "
              "of its heads (extra_groups_for_head_shards), in the state and in in_proj and conv1d" if extra else "")
    heads = "; the attention layers keep max(1, KV heads / tp) heads per rank" if attention_layers else ""
    if attention_layers and m.num_kv_heads < tp:
        # QKVParallelLinear: num_kv_head_replicas = tp // total_num_kv_heads, one whole KV head per rank
        left = (replicated_kv_elements(m, tp, tuple(layer.index for layer in m.layers))
                * (dtype_bits(r.scenario.serve.dtype) // 8))
        heads += (f" (each rank holds one of the {m.num_kv_heads} KV heads whole, replicated by vLLM's "
                  f"QKVParallelLinear: {left:,} B per rank more than the dense split's 1/{tp}, counted in the weights)")
    return [(f"tensor parallel {tp}: each rank keeps its share of every mixer's state (heads and convolution channels "
             f"/ {tp}: MambaStateShapeCalculator, mamba_utils.py){copied}; the mixers' weights are split as vLLM's "
             f"column- and row-parallel mixer layers split them (facts/vllm_releases.py MIXER_TP_SHARDED){heads}")]


def _hybrid_notes(r: Resolved, kv: _Blocks, rule: MambaHybridRule | None, version: str) -> list[str]:
    """What the report says of a hybrid or state-space model's layout (``serve/mamba_pages.py``)."""
    lay = kv.hybrid
    if lay is None or rule is None:
        return []
    m = r.model
    assert m.mamba is not None
    mamba1 = m.mamba.kind == "mamba1"
    kind = _MIXER_NAMES.get(m.mamba.kind, "Mamba" if mamba1 else "Mamba2")
    shape = {"mamba1": ("convolution state (d_conv - 1) x intermediate and SSM state intermediate x d_state "
                        "(MambaStateShapeCalculator.mamba1_state_shape)"),
             "gated_deltanet": ("convolution state (linear_conv_kernel_dim - 1) x (2 key_dim + value_dim) and "
                                "recurrent state value heads x key head dim x value head dim "
                                "(MambaStateShapeCalculator.gated_delta_net_state_shape)"),
             "short_conv": ("convolution state (conv_L_cache - 1) x conv_dim (config.json's conv_dim, the hidden "
                            "size), no recurrent state (MambaStateShapeCalculator.short_conv_state_shape)")}.get(
        m.mamba.kind, "convolution state (d_conv - 1) x conv_dim and SSM state heads x head_dim x d_state")
    ssm_bytes = _ssm_bytes(m, version)
    ssm = ("in the model dtype, mamba_cache_dtype 'auto'" if m.mamba.kind == "short_conv" else
           "both in the model dtype, mamba_cache_dtype and mamba_ssm_cache_dtype 'auto'" if ssm_bytes is None else
           f"the SSM state in {ssm_bytes} B per element: the config's mamba_ssm_cache_dtype, else "
           f"{MAMBA_SSM_DTYPE_DEFAULT} (MAMBA_SSM_DTYPE_FROM_CONFIG)")
    profile = {"mamba1": ("the profile run's mixer layers skip the scan (MambaMixer.forward_cuda 'V1 profile run': "
                          "in_proj, a contiguous copy of x, out_proj)"),
               "gated_deltanet": ("the profile run's Gated DeltaNet layers return before their input projection "
                                  "(gdn_attention 'V1 profile run')"),
               "short_conv": ("the profile run's convolution layers skip the convolution (ShortConv.forward_cuda "
                              "'V1 profile run': in_proj, B x x, C x Bx, out_proj)")}.get(
        m.mamba.kind, "the profile run's mixer layers skip the scan (MambaMixer2.forward_cuda 'profile run')")
    which = "hybrid" if lay.attention_layers else "state-space"
    graphs = (f"not modelled: the memory of the FULL_AND_PIECEWISE CUDA graphs vLLM captures for a {which} model "
              "(MambaModelConfig; the mixer layers' pieces are counted as attention layers' are, with bytes per segment "
              f"printed for attention-only models), and no published start-up log of a {which} model checks this "
              "estimate yet")
    if lay.attention_layers == 0:
        return [*_tp_note(r, 0), (f"state-space model: its {lay.mamba_layers} {kind} mixer layers form one KV-cache group "
                 f"(vllm/v1/core/kv_cache_utils.py get_kv_cache_groups: every layer's MambaSpec is the same); a page is "
                 f"one layer's state for one request ({lay.state_page:,} B: {shape}, {ssm}), the block is "
                 f"max_model_len ({lay.block_size} tokens: mamba_block_size), so a request takes one block; prefix "
                 "caching off (vLLM's default for attention-free models in these releases)"),
                profile, graphs]
    raised = (f"raised from {r.scenario.serve.block_size} to {lay.block_size} tokens"
              if lay.block_size != r.scenario.serve.block_size else f"kept at {lay.block_size} tokens")
    pad = lay.page - lay.state_page
    shared: list[str] = []
    if mamba1:
        rotary = "Jamba's attention layers take no rotary embedding"
    elif m.mamba.kind in _MIXER_NAMES or m.mamba.shared_attention_layers:
        rotary = "the rotary cache rotates partial_rotary_factor x head_dim of max_position_embeddings positions"
    else:
        rotary = ("the rotary cache rotates partial_rotary_factor x head_dim (BambaConfig's 0.5; vLLM 0.13+ reads "
                  "attn_rotary_emb from config.json instead, head_dim where it is absent)")
    shared = _tp_note(r, lay.attention_layers)
    if m.mamba.shared_attention_layers:
        # Zamba2HybridLayer's shared block (zamba2.py): its q/k/v and gate_up adapters' outputs are added in the
        # compiled graph; only the MLP's width (3 x intermediate) is counted; Zamba2Model.forward keeps
        # original_hidden_states = torch.clone(hidden_states) for every hybrid layer (zamba2.py:756 at 0.11.0)
        shared += [("not modelled: in the profile run, Zamba2's shared transformer blocks (one Attention and KV cache "
                   "per hybrid layer, the first group) are counted at their MLP's width; their adapters' outputs (up "
                   "to 2 x intermediate more per token where not fused) and the model's clone of the embeddings "
                   "(hidden per token, original_hidden_states) are not")]
    return [(f"hybrid attention + {kind} model: {lay.mamba_layers} mixer layers keep one state page per request "
            f"({lay.state_page:,} B: {shape}, {ssm}), padded by {pad:,} B "
            f"to the attention page; the attention block is {raised} so that a page holds it (rules of vLLM "
            f"{release_text(rule.first)}, facts/vllm_releases.py MAMBA_HYBRID_RULES); {lay.attention_groups} attention "
            f"and {lay.mamba_groups} mixer groups of {lay.group_size} layers; prefix caching off (vLLM's default for "
            "hybrid models in these releases)"),
            (f"hybrid model: the attention backend is assumed to take blocks in multiples of 16 (FlashAttention, "
             f"FlashInfer); {rotary}; {profile}"),
            # no published start-up log of a hybrid model checks this estimate, and the per-segment bytes were printed
            # for attention-only models: stated as not modelled, so the band widens (report/band.py)
            graphs, *shared]


def _speculative_notes(b: _Budget) -> list[str]:
    """What the speculative profile-run terms add (``_speculative_terms``), for the report's assumptions."""
    if not b.rejection_peak:
        return []
    peak = max(b.rejection_peak, b.proposer_peak)
    wins = "sets" if peak > max(b.forward, b.sampler) else "stays below"
    return [f"speculative profile run: the rejection sampler's dummy run on fp32 copies of the dummy logits peaks at "
            f"{b.rejection_peak / GiB:.2f} GiB (vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run, "
            "vllm/v1/sample/rejection_sampler.py)"
            + (f", the proposer's forward at {b.proposer_peak / GiB:.2f} GiB (_dummy_run -> drafter.dummy_run)"
               if b.proposer_peak else "")
            + f"; the larger {wins} the torch peak"
            + (f"; the proposer's buffers add {b.proposer_buffers / GiB:.3f} GiB outside the weights "
               "(SpecDecodeBaseProposer.__init__)" if b.proposer_buffers else "")
            + "; default rejection_sample_method 'standard' with draft_sample_method 'greedy' assumed (no draft "
            "probabilities)"]


def _weights_fix(r: Resolved, weights: int, non_kv: int, total: int, requested: int) -> str:
    """The option to change when nothing is left for the KV cache."""
    util_needed = (non_kv + GiB) / total
    if util_needed < 0.99:
        return f"serve.gpu_memory_utilization >= {util_needed:.2f}"
    if weights > requested:
        return "raise parallel.tp (weights per GPU exceed the budget) or quantize the weights"
    return "raise parallel.tp or lower serve.max_num_batched_tokens / serve.max_num_seqs"
