"""llama.cpp's memory at start-up (``llama-server`` / ``llama-cli``), part by part, as its log prints it.

Modelled at llama.cpp's source of build 3410 (``src/llama.cpp``) and of 2025-2026 (``src/llama-model.cpp``,
``src/llama-kv-cache.cpp``, ``src/llama-context.cpp``, ``src/llama-graph.cpp``), ``ggml/src/ggml-alloc.c``,
one CUDA device:

1. **Weights** (``load_tensors``).  ``act_gpu_layers = min(n_gpu_layers, n_layer + 1)``; slot ``il``
   (0..n_layer, slot n_layer being the output) is on the GPU when
   ``i_gpu_start <= il < i_gpu_start + act_gpu_layers``.  The order is the build's
   (``facts/llamacpp_builds.py`` ``output_first``): before ggml-org/llama.cpp#18148
   ``i_gpu_start = max(n_layer - n_gpu_layers, 0)``, the repeating layers from the last one and the output
   only when ``n_gpu_layers > n_layer``; from it ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``, the
   output first, then the repeating layers from the last one.  The KV cache of a layer and its part of the
   compute graph follow the layer's device.  The input layer (token embeddings) always stays
   on the CPU ("there is very little benefit to offloading the input layer", ``dev_input``); a model without
   an ``output.weight`` reads the token embeddings a second time as its output (``TENSOR_DUPLICATED``), on
   the output's device.  "CUDA0 model buffer size" is the sum of those tensors' bytes, each padded to the
   CUDA buffer's 128-byte alignment, a quantized row not a multiple of 512 elements padded to one
   (``ggml_backend_cuda_buffer_type_get_alloc_size``, ``MATRIX_ROW_PADDING``).
2. **KV cache** (``llama_kv_cache``): per offloaded layer a K tensor ``[n_embd_k_gqa, kv_size]`` and a V
   tensor ``[n_embd_v_gqa, kv_size]`` in the cache types (``--cache-type-k/-v``; q8_0 is 34 bytes per 32
   values, q4_0 18).  ``kv_size`` is ``n_ctx`` rounded up to the build's padding (32 cells, 256 with flash
   attention: ``llama_kv_cache_get_padding``).  A quantized V cache needs flash attention: without it
   llama.cpp refuses ("V cache quantization requires flash_attn").
3. **Compute buffer** (``serve/ggml_graph.py``): the worst-case graph llama.cpp reserves (``n_ubatch``
   tokens, all of them outputs, the whole cache in view), node by node in ``ggml_build_forward_expand``
   order (``llm_build_llama`` and its kin, ``llm_build_gptneox``), replayed through ggml-alloc's rules
   (in-place reuse, best-fit free list, frees after the last consumer); the buffer is the highest offset.
   Without flash attention the scores ``n_kv x n_ubatch x n_head`` f32 are the largest tensor; with it,
   the output ``n_embd_v x n_ubatch`` only; the logits ``n_vocab x n_ubatch`` f32 at the end.  The
   build's rules (KV padding, mask padding, the ``-fa`` default) are rows of ``facts/llamacpp_builds.py``.
4. **Outside the buffers**: the CUDA context (``analytic/overhead.py``).

Worked example (Llama-3.1-8B Q4_K_M, n_ctx 8192, f16 cache, all 33 slots offloaded): weights on the GPU
4.30 GiB (token_embd, 281.81 MiB in Q4_K, stays on the host); KV 32 layers x 2 x 1024 x 8192 x 2 B =
1024 MiB; compute without flash attention 8192 x 512 x 32 x 4 B = 512 MiB of scores plus the layer's
other live tensors: 560.00 MiB, as an ollama 0.5.4 log prints it (validation/published.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vramplan.analytic.moment import K, Moment
from vramplan.analytic.overhead import cuda_context_bytes
from vramplan.errors import Problem, ScenarioError
from vramplan.facts.gguf import FILE_TYPES, MIX_ASSUMPTIONS, GgmlType, file_type, ggml_type, row_bytes
from vramplan.facts.llamacpp_builds import (
    FLASH_UNEQUAL_HEADS_FROM,
    LLAMACPP_BUILDS,
    MLA_CACHE_FROM,
    MLA_V_LESS_FROM,
    LlamaCppBuild,
    llamacpp_build,
    mla_cache_layout,
    parse_build,
)
from vramplan.monotone import largest_true
from vramplan.serve.ggml_graph import GraphShape, gallocr_max_size, reserve_nodes
from vramplan.serve.gguf import GgufFile, GgufTensor, model_tensors, read_gguf
from vramplan.spec.fields import changed_fields
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Gguf, Serve
from vramplan.units import MiB, round_up

__all__ = ["LLAMACPP_SOURCES", "Hparams", "LlamaCppDecision", "compute_buffer_bytes", "decide", "kv_cache_bytes",
           "moment", "split_weights", "uses_other_engine"]

LLAMACPP_SOURCES: tuple[str, ...] = (
    "llama.cpp src/llama-model.cpp load_tensors (i_gpu_start, dev_input on the CPU, dev_output)",
    "llama.cpp src/llama-kv-cache.cpp llama_kv_cache (K/V tensors per layer), src/llama-context.cpp (n_ctx padding)",
    "llama.cpp ggml/src/ggml-alloc.c ggml_gallocr (in-place reuse, best-fit ggml_dyn_tallocr)",
    "llama.cpp src/llama-quant.cpp llama_tensor_get_type_impl (commit 007dbbf)",
    "ggml/src/ggml-common.h block structs; ggml/docs/gguf.md (file format)",
)
CUDA_ALIGNMENT = 128  # ggml_backend_cuda_buffer_type_get_alignment
MATRIX_ROW_PADDING = 512  # ggml-cuda/common.cuh
KV_PAD = 256  # the coarsest KV padding of a modelled build (facts/llamacpp_builds.py): n_ctx_that_fits steps
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # common/arg.cpp kv_cache_types


@dataclass(frozen=True)
class Hparams:
    """What the memory model reads of the model (``llama_hparams``)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_vocab: int
    n_ctx_train: int
    n_ff: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    gated: bool = True  # a gated MLP (ffn_gate): gate and up products, then their product
    v_cache: bool = True  # a V tensor is allocated (False: an MLA file from b7832, V a view of K)
    mla_file: bool = False  # a GGUF converted with the _mla keys (deepseek2 from b5137 on)

def _meta_int(g: GgufFile, key: str, default: int | None = None) -> int:
    v = g.arch_value(key, default)
    if isinstance(v, list):  # per-layer values (head counts of hybrid models): the largest
        v = max((x for x in v if isinstance(x, int)), default=default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 2**40:
        raise ScenarioError([Problem("serve.gguf.file", f"{g.path}: metadata {g.architecture}.{key} is "
                                     f"{'missing' if v is None else repr(v)}", "give a llama.cpp GGUF model file")])
    return v


def hparams_of_file(g: GgufFile, build: int = LLAMACPP_BUILDS[-1].build) -> Hparams:
    """The hyperparameters llama.cpp ``build`` reads from a GGUF file's metadata (``llm_load_hparams``)."""
    if not g.architecture:
        raise ScenarioError([Problem("serve.gguf.file", f"{g.path}: no general.architecture",
                                     "give a llama.cpp GGUF model file")])
    n_embd, n_head = _meta_int(g, "embedding_length"), _meta_int(g, "attention.head_count")
    n_kv = _meta_int(g, "attention.head_count_kv", n_head)
    head_k = _meta_int(g, "attention.key_length", n_embd // max(1, n_head))
    vocab = g.arch_value("vocab_size") or g.array_lengths.get("tokenizer.ggml.tokens") or next(
        (t.shape[1] for t in g.tensors if t.name in ("output.weight", "token_embd.weight") and len(t.shape) > 1), 0)
    # an MLA file (deepseek2 converted from b5137 on) names the decompressed head sizes in the _mla keys
    # (llama_hparams::is_mla: both non-zero); from b7832 its V is a view of K (facts/llamacpp_builds.py)
    mla_file = bool(_meta_int(g, "attention.key_length_mla", 0) and _meta_int(g, "attention.value_length_mla", 0))
    return Hparams(
        arch=g.architecture, n_layer=_meta_int(g, "block_count"), n_embd=n_embd, n_head=n_head, n_head_kv=n_kv,
        v_cache=mla_cache_layout(build, mla_file) != "mla-k", mla_file=mla_file,
        head_k=head_k, head_v=_meta_int(g, "attention.value_length", head_k), n_vocab=int(vocab),
        n_ctx_train=_meta_int(g, "context_length", 0), n_ff=_meta_int(g, "feed_forward_length", 0),
        n_expert=_meta_int(g, "expert_count", 0), n_expert_used=_meta_int(g, "expert_used_count", 0),
        n_ff_exp=_meta_int(g, "expert_feed_forward_length", 0),
        gated=any(".ffn_gate." in t.name or ".ffn_gate_exps." in t.name for t in g.tensors),
    )


def _mla_heads(m: ModelSpec, build: int) -> tuple[int, int, int, bool]:
    """(n_head_kv, head_k, head_v, V allocated) of ``m``'s cache in ``build``: an MLA model (llama.cpp's deepseek2)
    converted by the same build (facts/llamacpp_builds.py ``mla_cache_layout``); else the model's own heads."""
    a = m.mla
    if a is None:
        return m.num_kv_heads, m.head_dim, m.head_dim, True
    layout = mla_cache_layout(build)
    if layout == "mha":
        return m.num_attention_heads, a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim, True
    return 1, a.kv_lora_rank + a.qk_rope_head_dim, a.kv_lora_rank, layout == "mla"


def mla_cache_note(m: ModelSpec, build: int) -> list[str]:
    """The assumption that names an MLA model's cache layout at ``build``."""
    if m.mla is None:
        return []
    n_kv, hk, hv, _ = _mla_heads(m, build)
    layout = mla_cache_layout(build)
    said = {"mha": f"the multi-head layout before b{MLA_CACHE_FROM}: K {n_kv} x {hk}, V {n_kv} x {hv} per token and layer",
            "mla": (f"MLA from b{MLA_CACHE_FROM} (ggml-org/llama.cpp#12801), the GGUF assumed converted by it: one K "
                    f"row of {hk} and one V row of {hv} per token and layer; a file converted before keeps the "
                    "multi-head layout"),
            "mla-k": (f"MLA without a V tensor from b{MLA_V_LESS_FROM} (ggml-org/llama.cpp#19067): one K row of {hk} "
                      "per token and layer, V a view of it; the GGUF assumed converted from b5137 on")}[layout]
    return [f"KV cache of {m.name} (llama.cpp deepseek2) at b{build}: {said}"]


def hparams_of_model(r: Resolved, build: int = LLAMACPP_BUILDS[-1].build) -> Hparams:
    m = r.model
    n_kv, head_k, head_v, has_v = _mla_heads(m, build)
    return Hparams(
        arch=m.model_type, n_layer=m.num_layers, n_embd=m.hidden_size, n_head=m.num_attention_heads,
        n_head_kv=n_kv, head_k=head_k, head_v=head_v, v_cache=has_v, n_vocab=m.vocab_size,
        n_ctx_train=m.max_position_embeddings, n_ff=max((ls.intermediate_size for ls in m.layers), default=0),
        n_expert=m.moe.num_experts if m.moe else 0, n_expert_used=m.moe.top_k if m.moe else 0,
        n_ff_exp=m.moe.expert_intermediate_size if m.moe else 0, gated=m.mlp_gated,
    )


def _alloc_size(t: GgufTensor) -> int:
    """``ggml_backend_cuda_buffer_type_get_alloc_size``, then the buffer's alignment."""
    size = t.nbytes
    if t.type.block > 1 and t.shape[0] % MATRIX_ROW_PADDING:
        size += row_bytes(t.type, MATRIX_ROW_PADDING - t.shape[0] % MATRIX_ROW_PADDING)
    return round_up(size, CUDA_ALIGNMENT)


def split_weights(tensors: list[GgufTensor], n_layer: int, ngl: int,
                  build: LlamaCppBuild = LLAMACPP_BUILDS[-1]) -> tuple[int, int, int]:
    """(GPU model buffer bytes, host bytes, GPU slots) for ``n_gpu_layers = ngl`` in ``build``'s offload order
    (module docstring, 1)."""
    gpu = host = 0
    has_output = any(t.name == "output.weight" for t in tensors)
    out_gpu = build.on_gpu(n_layer, n_layer, ngl)
    for t in tensors:
        layer = t.layer
        if layer is not None:
            on = build.on_gpu(layer, n_layer, ngl)
        elif t.name.startswith(("token_embd", "token_types", "position_embd")):
            on = False  # dev_input
            if t.name == "token_embd.weight" and not has_output and out_gpu:
                gpu += _alloc_size(t)  # the duplicated output
        else:
            on = out_gpu
        if on:
            gpu += _alloc_size(t)
        else:
            host += t.nbytes
    slots = sum(1 for s in range(n_layer + 1) if build.on_gpu(s, n_layer, ngl))
    return gpu, host, slots


def kv_cache_bytes(h: Hparams, cells: int, layers: int, type_k: GgmlType, type_v: GgmlType) -> tuple[int, int]:
    """(K bytes, V bytes) of ``layers`` layers holding ``cells`` cells (module docstring, 2)."""
    k = row_bytes(type_k, h.n_head_kv * h.head_k) * cells * layers
    v = row_bytes(type_v, h.n_head_kv * h.head_v) * cells * layers if h.v_cache else 0
    return k, v


def _shape(h: Hparams, ub: int, n_kv: int, flash: bool, mask_pad: int, set_rows: bool) -> GraphShape:
    return GraphShape(
        arch="gptneox" if h.arch in ("gptneox", "gpt_neox") else "llama", n_embd=h.n_embd, n_head=h.n_head,
        n_head_kv=h.n_head_kv, head_k=h.head_k, head_v=h.head_v, n_ff=h.n_ff, n_vocab=h.n_vocab, n_tokens=ub,
        n_kv=n_kv, mask_rows=round_up(ub, mask_pad), flash_attn=flash, gated=h.gated, n_expert=h.n_expert,
        n_expert_used=h.n_expert_used, n_ff_exp=h.n_ff_exp, set_rows=set_rows)


def compute_buffer_bytes(h: Hparams, ub: int, n_kv: int, flash: bool, layers: int, output: bool,
                         mask_pad: int = 32, set_rows: bool = False) -> int:
    """The GPU compute buffer: ggml-alloc's highest offset over the reserve graph's GPU split, the last
    ``layers`` layers and, with ``output``, the output (module docstring, 3; ``serve/ggml_graph.py``)."""
    nodes = reserve_nodes(_shape(h, ub, n_kv, flash, mask_pad, set_rows), layers, output)
    return gallocr_max_size(nodes, CUDA_ALIGNMENT)


@dataclass
class LlamaCppDecision:
    """llama.cpp's buffers at start-up on one GPU, and whether they fit."""

    model: str
    gpu: str
    source: str  # "file <path>" or "catalog model in <quant>"
    file_type: str
    n_ctx: int
    kv_size: int
    n_parallel: int
    n_gpu_layers: int
    gpu_slots: int
    n_layer: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    cache_type_k: str
    cache_type_v: str
    model_buffer_bytes: int  # "CUDA0 model buffer size"
    host_weights_bytes: int  # "CPU_Mapped model buffer size" (tensors left on the host)
    kv_k_bytes: int
    kv_v_bytes: int
    kv_host_bytes: int  # the layers kept on the CPU keep their KV there
    compute_buffer_bytes: int  # "CUDA0 compute buffer size"
    cuda_context_bytes: int
    total_memory_bytes: int
    n_ctx_that_fits: int
    starts: bool
    problem: str = ""
    fix: str = ""
    assumptions: list[str] = field(default_factory=list)
    llamacpp_build: str = ""  # the modelled build whose rules were used (facts/llamacpp_builds.py)
    in_use_by_others_bytes: int = 0  # hardware.memory_in_use_gib: other processes' share of total_memory_bytes

    @property
    def kv_bytes(self) -> int:
        """"CUDA0 KV buffer size": the offloaded layers' K and V."""
        return self.kv_k_bytes + self.kv_v_bytes

    @property
    def device_used_bytes(self) -> int:
        return self.cuda_context_bytes + self.model_buffer_bytes + self.kv_bytes + self.compute_buffer_bytes

    def log_lines(self) -> list[str]:
        """llama.cpp's own start-up lines with vramplan's numbers, to compare with a real log."""
        def mib(n: int) -> str:
            return f"{n / MiB:8.2f} MiB"
        ngl = self.n_layer + 1 if self.n_gpu_layers < 0 else self.n_gpu_layers
        row, _ = llamacpp_build(self.llamacpp_build or None)
        out = [
            *(f"load_tensors: {line}" for line in row.offload_log(self.n_layer, ngl)),
            f"load_tensors: offloaded {self.gpu_slots}/{self.n_layer + 1} layers to GPU",
            f"load_tensors:        CUDA0 model buffer size = {mib(self.model_buffer_bytes)}",
            f"load_tensors:   CPU_Mapped model buffer size = {mib(self.host_weights_bytes)}",
            (f"llama_context: n_ctx = {self.kv_size}, n_batch = {self.n_batch}, n_ubatch = {self.n_ubatch}, "
            f"flash_attn = {int(self.flash_attn)}"),
            f"llama_kv_cache:      CUDA0 KV buffer size = {mib(self.kv_bytes)}",
            (f"llama_kv_cache: size = {mib(self.kv_bytes + self.kv_host_bytes)} ({self.kv_size} cells), "
            f"K ({self.cache_type_k}): {mib(self.kv_k_bytes)}, V ({self.cache_type_v}): {mib(self.kv_v_bytes)}"),
            f"llama_context:      CUDA0 compute buffer size = {mib(self.compute_buffer_bytes)}",
        ]
        if self.problem:
            out.append(f"error: {self.problem}")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "assumptions"
             and (k != "in_use_by_others_bytes" or self.in_use_by_others_bytes)}
        d.update(kv_bytes=self.kv_bytes, device_used_bytes=self.device_used_bytes, assumptions=list(self.assumptions))
        return d


def _refuse(where: str, message: str, hint: str) -> ScenarioError:
    return ScenarioError([Problem(where, message, hint)])


def _check(r: Resolved) -> None:
    """Options llama.cpp does not have."""
    sv, par = r.scenario.serve, r.scenario.parallel
    if par.ep > 1:
        raise _refuse("parallel.ep", "llama.cpp has no expert parallelism: every expert of a layer sits on the GPU "
                      "that holds the layer", "set parallel.ep 1")
    if par.tp > 1 or par.pp > 1 or r.scenario.hardware.num_gpus > 1:
        raise _refuse("parallel.tp", "llama.cpp's memory is modelled on one GPU (its --split-mode layer/row over "
                      "several GPUs is not modelled)", "use one GPU: parallel.tp 1, hardware.num_gpus 1")
    if changed_fields(sv, ("gpu_memory_utilization",)):
        # a value, not the key's presence: a report's scenario (every field, model_dump) must estimate again
        raise _refuse("serve.gpu_memory_utilization", "llama.cpp has no gpu_memory_utilization: it allocates "
                      "exactly its buffers", "remove it; choose serve.gguf.n_gpu_layers and serve.max_model_len")
    if sv.quantization != "none":
        raise _refuse("serve.quantization", "llama.cpp reads GGUF tensors, not a checkpoint quantization",
                      "remove serve.quantization; choose serve.gguf.quant (Q4_K_M, Q8_0, ...)")


def _tensors(r: Resolved, build: int) -> tuple[list[GgufTensor], Hparams, str, str, list[str]]:
    g = r.scenario.serve.gguf
    if g.file:
        f = read_gguf(g.file)
        h = hparams_of_file(f, build)
        return f.tensors, h, f"file {g.file}", f.file_type or "unknown", [(f"weights: the tensors of {g.file} (GGUF v{f.version}, "
                                                    f"{len(f.tensors)} tensors, architecture {h.arch})")]
    ftype = file_type(g.quant)
    if ftype is None:
        raise _refuse("serve.gguf.quant", f"unknown GGUF file type {g.quant!r}", f"choose one of {', '.join(FILE_TYPES)}")
    notes = [(f"weights: {r.model.name} as llama-quantize {ftype.name} would write it (no file given: the tensor list "
             "from the catalog model, each tensor's type from the file type's rules)"), *MIX_ASSUMPTIONS]
    notes += mla_cache_note(r.model, build)
    return (model_tensors(r.model, ftype.name), hparams_of_model(r, build), f"catalog model in {ftype.name}", ftype.name,
            notes)


def _cache_type(name: str, where: str, h: Hparams) -> GgmlType:
    if name not in CACHE_TYPES:
        raise _refuse(where, f"unsupported cache type {name!r}", f"choose one of {', '.join(CACHE_TYPES)}")
    t = ggml_type(name)
    if (h.head_k if where.endswith("_k") else h.head_v) % t.block:
        raise _refuse(where, f"a {name} cache needs a head size divisible by {t.block}", "choose f16 or q8_0")
    return t


def _fits_ctx(h: Hparams, r: Resolved, fixed: int, layers: int, tk: GgmlType, tv: GgmlType, out: bool,
              rules: _Rules) -> int:
    """The largest n_ctx (multiple of 256) whose KV cache and compute buffer fit beside ``fixed`` bytes."""
    g, cap = r.scenario.serve.gguf, r.gpu.total_memory_bytes

    def used(n: int) -> int:
        k, v = kv_cache_bytes(h, n, layers, tk, tv)
        ub = min(g.n_ubatch, g.n_batch, n)
        b = rules.build
        return fixed + k + v + compute_buffer_bytes(h, ub, n, rules.flash, layers, out, b.kq_mask_pad, b.set_rows)
    hi = max(KV_PAD, round_up(h.n_ctx_train or KV_PAD, KV_PAD)) // KV_PAD
    return (largest_true(1, hi, lambda k: used(k * KV_PAD) <= cap) or 0) * KV_PAD


@dataclass(frozen=True)
class _Rules:
    """The build's rules for this scenario: its row, the note when the build is not a row, flash attention."""

    build: LlamaCppBuild
    note: str
    flash: bool
    number: int  # the build asked for (null: the newest row's), for behaviour tabled apart from the rows


def _rules(g: Gguf) -> _Rules:
    """``serve.gguf.llamacpp_build`` (null: the newest row) and ``flash_attn`` (unset: the build's ``-fa`` default,
    ``auto`` being on for a CUDA GPU)."""
    try:
        row, note = llamacpp_build(g.llamacpp_build)
    except ValueError as e:
        raise _refuse("serve.gguf.llamacpp_build", str(e), "give a build number such as b3410 or 6327") from None
    flash = g.flash_attn if g.flash_attn is not None else row.flash_attn_default == "auto"
    number = parse_build(g.llamacpp_build) if g.llamacpp_build is not None else None
    return _Rules(row, note, flash, number if number is not None else row.build)


def uses_other_engine(r: Resolved) -> bool:
    """The scenario asks for llama.cpp (or sets llama.cpp's options for another engine, which ``decide``
    refuses); vLLM and SGLang go through ``serve.report.serve``."""
    sv = r.scenario.serve
    return sv.engine == "llamacpp" or _gguf_given(sv)


def _gguf_given(sv: Serve) -> bool:
    """``serve.gguf`` set to anything but its defaults (a report's scenario, dumped with every field, carries the
    defaults for every engine)."""
    return bool(changed_fields(sv, ("gguf",)))


def decide(r: Resolved) -> LlamaCppDecision:
    """llama.cpp's start-up buffers for a ``task: serve`` scenario with ``serve.engine: llamacpp``."""
    sv = r.scenario.serve
    if sv.engine != "llamacpp":
        raise _refuse("serve.gguf", f"is set, which only serve.engine: llamacpp reads (engine {sv.engine})",
                      "remove serve.gguf, or set serve.engine: llamacpp")
    _check(r)
    sv, g = r.scenario.serve, r.scenario.serve.gguf
    rules = _rules(g)
    tensors, h, source, ftype, notes = _tensors(r, rules.number)
    if h.mla_file and rules.number < MLA_CACHE_FROM:
        raise _refuse("serve.gguf.llamacpp_build", f"{g.file} was converted with the _mla keys (attention.key_length_mla), "
                      f"which llama.cpp reads from b{MLA_CACHE_FROM} on (ggml-org/llama.cpp#12801); b{rules.number} "
                      "cannot load it", f"set serve.gguf.llamacpp_build to b{MLA_CACHE_FROM} or later")
    if rules.flash and h.head_k != h.head_v and rules.number < FLASH_UNEQUAL_HEADS_FROM:
        # llama.cpp forces flash attention off for unequal K and V heads before b4987 (DeepSeek's 192 / 128)
        rules = replace(rules, flash=False)
        notes.append(f"flash attention off: llama.cpp b{rules.number} forces it off when the K and V heads differ "
                     f"({h.head_k} and {h.head_v}: 'flash_attn requires n_embd_head_k == n_embd_head_v - forcing "
                     f"off'; allowed from b{FLASH_UNEQUAL_HEADS_FROM}, ggml-org/llama.cpp#12612)")
    tk, tv = _cache_type(g.cache_type_k, "serve.gguf.cache_type_k", h), _cache_type(g.cache_type_v, "serve.gguf.cache_type_v", h)
    if tv.block > 1 and not rules.flash:
        raise _refuse("serve.gguf.cache_type_v", "V cache quantization requires flash_attn (llama.cpp refuses to "
                      "create the context)", "set serve.gguf.flash_attn true or serve.gguf.cache_type_v f16")
    ngl = h.n_layer + 1 if g.n_gpu_layers < 0 else g.n_gpu_layers
    model_buf, host_w, slots = split_weights(tensors, h.n_layer, ngl, rules.build)
    layers_gpu = sum(1 for il in range(h.n_layer) if rules.build.on_gpu(il, h.n_layer, ngl))
    out_gpu = rules.build.on_gpu(h.n_layer, h.n_layer, ngl)
    n_ctx = sv.max_model_len or h.n_ctx_train
    kv_size = rules.build.kv_cells(n_ctx, rules.flash)
    k, v = kv_cache_bytes(h, kv_size, layers_gpu, tk, tv)
    hk, hv = kv_cache_bytes(h, kv_size, h.n_layer - layers_gpu, tk, tv)
    ub = min(g.n_ubatch, g.n_batch, kv_size)  # n_tokens = min(n_ctx, n_ubatch), n_batch <= n_ctx
    compute = (compute_buffer_bytes(h, ub, kv_size, rules.flash, layers_gpu, out_gpu, rules.build.kq_mask_pad,
                                    rules.build.set_rows) if slots else 0)
    ctx = cuda_context_bytes(r.gpu, at_start=True)  # llama.cpp loads no PyTorch kernels
    fits_ctx = _fits_ctx(h, r, ctx + model_buf, layers_gpu, tk, tv, out_gpu, rules) if layers_gpu else 0
    used = ctx + model_buf + k + v + compute
    cap = r.gpu.total_memory_bytes
    problem = fix = ""
    if used > cap:
        problem = (f"cudaMalloc failed: out of memory (model {model_buf / MiB:.2f} MiB + KV {(k + v) / MiB:.2f} MiB + "
                   f"compute {compute / MiB:.2f} MiB + CUDA context {ctx / MiB:.0f} MiB > {cap / MiB:.0f} MiB)")
        fix = (f"serve.max_model_len <= {fits_ctx}" if fits_ctx >= 256 else
               "lower serve.gguf.n_gpu_layers (keep layers on the host) or choose a smaller serve.gguf.quant")
    order = "the output first, then the last layers" if rules.build.output_first else "the last layers first, then the output"
    assumptions = [
        (f"llama.cpp: {source}, file type {ftype}; n_gpu_layers {g.n_gpu_layers} -> {slots}/{h.n_layer + 1} slots on "
         f"the GPU ({order}; token embeddings stay on the host)"),
        *notes,
        *_build_notes(rules, g),
        (f"KV cache: {kv_size} cells (n_ctx {n_ctx} rounded up to "
         f"{rules.build.kv_pad_flash if rules.flash else rules.build.kv_pad}), K {g.cache_type_k}, V {g.cache_type_v}, "
         f"{g.n_parallel} sequence(s) sharing them (unified cache)"),
        (f"compute buffer: ggml-alloc over the reserve graph of {ub} tokens, all outputs ("
         f"{'flash attention' if rules.flash else 'no flash attention: n_ctx x n_ubatch x n_head f32 scores'}); "
         "the CUDA memory pool (cuBLAS/MMQ scratch) and the host compute buffer are not counted"),
    ]
    if 0 < layers_gpu < h.n_layer:
        assumptions.append("partial offload: ops of host layers that llama.cpp offloads to the GPU for large batches "
                           "(weights copied per micro-batch) are not in the compute buffer")
    return LlamaCppDecision(
        model=r.model.name, gpu=r.gpu.name, source=source, file_type=ftype, n_ctx=n_ctx, kv_size=kv_size,
        n_parallel=g.n_parallel, n_gpu_layers=g.n_gpu_layers, gpu_slots=slots, n_layer=h.n_layer, n_batch=g.n_batch,
        n_ubatch=ub, flash_attn=rules.flash, cache_type_k=g.cache_type_k, cache_type_v=g.cache_type_v,
        model_buffer_bytes=model_buf, host_weights_bytes=host_w, kv_k_bytes=k, kv_v_bytes=v, kv_host_bytes=hk + hv,
        compute_buffer_bytes=compute, cuda_context_bytes=ctx, total_memory_bytes=r.gpu.device_total_bytes,
        in_use_by_others_bytes=r.gpu.in_use_by_others_bytes, n_ctx_that_fits=fits_ctx,
        starts=not problem, problem=problem, fix=fix, assumptions=assumptions, llamacpp_build=f"b{rules.build.build}",
    )


def _build_notes(rules: _Rules, g: Gguf) -> list[str]:
    b = rules.build
    out = [f"llama.cpp build rules of b{b.build} ({b.date}; {b.reserve})" +
           ("" if g.llamacpp_build else ", the newest modelled build (serve.gguf.llamacpp_build not given)")]
    if rules.note:
        out.append(rules.note)
    if g.flash_attn is None:
        out.append(f"flash attention {'on' if rules.flash else 'off'}: b{b.build}'s -fa default is "
                   f"{b.flash_attn_default}" + (" (on for a CUDA GPU)" if b.flash_attn_default == "auto" else ""))
    return out


def moment(d: LlamaCppDecision) -> Moment:
    """The decision as the report's serve moment: the GPU model buffer, KV buffer and compute buffer."""
    peak = Moment("serve")
    peak.add(K.GGUF_WEIGHTS, d.model_buffer_bytes, layers=f"{d.gpu_slots}/{d.n_layer + 1}")
    peak.add(K.LLAMACPP_KV, d.kv_bytes, cells=d.kv_size, type_k=d.cache_type_k, type_v=d.cache_type_v)
    peak.add(K.COMPUTE_BUFFER, d.compute_buffer_bytes)
    return peak
