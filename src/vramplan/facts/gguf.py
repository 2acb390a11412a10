"""GGUF as data: ggml's tensor types (block size, bytes per block) and llama.cpp's file-type mixes.

**Tensor types.**  A ggml tensor stores its rows (``ne[0]`` elements each) as blocks: ``blck_size``
elements in ``type_size`` bytes (``ggml_row_size(type, ne) = type_size * ne / blck_size``).  The
sizes are the ``static_assert`` of each block struct in ``ggml/src/ggml-common.h`` and the
``type_traits`` table of ``ggml/src/ggml.c``; the ids are ``enum ggml_type`` of
``ggml/include/ggml.h`` (llama.cpp, commit 01243c5 for ggml-common.h).  Worked: ``block_q4_K`` is
``2*sizeof(ggml_half) + K_SCALE_SIZE(12) + QK_K/2`` = 2*2 + 12 + 128 = 144 bytes per 256 weights
(4.5 bits per weight); ``block_q8_0`` is 2 + 32 = 34 bytes per 32.

**File types.**  ``llama-quantize <ftype>`` starts from the ftype's default tensor type and then picks a
type per tensor (``src/llama-quant.cpp``, ``llama_tensor_get_type_impl`` at llama.cpp commit
007dbbf): the output matrix (and a tied token embedding) gets Q6_K unless the default is Q8_0;
``attn_v`` and ``ffn_down`` get more bits in the layers ``use_more_bits`` selects (the first and last
eighth and every third layer between) for Q4_K_M/Q5_K_M; Q3_K_M/L, Q4_K_S, Q2_K, IQ4_XS... have their own
rules; 1-d tensors (norms, biases) and the MoE router stay as converted (f32).  A row whose length is
not a multiple of the chosen type's block falls back (``tensor_type_fallback``: Q4_K -> Q5_0,
Q5_K -> Q5_1, Q6_K -> Q8_0, IQ* -> IQ4_NL, else F16).  ``mix_type`` implements that function for the
categories vramplan models; what it does not model (an importance matrix, ``--pure``, user overrides,
the Falcon branches) is named in ``MIX_ASSUMPTIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FILE_TYPES",
    "FILE_TYPE_ALIASES",
    "FILE_TYPE_IDS",
    "GGML_TYPES",
    "GGML_TYPE_IDS",
    "MIX_ASSUMPTIONS",
    "FileType",
    "GgmlType",
    "MixContext",
    "file_type",
    "ggml_type",
    "mix_type",
    "row_bytes",
    "tensor_bytes",
    "use_more_bits",
]

QK_K = 256  # elements of a k-quant / i-quant super-block (ggml-common.h)


@dataclass(frozen=True)
class GgmlType:
    """One ``enum ggml_type`` entry: ``block`` elements stored in ``block_bytes`` bytes."""

    name: str
    id: int
    block: int
    block_bytes: int
    struct: str  # the block struct of ggml-common.h (or the scalar type)

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / self.block


def _t(name: str, tid: int, block: int, nbytes: int, struct: str) -> GgmlType:
    return GgmlType(name, tid, block, nbytes, struct)


# ggml/include/ggml.h enum ggml_type; ggml/src/ggml-common.h block structs (sizes from their static_asserts)
GGML_TYPES: dict[str, GgmlType] = {t.name: t for t in (
    _t("F32", 0, 1, 4, "float"),
    _t("F16", 1, 1, 2, "ggml_half"),
    _t("Q4_0", 2, 32, 18, "block_q4_0: d(2) + qs[16]"),
    _t("Q4_1", 3, 32, 20, "block_q4_1: d, m(4) + qs[16]"),
    _t("Q5_0", 6, 32, 22, "block_q5_0: d(2) + qh[4] + qs[16]"),
    _t("Q5_1", 7, 32, 24, "block_q5_1: d, m(4) + qh[4] + qs[16]"),
    _t("Q8_0", 8, 32, 34, "block_q8_0: d(2) + qs[32]"),
    _t("Q8_1", 9, 32, 36, "block_q8_1: d, s(4) + qs[32]"),
    _t("Q2_K", 10, QK_K, 84, "block_q2_K: scales[16] + qs[64] + d, dmin(4)"),
    _t("Q3_K", 11, QK_K, 110, "block_q3_K: hmask[32] + qs[64] + scales[12] + d(2)"),
    _t("Q4_K", 12, QK_K, 144, "block_q4_K: d, dmin(4) + scales[12] + qs[128]"),
    _t("Q5_K", 13, QK_K, 176, "block_q5_K: d, dmin(4) + scales[12] + qh[32] + qs[128]"),
    _t("Q6_K", 14, QK_K, 210, "block_q6_K: ql[128] + qh[64] + scales[16] + d(2)"),
    _t("Q8_K", 15, QK_K, 292, "block_q8_K: d(4) + qs[256] + bsums[16] int16"),
    _t("IQ2_XXS", 16, QK_K, 66, "block_iq2_xxs: d(2) + qs[32] uint16"),
    _t("IQ2_XS", 17, QK_K, 74, "block_iq2_xs: d(2) + qs[32] uint16 + scales[8]"),
    _t("IQ3_XXS", 18, QK_K, 98, "block_iq3_xxs: d(2) + qs[96]"),
    _t("IQ1_S", 19, QK_K, 50, "block_iq1_s: d(2) + qs[32] + qh[8] uint16"),
    _t("IQ4_NL", 20, 32, 18, "block_iq4_nl: d(2) + qs[16]"),
    _t("IQ3_S", 21, QK_K, 110, "block_iq3_s: d(2) + qs[64] + qh[8] + signs[32] + scales[4]"),
    _t("IQ2_S", 22, QK_K, 82, "block_iq2_s: d(2) + qs[64] + qh[8] + scales[8]"),
    _t("IQ4_XS", 23, QK_K, 136, "block_iq4_xs: d(2) + scales_h(2) + scales_l[4] + qs[128]"),
    _t("I8", 24, 1, 1, "int8_t"),
    _t("I16", 25, 1, 2, "int16_t"),
    _t("I32", 26, 1, 4, "int32_t"),
    _t("I64", 27, 1, 8, "int64_t"),
    _t("F64", 28, 1, 8, "double"),
    _t("IQ1_M", 29, QK_K, 56, "block_iq1_m: qs[32] + qh[16] + scales[8]"),
    _t("BF16", 30, 1, 2, "ggml_bf16_t"),
    _t("TQ1_0", 34, QK_K, 54, "block_tq1_0: qs[48] + qh[4] + d(2)"),
    _t("TQ2_0", 35, QK_K, 66, "block_tq2_0: qs[64] + d(2)"),
    _t("MXFP4", 39, 32, 17, "block_mxfp4: e(1) + qs[16]"),
    _t("NVFP4", 40, 64, 36, "block_nvfp4: d[4] + qs[32]"),
    _t("Q1_0", 41, 128, 18, "block_q1_0: d(2) + qs[16]"),
    _t("Q2_0", 42, 64, 18, "block_q2_0: d(2) + qs[16]"),
)}
GGML_TYPE_IDS: dict[int, GgmlType] = {t.id: t for t in GGML_TYPES.values()}


def ggml_type(name: str) -> GgmlType:
    """The type called ``name`` (case-insensitive: ``q4_k`` and ``Q4_K`` are one type)."""
    key = name.strip().upper()
    if key not in GGML_TYPES:
        raise KeyError(name)
    return GGML_TYPES[key]


def row_bytes(t: GgmlType, ne0: int) -> int:
    """``ggml_row_size``: bytes of one row of ``ne0`` elements (a whole number of blocks)."""
    return t.block_bytes * (ne0 // t.block)


def tensor_bytes(t: GgmlType, shape: tuple[int, ...]) -> int:
    """``ggml_nbytes`` of a contiguous tensor: rows x row bytes (``shape[0]`` is ``ne[0]``, the row)."""
    if not shape:
        return t.block_bytes
    rows = 1
    for d in shape[1:]:
        rows *= d
    return rows * row_bytes(t, shape[0])


@dataclass(frozen=True)
class FileType:
    """A ``llama_ftype``: the name ``llama-quantize`` takes, its ``general.file_type`` id, its default type."""

    name: str
    id: int
    default: str  # ggml type name the tensors start from (llama_model_quantize_impl's switch)


# include/llama.h enum llama_ftype (ids) and llama-quant.cpp llama_model_quantize_impl (default_type)
FILE_TYPES: dict[str, FileType] = {f.name: f for f in (
    FileType("F32", 0, "F32"), FileType("F16", 1, "F16"), FileType("Q4_0", 2, "Q4_0"), FileType("Q4_1", 3, "Q4_1"),
    FileType("Q8_0", 7, "Q8_0"), FileType("Q5_0", 8, "Q5_0"), FileType("Q5_1", 9, "Q5_1"),
    FileType("Q2_K", 10, "Q2_K"), FileType("Q3_K_S", 11, "Q3_K"), FileType("Q3_K_M", 12, "Q3_K"),
    FileType("Q3_K_L", 13, "Q3_K"), FileType("Q4_K_S", 14, "Q4_K"), FileType("Q4_K_M", 15, "Q4_K"),
    FileType("Q5_K_S", 16, "Q5_K"), FileType("Q5_K_M", 17, "Q5_K"), FileType("Q6_K", 18, "Q6_K"),
    FileType("IQ2_XXS", 19, "IQ2_XXS"), FileType("IQ2_XS", 20, "IQ2_XS"), FileType("Q2_K_S", 21, "Q2_K"),
    FileType("IQ3_XS", 22, "IQ3_S"), FileType("IQ3_XXS", 23, "IQ3_XXS"), FileType("IQ1_S", 24, "IQ1_S"),
    FileType("IQ4_NL", 25, "IQ4_NL"), FileType("IQ3_S", 26, "IQ3_S"), FileType("IQ3_M", 27, "IQ3_S"),
    FileType("IQ2_S", 28, "IQ2_XS"), FileType("IQ2_M", 29, "IQ2_S"), FileType("IQ4_XS", 30, "IQ4_XS"),
    FileType("IQ1_M", 31, "IQ1_M"), FileType("BF16", 32, "BF16"), FileType("TQ1_0", 36, "TQ1_0"),
    FileType("TQ2_0", 37, "TQ2_0"), FileType("MXFP4_MOE", 38, "MXFP4"),
)}
FILE_TYPE_IDS: dict[int, FileType] = {f.id: f for f in FILE_TYPES.values()}
# llama-quantize's short names (tools/quantize/quantize.cpp QUANT_OPTIONS: "Q4_K" is an alias for Q4_K_M)
FILE_TYPE_ALIASES: dict[str, str] = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def file_type(name: str) -> FileType | None:
    """The file type called ``name`` (any case, or llama-quantize's alias), None if unknown."""
    key = name.strip().upper()
    return FILE_TYPES.get(FILE_TYPE_ALIASES.get(key, key))

MIX_ASSUMPTIONS: tuple[str, ...] = (
    ("GGUF quant mix: llama-quantize's per-tensor rule (llama.cpp src/llama-quant.cpp llama_tensor_get_type_impl, "
    "commit 007dbbf) without an importance matrix, --pure or --tensor-type overrides; Falcon-only branches not modelled"),
    "a model with 80 layers is treated as llama.cpp's LLM_TYPE_70B (attn_v Q3_K/Q4_K -> Q5_K)",
    ("a fused attn_qkv follows its own ATTENTION_QKV rule (Q3_K_M/L, IQ3_M -> Q4_K; Q4_K_M -> Q5_K; Q5_K_M -> Q6_K; "
     "else the default), as in the files of llama.cpp b3410 (ggml-org/ci pythia logs: q5_K x 32 for Q4_K_M, q2_K "
     "for Q2_K); commit 007dbbf sends it through the attn_v rule first"),
)

_IQ12 = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
             "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q2_0": "Q4_0", "Q2_K": "Q4_0",
             "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp ``use_more_bits``: the first and last eighth, and every third layer between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass(frozen=True)
class MixContext:
    """What ``llama_tensor_get_type_impl`` reads about the model (``hparams``) and the tensor."""

    n_layer: int
    n_gqa: int  # n_head / n_head_kv
    n_expert: int
    tied_embeddings: bool


def _output_type(ftype: str, default: str, ncols: int) -> str:
    if ftype == "MXFP4_MOE" or ncols % GGML_TYPES[default].block:
        return "Q8_0"
    if ftype in _IQ12:
        return "Q5_K"
    return default if default == "Q8_0" else "Q6_K"


def _iq12_type(ftype: str, cat: str, default: str, i: int, ctx: MixContext) -> str:
    s_or_m = ftype in ("IQ2_S", "IQ2_M")
    if cat == "attn_v":
        if ctx.n_gqa >= 4 or ctx.n_expert >= 4:
            return "Q4_K"
        return "IQ3_S" if s_or_m else "Q2_K"
    if cat == "attn_k" and ctx.n_expert == 8:
        return "Q4_K"
    if cat == "ffn_down" and i < ctx.n_layer // 8:
        return "IQ3_S" if s_or_m else "Q2_K"
    if cat == "attn_output":
        if ctx.n_expert == 8:
            return "Q5_K"
        if ftype in ("IQ1_S", "IQ1_M"):
            return "IQ2_XXS"
        if s_or_m:
            return "IQ3_S"
    return default


def _attn_v_type(ftype: str, default: str, i: int, ctx: MixContext) -> str:
    t, gqa4 = default, ctx.n_gqa >= 4
    if ftype == "Q2_K":
        t = "Q4_K" if gqa4 else "Q3_K"
    elif ftype == "Q2_K_S" and gqa4:
        t = "Q4_K"
    elif ftype == "IQ3_XXS":
        t = "Q4_K" if gqa4 else "IQ3_S"  # no importance matrix
    elif ftype in ("IQ3_XS", "IQ3_S") and gqa4 or ftype == "IQ3_M":
        t = "Q4_K"
    elif ftype == "Q3_K_M":
        t = "Q5_K" if i < 2 else "Q4_K"
    elif ftype == "Q3_K_L" or ftype in ("IQ4_NL", "IQ4_XS") and gqa4:
        t = "Q5_K"
    elif ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, ctx.n_layer):
        t = "Q6_K"
    elif ftype == "Q4_K_S" and i < 4:
        t = "Q5_K"
    if ctx.n_layer == 80 and t in ("Q3_K", "Q4_K"):  # LLM_TYPE_70B
        t = "Q5_K"
    return "Q8_0" if ctx.n_expert == 8 else t


def _ffn_down_type(ftype: str, default: str, i: int, ctx: MixContext) -> str:
    n = ctx.n_layer
    rules: dict[str, str | None] = {
        "Q2_K": "Q3_K",
        "Q2_K_S": "Q4_K" if i < n // 8 else None,
        "IQ3_XXS": "Q4_K" if i < n // 8 else "Q3_K",
        "Q3_K_M": "Q5_K" if i < n // 16 else "Q4_K",  # non-Falcon: Q4_K for every other layer
        "IQ3_M": "Q4_K" if i < n // 8 or (ctx.n_expert == 8 and use_more_bits(i, n)) else None,
        "Q3_K_L": "Q5_K",
        "Q4_K_M": "Q6_K" if use_more_bits(i, n) else None,
        "IQ4_NL": "Q5_K" if i < n // 8 else None,
        "IQ4_XS": "Q5_K" if i < n // 8 else None,
        "Q5_K_M": "Q6_K" if use_more_bits(i, n) else None,
        "Q4_K_S": "Q5_K" if i < n // 8 else None,
    }
    return rules.get(ftype) or default


def _attn_output_type(ftype: str, default: str, ctx: MixContext) -> str:
    if ctx.n_expert == 8:
        bumped = {"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M",
                  "IQ4_XS"}
        return "Q5_K" if ftype in bumped else default
    return {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(ftype, default)


def _impl(ftype: str, cat: str, default: str, i: int, ctx: MixContext, ncols: int) -> str:
    """``llama_tensor_get_type_impl`` for one tensor of category ``cat`` in layer ``i``."""
    if cat == "output" or (cat == "token_embd" and ctx.tied_embeddings):
        return _output_type(ftype, default, ncols)
    if ftype == "MXFP4_MOE":
        return "MXFP4" if cat.endswith("_exps") else "Q8_0"
    if cat == "token_embd":
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        return "Q4_K" if ftype in ("TQ1_0", "TQ2_0") else default
    base = cat.removesuffix("_exps").removesuffix("_shexp")
    if ftype in _IQ12:
        return _iq12_type(ftype, base, default, i, ctx)
    if base == "attn_qkv":  # ATTENTION_QKV's own rule (see MIX_ASSUMPTIONS)
        return {"Q3_K_M": "Q4_K", "Q3_K_L": "Q4_K", "IQ3_M": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}.get(
            ftype, default)
    if base in ("attn_v", "attn_kv_b"):
        return _attn_v_type(ftype, default, i, ctx)
    if base in ("attn_k", "attn_q"):
        if base == "attn_k" and ctx.n_expert == 8:
            return "Q8_0"
        return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ftype, default)
    if base == "ffn_down":
        return _ffn_down_type(ftype, default, i, ctx)
    if base == "attn_output":
        return _attn_output_type(ftype, default, ctx)
    if base in ("ffn_gate", "ffn_up") and ftype == "IQ3_XS" and ctx.n_layer // 8 <= i < 7 * ctx.n_layer // 8:
        return "IQ3_XXS"
    return default


def mix_type(ftype: str, category: str, layer: int, ctx: MixContext, ncols: int) -> str:
    """The ggml type llama-quantize gives a quantizable matrix (``llama_tensor_get_type``), with the
    shape fallback.  ``category``: token_embd, output, attn_q/k/v/qkv/output/kv_b, ffn_gate/up/down
    (``_exps``/``_shexp`` suffixes for experts), or other; ``ncols`` is the row length ``ne[0]``."""
    ft = FILE_TYPES[ftype]
    default = ft.default
    if not GGML_TYPES[default].block > 1:  # F32/F16/BF16 files: every matrix in the default type
        return default
    t = _impl(ftype, category, default, layer, ctx, ncols)
    if ncols % GGML_TYPES[t].block:
        t = _FALLBACK.get(t, "F16")
        if ncols % GGML_TYPES[t].block:
            t = "F16"
    return t
