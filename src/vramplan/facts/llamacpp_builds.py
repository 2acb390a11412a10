"""llama.cpp builds whose start-up memory rules differ, as data (``serve.gguf.llamacpp_build``).

Each row is the first build of a behaviour and the sources it was read from; a build between two rows
uses the earlier row and says so (``llamacpp_build``).  What every row shares -- the worst-case graph of
``min(n_ctx, n_ubatch)`` tokens, all of them outputs, the whole cache in view, allocated by ggml-alloc's
best-fit allocator with in-place reuse -- is in ``serve/ggml_graph.py``; a row holds what moves between
builds:

* ``kv_pad`` / ``kv_pad_flash``: the KV cache cells are ``n_ctx`` rounded up to this many, without / with
  flash attention (``llama_kv_cache_get_padding``: ``flash_attn ? 256u : 32u`` since
  https://github.com/ggml-org/llama.cpp/pull/7257, 2024-05-13, "Reduce KV cache padding from 256 to 32
  when FA is disabled").
* ``kq_mask_pad``: the mask's rows are ``GGML_PAD(n_tokens, GGML_KQ_MASK_PAD)`` (``ggml/include/ggml.h``).
* ``flash_attn_default``: what ``-fa`` means when it is not given: ``off``, or ``auto`` (on where the
  device supports it: every CUDA GPU vramplan lists).
* ``set_rows``: the cache stores are ``ggml_set_rows`` with index inputs the GPU graph copies in (without
  flash attention one index per value of V: ``n_tokens x n_embd_v_gqa`` x 8 bytes), not ``ggml_cpy``.
* ``reserve``: the function that reserves the compute buffer and prints "CUDA0 compute buffer size".
* ``output_first``: the order ``-ngl`` offloads in (``load_tensors``).  Before
  https://github.com/ggml-org/llama.cpp/pull/18148 ("llama: offload output layer to GPU first", 2025-12-17)
  ``i_gpu_start = max(n_layer - n_gpu_layers, 0)``: the repeating layers from the last one, the output only
  when ``n_gpu_layers > n_layer``; from it ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``: the output
  first, then the repeating layers from the last one.  Both keep ``act_gpu_layers = min(n_gpu_layers,
  n_layer + 1)`` and put slot ``il`` on the CPU when ``il < i_gpu_start || il - i_gpu_start >= act_gpu_layers``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FLASH_UNEQUAL_HEADS_FROM", "LLAMACPP_BUILDS", "MLA_CACHE_FROM", "MLA_CACHE_SOURCES", "MLA_V_LESS_FROM",
           "LlamaCppBuild", "llamacpp_build", "mla_cache_layout", "parse_build"]


@dataclass(frozen=True)
class LlamaCppBuild:
    """One llama.cpp behaviour, from ``build`` on."""

    build: int
    date: str
    kv_pad: int
    kv_pad_flash: int
    kq_mask_pad: int
    flash_attn_default: str  # "off" | "auto"
    set_rows: bool  # the KV stores are ggml_set_rows with I64 index inputs (split inputs of the GPU graph)
    reserve: str
    sources: tuple[str, ...]
    output_first: bool = False  # -ngl offloads the output layer before the repeating layers (ggml-org/llama.cpp#18148)
    checked_by: tuple[str, ...] = ()  # validation/published.yaml sources that check the row

    def gpu_start(self, n_layer: int, n_gpu_layers: int) -> int:
        """``i_gpu_start`` of ``load_tensors``: the first slot (0..n_layer, n_layer the output) on the GPU."""
        return max(n_layer + (1 if self.output_first else 0) - n_gpu_layers, 0)

    def on_gpu(self, slot: int, n_layer: int, n_gpu_layers: int) -> bool:
        """Slot ``slot`` (a repeating layer, or ``n_layer``: the output) is on the GPU for ``-ngl n_gpu_layers``."""
        start, act = self.gpu_start(n_layer, n_gpu_layers), min(n_gpu_layers, n_layer + 1)
        return start <= slot < start + act

    def offload_log(self, n_layer: int, n_gpu_layers: int) -> list[str]:
        """The "offloading ..." lines ``load_tensors`` prints (before the "offloaded N/M layers" line)."""
        n_gpu = min(n_gpu_layers, n_layer)
        if not self.output_first:  # "output layer" only when n_gpu_layers > n_layer
            return ([f"offloading {n_gpu} repeating layers to GPU"] +
                    (["offloading output layer to GPU"] if n_gpu_layers > n_layer else []))
        # from #18148: the output is counted out of min(n_gpu_layers, n_layer), so -ngl n_layer + 1 prints one
        # repeating layer fewer than it offloads (the log's arithmetic, not the placement)
        if n_gpu <= 0:
            return ["offloading 0 repeating layers to GPU"]
        return ["offloading output layer to GPU", f"offloading {n_gpu - 1} repeating layers to GPU"]

    def kv_cells(self, n_ctx: int, flash_attn: bool) -> int:
        pad = self.kv_pad_flash if flash_attn else self.kv_pad
        return -(-n_ctx // pad) * pad


LLAMACPP_BUILDS: tuple[LlamaCppBuild, ...] = (
    LlamaCppBuild(
        build=3410, date="2024-07-17", kv_pad=32, kv_pad_flash=256, kq_mask_pad=32, flash_attn_default="off", set_rows=False,
        reserve="llama_new_context_with_model (src/llama.cpp)",
        sources=(
            "src/llama.cpp llama_kv_cache_get_padding: flash_attn ? 256 : 32 (ggml-org/llama.cpp#7257)",
            ("src/llama.cpp llama_new_context_with_model: the worst-case graph, n_tokens = min(n_ctx, n_ubatch), "
            "n_outputs = n_tokens (llm_build_context, worst_case), n_kv = kv_self.size"),
            ("ggml/src/ggml-backend.c ggml_backend_sched_split_graph: a split's input copies are flagged input and "
            "output only when n_copies > 1 (pipeline parallelism)"),
            "ggml/src/ggml-alloc.c ggml_gallocr_alloc_graph_impl, ggml_gallocr_allocate_node, ggml_dyn_tallocr_alloc",
        ),
        checked_by=("ggml-org-ci-llamacpp-b3410-v100", "llama-cpp-python-llama-3-8b-rtx3070",
                    "ollama-0.5.4-llama-3.1-8b-rtx4090"),
    ),
    LlamaCppBuild(
        build=6327, date="2025-08-31", kv_pad=32, kv_pad_flash=256, kq_mask_pad=64, flash_attn_default="auto", set_rows=True,
        reserve="llama_context::sched_reserve (src/llama-context.cpp)",
        sources=(
            ("common/arg.cpp -fa, --flash-attn [on|off|auto], default auto; llama_context_params.flash_attn_type "
            "(mybigday/llama.node#102, 'sync llama.cpp to b6327': 'Deprecate flash_attn and introduce "
            "flash_attn_type (auto|on|off)')"),
            ("src/llama-context.cpp llama_context::sched_reserve: the pp graph of n_tokens = min(n_ctx, n_ubatch), "
            "n_outputs = min(n_tokens, n_outputs_max) (n_outputs_max defaults to n_batch), reserved last"),
            "ggml/include/ggml.h GGML_KQ_MASK_PAD 64",
            ("src/llama-kv-cache.cpp llama_kv_cache::cpy_k / cpy_v: ggml_set_rows into the cache with the I64 inputs "
             "of build_input_k_idxs ([n_tokens]) and build_input_v_idxs ([n_tokens], or [n_tokens * n_embd_v_gqa] for "
             "the transposed V of -fa off)"),
            ("ggml/src/ggml-alloc.c: chunked ggml_dyn_tallocr, one chunk for a CUDA buffer (max size SIZE_MAX): the "
            "same best fit as before"),
            "src/llama-model.cpp load_tensors: i_gpu_start = max(n_layer - n_gpu_layers, 0) (before #18148)",
        ),
    ),
    LlamaCppBuild(
        build=7377, date="2025-12-17", kv_pad=32, kv_pad_flash=256, kq_mask_pad=64, flash_attn_default="auto", set_rows=True,
        reserve="llama_context::sched_reserve (src/llama-context.cpp)", output_first=True,
        sources=(
            ("ggml-org/llama.cpp#18148 'llama: offload output layer to GPU first' (JohannesGaessler, 2025-12-17, "
             "fixes #18119): src/llama-model.cpp load_tensors i_gpu_start = max(int(hparams.n_layer) + 1 - "
             "n_gpu_layers, 0); the log prints 'offloading output layer to GPU' first, then "
             "min(n_gpu_layers, n_layer) - 1 repeating layers"),
            ("the build number is a bracket, not the merge commit's count: b7376 predates the merge "
             "(xorbitsai/xllamacpp#99 'Update llama cpp to b7376', 2025-12-13) and b9527 has the new order "
             "(ggml-org/llama.cpp#24183, 2026-06-05: 'offloading output layer to GPU' before 'offloading 64 "
             "repeating layers'); the row starts at b7377, the end of the bracket that puts the output (the "
             "largest tensor) on the GPU for the builds in doubt"),
            ("every other rule is b6327's, read again at the same files; not in this row: the 256-cell n_ctx "
             "padding without flash attention of #16812 / #17046 (docs/serving.md)"),
        ),
    ),
)


def parse_build(text: str) -> int | None:
    """``"b3410"``, ``"3410"`` or ``"b3410 (b3283448)"`` -> 3410; anything else None."""
    t = text.strip().lower().removeprefix("b").split(" ")[0].split("-")[0]
    return int(t) if t.isdigit() else None


def llamacpp_build(text: str | None) -> tuple[LlamaCppBuild, str]:
    """The row for a build (null: the newest row) and a note when the build is not a row of its own."""
    if text is None:
        return LLAMACPP_BUILDS[-1], ""
    n = parse_build(text)
    if n is None:
        raise ValueError(f"llamacpp_build {text!r} is not a llama.cpp build number (b3410, 6327 ...)")
    earlier = [b for b in LLAMACPP_BUILDS if b.build <= n]
    if not earlier:
        first = LLAMACPP_BUILDS[0]
        return first, (f"llama.cpp b{n} is older than the first modelled build b{first.build}; b{first.build}'s "
                       "rules are used (its KV padding and flash-attention default may differ)")
    row = earlier[-1]
    note = "" if row.build == n else f"llama.cpp b{n} uses the rules of b{row.build}, the nearest earlier modelled build"
    return row, note


# DeepSeek's multi-head latent attention (llama.cpp architecture deepseek2: DeepSeek-V2/V3/R1, Kimi-K2) in the KV
# cache, by build.  The build number is the commit count (cmake/build-info.cmake); each boundary is its merge commit's.
MLA_CACHE_FROM = 5137
MLA_V_LESS_FROM = 7832
# before b4987 the context forces flash attention off when K and V heads differ (src/llama.cpp at c392e50:
# "flash_attn requires n_embd_head_k == n_embd_head_v - forcing off"; lifted by ggml-org/llama.cpp#12612, b4987)
FLASH_UNEQUAL_HEADS_FROM = 4987
MLA_CACHE_SOURCES: tuple[str, ...] = (
    ("before b5137 (src/llama.cpp llama_kv_cache_init at a097415, b4333; src/llama-kv-cache.cpp at eccc7a1, b5136): "
     "K rows of n_head_kv x n_embd_head_k and V rows of n_head_kv x n_embd_head_v, from the GGUF's "
     "attention.key_length = qk_nope + qk_rope (192) and value_length = v_head_dim (128), head_count_kv = "
     "num_key_value_heads (128 for V3): the multi-head layout (ggml-org/llama.cpp#10981 prints n_embd_k_gqa = 24576, "
     "n_embd_v_gqa = 16384)"),
    ("b5137 (ggml-org/llama.cpp#12801, commit daa4228, 2025-04-15, 'DeepSeek V2/V3 MLA implementation'): "
     "convert_hf_to_gguf.py writes num_key_value_heads 1, key_length kv_lora_rank + qk_rope (576), value_length "
     "kv_lora_rank (512) and the _mla keys; such a file caches one 576-wide K row and one 512-wide V row per token "
     "and layer (is_mla); a file converted before, without the _mla keys, keeps the multi-head layout"),
    ("b7832 (ggml-org/llama.cpp#19067, commit d9c6ce4, 2026-01-25, 'kv-cache : support V-less cache'): "
     "src/llama-kv-cache.cpp has_v = !is_mla: no V tensor, V is a view of K's first 512 columns"),
)


def mla_cache_layout(build: int, mla_file: bool = True) -> str:
    """How build ``build`` caches an MLA model: ``"mha"`` (K n_head x (nope + rope), V n_head x v_head_dim),
    ``"mla"`` (one 576-wide K and one 512-wide V row per token and layer) or ``"mla-k"`` (the K row only).
    ``mla_file``: the GGUF was converted with the _mla keys (b5137 or later)."""
    if build < MLA_CACHE_FROM or not mla_file:
        return "mha"
    return "mla" if build < MLA_V_LESS_FROM else "mla-k"
