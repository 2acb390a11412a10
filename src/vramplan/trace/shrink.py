"""Shrunken copies of catalog configs: the same architecture at a size that traces in milliseconds.

Used by the engine-agreement matrix and the family tests.  The shrunken config keeps the
family's structure (norms, gating, GQA ratio, MQA, MoE routing, MLA, parallel residual, tied
embeddings, soft-capping) and scales widths: hidden ``hidden``, head dimension 64, the GQA ratio
kept, MLP widths scaled by the original ratio, ``layers`` decoder layers, ``vocab`` tokens, and at
most 8 experts (top-2).  Per-layer lists (gpt-oss's ``layer_types``) keep their first ``layers``
entries.

The rules follow the config's own keys (each family's ``configuration_*.py`` spelling, see
``vramplan.spec.families.KEY_ALIASES``), not its family's name: GPT-2's ``n_embd``/``n_layer``/``n_head``,
OPT's ``ffn_dim``, DeepSeek's ``kv_lora_rank``, Falcon's ``num_kv_heads``, Gemma 3's ``sliding_window_pattern``.
"""

from __future__ import annotations

import copy
from typing import Any

from vramplan.catalog.models import list_models

__all__ = ["catalog_config", "shrink"]


def catalog_config(model_id: str) -> dict[str, Any]:
    """The config.json mapping of a catalog entry (by id or alias)."""
    key = model_id.lower()
    for m in list_models():
        if key in {m.id.lower(), m.id.split("/")[-1].lower(), *(a.lower() for a in m.aliases)}:
            return copy.deepcopy(m.config)
    raise KeyError(model_id)


def _mult(n: float, m: int = 16) -> int:
    return max(m, round(n / m) * m)


def _cut_per_layer_lists(c: dict[str, Any], layers: int) -> None:
    """Per-layer lists (``layer_types``: gpt-oss's alternating sliding/full attention) cut to the first
    ``layers`` entries, so the pattern of the shrunken model is the original's first layers.

    transformers 5 validates the list against the layer count (``PreTrainedConfig.validate_layer_type``:
    "`num_hidden_layers` (2) must be equal to the number of `layer_types` (24)"), and the decoder
    picks each layer's attention from it (modeling_gpt_oss.py ``GptOssAttention``:
    ``self.sliding_window = config.sliding_window if self.layer_type == "sliding_attention"``).
    measure/config.py cuts the lists the same way.
    """
    old = c.get("num_hidden_layers", c.get("n_layer"))
    if not isinstance(old, int) or isinstance(old, bool):
        return
    for key, value in list(c.items()):
        if isinstance(value, list) and len(value) == old and key not in ("num_hidden_layers", "n_layer"):
            c[key] = value[:layers]


def shrink(config: dict[str, Any], hidden: int = 256, layers: int = 2, vocab: int = 4096,
           head_dim: int = 64, experts: int = 8) -> dict[str, Any]:
    """A small config of the same family (see the module docstring)."""
    c = copy.deepcopy(config)
    for k in ("quantization_config", "auto_map", "_name_or_path", "rope_scaling"):
        c.pop(k, None)
    _cut_per_layer_lists(c, layers)
    if "n_embd" in c:  # GPT-2's spelling (GPT2Config.attribute_map)
        old_h = c["n_embd"]
        c.update(n_embd=hidden, n_layer=layers, n_head=hidden // head_dim, vocab_size=vocab,
                 n_positions=max(c.get("n_positions", 1024), 4096))
        if c.get("n_inner"):
            c["n_inner"] = _mult(c["n_inner"] * hidden / old_h)
        return c
    if "d_model" in c and isinstance(c.get("ffn_config"), dict):  # DBRX's spelling (DbrxConfig.attribute_map)
        return _shrink_dbrx(c, hidden, layers, vocab, head_dim, experts)
    old_h = c["hidden_size"]
    old_heads = c["num_attention_heads"]
    heads = max(2, hidden // head_dim)
    kv = c.get("num_key_value_heads") or old_heads
    ratio = max(1, old_heads // max(1, kv))
    c.update(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, vocab_size=vocab)
    c["max_position_embeddings"] = max(int(c.get("max_position_embeddings") or 2048), 4096)
    # every catalog config of a family whose configuration class defaults num_key_value_heads to other than the
    # head count (Mistral, Mixtral, Qwen2/3) writes the key
    if "num_key_value_heads" in c:
        c["num_key_value_heads"] = max(1, heads // ratio)
    if c.get("head_dim"):
        c["head_dim"] = head_dim
    if c.get("intermediate_size"):
        c["intermediate_size"] = _mult(c["intermediate_size"] * hidden / old_h)
    if "ffn_dim" in c:  # OPT
        c["ffn_dim"] = _mult(c["ffn_dim"] * hidden / old_h)
        c["word_embed_proj_dim"] = hidden
    if c.get("partial_rotary_factor"):
        # keep an even number of rotated dimensions (phi-2's 0.4 of 64 would rotate 25.6)
        rot = max(2, 2 * round(head_dim * float(c["partial_rotary_factor"]) / 2))
        c["partial_rotary_factor"] = rot / head_dim
    if "query_pre_attn_scalar" in c:
        c["query_pre_attn_scalar"] = head_dim
    if "moe_intermediate_size" in c:
        c["moe_intermediate_size"] = _mult(c["moe_intermediate_size"] * hidden / old_h)
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if c.get(key):
            c[key] = min(int(c[key]), experts)
    if c.get("num_experts_per_tok"):
        c["num_experts_per_tok"] = min(2, int(c["num_experts_per_tok"]))
    if "kv_lora_rank" in c:  # DeepSeek's multi-head latent attention
        c.update(num_key_value_heads=heads, n_group=1, topk_group=1, first_k_dense_replace=min(
            1, int(c.get("first_k_dense_replace", 0))), kv_lora_rank=_mult(c["kv_lora_rank"] * hidden / old_h),
            qk_nope_head_dim=head_dim, qk_rope_head_dim=head_dim // 2, v_head_dim=head_dim)
        if c.get("q_lora_rank"):
            c["q_lora_rank"] = _mult(c["q_lora_rank"] * hidden / old_h)
        c.pop("num_nextn_predict_layers", None)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(c.get(key), int) and c[key] >= vocab:
            c[key] = vocab - 1
    # Falcon's new decoder architecture: its KV head count (8 for Falcon-40B) would exceed the shrunken head
    # count; without it FalconConfig uses multi-head attention
    c.pop("num_kv_heads", None)
    if "sliding_window_pattern" in c:  # Gemma 3: five local layers, then one global
        c["sliding_window_pattern"] = min(int(c.get("sliding_window_pattern", 6)), layers)
        c.pop("layer_types", None)
    return c


def _shrink_dbrx(c: dict[str, Any], hidden: int, layers: int, vocab: int, head_dim: int,
                 experts: int) -> dict[str, Any]:
    """DBRX (configuration_dbrx.py): d_model/n_layers/n_heads outside, kv_n_heads in ``attn_config`` and the
    experts' sizes in ``ffn_config``; the GQA ratio and the experts' width ratio kept."""
    old_h, old_heads = int(c["d_model"]), int(c["n_heads"])
    heads = max(2, hidden // head_dim)
    attn, ffn = dict(c.get("attn_config") or {}), dict(c["ffn_config"])
    ratio = max(1, old_heads // max(1, int(attn.get("kv_n_heads", 1))))
    attn["kv_n_heads"] = max(1, heads // ratio)
    ffn["ffn_hidden_size"] = _mult(int(ffn.get("ffn_hidden_size", 3584)) * hidden / old_h)
    ffn["moe_num_experts"] = min(int(ffn.get("moe_num_experts", 4)), experts)
    ffn["moe_top_k"] = min(2, int(ffn.get("moe_top_k", 1)))
    c.update(d_model=hidden, n_layers=layers, n_heads=heads, vocab_size=vocab, attn_config=attn, ffn_config=ffn,
             max_seq_len=max(int(c.get("max_seq_len") or 2048), 4096))
    return c
