"""The norms' fp32 weight tensors that the product keeps for its input's gradient (analytic/activations.py
``norm_weight_tensors``): Gemma's ``1.0 + self.weight.float()`` (transformers 5.24 modeling_gemma3.py line 132),
Nemotron-H's and Cohere's ``self.weight.to(torch.float32)`` (transformers 5.24
modeling_nemotron_h.py line 633, modeling_cohere.py line 64).  Bytes per layer, whatever the tokens; the per-token
part of the same norms is in test_saved_norms.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from meta_build import live_at_backward
from vramplan.analytic import activations as act
from vramplan.catalog.resolve import resolve
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.model import ModelSpec
from vramplan.trace.shrink import catalog_config, shrink

_CTX = act.ActContext(compute_bytes=2, residual_bytes=2, linear_input_bytes=2, autocast=False, attention="flash",
                      gqa_repeat=False, seq_len=64, norm_weight_bytes=2)


def _weights(m: ModelSpec, ctx: act.ActContext) -> dict[str, int]:
    return {t.name: t.nbytes for t in act.norm_weight_tensors(m, ctx, act.layer_tensors(m, m.layers[0], ctx))}


def _nemotron() -> ModelSpec:
    import test_families_nemotron_h as nh

    return model_from_config(nh.TESTER)


def test_gemma3_1b_by_hand() -> None:
    m = resolve({"model": "google/gemma-3-1b-pt", "hardware": {"gpu": "h100"}}).model
    assert (m.hidden_size, m.head_dim) == (1152, 256)
    w = _weights(m, _CTX)
    # four sandwich norms of h 1,152: (1 + w.float()) is fp32, 4 x 1,152 = 4,608 B each; q/k norms RMSNorm(head_dim
    # 256): 4 x 256 = 1,024 B each; 4 x 4,608 + 2 x 1,024 = 20,480 B per layer
    assert w == {"norm.input.weight_fp32": 4_608, "norm.post_attention.weight_fp32": 4_608,
                 "norm.pre_feedforward.weight_fp32": 4_608, "norm.post_feedforward.weight_fp32": 4_608,
                 "attention.q_norm.weight_fp32": 1_024, "attention.k_norm.weight_fp32": 1_024}
    # the sum is a new tensor whatever the weight's dtype: fp32 weights (mixed precision) keep it as well
    assert sum(_weights(m, replace(_CTX, norm_weight_bytes=4)).values()) == 20_480


def test_weight_to_fp32_copies_only_a_half_weight() -> None:
    m = _nemotron()
    assert m.traits.norm_weight_to_fp32 and m.norm == "rms_fp32"
    # the MLP block (layer 1, "-"): one norm of h 32, its bf16 weight copied to fp32: 4 x 32 = 128 B
    mlp_block = act.norm_weight_tensors(m, _CTX, [act.SavedTensor("norm.input", 1, 1, "mlp")])
    assert mlp_block == [act.SavedTensor("norm.input.weight_fp32", 128, 1, "mlp")]
    # an fp32 weight is its own ``.to(torch.float32)``: nothing new
    assert act.norm_weight_tensors(m, replace(_CTX, norm_weight_bytes=4), [act.SavedTensor("norm.input", 1)]) == []
    # gpt-oss's and OLMo-2's ``self.weight * hidden_states`` keep the parameter itself (same norm kind)
    oss = resolve({"model": shrink(catalog_config("openai/gpt-oss-20b"), vocab=2048), "hardware": {"gpu": "h100"}}).model
    assert oss.norm == "rms_fp32" and not oss.traits.norm_weight_to_fp32 and _weights(oss, _CTX) == {}


def test_cohere_layer_norm_by_hand() -> None:
    # shrunk Command-R (h 256) with per-head q/k norms (use_qk_norm, weight (heads 4, head_dim 64) and (kv 4, 64))
    cfg = {**shrink(catalog_config("CohereForAI/aya-23-8B"), vocab=2048), "use_qk_norm": True}
    m = model_from_config(cfg)
    heads, kv, hd = m.num_attention_heads, m.num_kv_heads, m.head_dim
    w = _weights(m, _CTX)
    # one (shared) norm of h 256: 4 x 256 = 1,024 B; q norm 4 x heads x 64, k norm 4 x kv x 64
    assert w == {"norm.input.weight_fp32": 1_024, "attention.q_norm.weight_fp32": 4 * heads * hd,
                 "attention.k_norm.weight_fp32": 4 * kv * hd}
    assert _weights(m, replace(_CTX, norm_weight_bytes=4)) == {}


def _layer_bytes(doc: dict[str, Any], layer: int) -> tuple[int, int]:
    """(the trace's live bytes made inside decoder layer ``layer`` when the backward starts, the analytic engine's
    saved bytes of that layer); the layer's input residual is made by the layer before, and the analytic engine
    counts it with the layer in the models below only when a norm saves it in fp32 (none here: bf16-true)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.analytic.terms.layers import layer_activations
    from vramplan.analytic.train import train_step
    from vramplan.trace.step import trace_train

    r = resolve(doc)
    inside = sum(e.nbytes for e in live_at_backward(trace_train(r)) if f".layers.{layer}." in f".{e.module}.")
    res = train_step(r)
    assert res.context is not None
    return inside, layer_activations(res.context).full[layer]


@pytest.mark.parametrize("model", ["gemma3", "cohere", "nemotron_h"])
def test_layer_saved_bytes_equal_the_trace(model: str) -> None:
    import test_families_nemotron_h as nh

    cfg = {"gemma3": lambda: shrink(catalog_config("google/gemma-3-1b-pt"), vocab=2048),
           "cohere": lambda: shrink(catalog_config("CohereForAI/aya-23-8B"), vocab=2048),
           "nemotron_h": lambda: nh.TESTER}[model]()
    doc = {"model": cfg, "hardware": {"gpu": "a100"},
           "train": {"micro_batch_size": 1, "seq_len": 64, "precision": "bf16-true"}}
    traced, analytic = _layer_bytes(doc, 1)
    # without the weight tensors the analytic engine was under by Gemma 3's 4 x 4 x 256 + 2 x 4 x 64 = 4,608 B,
    # Command-R's 4 x 256 = 1,024 B, Nemotron-H's MLP block 4 x 32 = 128 B
    assert analytic == traced
