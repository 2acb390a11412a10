"""The q/k norms' saved tensors and OLMo-2's fp32 norm multiply (analytic/activations.py ``qk_norm_tensors``,
``layer_norm_saved``): hand-computed records, and a check against what autograd really saves
(``torch.autograd.graph.saved_tensors_hooks``) on tiny random-weight models built from a config."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.activations import ActContext, layer_tensors
from vramplan.spec.hf_config import model_from_config

_MIXED = ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                    gqa_repeat=False, seq_len=2048, dropout=False)


def _records(cfg: dict[str, Any], ctx: ActContext = _MIXED) -> dict[str, int]:
    m = model_from_config(cfg)
    return {t.name: t.nbytes * t.copies for t in layer_tensors(m, m.layers[0], ctx)}


def test_qwen3_per_head_norm_statistics_by_hand() -> None:
    # Qwen3-8B: 32 heads, 8 KV heads, head_dim 128; RMSNorm(head_dim) per head under bf16 mixed precision.
    # q: fp32 copy (4) + bf16 normalized (2) per element over 32 x 128 = 4096, and one fp32 rsqrt per head:
    #    6 x 4096 + 4 x 32 = 24,576 + 128 = 24,704 B per token
    # k: 6 x (8 x 128) + 4 x 8 = 6,144 + 32 = 6,176 B per token
    cfg = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}
    r = _records(cfg)
    assert r["attention.q_norm"] == 24_704
    assert r["attention.k_norm"] == 6_176
    # a frozen base (LoRA) drops the normalized tensors (only the weights' gradients need them), not the rsqrt:
    # 4 x 4096 + 4 x 32 = 16,512 and 4 x 1024 + 4 x 8 = 4,128
    frozen = ActContext(2, 4, 2, True, "flash", False, 2048, frozen_base=True, dropout=False)
    r = _records(cfg, frozen)
    assert (r["attention.q_norm"], r["attention.k_norm"]) == (16_512, 4_128)


def test_olmo2_norms_multiply_in_fp32_by_hand() -> None:
    # OLMo-2-1124-7B: h = 4096, 32 heads = 32 KV heads of 128.  Olmo2RMSNorm's ``(weight * x).to(input_dtype)``
    # keeps the normalized tensor in fp32: 4 (fp32 copy of the bf16 sublayer output) + 4 per element.
    # post-norms: 8 x 4096 + 4 (rsqrt) = 32,772 B per token each (a bf16 normalized tensor would give 24,580)
    # q/k norms over the full width (one row per token): 8 x 4096 + 4 = 32,772 B per token each
    cfg = {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352}
    r = _records(cfg)
    assert r["norm.input"] == r["norm.post_attention"] == 32_772
    assert r["attention.q_norm"] == r["attention.k_norm"] == 32_772
    m = model_from_config(cfg)
    assert {p.name for p in m.params if p.role == "norm" and p.layer_span} >= {
        "layers.post_attention_layernorm.weight", "layers.post_feedforward_layernorm.weight"}
    assert not any("input_layernorm" in p.name for p in m.params)


_TINY: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 64,
         "tie_word_embeddings": False, "attention_dropout": 0.0, "eos_token_id": 1, "pad_token_id": 0,
         "bos_token_id": 1}


def _hook_bytes(model: Any, batch: int, seq: int) -> int:
    """Bytes of the distinct storages autograd saves inside the second decoder layer's forward, parameters and
    the rotary cos/sin (made once per forward, outside the layer) left out."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inside = [False]
    seen: dict[int, int] = {}
    layer = model.model.layers[1]

    def pre(_mod: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        inside[0] = True
        skip.update(t.untyped_storage().data_ptr() for t in kwargs.get("position_embeddings") or ())

    def post(*_a: Any) -> None:
        inside[0] = False

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if inside[0] and st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    handles = [layer.register_forward_pre_hook(pre, with_kwargs=True), layer.register_forward_hook(post)]
    ids = torch.randint(0, 128, (batch, seq))  # _TINY vocab_size
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    for h in handles:
        h.remove()
    return sum(seen.values())


# Cohere's per-head CohereLayerNorm q/k norms (use_qk_norm): 12 B per element and one rsqrt per head
@pytest.mark.parametrize("model_type", ["qwen3", "olmo2", "gemma3_text", "cohere"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_saved_bytes_per_token_match_autograd(model_type: str, dtype_name: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {"model_type": model_type, **_TINY, **({"use_qk_norm": True} if model_type == "cohere" else {})}
    conf = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa").to(dtype).train()
    # two lengths: the difference is what grows with the tokens (Gemma 3's per-norm ``1 + weight.float()``
    # and Cohere's ``weight.to(fp32)`` copies do not), per token
    b, s1, s2 = 2, 8, 12
    hook = (_hook_bytes(model, b, s2) - _hook_bytes(model, b, s1)) // (b * (s2 - s1))
    c = 4 if dtype == torch.float32 else 2
    ctx = ActContext(compute_bytes=c, residual_bytes=c, linear_input_bytes=c, autocast=False, attention="flash",
                     gqa_repeat=False, seq_len=s2, dropout=False)
    m = model_from_config(conf.to_dict())
    engine = sum(t.nbytes * t.copies for t in layer_tensors(m, m.layers[1], ctx))
    assert engine == hook
