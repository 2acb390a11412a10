"""llama.cpp's memory at start-up (``llama-server`` / ``llama-cli``), part by part, as its log prints it.

Modelled at llama.cpp's source of 2025-2026 (``src/llama-model.cpp``, ``src/llama-kv-cache.cpp``,
``src/llama-context.cpp``, ``src/llama-graph.cpp``, ``ggml/src/ggml-alloc.c``), one CUDA device:

1. **Weights** (``load_tensors``).  The repeating layers are offloaded from the last:
   ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``, ``act_gpu_layers = min(n_gpu_layers, n_layer + 1)``;
   slot ``il`` (0..n_layer, slot n_layer being the output) is on the GPU when
   ``i_gpu_start <= il < i_gpu_start + act_gpu_layers``.  The input layer (token embeddings) always stays
   on the CPU ("there is very little benefit to offloading the input layer", ``dev_input``); a model without
   an ``output.weight`` reads the token embeddings a second time as its output (``TENSOR_DUPLICATED``), on
   the output's device.  "CUDA0 model buffer size" is the sum of those tensors' bytes, each padded to the
   CUDA buffer's 128-byte alignment, a quantized row not a multiple of 512 elements padded to one
   (``ggml_backend_cuda_buffer_type_get_alloc_size``, ``MATRIX_ROW_PADDING``).
2. **KV cache** (``llama_kv_cache``): per offloaded layer a K tensor ``[n_embd_k_gqa, kv_size]`` and a V
   tensor ``[n_embd_v_gqa, kv_size]`` in the cache types (``--cache-type-k/-v``; q8_0 is 34 bytes per 32
   values, q4_0 18).  ``kv_size`` is ``n_ctx`` rounded up to 256 (``GGML_PAD(n_ctx, 256)``,
   ``llama_context``).  A quantized V cache needs flash attention: without it llama.cpp refuses ("V cache
   quantization requires flash_attn").
3. **Compute buffer** (``graph_reserve`` with ``n_ubatch`` tokens, all of them outputs, and the whole cache
   in view): ggml-alloc places the graph's tensors one node after the other, freeing a tensor after its
   last consumer and computing an element-wise node in place of its only input
   (``ggml_gallocr_allocate_node``), in a best-fit free list (``ggml_dyn_tallocr_alloc``); the buffer is
   the highest offset reached.  ``_graph`` lists the tensors of a llama-style layer as
   ``llm_build_llama`` builds them: without flash attention the scores ``n_kv x n_ubatch x n_head`` f32 are
   the largest; with it, the output ``n_embd_v x n_ubatch`` only; the logits ``n_vocab x n_ubatch`` f32
   at the end.
4. **Outside the buffers**: the CUDA context (``analytic/overhead.py``).

Worked example (Llama-3.1-8B Q4_K_M, n_ctx 8192, f16 cache, all 33 slots offloaded): weights on the GPU
4.30 GiB (token_embd, 281.81 MiB in Q4_K, stays on the host); KV 32 layers x 2 x 1024 x 8192 x 2 B =
1024 MiB; compute without flash attention 8192 x 512 x 32 x 4 B = 512 MiB of scores plus the layer's
other live tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramplan.analytic.moment import K, Moment
from vramplan.analytic.overhead import cuda_context_bytes
from vramplan.errors import Problem, ScenarioError
from vramplan.facts.gguf import FILE_TYPES, MIX_ASSUMPTIONS, GgmlType, file_type, ggml_type, row_bytes
from vramplan.serve.gguf import GgufFile, GgufTensor, model_tensors, read_gguf
from vramplan.spec.load import Resolved
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
KV_PAD = 256  # n_ctx is padded to a multiple of 256 (llama-context.cpp GGML_PAD(n_ctx, 256))
KQ_MASK_PAD = 64  # GGML_KQ_MASK_PAD (llama-graph.cpp)
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

def _meta_int(g: GgufFile, key: str, default: int | None = None) -> int:
    v = g.arch_value(key, default)
    if isinstance(v, list):  # per-layer values (head counts of hybrid models): the largest
        v = max((x for x in v if isinstance(x, int)), default=default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 2**40:
        raise ScenarioError([Problem("serve.gguf.file", f"{g.path}: metadata {g.architecture}.{key} is "
                                     f"{'missing' if v is None else repr(v)}", "give a llama.cpp GGUF model file")])
    return v


def hparams_of_file(g: GgufFile) -> Hparams:
    """The hyperparameters llama.cpp reads from a GGUF file's metadata (``llm_load_hparams``)."""
    if not g.architecture:
        raise ScenarioError([Problem("serve.gguf.file", f"{g.path}: no general.architecture",
                                     "give a llama.cpp GGUF model file")])
    n_embd, n_head = _meta_int(g, "embedding_length"), _meta_int(g, "attention.head_count")
    n_kv = _meta_int(g, "attention.head_count_kv", n_head)
    head_k = _meta_int(g, "attention.key_length", n_embd // max(1, n_head))
    vocab = g.arch_value("vocab_size") or g.array_lengths.get("tokenizer.ggml.tokens") or next(
        (t.shape[1] for t in g.tensors if t.name in ("output.weight", "token_embd.weight") and len(t.shape) > 1), 0)
    return Hparams(
        arch=g.architecture, n_layer=_meta_int(g, "block_count"), n_embd=n_embd, n_head=n_head, n_head_kv=n_kv,
        head_k=head_k, head_v=_meta_int(g, "attention.value_length", head_k), n_vocab=int(vocab),
        n_ctx_train=_meta_int(g, "context_length", 0), n_ff=_meta_int(g, "feed_forward_length", 0),
        n_expert=_meta_int(g, "expert_count", 0), n_expert_used=_meta_int(g, "expert_used_count", 0),
        n_ff_exp=_meta_int(g, "expert_feed_forward_length", 0),
        gated=any(".ffn_gate." in t.name or ".ffn_gate_exps." in t.name for t in g.tensors),
    )


def hparams_of_model(r: Resolved) -> Hparams:
    m = r.model
    return Hparams(
        arch=m.model_type, n_layer=m.num_layers, n_embd=m.hidden_size, n_head=m.num_attention_heads,
        n_head_kv=m.num_kv_heads, head_k=m.head_dim, head_v=m.head_dim, n_vocab=m.vocab_size,
        n_ctx_train=m.max_position_embeddings, n_ff=max((ls.intermediate_size for ls in m.layers), default=0),
        n_expert=m.moe.num_experts if m.moe else 0, n_expert_used=m.moe.top_k if m.moe else 0,
        n_ff_exp=m.moe.expert_intermediate_size if m.moe else 0, gated=m.mlp_gated,
    )


def _on_gpu(slot: int, n_layer: int, ngl: int) -> bool:
    start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    return start <= slot < start + act


def _alloc_size(t: GgufTensor) -> int:
    """``ggml_backend_cuda_buffer_type_get_alloc_size``, then the buffer's alignment."""
    size = t.nbytes
    if t.type.block > 1 and t.shape[0] % MATRIX_ROW_PADDING:
        size += row_bytes(t.type, MATRIX_ROW_PADDING - t.shape[0] % MATRIX_ROW_PADDING)
    return round_up(size, CUDA_ALIGNMENT)


def split_weights(tensors: list[GgufTensor], n_layer: int, ngl: int) -> tuple[int, int, int]:
    """(GPU model buffer bytes, host bytes, GPU slots) for ``n_gpu_layers = ngl`` (module docstring, 1)."""
    gpu = host = 0
    has_output = any(t.name == "output.weight" for t in tensors)
    out_gpu = _on_gpu(n_layer, n_layer, ngl)
    for t in tensors:
        layer = t.layer
        if layer is not None:
            on = _on_gpu(layer, n_layer, ngl)
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
    slots = sum(1 for s in range(n_layer + 1) if _on_gpu(s, n_layer, ngl))
    return gpu, host, slots


def kv_cache_bytes(h: Hparams, cells: int, layers: int, type_k: GgmlType, type_v: GgmlType) -> tuple[int, int]:
    """(K bytes, V bytes) of ``layers`` layers holding ``cells`` cells (module docstring, 2)."""
    k = row_bytes(type_k, h.n_head_kv * h.head_k) * cells * layers
    v = row_bytes(type_v, h.n_head_kv * h.head_v) * cells * layers
    return k, v


class _DynAlloc:
    """``ggml_dyn_tallocr``: best fit among the free blocks but the last, else the last; merged on free."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.free: list[list[int]] = [[0, 1 << 62]]  # [offset, size], sorted by offset
        self.max_size = 0

    def alloc(self, size: int) -> int:
        size = round_up(size, self.alignment)
        best, best_size = -1, 1 << 63
        for i, (_, bsize) in enumerate(self.free[:-1]):
            if size <= bsize <= best_size:
                best, best_size = i, bsize
        if best < 0:
            best = len(self.free) - 1
        block = self.free[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0 and best != len(self.free) - 1:
            del self.free[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        size = round_up(size, self.alignment)
        for b in self.free:
            if b[0] + b[1] == offset:  # after a free block
                b[1] += size
                self._merge()
                return
            if offset + size == b[0]:  # before a free block
                b[0], b[1] = offset, b[1] + size
                self._merge()
                return
        self.free.append([offset, size])
        self.free.sort()

    def _merge(self) -> None:
        merged: list[list[int]] = []
        for b in sorted(self.free):
            if merged and merged[-1][0] + merged[-1][1] == b[0]:
                merged[-1][1] += b[1]
            else:
                merged.append(b)
        self.free = merged


@dataclass(frozen=True)
class _Node:
    name: str
    nbytes: int
    srcs: tuple[str, ...] = ()
    inplace: bool = False  # the op may take its first input's memory (ggml_op_can_inplace, same layout)


def _attention(il: int, h: Hparams, ub: int, n_kv: int, flash: bool, x: str) -> list[_Node]:
    f = 4
    q, kdim, vdim = h.n_head * h.head_k, h.n_head_kv * h.head_k, h.n_head_kv * h.head_v
    p = f"l{il}."
    nodes = [
        _Node(p + "norm", h.n_embd * ub * f, (x,)), _Node(p + "norm_w", h.n_embd * ub * f, (p + "norm",), True),
        _Node(p + "q", q * ub * f, (p + "norm_w",)), _Node(p + "k", kdim * ub * f, (p + "norm_w",)),
        _Node(p + "v", vdim * ub * f, (p + "norm_w",)),
        _Node(p + "q_rope", q * ub * f, (p + "q", "inp_pos"), True),
        _Node(p + "k_rope", kdim * ub * f, (p + "k", "inp_pos"), True),
        _Node(p + "k_store", 0, (p + "k_rope",)), _Node(p + "v_store", 0, (p + "v",)),  # views of the cache
    ]
    if flash:
        nodes.append(_Node(p + "attn", h.n_head * h.head_v * ub * f, (p + "q_rope", p + "k_store", p + "v_store",
                                                                      "kq_mask_f16")))
    else:
        nodes += [
            _Node(p + "kq", n_kv * ub * h.n_head * f, (p + "q_rope", p + "k_store")),
            _Node(p + "kq_soft", n_kv * ub * h.n_head * f, (p + "kq", "kq_mask"), True),
            _Node(p + "kqv", h.head_v * ub * h.n_head * f, (p + "kq_soft", p + "v_store")),
            _Node(p + "attn", h.n_head * h.head_v * ub * f, (p + "kqv",)),  # ggml_cont of the permuted kqv
        ]
    nodes.append(_Node(p + "wo", h.n_embd * ub * f, (p + "attn",)))
    return nodes


def _ffn(il: int, h: Hparams, ub: int, x: str) -> list[_Node]:
    f, p = 4, f"l{il}."
    nodes = [_Node(p + "ffn_inp", h.n_embd * ub * f, (p + "wo", x), True),
             _Node(p + "ffn_norm", h.n_embd * ub * f, (p + "ffn_inp",)),
             _Node(p + "ffn_norm_w", h.n_embd * ub * f, (p + "ffn_norm",), True)]
    src = p + "ffn_norm_w"
    if h.n_expert and h.n_ff_exp:
        e, k, ff = h.n_expert, max(1, h.n_expert_used), h.n_ff_exp
        nodes += [
            _Node(p + "router", e * ub * f, (src,)), _Node(p + "probs", e * ub * f, (p + "router",), True),
            _Node(p + "argsort", e * ub * 4, (p + "probs",)), _Node(p + "weights", k * ub * f, (p + "probs", p + "argsort")),
            _Node(p + "up", ff * k * ub * f, (src, p + "argsort")), _Node(p + "gate", ff * k * ub * f, (src, p + "argsort")),
            _Node(p + "act", ff * k * ub * f, (p + "gate", p + "up")),
            _Node(p + "down", h.n_embd * k * ub * f, (p + "act", p + "argsort")),
            _Node(p + "weighted", h.n_embd * k * ub * f, (p + "down", p + "weights"), True),
            _Node(p + "ffn_out", h.n_embd * ub * f, (p + "weighted",)),
        ]
    elif h.gated:
        nodes += [_Node(p + "gate", h.n_ff * ub * f, (src,)), _Node(p + "up", h.n_ff * ub * f, (src,)),
                  _Node(p + "act", h.n_ff * ub * f, (p + "gate", p + "up")),
                  _Node(p + "ffn_out", h.n_embd * ub * f, (p + "act",))]
    else:  # up, its activation in place, down
        nodes += [_Node(p + "up", h.n_ff * ub * f, (src,)), _Node(p + "act", h.n_ff * ub * f, (p + "up",), True),
                  _Node(p + "ffn_out", h.n_embd * ub * f, (p + "act",))]
    nodes.append(_Node(p + "out", h.n_embd * ub * f, (p + "ffn_out", p + "ffn_inp"), True))
    return nodes


def _graph(h: Hparams, ub: int, n_kv: int, flash: bool, layers: int, output: bool) -> tuple[list[_Node], list[_Node]]:
    """(inputs, nodes) of the reserve graph's offloaded part, in build order (module docstring, 3)."""
    mask_rows = round_up(ub, KQ_MASK_PAD)
    inputs = [_Node("inp_embd", h.n_embd * ub * 4), _Node("inp_pos", ub * 4), _Node("kq_mask", n_kv * mask_rows * 4)]
    nodes: list[_Node] = [_Node("kq_mask_f16", n_kv * mask_rows * 2, ("kq_mask",))] if flash else []
    x = "inp_embd"
    for il in range(layers):
        nodes += _attention(il, h, ub, n_kv, flash, x)
        nodes += _ffn(il, h, ub, x)
        x = f"l{il}.out"
    if output:
        nodes += [_Node("result_norm", h.n_embd * ub * 4, (x,), True),
                  _Node("result_norm_w", h.n_embd * ub * 4, ("result_norm",), True),
                  _Node("result_output", h.n_vocab * ub * 4, ("result_norm_w",))]
    return inputs, nodes


def compute_buffer_bytes(h: Hparams, ub: int, n_kv: int, flash: bool, layers: int, output: bool) -> int:
    """The GPU compute buffer: ggml-alloc's highest offset over the reserve graph (module docstring, 3)."""
    inputs, nodes = _graph(h, ub, n_kv, flash, layers, output)
    children: dict[str, int] = {}
    for n in nodes:
        for s in n.srcs:
            children[s] = children.get(s, 0) + 1
    alloc = _DynAlloc(CUDA_ALIGNMENT)
    where: dict[str, tuple[int, int]] = {}
    for n in inputs:
        where[n.name] = (alloc.alloc(n.nbytes), n.nbytes)
    for n in nodes:
        parent = n.srcs[0] if n.srcs else ""
        if n.inplace and parent in where and children.get(parent) == 1 and where[parent][1] == n.nbytes:
            where[n.name] = where.pop(parent)  # ggml_gallocr_allocate_node: reusing the parent
        elif n.nbytes:
            where[n.name] = (alloc.alloc(n.nbytes), n.nbytes)
        for s in n.srcs:
            children[s] -= 1
            if children[s] == 0 and s in where:
                alloc.release(*where.pop(s))
    return alloc.max_size


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
        out = [
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
        d = {k: v for k, v in vars(self).items() if k != "assumptions"}
        d.update(kv_bytes=self.kv_bytes, device_used_bytes=self.device_used_bytes, assumptions=list(self.assumptions))
        return d


def _refuse(where: str, message: str, hint: str) -> ScenarioError:
    return ScenarioError([Problem(where, message, hint)])


def _check(r: Resolved) -> None:
    """Options llama.cpp does not have."""
    sv, par = r.scenario.serve, r.scenario.parallel
    if par.tp > 1 or par.pp > 1 or r.scenario.hardware.num_gpus > 1:
        raise _refuse("parallel.tp", "llama.cpp's memory is modelled on one GPU (its --split-mode layer/row over "
                      "several GPUs is not modelled)", "use one GPU: parallel.tp 1, hardware.num_gpus 1")
    if "gpu_memory_utilization" in sv.model_fields_set:
        raise _refuse("serve.gpu_memory_utilization", "llama.cpp has no gpu_memory_utilization: it allocates "
                      "exactly its buffers", "remove it; choose serve.gguf.n_gpu_layers and serve.max_model_len")
    if sv.quantization != "none":
        raise _refuse("serve.quantization", "llama.cpp reads GGUF tensors, not a checkpoint quantization",
                      "remove serve.quantization; choose serve.gguf.quant (Q4_K_M, Q8_0, ...)")


def _tensors(r: Resolved) -> tuple[list[GgufTensor], Hparams, str, str, list[str]]:
    g = r.scenario.serve.gguf
    if g.file:
        f = read_gguf(g.file)
        h = hparams_of_file(f)
        return f.tensors, h, f"file {g.file}", f.file_type or "unknown", [(f"weights: the tensors of {g.file} (GGUF v{f.version}, "
                                                    f"{len(f.tensors)} tensors, architecture {h.arch})")]
    ftype = file_type(g.quant)
    if ftype is None:
        raise _refuse("serve.gguf.quant", f"unknown GGUF file type {g.quant!r}", f"choose one of {', '.join(FILE_TYPES)}")
    notes = [(f"weights: {r.model.name} as llama-quantize {ftype.name} would write it (no file given: the tensor list "
             "from the catalog model, each tensor's type from the file type's rules)"), *MIX_ASSUMPTIONS]
    return model_tensors(r.model, ftype.name), hparams_of_model(r), f"catalog model in {ftype.name}", ftype.name, notes


def _cache_type(name: str, where: str, h: Hparams) -> GgmlType:
    if name not in CACHE_TYPES:
        raise _refuse(where, f"unsupported cache type {name!r}", f"choose one of {', '.join(CACHE_TYPES)}")
    t = ggml_type(name)
    if (h.head_k if where.endswith("_k") else h.head_v) % t.block:
        raise _refuse(where, f"a {name} cache needs a head size divisible by {t.block}", "choose f16 or q8_0")
    return t


def _fits_ctx(h: Hparams, r: Resolved, fixed: int, layers: int, tk: GgmlType, tv: GgmlType, out: bool) -> int:
    """The largest n_ctx (multiple of 256) whose KV cache and compute buffer fit beside ``fixed`` bytes."""
    g, cap = r.scenario.serve.gguf, r.gpu.total_memory_bytes

    def used(n: int) -> int:
        k, v = kv_cache_bytes(h, n, layers, tk, tv)
        return fixed + k + v + compute_buffer_bytes(h, g.n_ubatch, n, g.flash_attn, min(layers, 2), out)
    lo, hi = 0, max(KV_PAD, round_up(h.n_ctx_train or KV_PAD, KV_PAD)) // KV_PAD
    if used(KV_PAD) > cap:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if used(mid * KV_PAD) <= cap else (lo, mid - 1)
    return lo * KV_PAD


def uses_other_engine(r: Resolved) -> bool:
    """The scenario asks for llama.cpp (or sets llama.cpp's options for another engine, which ``decide``
    refuses); vLLM and SGLang go through ``serve.report.serve``."""
    sv = r.scenario.serve
    return sv.engine == "llamacpp" or "gguf" in sv.model_fields_set


def decide(r: Resolved) -> LlamaCppDecision:
    """llama.cpp's start-up buffers for a ``task: serve`` scenario with ``serve.engine: llamacpp``."""
    sv = r.scenario.serve
    if sv.engine != "llamacpp":
        raise _refuse("serve.gguf", f"is set, which only serve.engine: llamacpp reads (engine {sv.engine})",
                      "remove serve.gguf, or set serve.engine: llamacpp")
    _check(r)
    sv, g = r.scenario.serve, r.scenario.serve.gguf
    tensors, h, source, ftype, notes = _tensors(r)
    tk, tv = _cache_type(g.cache_type_k, "serve.gguf.cache_type_k", h), _cache_type(g.cache_type_v, "serve.gguf.cache_type_v", h)
    if tv.block > 1 and not g.flash_attn:
        raise _refuse("serve.gguf.cache_type_v", "V cache quantization requires flash_attn (llama.cpp refuses to "
                      "create the context)", "set serve.gguf.flash_attn true or serve.gguf.cache_type_v f16")
    ngl = h.n_layer + 1 if g.n_gpu_layers < 0 else g.n_gpu_layers
    model_buf, host_w, slots = split_weights(tensors, h.n_layer, ngl)
    layers_gpu = sum(1 for il in range(h.n_layer) if _on_gpu(il, h.n_layer, ngl))
    out_gpu = _on_gpu(h.n_layer, h.n_layer, ngl)
    n_ctx = sv.max_model_len or h.n_ctx_train
    kv_size = round_up(n_ctx, KV_PAD)
    k, v = kv_cache_bytes(h, kv_size, layers_gpu, tk, tv)
    hk, hv = kv_cache_bytes(h, kv_size, h.n_layer - layers_gpu, tk, tv)
    ub = min(g.n_ubatch, g.n_batch)
    compute = compute_buffer_bytes(h, ub, kv_size, g.flash_attn, min(layers_gpu, 2), out_gpu) if slots else 0
    ctx = cuda_context_bytes(r.gpu)
    fits_ctx = _fits_ctx(h, r, ctx + model_buf, layers_gpu, tk, tv, out_gpu) if layers_gpu else 0
    used = ctx + model_buf + k + v + compute
    cap = r.gpu.total_memory_bytes
    problem = fix = ""
    if used > cap:
        problem = (f"cudaMalloc failed: out of memory (model {model_buf / MiB:.2f} MiB + KV {(k + v) / MiB:.2f} MiB + "
                   f"compute {compute / MiB:.2f} MiB + CUDA context {ctx / MiB:.0f} MiB > {cap / MiB:.0f} MiB)")
        fix = (f"serve.max_model_len <= {fits_ctx}" if fits_ctx >= 256 else
               "lower serve.gguf.n_gpu_layers (keep layers on the host) or choose a smaller serve.gguf.quant")
    assumptions = [
        (f"llama.cpp: {source}, file type {ftype}; n_gpu_layers {g.n_gpu_layers} -> {slots}/{h.n_layer + 1} slots on "
        "the GPU (the last layers first, then the output; token embeddings stay on the host)"),
        *notes,
        (f"KV cache: {kv_size} cells (n_ctx {n_ctx} rounded up to {KV_PAD}), K {g.cache_type_k}, V {g.cache_type_v}, "
        f"{g.n_parallel} sequence(s) sharing them (unified cache)"),
        (f"compute buffer: ggml-alloc over the reserve graph of {ub} tokens ("
         f"{'flash attention' if g.flash_attn else 'no flash attention: n_ctx x n_ubatch x n_head f32 scores'}); "
         "the CUDA memory pool (cuBLAS/MMQ scratch) and the host compute buffer are not counted"),
    ]
    if 0 < layers_gpu < h.n_layer:
        assumptions.append("partial offload: ops of host layers that llama.cpp offloads to the GPU for large batches "
                           "(weights copied per micro-batch) are not in the compute buffer")
    return LlamaCppDecision(
        model=r.model.name, gpu=r.gpu.name, source=source, file_type=ftype, n_ctx=n_ctx, kv_size=kv_size,
        n_parallel=g.n_parallel, n_gpu_layers=g.n_gpu_layers, gpu_slots=slots, n_layer=h.n_layer, n_batch=g.n_batch,
        n_ubatch=ub, flash_attn=g.flash_attn, cache_type_k=g.cache_type_k, cache_type_v=g.cache_type_v,
        model_buffer_bytes=model_buf, host_weights_bytes=host_w, kv_k_bytes=k, kv_v_bytes=v, kv_host_bytes=hk + hv,
        compute_buffer_bytes=compute, cuda_context_bytes=ctx, total_memory_bytes=cap, n_ctx_that_fits=fits_ctx,
        starts=not problem, problem=problem, fix=fix, assumptions=assumptions,
    )


def moment(d: LlamaCppDecision) -> Moment:
    """The decision as the report's serve moment: the GPU model buffer, KV buffer and compute buffer."""
    peak = Moment("serve")
    peak.add(K.GGUF_WEIGHTS, d.model_buffer_bytes, layers=f"{d.gpu_slots}/{d.n_layer + 1}")
    peak.add(K.LLAMACPP_KV, d.kv_bytes, cells=d.kv_size, type_k=d.cache_type_k, type_v=d.cache_type_v)
    peak.add(K.COMPUTE_BUFFER, d.compute_buffer_bytes)
    return peak
