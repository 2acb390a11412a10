"""llama.cpp's compute buffer: the reserve graph as llama.cpp builds it, allocated as ggml-alloc allocates it.

**The graph.**  At start-up llama.cpp builds the worst-case graph once (``llama_new_context_with_model`` in
build 3410, ``llama_context::sched_reserve`` in 2025-2026 builds): ``n_tokens = min(n_ctx, n_ubatch)``
tokens, all of them outputs, the whole cache in view (``n_kv = kv_size``).  ``ggml_build_forward_expand``
orders the nodes depth first, sources left to right (``ggml_visit_parents``), so the order of the nodes
is the order in which each layer's builder expands them: in ``llm_build_kv`` the query, key and value
(``ggml_build_forward_expand(graph, q_cur / k_cur / v_cur)``), the cache stores, the attention up to
``kqv_merged_cont``; the rest of the layer (output projection, residual, FFN) when the next layer (or the
output) expands its input.  Views (reshape, permute, transpose, the cache views, the result of
``ggml_cpy``) own no memory.

**The split inputs.**  ``ggml_backend_sched`` runs the token embeddings (kept on the CPU) in a CPU split and
copies every tensor a GPU split reads from another backend -- the embeddings, ``inp_pos``, ``KQ_mask``,
``inp_out_ids``, all graph inputs sit on the CPU (``ggml_backend_sched_backend_id_from_cur``: "1.inp") --
into a tensor of the GPU split (``ggml_backend_sched_split_graph``); the copies are the split's first
nodes in the graph ggml-alloc sees, in the order the split first reads them.  They are flagged input and
output (never freed) only with pipeline parallelism (``n_copies > 1``, several GPUs); on one GPU they are
freed after their last reader like any tensor.

**The allocator** (``ggml/src/ggml-alloc.c``): ``ggml_gallocr_alloc_graph_impl`` counts each tensor's
children and views, then walks the nodes: a node whose op may work in place (``ggml_op_can_inplace``:
add, mul, unary, rope, rms_norm, soft_max, ...) takes the memory of a source that ggml-alloc allocated
itself (never a view, never an output), has the same layout and no other consumer left; any other node
gets a best-fit block (``ggml_dyn_tallocr_alloc``: the smallest free block that fits, the free tail last);
a tensor is freed after its last consumer (a view's source after its last view).  The compute buffer is
the highest offset reached, each tensor rounded up to the CUDA buffer's 128-byte alignment.  The holes
this leaves matter: in build 3410 a GPT-NeoX layer frees its fused QKV output (15 MiB for Pythia-2.8B at
512 tokens) below the roped query, so the ``n_kv x n_tokens x n_head`` scores go above both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GTensor", "GraphShape", "ReserveGraph", "gallocr_max_size", "reserve_nodes"]

F32 = 4
I32 = 4
I64 = 8
F16 = 2
# ggml_op_can_inplace (ggml-alloc.c): the ops vramplan's graphs use that may reuse a source's memory
INPLACE_OPS = frozenset({"add", "mul", "unary", "rope", "rms_norm", "soft_max", "scale"})


@dataclass(eq=False)
class GTensor:
    """One tensor of the reserve graph (identity, not value, equality, as ggml's hash set)."""

    name: str
    op: str
    ne: tuple[int, ...] = ()
    elem: int = F32
    srcs: tuple[GTensor, ...] = ()
    view_src: GTensor | None = None  # the tensor a view aliases (ggml follows a view of a view to its root)
    external: bool = False  # data not in the compute buffer: weights, the KV cache
    split_input: bool = False  # a GPU split's copy of a tensor read from another backend
    # ggml_gallocr's hash_node
    n_children: int = field(default=0, repr=False)
    n_views: int = field(default=0, repr=False)
    allocated: bool = field(default=False, repr=False)
    offset: int = field(default=0, repr=False)

    @property
    def nbytes(self) -> int:
        n = self.elem
        for d in self.ne:
            n *= d
        return n

    @property
    def is_view(self) -> bool:
        return self.view_src is not None


class ReserveGraph:
    """Nodes in ``ggml_build_forward_expand`` order, built with ggml's op names."""

    def __init__(self) -> None:
        self.nodes: list[GTensor] = []
        self._seen: set[int] = set()

    def expand(self, t: GTensor) -> GTensor:
        """``ggml_visit_parents``: sources first, left to right; leafs (inputs, weights, caches) are not nodes."""
        stack: list[tuple[GTensor, int]] = [(t, 0)]
        while stack:
            cur, i = stack.pop()
            if i == 0:
                if id(cur) in self._seen:
                    continue
                self._seen.add(id(cur))
            if i < len(cur.srcs):
                stack.append((cur, i + 1))
                stack.append((cur.srcs[i], 0))
            elif cur.op != "leaf":
                self.nodes.append(cur)
        return t

    # ops ------------------------------------------------------------------------------------------
    @staticmethod
    def op(name: str, op: str, ne: tuple[int, ...], *srcs: GTensor, elem: int = F32) -> GTensor:
        return GTensor(name, op, ne, elem, tuple(srcs))

    @staticmethod
    def view(name: str, parent: GTensor, ne: tuple[int, ...] | None = None, *extra: GTensor) -> GTensor:
        root = parent.view_src or parent
        return GTensor(name, "view", ne or parent.ne, parent.elem, (parent, *extra), view_src=root)


def _alloc(free: list[list[int]], size: int) -> tuple[int, int]:
    """``ggml_dyn_tallocr_alloc`` (free blocks sorted by offset, the last one the unbounded tail): the
    smallest block besides the last that fits (the later of equal ones), else the tail.  Returns
    (offset, end)."""
    best, best_size = -1, 1 << 63
    for i in range(len(free) - 1):
        if size <= free[i][1] <= best_size:
            best, best_size = i, free[i][1]
    if best < 0:
        best = len(free) - 1
    offset = free[best][0]
    free[best][0] += size
    free[best][1] -= size
    if free[best][1] == 0:
        del free[best]
    return offset, offset + size


def _release(free: list[list[int]], offset: int, size: int) -> None:
    """``ggml_dyn_tallocr_free_tensor``: merge with the block it ends or starts, else insert in order."""
    for i, b in enumerate(free):
        if b[0] + b[1] == offset:
            b[1] += size
            if i + 1 < len(free) and b[0] + b[1] == free[i + 1][0]:
                b[1] += free[i + 1][1]
                del free[i + 1]
            return
        if offset + size == b[0]:
            b[0], b[1] = offset, b[1] + size
            if i > 0 and free[i - 1][0] + free[i - 1][1] == b[0]:
                free[i - 1][1] += b[1]
                del free[i]
            return
    pos = 0
    while pos < len(free) and free[pos][0] < offset:
        pos += 1
    free.insert(pos, [offset, size])


@dataclass
class _Allocator:
    alignment: int
    free: list[list[int]] = field(default_factory=lambda: [[0, 1 << 62]])
    max_size: int = 0

    def size_of(self, t: GTensor) -> int:
        a = self.alignment
        return -(-t.nbytes // a) * a

    def allocate(self, t: GTensor) -> None:
        """``ggml_gallocr_allocate_node``."""
        if t.allocated or t.external or t.is_view or t.op == "leaf" and not t.split_input:
            return
        t.allocated = True
        if t.op in INPLACE_OPS:
            for p in t.srcs:
                if (p.allocated and p.ne == t.ne and p.elem == t.elem
                        and p.n_children == 1 and p.n_views == 0):
                    t.offset, p.allocated = p.offset, False  # reusing the parent
                    return
        t.offset, end = _alloc(self.free, self.size_of(t))
        self.max_size = max(self.max_size, end)

    def release(self, t: GTensor) -> None:
        """``ggml_gallocr_free_node`` (no tensor of the GPU split is a graph output on one GPU)."""
        _release(self.free, t.offset, self.size_of(t))
        t.allocated = False


def gallocr_max_size(nodes: list[GTensor], alignment: int) -> int:
    """The buffer ``ggml_gallocr_reserve_n`` sizes for ``nodes`` (module docstring)."""
    a = _Allocator(alignment)
    for n in nodes:
        if n.is_view:
            assert n.view_src is not None
            n.view_src.n_views += 1
        for s in n.srcs:
            s.n_children += 1
    for t in dict.fromkeys(s for n in nodes for s in n.srcs if s.split_input):
        a.allocate(t)  # the split's input copies are its first nodes, in the order the split reads them
    for n in nodes:
        for s in n.srcs:
            a.allocate(s)
        a.allocate(n)
        for p in n.srcs:
            p.n_children -= 1
            if p.n_children or p.n_views:
                continue
            if p.is_view:
                assert p.view_src is not None
                v = p.view_src
                v.n_views -= 1
                if v.n_views == 0 and v.n_children == 0 and v.allocated:
                    a.release(v)
            elif p.allocated:
                a.release(p)
    return a.max_size


@dataclass(frozen=True)
class GraphShape:
    """What the reserve graph's shapes read of the model and the context."""

    arch: str  # "llama" (llm_build_llama and its kin) or "gptneox" (llm_build_gptneox)
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_ff: int
    n_vocab: int
    n_tokens: int  # min(n_ctx, n_ubatch)
    n_kv: int  # the cache cells in view: kv_size
    mask_rows: int  # GGML_PAD(n_tokens, GGML_KQ_MASK_PAD)
    flash_attn: bool
    gated: bool = True
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    set_rows: bool = False  # the cache stores are ggml_set_rows with I64 index inputs (k_idxs, v_idxs)


class _Builder:
    """The reserve graph of build 3410's ``llm_build_llama`` / ``llm_build_gptneox`` (``src/llama.cpp``),
    the bias additions left out (in place on their only source, they never move an allocation)."""

    def __init__(self, s: GraphShape) -> None:
        self.s, self.g, ub = s, ReserveGraph(), s.n_tokens
        self.inp_pos = GTensor("inp_pos", "leaf", (ub,), I32, split_input=True)
        self.mask = GTensor("KQ_mask", "leaf", (s.n_kv, s.mask_rows), F32, split_input=True)
        # flash attention reads the mask as f16: ggml_cast in build_inp_KQ_mask, a node of the GPU split
        self.mask_fa = ReserveGraph.op("KQ_mask_f16", "cpy", self.mask.ne, self.mask, elem=F16)
        self.out_ids = GTensor("inp_out_ids", "leaf", (ub,), I32, split_input=True)
        self.k_cache = GTensor("cache_k", "leaf", external=True)
        self.v_cache = GTensor("cache_v", "leaf", external=True)
        # llama_kv_cache::build_input_k_idxs / build_input_v_idxs: one I64 row index per token, per value of a
        # transposed V (no flash attention: each row one element)
        v_rows = ub if s.flash_attn else ub * s.n_head_kv * s.head_v
        self.idxs = (GTensor("k_idxs", "leaf", (ub,), I64, split_input=True),
                     GTensor("v_idxs", "leaf", (v_rows,), I64, split_input=True))

    def _store(self, cur: GTensor, cache: GTensor, which: int) -> None:
        """The cache store: ``ggml_cpy`` into a view of the cache (llm_build_kv_store), or ``ggml_set_rows`` with
        the index input (llama_kv_cache::cpy_k / cpy_v); either result is a view of the cache."""
        dst = ReserveGraph.view("cache_view", cache, cur.ne)
        srcs = (dst, cur, self.idxs[which]) if self.s.set_rows else (cur, dst)
        self.g.expand(GTensor("cpy", "cpy", cur.ne, cur.elem, srcs, view_src=cache))

    def _kqv(self, q_r: GTensor) -> GTensor:
        """llm_build_kqv, expanded up to the merged heads (``kqv_merged_cont``, or the reshaped flash output)."""
        s, ub, op, view = self.s, self.s.n_tokens, ReserveGraph.op, ReserveGraph.view
        q = view("q", q_r, (s.head_k, ub, s.n_head))
        k = view("k", self.k_cache, (s.head_k, s.n_kv, s.n_head_kv))
        v = view("v", self.v_cache, (s.head_v, s.n_kv, s.n_head_kv))
        if s.flash_attn:
            fa = op("flash_attn_ext", "flash_attn_ext", (s.head_v, s.n_head, ub), q, k, v, self.mask_fa)
            out = view("kqv_out", fa, (s.head_v * s.n_head, ub))
        else:
            kq = op("kq", "mul_mat", (s.n_kv, ub, s.n_head), k, q)
            kq = op("kq_soft_max_ext", "soft_max", kq.ne, kq, self.mask)
            kqv = op("kqv", "mul_mat", (s.head_v, ub, s.n_head), v, kq)
            out = op("kqv_merged_cont", "cont", (s.head_v * s.n_head, ub), view("kqv_merged", kqv))
        return self.g.expand(out)

    def _norm(self, x: GTensor) -> GTensor:
        op = "norm" if self.s.arch == "gptneox" else "rms_norm"  # LLM_NORM / LLM_NORM_RMS
        n = ReserveGraph.op("norm", op, x.ne, x)
        return ReserveGraph.op("norm_w", "mul", x.ne, n)

    def _ffn(self, x: GTensor) -> GTensor:
        s, ub, op = self.s, self.s.n_tokens, ReserveGraph.op
        if s.n_expert and s.n_ff_exp:
            return self._moe(x)
        up = op("ffn_up", "mul_mat", (s.n_ff, ub), x)
        if not s.gated:  # LLM_FFN_SEQ without a gate: up, its activation in place, down
            return op("ffn_down", "mul_mat", (s.n_embd, ub), op("ffn_act", "unary", up.ne, up))
        gate = op("ffn_act", "unary", up.ne, op("ffn_gate", "mul_mat", up.ne, x))  # LLM_FFN_PAR
        return op("ffn_down", "mul_mat", (s.n_embd, ub), op("ffn_gate_par", "mul", up.ne, gate, up))

    def _moe(self, x: GTensor) -> GTensor:
        """llm_build_moe_ffn: router soft_max, top-k (a view of argsort), the selected experts' products."""
        s, ub, op, view = self.s, self.s.n_tokens, ReserveGraph.op, ReserveGraph.view
        e, k = s.n_expert, max(1, s.n_expert_used)
        probs = op("ffn_moe_probs", "soft_max", (e, ub), op("ffn_moe_logits", "mul_mat", (e, ub), x))
        sel = view("ffn_moe_topk", op("argsort", "argsort", (e, ub), probs, elem=I32), (k, ub))
        w = op("ffn_moe_weights", "get_rows", (1, k, ub), view("probs_3d", probs, (1, e, ub)), sel)
        x3 = view("cur_3d", x, (s.n_embd, 1, ub))
        up = op("ffn_moe_up", "mul_mat_id", (s.n_ff_exp, k, ub), x3, sel)
        gate = op("ffn_moe_gate", "unary", up.ne, op("ffn_moe_gate", "mul_mat_id", up.ne, x3, sel))
        par = op("ffn_moe_gate_par", "mul", up.ne, gate, up)
        ex = op("ffn_moe_down", "mul_mat_id", (s.n_embd, k, ub), par, sel)
        ex = op("ffn_moe_weighted", "mul", ex.ne, ex, w)
        out = view("expert_0", ex, (s.n_embd, ub))
        for i in range(1, k):
            out = op("ffn_moe_out", "add", (s.n_embd, ub), out, view(f"expert_{i}", ex, (s.n_embd, ub)))
        return out

    def _qkv(self, x: GTensor) -> tuple[GTensor, GTensor, GTensor]:
        s, ub, op, view = self.s, self.s.n_tokens, ReserveGraph.op, ReserveGraph.view
        nq, nk = s.n_head * s.head_k, s.n_head_kv * s.head_k
        if s.arch == "gptneox":  # one fused wqkv, each part a ggml_cont of a view of it
            qkv = op("wqkv", "mul_mat", (nq + nk + s.n_head_kv * s.head_v, ub), x)
            q = op("Qcur", "cont", (nq, ub), view("q_view", qkv, (nq, ub)))
            k = op("Kcur", "cont", (nk, ub), view("k_view", qkv, (nk, ub)))
            v = op("Vcur", "cont", (s.n_head_kv * s.head_v, ub), view("v_view", qkv, (nk, ub)))
        else:
            q = op("Qcur", "mul_mat", (nq, ub), x)
            k = op("Kcur", "mul_mat", (nk, ub), x)
            v = op("Vcur", "mul_mat", (s.n_head_kv * s.head_v, ub), x)
        q_r = op("Qcur_rope", "rope", (s.head_k, s.n_head, ub), view("q3", q, (s.head_k, s.n_head, ub)), self.inp_pos)
        k_r = op("Kcur_rope", "rope", (s.head_k, s.n_head_kv, ub), view("k3", k, (s.head_k, s.n_head_kv, ub)),
                 self.inp_pos)
        return q_r, k_r, v

    def layer(self, x: GTensor, last: bool) -> GTensor:
        """One layer; ``x`` is its input, ``last`` the model's last layer (where ``inp_out_ids`` picks the
        output rows: all of them in the reserve graph)."""
        s, ub, op, view = self.s, self.s.n_tokens, ReserveGraph.op, ReserveGraph.view
        q_r, k_r, v = self._qkv(self._norm(x))
        for t in (q_r, k_r, v):  # llm_build_kv: "added to the graph together so that they are not reordered"
            self.g.expand(t)
        self._store(k_r, self.k_cache, 0)
        self._store(v if s.flash_attn else view("v_t", v), self.v_cache, 1)  # without flash attention V is transposed
        attn = op("wo", "mul_mat", (s.n_embd, ub), self._kqv(q_r))
        if last:
            attn = op("attn_rows", "get_rows", attn.ne, attn, self.out_ids)
            x = op("inp_rows", "get_rows", x.ne, x, self.out_ids)
        if s.arch == "gptneox":  # parallel residual: x + attn(ln1(x)) + ffn(ln2(x))
            ffn = op("ffn_res", "add", x.ne, self._ffn(self._norm(x)), x)
            return op("l_out", "add", x.ne, ffn, attn)
        ffn_inp = op("ffn_inp", "add", x.ne, attn, x)
        return op("l_out", "add", x.ne, self._ffn(self._norm(ffn_inp)), ffn_inp)

    def output(self, x: GTensor) -> GTensor:
        return ReserveGraph.op("result_output", "mul_mat", (self.s.n_vocab, self.s.n_tokens), self._norm(x))


def reserve_nodes(s: GraphShape, layers: int, output: bool) -> list[GTensor]:
    """The GPU split of the reserve graph: the last ``layers`` layers, then the output when ``output``; its
    input (the embeddings, or the hidden state of the last host layer) a split input."""
    b = _Builder(s)
    x = GTensor("inp_embd", "leaf", (s.n_embd, s.n_tokens), split_input=True)
    for il in range(layers):
        x = b.layer(x, il == layers - 1)
    if output:
        x = b.output(x)
    b.g.expand(x)
    return b.g.nodes
