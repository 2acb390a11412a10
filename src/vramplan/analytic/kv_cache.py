"""KV cache: bytes per token, per sequence, per block.

Per layer and token, a standard attention layer stores K and V:
2 * kv_heads * head_dim * bytes (the factor 2 is K and V).  Summed over layers,
for Llama-2-7B in fp16: 2 * 32 layers * 32 heads * 128 * 2 B = 524,288 B = 0.5 MiB
per token; 4096 tokens x 32 sequences -> 68.72 GB (64 GiB).  Llama-3-8B has 8 KV
heads (GQA): 131,072 B per token, a quarter of that.

MLA (DeepSeek-V2/V3, arXiv 2405.04434 section 2.1.2) caches the compressed latent
c_KV (kv_lora_rank) and the decoupled RoPE key (qk_rope_head_dim), shared by all
heads: (512 + 64) * 2 B = 1,152 B per layer and token; 61 layers -> 70,272 B.

Sliding-window layers (Mistral, Gemma 2/3, gpt-oss) keep at most ``window`` tokens.
fp8 caches use 1 byte per element; int8 caches add one fp32 scale per head and token.
"""

from __future__ import annotations

from vramplan.spec.model import ModelSpec
from vramplan.units import ceil_div


def kv_elem_bytes(kv_dtype: str, model_dtype_bytes: int) -> int:
    if kv_dtype in ("fp8", "int8"):
        return 1
    if kv_dtype in ("fp16", "bf16"):
        return 2
    return model_dtype_bytes


def layer_kv_bytes_per_token(m: ModelSpec, elem_bytes: int, tp: int = 1, kv_dtype: str = "auto") -> int:
    if m.mla is not None:
        return (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * elem_bytes
    kv_heads = max(1, ceil_div(m.num_kv_heads, tp))  # MQA/GQA heads are replicated when tp > kv_heads
    per = 2 * kv_heads * m.head_dim * elem_bytes
    if kv_dtype == "int8":
        per += 2 * kv_heads * 4
    return per


def kv_bytes_per_token(m: ModelSpec, elem_bytes: int, tp: int = 1, kv_dtype: str = "auto") -> int:
    """Full-attention cost per token over all layers (sliding windows ignored)."""
    return m.num_layers * layer_kv_bytes_per_token(m, elem_bytes, tp, kv_dtype)


def kv_cache_bytes(
    m: ModelSpec, batch: int, tokens: int, elem_bytes: int, tp: int = 1, layers: tuple[int, ...] | None = None,
    kv_dtype: str = "auto",
) -> int:
    """A contiguous cache for ``batch`` sequences of ``tokens`` tokens (HF DynamicCache)."""
    per_layer = layer_kv_bytes_per_token(m, elem_bytes, tp, kv_dtype)
    total = 0
    for spec in m.layers if layers is None else [m.layers[i] for i in layers]:
        held = min(tokens, spec.sliding_window) if spec.sliding_window else tokens
        total += per_layer * held
    return total * batch
