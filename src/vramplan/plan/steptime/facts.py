"""The architecture facts the step-time model reads, computed once per model.

Only *matmul* parameters cost FLOPs per token (a lookup in the embedding table costs none);
for mixture-of-experts layers only the ``top_k`` of ``num_experts`` experts a token is
routed to do (the "active" parameters, as ``ModelSpec.num_active_parameters`` counts them).
The LM head is a matmul of the hidden state by the ``vocab x hidden`` matrix whether or not
it is tied to the input embedding.

Worked example, Llama-2-7B (32 layers, h = 4096, I = 11008, V = 32000, untied head):
per layer 4*h*h (q, k, v, o) + 3*h*I (gate, up, down) = 67,108,864 + 135,266,304
= 202,375,168 matmul parameters; the head adds 32000 * 4096 = 131,072,000.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.spec.model import ModelSpec

__all__ = ["ModelFacts", "model_facts"]

_MATMUL_ROLES = ("linear", "expert", "router")


@dataclass(frozen=True)
class ModelFacts:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    layer_matmul_params: tuple[float, ...]  # active matmul parameters of each decoder layer
    head_matmul_params: int  # vocab x hidden (tied or not)
    attn_width: int  # q/k width + v width per token summed over heads (QK^T and PV)
    windows: tuple[int | None, ...]  # sliding window of each layer (None: full attention)
    num_parameters: int
    linear_params: int  # decoder linear weights (the ones 4-bit quantization stores)
    encoder_only: bool

    @property
    def matmul_params(self) -> float:
        return sum(self.layer_matmul_params) + self.head_matmul_params


def _head_params(m: ModelSpec) -> int:
    for p in m.params:
        if p.role == "lm_head":
            return p.total
    if m.tie_word_embeddings:
        return m.vocab_size * m.hidden_size
    return 0


def model_facts(m: ModelSpec) -> ModelFacts:
    """Per-layer active matmul parameters and attention widths of ``m``."""
    per_layer = [0.0] * m.num_layers
    linear = 0
    for p in m.params:
        if p.role not in _MATMUL_ROLES or not p.layer_span:
            continue
        share = float(p.numel * (p.count // max(1, len(p.layer_span))))
        if p.role == "expert" and m.moe is not None:
            share = share * m.moe.top_k / m.moe.num_experts
        if p.role in ("linear", "expert"):
            linear += p.total
        for i in p.layer_span:
            per_layer[i] += share
    if m.mla is not None:
        v_width = m.num_attention_heads * m.mla.v_head_dim
    else:
        v_width = m.num_attention_heads * m.head_dim
    return ModelFacts(
        name=m.name, num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        layer_matmul_params=tuple(per_layer), head_matmul_params=_head_params(m), attn_width=m.q_width + v_width,
        windows=tuple(ls.sliding_window for ls in m.layers), num_parameters=m.num_parameters, linear_params=linear,
        encoder_only=m.encoder_only,
    )
