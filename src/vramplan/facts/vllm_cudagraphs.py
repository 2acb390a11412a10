"""vLLM's CUDA-graph capture by release, as data: which batch sizes it captures, in which modes, and what
published figures say of the driver's share of the memory.

``serve/cudagraphs.py`` turns a row into bytes.  The mechanism, read in each release's source (the wheels on
PyPI, as ``facts/vllm_releases.py``):

* **Sizes.**  V0 (``vllm/worker/model_runner.py``): ``_BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 i for i in
  1..1024]`` up to the smallest of them >= ``max_num_seqs`` (``_get_max_graph_batch_size``, 0.6.0-0.6.4;
  ``VllmConfig._set_cudagraph_sizes``'s V0 branch from 0.6.5): 35 sizes at the default 256.  V1 0.8.0-0.9.x
  (``vllm/config.py`` ``VllmConfig._set_cudagraph_sizes``): ``[1, 2, 4] + range(8, 513, 8)`` no larger than
  ``max_num_batched_tokens`` (0.9.0: ``SchedulerConfig.cuda_graph_sizes`` default ``[512]``, the same list).
  0.10.0-0.11.x: ``cuda_graph_sizes`` defaults to ``[min(max_num_seqs x 2, 512)]`` and the list is ``[1, 2, 4] +
  range(8, that + 1, 8)``, no larger than ``max_num_batched_tokens``.  From 0.12.0 (``vllm/config/vllm.py``
  ``_set_cudagraph_sizes``): ``max_cudagraph_capture_size = min(max_num_seqs x 2, 512, max_num_batched_tokens)``
  and the sizes ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)``; from 0.13.0 ``max_num_seqs`` counts
  ``1 + num_speculative_tokens`` tokens per sequence; 0.21.0 appends ``max_num_batched_tokens`` when it is within
  the maximum, 0.28.0 takes 1024 instead of 512 on a compute-capability-10 (data-center Blackwell) device, 0.31.0
  appends ``max_num_seqs`` too.
* **Modes.**  V0 captures one whole-model graph per size, decode only (``capture_model``).  V1 0.8.0-0.10.x
  compiles the model piecewise (``CompilationConfig.splitting_ops``: the attention ops) and captures each piece
  between two attention calls as its own graph (``vllm/compilation/cuda_piecewise_backend.py``): layers + 1
  graphs per size.  From 0.11.0 the default ``cudagraph_mode`` is ``FULL_AND_PIECEWISE``
  (``vllm/config/__init__.py`` ``VllmConfig.__post_init__``): the piecewise graphs of every size, and for uniform
  decode batches one whole-model graph per size up to ``max_num_seqs`` (``GPUModelRunner.capture_model``:
  ``decode_cudagraph_batch_sizes``).
* **One pool.**  Every graph is captured into one memory pool (V0: ``self.graph_memory_pool =
  graph_runner.graph.pool()`` passed to the next capture; V1: ``current_platform.get_global_graph_pool()``,
  ``vllm/compilation/cuda_graph.py``), largest size first ("Capturing the largest batch size first may help
  reduce the memory usage of CUDA graph"), and V1 keeps only weak references to the pieces' outputs
  (``weak_ref_tensors``).  Graphs are never replayed at once, so a later capture reuses what an earlier one
  freed: the pool holds the intermediate tensors of the largest size's forward, its transient peak.
* **What is per graph.**  ``cudaGraphInstantiate`` allocates device memory for each executable graph (its
  kernel nodes' parameters and the driver's bookkeeping).  How much is the driver's and cannot be read from
  vLLM's source.  It is counted here in **segments**: one segment is the kernels of one piece (the layers'
  kernels between two attention calls), so a piecewise size is layers + 1 segments and a whole-model graph,
  which runs the same kernels plus the attention ones, is counted as layers + 1 segments too (an assumption).
  The bytes per segment are not fitted: ``GRAPH_LOGS`` holds vLLM's own printed figures for known
  configurations, and each gives the bytes per segment it implies; the lowest and highest bound the band
  (``SEGMENT_BYTES_LOW``, ``SEGMENT_BYTES_HIGH``) and the report's point is their middle.
* **The user's sizes and modes.**  ``--cudagraph-capture-sizes`` (``CompilationConfig.cudagraph_capture_sizes``,
  every V1 release; ``serve.cudagraph_capture_sizes``) is the exact list: 0.8.0-0.11.x take it as given
  (``CompilationConfig.init_with_cudagraph_sizes``: de-duplicated, nothing dropped), from 0.12.0 the sizes
  above ``max_num_batched_tokens`` are dropped (``VllmConfig._set_cudagraph_sizes``: ``[i for i in
  dedup_sizes if i <= max_num_tokens]``).  The largest size (``serve.max_cudagraph_capture_size``) is
  ``--cuda-graph-sizes N`` with one value in 0.9.0-0.11.x (``[1, 2, 4] + range(8, N + 1, 8)``, then no larger
  than ``max_num_batched_tokens``: 1, 2 and 4 even for N below 4) and ``--max-cudagraph-capture-size`` from 0.12.0, which replaces only the
  default maximum: the grid (steps of 8 to 256, then 16), ``max_num_batched_tokens`` appended from 0.21.0 when
  within it; neither the Blackwell ceiling, the speculative query length nor 0.31.0's ``max_num_seqs`` append
  applies (they shape the default maximum only: ``uniform_decode_sizes`` is "Populated only when the default is
  computed here").  ``--compilation-config '{"cudagraph_mode": ...}'`` (0.11.0 on, ``CUDAGraphMode``;
  ``serve.cudagraph_mode``): ``GPUModelRunner.capture_model`` captures the mixed-batch graphs of every size in
  ``mixed_mode()`` and, when the mode is a pair (``separate_routine``), FULL decode graphs for the uniform
  decode sizes: PIECEWISE is piecewise graphs only, FULL one whole-model graph per size, FULL_DECODE_ONLY
  whole-model graphs for the decode sizes only, NONE no graph (the model is still compiled).
* **vLLM's own word.**  0.6.0-0.6.3 print "CUDA graphs can take additional 1~3 GiB memory per GPU"
  (``capture_model``); for those releases the band's high end is at least 3 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.units import GiB

__all__ = [
    "CUDAGRAPH_RULES",
    "GRAPH_LOGS",
    "SEGMENT_BYTES_HIGH",
    "SEGMENT_BYTES_LOW",
    "SEGMENT_BYTES_POINT",
    "USER_MAX_FROM",
    "USER_MODES",
    "USER_MODE_FROM",
    "USER_SIZES_FILTERED_FROM",
    "CaptureSizes",
    "CudagraphRule",
    "GraphLog",
    "GraphModes",
    "capture_sizes",
    "cudagraph_rule",
    "graph_segments",
    "log_segment_bytes",
    "user_capture_sizes",
]

Release = tuple[int, int, int]
CaptureSizes = Literal["v0", "v1-512", "v1-2x-8", "v1-2x-16"]
GraphModes = Literal["full", "piecewise", "full_and_piecewise", "full_decode_only"]
# serve.cudagraph_mode (vLLM's CUDAGraphMode names, 0.11.0 vllm/config/compilation.py) -> the modes counted here;
# NONE captures nothing and is handled by the caller
USER_MODES: dict[str, GraphModes] = {"PIECEWISE": "piecewise", "FULL": "full", "FULL_DECODE_ONLY": "full_decode_only",
                                     "FULL_AND_PIECEWISE": "full_and_piecewise"}
# the first release of each option of the user's (module docstring)
USER_MAX_FROM: Release = (0, 9, 0)  # SchedulerConfig.cuda_graph_sizes (one value); --max-cudagraph-capture-size 0.12.0
USER_MODE_FROM: Release = (0, 11, 0)  # CompilationConfig.cudagraph_mode
USER_SIZES_FILTERED_FROM: Release = (0, 12, 0)  # explicit sizes above max_num_batched_tokens dropped


@dataclass(frozen=True, kw_only=True)
class CudagraphRule:
    """One row: vLLM's capture from release ``first`` on (module docstring)."""

    first: Release
    read_at: tuple[Release, ...]
    sizes: CaptureSizes
    modes: GraphModes
    statement_bytes: int = 0  # the release's own printed warning of what graphs may take (0: none)
    spec_query: bool = False  # the maximum size counts 1 + num_speculative_tokens tokens per sequence
    append_batched: bool = False  # max_num_batched_tokens is appended when within the maximum (0.21.0 on)
    blackwell_1024: bool = False  # the maximum is 1024, not 512, on a compute-capability-10 device (0.28.0 on)
    append_seqs: bool = False  # max_num_seqs is appended when within the maximum (0.31.0 on, no speculation)
    sources: tuple[str, ...]


_V0_RUNNER = "vllm/worker/model_runner.py GPUModelRunnerBase.capture_model"
CUDAGRAPH_RULES: tuple[CudagraphRule, ...] = (
    CudagraphRule(
        first=(0, 6, 0), read_at=((0, 6, 0), (0, 6, 2), (0, 6, 3)), sizes="v0", modes="full",
        statement_bytes=3 * GiB,
        sources=((f"0.6.0-0.6.3 {_V0_RUNNER}: 'CUDA graphs can take additional 1~3 GiB memory per GPU'; sizes "
                 "_BATCH_SIZES_TO_CAPTURE up to _get_max_graph_batch_size(max_num_seqs), largest first, one "
                 "graph_memory_pool"),)),
    CudagraphRule(
        first=(0, 6, 4), read_at=((0, 6, 4), (0, 6, 5), (0, 7, 3)), sizes="v0", modes="full",
        sources=(f"0.6.4 {_V0_RUNNER}: 'Graph capturing finished in %.0f secs, took %.2f GiB' (free-memory drop)",
                 "0.6.5-0.7.3 vllm/config.py VllmConfig._set_cudagraph_sizes (V0 branch): the same sizes")),
    CudagraphRule(
        first=(0, 8, 0), read_at=((0, 8, 0), (0, 9, 0)), sizes="v1-512", modes="piecewise",
        sources=(("0.8.0 vllm/config.py VllmConfig._set_cudagraph_sizes (V1): [1, 2, 4] + range(8, 513, 8) <= "
                 "max_num_batched_tokens; 0.9.0 SchedulerConfig.cuda_graph_sizes default [512]"),
                 "vllm/compilation/cuda_piecewise_backend.py: one graph per piece and size, global graph pool")),
    CudagraphRule(
        first=(0, 10, 0), read_at=((0, 10, 0), (0, 10, 2)), sizes="v1-2x-8", modes="piecewise",
        sources=(("0.10.0 vllm/config.py SchedulerConfig.__post_init__: cuda_graph_sizes = [min(max_num_seqs * 2, "
                 "512)]; VllmConfig._set_cudagraph_sizes: [1, 2, 4] + range(8, n + 1, 8) <= max_num_batched_tokens"),)),
    CudagraphRule(
        first=(0, 11, 0), read_at=((0, 11, 0),), sizes="v1-2x-8", modes="full_and_piecewise",
        sources=(("0.11.0 vllm/config/__init__.py VllmConfig.__post_init__: cudagraph_mode FULL_AND_PIECEWISE; "
                 "vllm/v1/worker/gpu_model_runner.py capture_model: FULL graphs for decode sizes <= max_num_seqs"),)),
    CudagraphRule(
        first=(0, 12, 0), read_at=((0, 12, 0),), sizes="v1-2x-16", modes="full_and_piecewise",
        sources=(("0.12.0 vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: max = min(max_num_seqs * 2, 512, "
                 "max_num_batched_tokens); [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)"),)),
    CudagraphRule(
        first=(0, 13, 0), read_at=((0, 13, 0), (0, 19, 0), (0, 20, 0)), sizes="v1-2x-16", modes="full_and_piecewise",
        spec_query=True,
        sources=(("0.13.0 vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: max = min(max_num_seqs * "
                 "decode_query_len * 2, 512), decode_query_len = 1 + num_speculative_tokens"),)),
    CudagraphRule(
        first=(0, 21, 0), read_at=((0, 21, 0), (0, 24, 0), (0, 27, 0)), sizes="v1-2x-16", modes="full_and_piecewise",
        spec_query=True, append_batched=True,
        sources=(("0.21.0 vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: max_num_batched_tokens appended when "
                  "<= max_cudagraph_capture_size and not listed"),)),
    CudagraphRule(
        first=(0, 28, 0), read_at=((0, 28, 0), (0, 29, 0), (0, 30, 0)), sizes="v1-2x-16", modes="full_and_piecewise",
        spec_query=True, append_batched=True, blackwell_1024=True,
        sources=(("0.28.0 vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: default_max_graph_size 1024 if "
                  "current_platform.is_device_capability_family(100) else 512 (0.29.0 adds request-count decode "
                  "sizes under speculative decoding, not modelled)"),)),
    CudagraphRule(
        first=(0, 31, 0), read_at=((0, 31, 0), (0, 32, 0), (0, 33, 0)), sizes="v1-2x-16", modes="full_and_piecewise",
        spec_query=True, append_batched=True, blackwell_1024=True, append_seqs=True,
        sources=(("0.31.0 vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: uniform_decode_sizes = [max_num_seqs] "
                  "when within the maximum, appended to the sizes"),)),
)


def cudagraph_rule(rel: Release) -> tuple[CudagraphRule, bool]:
    """The row of a release (the nearest earlier one), and whether that release's source was read."""
    row = [r for r in CUDAGRAPH_RULES if r.first <= rel][-1]
    return row, rel in row.read_at


def capture_sizes(rule: CudagraphRule, max_num_seqs: int, max_num_batched_tokens: int,
                  blackwell: bool = False, query_len: int = 1) -> tuple[int, ...]:
    """The batch sizes vLLM captures (ascending), as the release builds its list (module docstring).

    Llama-3.1-8B under 0.19 with 1024 sequences and 8192 tokens: max min(2048, 512, 8192) = 512 -> 1, 2, 4,
    8..248 (31), 256..512 (17): 51 sizes.  V0 with 256 sequences: 1, 2, 4, 8..256: 35 sizes."""
    if rule.sizes == "v0":
        possible = [1, 2, 4] + [8 * i for i in range(1, 1025)]
        top = next((x for x in possible if x >= max_num_seqs), possible[-1])
        return tuple(x for x in possible if x <= top)
    if rule.sizes == "v1-512":
        return tuple(x for x in [1, 2, 4, *range(8, 513, 8)] if x <= max_num_batched_tokens)
    if rule.sizes == "v1-2x-8":
        top = min(max_num_seqs * 2, 512)
        return tuple(x for x in [1, 2, 4, *range(8, top + 1, 8)] if x <= max_num_batched_tokens)
    ceiling = 1024 if blackwell and rule.blackwell_1024 else 512
    q = query_len if rule.spec_query else 1
    uncapped = min(max_num_seqs * q * 2, ceiling)
    top = min(uncapped, max_num_batched_tokens)
    sizes = [x for x in (1, 2, 4) if x <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    if rule.append_batched and max_num_batched_tokens <= uncapped:
        sizes.append(max_num_batched_tokens)
    if rule.append_seqs and q == 1 and max_num_seqs <= min(uncapped, max_num_batched_tokens):
        sizes.append(max_num_seqs)
    return tuple(sorted(set(sizes)))


def user_capture_sizes(rule: CudagraphRule, release: Release, max_num_batched_tokens: int,
                       explicit: tuple[int, ...] | None = None, max_size: int | None = None) -> tuple[int, ...]:
    """The sizes captured when the user names them (``explicit``) or their maximum (``max_size``), as the
    release builds the list (module docstring, "The user's sizes and modes").

    0.11.0, --cuda-graph-sizes 64, 8192 tokens: 1, 2, 4, 8..64: 11 sizes.  0.19.0, --max-cudagraph-capture-size
    300, 8192 tokens: 1, 2, 4, 8..248 (31), 256, 272, 288: 37 sizes.  0.21.0, max 300, 256 tokens: 1, 2, 4,
    8..248, then 256 appended (256 <= 300): 35 sizes."""
    if explicit is not None:
        dedup = sorted(set(explicit))
        if release >= USER_SIZES_FILTERED_FROM:
            dedup = [x for x in dedup if x <= max_num_batched_tokens]
        return tuple(dedup)
    if max_size is None:
        raise ValueError("user_capture_sizes needs explicit sizes or a maximum")
    if rule.sizes in ("v1-512", "v1-2x-8"):  # --cuda-graph-sizes N: [1, 2, 4] + range(8, N + 1, 8)
        return tuple(x for x in [1, 2, 4, *range(8, max_size + 1, 8)] if x <= max_num_batched_tokens)
    top = min(max_size, max_num_batched_tokens)
    sizes = [x for x in (1, 2, 4) if x <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    if rule.append_batched and max_num_batched_tokens <= max_size:
        sizes.append(max_num_batched_tokens)
    return tuple(sorted(set(sizes)))


def graph_segments(rule: CudagraphRule, sizes: tuple[int, ...], layers: int, max_num_seqs: int,
                   query_len: int = 1, draft_layers: int = 0, modes: GraphModes | None = None) -> tuple[int, int]:
    """(graphs captured, segments): piecewise graphs are layers + 1 per size; a whole-model graph (V0's, and the
    FULL decode graphs of sizes from query_len to max_num_seqs x query_len from 0.11.0) is one graph of layers + 1
    segments.  A V1 speculative proposer with layers of its own (``draft_layers``) is captured piecewise at the same
    sizes (vllm/v1/spec_decode/llm_base_proposer.py ``initialize_cudagraph_keys``: "Only supports PIECEWISE
    cudagraphs", read in 0.29.0).  ``modes``: the user's ``cudagraph_mode`` (``USER_MODES``), else the rule's;
    full_decode_only is the FULL decode graphs alone."""
    pieces = layers + 1
    mode = modes or rule.modes
    if mode == "full":
        return len(sizes), len(sizes) * pieces
    q = query_len if rule.spec_query else 1
    decode = sum(1 for x in sizes if q <= x <= max_num_seqs * q)
    if mode == "full_decode_only":
        return decode, decode * pieces
    full = decode if mode == "full_and_piecewise" else 0
    drafts = len(sizes) * (draft_layers + 1) if draft_layers else 0
    return len(sizes) * pieces + full + drafts, (len(sizes) + full) * pieces + drafts


@dataclass(frozen=True, kw_only=True)
class GraphLog:
    """A CUDA-graph figure vLLM printed, with the configuration that gives its segments and its pool."""

    source: str
    release: Release
    printed_bytes: int
    layers: int
    max_num_seqs: int
    max_num_batched_tokens: int
    pool_bytes: int  # the largest size's forward peak (serve/vllm.py forward_peak_bytes, compiled)


GRAPH_LOGS: tuple[GraphLog, ...] = (
    # Llama-3.1-8B (h 4096, intermediate 14,336, 32 layers) on an H100: "Estimated CUDA graph memory: 0.84 GiB"
    # (llm-d-planner v0.19.0 logs, validation/published.yaml); pool at 512 tokens (4 x 4096 + 3 x 14,336) x 512 x 2
    GraphLog(source="vLLM 0.19.0, Llama-3.1-8B, H100 (llm-d-incubation/llm-d-planner accuracy/results/v0.19.0 logs)",
             release=(0, 19, 0), printed_bytes=int(0.84 * GiB), layers=32, max_num_seqs=1024,
             max_num_batched_tokens=8192, pool_bytes=(4 * 4096 + 3 * 14336) * 512 * 2),
    # Qwen3-8B (h 4096, intermediate 12,288, 36 layers) on an RTX A5000: "Estimated CUDA graph memory: 0.52 GiB
    # total" (LMCache/LMCache#3430, validation/published.yaml); pool (4 x 4096 + 3 x 12,288) x 512 x 2
    GraphLog(source="vLLM 0.21.0, Qwen3-8B, RTX A5000 (LMCache/LMCache issue 3430)",
             release=(0, 21, 0), printed_bytes=int(0.52 * GiB), layers=36, max_num_seqs=256,
             max_num_batched_tokens=8192, pool_bytes=(4 * 4096 + 3 * 12288) * 512 * 2),
)


def log_segment_bytes(log: GraphLog) -> int:
    """Bytes per segment a printed figure implies: (printed - pool) // segments.

    0.19.0 Llama-3.1-8B: 51 sizes, all <= 1024 sequences, so (51 + 51) x 33 = 3,366 segments;
    (901,943,132 - 60,817,408) // 3,366 = 249,888.  0.21.0 Qwen3-8B: 51 sizes, 35 of them <= 256, (51 + 35) x 37 =
    3,182 segments; (558,345,748 - 54,525,952) // 3,182 = 158,334."""
    rule, _ = cudagraph_rule(log.release)
    sizes = capture_sizes(rule, log.max_num_seqs, log.max_num_batched_tokens)
    _, segments = graph_segments(rule, sizes, log.layers, log.max_num_seqs)
    return (log.printed_bytes - log.pool_bytes) // segments


SEGMENT_BYTES_LOW = min(log_segment_bytes(g) for g in GRAPH_LOGS)
SEGMENT_BYTES_HIGH = max(log_segment_bytes(g) for g in GRAPH_LOGS)
SEGMENT_BYTES_POINT = (SEGMENT_BYTES_LOW + SEGMENT_BYTES_HIGH) // 2
