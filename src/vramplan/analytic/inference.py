"""Inference with Hugging Face ``generate``: the peak across prefill and decode.

No autograd graph is kept, so activations are only the tensors alive inside the
running layer.  Prefill of T = batch * prompt tokens peaks in the gated MLP, where the
gate output, the up output and the activation are alive together (3 * I * T * c),
plus the layer input and residual (2 * h * T * c); eager attention also holds the
scores and the fp32 softmax (b * heads * p^2 * (c + 4)).  ``generate`` keeps only the
last position's logits (``logits_to_keep=1``) and copies them to fp32.

The KV cache grows by ``torch.cat`` per layer and step (``DynamicCache``), so at the
last step one layer's old and new cache coexist.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic.kv_cache import kv_cache_bytes, kv_elem_bytes
from vramplan.analytic.layout import rank_params
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.train import Moment
from vramplan.analytic.weights import weights_bytes
from vramplan.spec.load import Resolved
from vramplan.units import ceil_div, dtype_bits


@dataclass
class InferenceResult:
    moments: list[Moment]
    peak: Moment
    assumptions: list[str]


def prefill_transient_bytes(r: Resolved, batch: int, prompt: int, c: int, tp: int, attention: str) -> int:
    m = r.model
    t = batch * prompt
    h = m.hidden_size
    if m.moe is not None:
        inter = m.moe.expert_intermediate_size * m.moe.top_k + m.moe.shared_intermediate_size
    else:
        inter = max(ls.intermediate_size for ls in m.layers)
    inter = ceil_div(inter, tp)
    mlp = (3 * inter + 2 * h) * t * c
    heads = ceil_div(m.num_attention_heads, tp)
    attn = (2 * h + m.q_width // tp + 2 * m.kv_width // max(1, min(tp, m.num_kv_heads))) * t * c
    if attention == "eager":
        attn += batch * heads * prompt * prompt * (c + 4)
    return max(mlp, attn)


def inference_step(r: Resolved) -> InferenceResult:
    s, m, gpu = r.scenario, r.model, r.gpu
    inf, par = s.inference, s.parallel
    c = dtype_bits(inf.dtype) // 8
    tp = par.tp
    rp = rank_params(m, tp, 1, par.ep, 0, None)
    quant = inf.quantization
    weights = weights_bytes(rp, c, quant)
    elem = kv_elem_bytes(inf.kv_cache_dtype, c)
    total_tokens = inf.prompt_len + inf.new_tokens
    kv_final = kv_cache_bytes(m, inf.batch_size, total_tokens, elem, tp, kv_dtype=inf.kv_cache_dtype)
    kv_prompt = kv_cache_bytes(m, inf.batch_size, inf.prompt_len, elem, tp, kv_dtype=inf.kv_cache_dtype)
    attention = "eager" if inf.attention == "eager" else "flash"
    ws = cublas_workspace_bytes(gpu, handles=1)
    dequant = 0
    if quant in ("nf4", "nf4-dq", "fp4", "int8") and inf.batch_size * inf.prompt_len > 1:
        dequant = rp.largest_linear * c  # bitsandbytes dequantizes a layer's weight for multi-token inputs
    vocab_logits = inf.batch_size * ceil_div(m.vocab_size, tp) * (c + 4)

    pre = Moment("prefill")
    pre.add("weights", "parameters", weights)
    pre.add("kv_cache", "prompt", kv_prompt)
    pre.add("activations", "running layer", prefill_transient_bytes(r, inf.batch_size, inf.prompt_len, c, tp,
                                                                      attention))
    pre.add("temporaries", "dequantized weight", dequant)
    pre.add("other", "cuBLAS workspaces", ws)
    dec = Moment("decode")
    dec.add("weights", "parameters", weights)
    dec.add("kv_cache", "all tokens", kv_final)
    per_layer_cache = kv_final // max(1, m.num_layers)
    dec.add("temporaries", "cache growth (torch.cat copy of one layer)", per_layer_cache)
    dec.add("temporaries", "last-token logits (c + fp32 copy)", vocab_logits)
    dec.add("other", "cuBLAS workspaces", ws)
    moments = [pre, dec]
    peak = max(moments, key=lambda mo: mo.total)
    assumptions = [
        "Hugging Face generate with DynamicCache (contiguous per-layer cache grown by torch.cat)",
        f"weights in {inf.dtype}" + (f", linear weights quantized as {quant}" if quant != "none" else ""),
        "CUDA context 400 MiB with lazy module loading",
    ]
    return InferenceResult(moments, peak, assumptions)
