"""KV cache: what each attention layer keeps per token, per sequence and per block.

Per layer and token a standard attention layer stores one key and one value vector
per KV head: ``2 * kv_heads * head_dim * bytes`` (the 2 is K and V).  Summed over layers:

* Llama-2-7B (MHA, 32 layers, 32 KV heads, head_dim 128, fp16):
  2 * 32 * 32 * 128 * 2 B = 524,288 B = 0.5 MiB per token; 4096 tokens x 32 sequences
  -> 524,288 * 131,072 = 68,719,476,736 B = 68.7 GB (64 GiB), the seeds' figure.
* Llama-3-8B (GQA, 8 KV heads): 2 * 32 * 8 * 128 * 2 B = 131,072 B per token, a quarter.
* MQA (one KV head) divides by the number of query heads instead.
* MLA (DeepSeek-V2/V3, arXiv 2405.04434 section 2.1.2) caches the compressed latent
  c_KV (``kv_lora_rank``) and the decoupled RoPE key (``qk_rope_head_dim``), shared by all
  heads: (512 + 64) * 2 B = 1,152 B per layer and token; 61 layers -> 70,272 B.  vLLM
  stores it as one 576-wide "head" per layer (``MLAAttentionSpec``), replicated on every
  tensor-parallel rank.
* Sliding-window layers (Mistral, Gemma 2/3 local layers, gpt-oss) need at most ``window``
  tokens; hybrid models alternate them with full-attention layers.
* Hybrid attention + Mamba2 models (Bamba) cache K and V only in their attention layers; the mixer
  layers keep a fixed-size convolution and SSM state per sequence (``analytic/ssm_state.py``).
* Gemma 3n's last ``num_kv_shared_layers`` layers read the K/V of the last earlier layer of their type and
  cache nothing (``ModelSpec.kv_reuse_layers``): E4B caches 20 of its 35 layers (16 sliding, 4 full).

KV dtypes: ``fp16``/``bf16`` 2 B per element; ``fp8`` (e4m3/e5m2) 1 B with per-tensor
scales (a few bytes per layer, ignored); ``int8`` 1 B plus one fp32 scale per token and
head for K and for V (symmetric per-token quantization, as transformers' quantized caches
and KIVI-style schemes keep it): ``2 * kv_heads * 4`` B more per layer and token.
``auto`` follows the model dtype.

Under tensor parallelism each rank holds ``kv_heads / tp`` heads; when ``tp`` exceeds the
KV heads (GQA/MQA), heads are replicated so that each rank still holds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.spec.model import LayerSpec, ModelSpec
from vramplan.units import ceil_div

__all__ = [
    "KV_DTYPES",
    "KVLayer",
    "KVSpec",
    "PageCapacity",
    "attention_layers",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_elem_bytes",
    "kv_spec",
    "layer_kv_bytes_per_token",
    "page_capacity",
]

LayerKind = Literal["full", "sliding", "mla"]
KV_DTYPES = ("auto", "fp16", "bf16", "fp8", "int8")
INT8_SCALE_BYTES = 4  # one fp32 scale per token and head, for K and for V


def kv_elem_bytes(kv_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per cached element: fp8/int8 -> 1, fp16/bf16 -> 2, auto -> the model dtype's.

    >>> kv_elem_bytes("auto", 2), kv_elem_bytes("fp8", 2), kv_elem_bytes("fp16", 4)
    (2, 1, 2)
    """
    if kv_dtype in ("fp8", "int8"):
        return 1
    if kv_dtype in ("fp16", "bf16"):
        return 2
    return model_dtype_bytes


def kv_heads_on_rank(m: ModelSpec, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: kv_heads / tp, at least one (replicated)."""
    if m.mla is not None:
        return 1
    return max(1, ceil_div(m.num_kv_heads, tp))


@dataclass(frozen=True)
class KVLayer:
    """One decoder layer's cache per token on one rank."""

    index: int
    kind: LayerKind
    heads: int  # KV heads on this rank (1 for MLA's shared latent)
    key_dim: int  # elements per head for K (MLA: kv_lora_rank + qk_rope_head_dim)
    value_dim: int  # elements per head for V (MLA: 0, the latent serves both)
    window: int | None  # sliding window in tokens; None for full attention

    def elements_per_token(self) -> int:
        return self.heads * (self.key_dim + self.value_dim)


@dataclass(frozen=True)
class KVSpec:
    """The KV cache of one model on one tensor-parallel rank, layer by layer."""

    model: str
    attention_kind: str  # mha | gqa | mqa | mla
    kv_dtype: str
    elem_bytes: int
    tp: int
    layers: tuple[KVLayer, ...]

    def layer_bytes_per_token(self, layer: KVLayer) -> int:
        """Bytes one layer adds per token: elements * dtype, plus int8 scales."""
        nbytes = layer.elements_per_token() * self.elem_bytes
        if self.kv_dtype == "int8":
            tensors = 1 if layer.kind == "mla" else 2  # a scale for K and one for V
            nbytes += tensors * layer.heads * INT8_SCALE_BYTES
        return nbytes

    @property
    def bytes_per_token(self) -> int:
        """Every layer as full attention (no window): the seeds' per-token figure."""
        return sum(self.layer_bytes_per_token(la) for la in self.layers)

    @property
    def uniform_layer_bytes_per_token(self) -> int:
        """Per-layer bytes per token when all layers have the same width (the common case)."""
        return max(self.layer_bytes_per_token(la) for la in self.layers) if self.layers else 0

    def sequence_bytes(self, tokens: int) -> int:
        """Bytes one sequence of ``tokens`` holds when each sliding layer keeps only its window."""
        total = 0
        for la in self.layers:
            held = min(tokens, la.window) if la.window else tokens
            total += held * self.layer_bytes_per_token(la)
        return total

    def block_bytes(self, block_size: int) -> int:
        """One block of ``block_size`` tokens across all layers (vLLM's page x layers)."""
        return block_size * self.bytes_per_token

    @property
    def has_sliding(self) -> bool:
        return any(la.window for la in self.layers)

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for la in self.layers:
            key = la.kind if la.kind != "sliding" else f"sliding window {la.window}"
            kinds[key] = kinds.get(key, 0) + 1
        parts = ", ".join(f"{n} x {k}" for k, n in kinds.items())
        return f"{self.attention_kind.upper()} ({parts}), {self.kv_dtype} KV, {self.bytes_per_token:,} B/token"


def kv_spec(m: ModelSpec, kv_dtype: str = "auto", model_dtype_bytes: int = 2, tp: int = 1) -> KVSpec:
    """The cache layout of ``m`` on one of ``tp`` ranks with the given KV dtype."""
    elem = kv_elem_bytes(kv_dtype, model_dtype_bytes)
    layers: list[KVLayer] = []
    for ls in attention_layers(m):
        if m.mla is not None:
            layers.append(KVLayer(ls.index, "mla", 1, m.mla.kv_lora_rank + m.mla.qk_rope_head_dim, 0, None))
        else:
            heads = kv_heads_on_rank(m, tp)
            kind: LayerKind = "sliding" if ls.sliding_window else "full"
            layers.append(KVLayer(ls.index, kind, heads, m.head_dim, m.head_dim, ls.sliding_window))
    name = "auto" if kv_dtype == "auto" else kv_dtype
    return KVSpec(m.name, m.attention_kind, name, elem, tp, tuple(layers))


def attention_layers(m: ModelSpec) -> tuple[LayerSpec, ...]:
    """The decoder layers that keep a KV cache of the text tokens: all of them, less a hybrid model's Mamba2 mixer
    layers (``ModelSpec.mamba``), which keep a fixed-size state instead (``analytic/ssm_state.py``), unless their
    attention runs beside the mixer (``MambaSpec.parallel_attention``, Falcon-H1: both caches in every layer) or ahead of
    it (``MambaSpec.shared_attention_layers``, Zamba2's hybrid layers), and its
    MLP-only layers (``MambaSpec.ffn_only_layers``), and a
    cross-attention model's cross-attention layers, which cache the images' positions instead
    (``analytic/cross_attention.py``), and the layers that read an earlier layer's keys and values
    (``ModelSpec.kv_reuse_layers``, Gemma 3n's KV-shared layers: ``Gemma3nTextAttention.forward``, transformers 5.24
    modeling_gemma3n.py:1209-1223, takes ``shared_kv_states[self.layer_type]`` and calls no ``cache.update``)."""
    ms = m.mamba
    mixers = () if ms is None or ms.parallel_attention else tuple(i for i in ms.layers
                                                                    if i not in ms.shared_attention_layers)
    skipped = frozenset((*mixers, *ms.ffn_only_layers) if ms is not None else ())
    if m.vision is not None and m.vision.cross_attention_tokens_per_image:
        skipped |= frozenset(m.vision.cross_attention_layers)
    skipped |= frozenset(m.kv_reuse_layers)
    if not skipped:
        return m.layers
    return tuple(ls for ls in m.layers if ls.index not in skipped)


# ---- functional forms kept for callers that only need a number ------------------------


def layer_kv_bytes_per_token(m: ModelSpec, elem_bytes: int, tp: int = 1, kv_dtype: str = "auto") -> int:
    """One layer's bytes per token (all layers of supported models have the same width)."""
    dtype = kv_dtype if kv_dtype == "int8" else "auto"
    spec = kv_spec(m, dtype, elem_bytes, tp)
    return spec.uniform_layer_bytes_per_token


def kv_bytes_per_token(m: ModelSpec, elem_bytes: int, tp: int = 1, kv_dtype: str = "auto") -> int:
    """Full-attention cost per token over all layers (sliding windows ignored).

    Llama-2-7B in fp16: 32 layers * 2 * 32 heads * 128 * 2 B = 524,288 B.
    """
    return len(attention_layers(m)) * layer_kv_bytes_per_token(m, elem_bytes, tp, kv_dtype)


def kv_cache_bytes(
    m: ModelSpec, batch: int, tokens: int, elem_bytes: int, tp: int = 1, layers: tuple[int, ...] | None = None,
    kv_dtype: str = "auto",
) -> int:
    """A contiguous cache for ``batch`` sequences of ``tokens`` tokens (Hugging Face DynamicCache).

    Sliding-window layers keep at most ``window`` tokens.  Llama-2-7B, fp16, 32 x 4096:
    524,288 * 4096 * 32 = 68,719,476,736 B.
    """
    per_layer = layer_kv_bytes_per_token(m, elem_bytes, tp, kv_dtype)
    total = 0
    kept = {ls.index for ls in attention_layers(m)}
    for spec in m.layers if layers is None else [m.layers[i] for i in layers]:
        if spec.index not in kept:
            continue
        held = min(tokens, spec.sliding_window) if spec.sliding_window else tokens
        total += per_layer * held
    return total * batch


@dataclass(frozen=True)
class PageCapacity:
    """How many pages and sequences a KV budget holds (PagedAttention's accounting)."""

    budget_bytes: int
    page_tokens: int
    page_bytes: int
    total_pages: int
    total_tokens: int
    max_sequences: dict[int, int]  # sequence length -> concurrent sequences


def page_capacity(spec: KVSpec, budget_bytes: int, page_tokens: int = 16,
                  seq_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096)) -> PageCapacity:
    """Pages of ``page_tokens`` tokens (all layers) in ``budget_bytes``, and sequences per length.

    Worked example (the seeds' table): Llama-3-8B, fp16, 16-token pages, 60 GB budget:
    page = 16 * 131,072 = 2,097,152 B; 60e9 // 2,097,152 = 28,610 pages = 457,760 tokens;
    a 4096-token sequence needs 256 pages -> 28,610 // 256 = 111 sequences.
    """
    page = spec.block_bytes(page_tokens)
    pages = budget_bytes // page if page else 0
    per_len = {n: pages // ceil_div(n, page_tokens) for n in seq_lens}
    return PageCapacity(budget_bytes, page_tokens, page, pages, pages * page_tokens, per_len)
