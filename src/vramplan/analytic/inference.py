"""Inference with Hugging Face ``generate``: the peak across prefill and decode.

Modelled on transformers 5.x (``generation/utils.py``, ``cache_utils.py``) with the
default ``DynamicCache``.  No autograd graph is kept, so activations are only the tensors
alive inside the running layer.  T = batch * prompt tokens, h the hidden size, I the MLP
width, c the bytes of the compute dtype.

Prefill (the whole prompt in one forward pass):

* the cache of every layer for the prompt.  Sliding-window layers
  (``DynamicSlidingWindowLayer``) keep a *view* of the last window-1 tokens of the
  concatenated prompt, so the prompt's storage stays alive until the first decode step;
* the running layer: residual and normalised input (2h per token) plus the larger of
  the gated MLP (gate activation, up projection and their product alive together, 3I;
  HF ``LlamaMLP``) and attention (q, k, v and the rotary copies of q and k, the
  attention output).  ``eager`` attention also materialises the scores
  (``eager_attention_forward``: matmul output, + mask, fp32 softmax, cast back:
  b * heads * p^2 * (2c + 4)), the 4-D additive mask (b * p^2 * c) and the KV heads
  repeated to the query heads (``repeat_kv``); ``sdpa``/``flash`` keep O(p) state
  (``enable_gqa`` avoids the repeat);
* the logits: ``generate`` passes ``logits_to_keep=1`` so the LM head runs on the last
  position only (b * V * c), then copies it to fp32 (``outputs.logits[:, -1].to(copy=True,
  dtype=torch.float32)``, 4bV), and the sampling warpers (top-k/top-p: sort values and
  int64 indices, softmax, cumulative sum, mask) add about 25 B per entry.

Decode (one token per step; the peak is at the last step, cache length L = prompt + new):

* the cache of all tokens (sliding layers: their window);
* cache growth: ``DynamicLayer.update`` does ``self.keys = torch.cat([self.keys, k])``,
  so the old and the new key tensor of one layer coexist (then the same for values):
  one layer's K at full length is transient;
* the last-token logits, their fp32 copy and the sampling temporaries as above.

Solvers ``max_batch_size`` and ``max_prompt_len`` find the largest batch and the longest
prompt for which the whole estimate (allocator rounding and memory outside PyTorch
included) still fits the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramplan.analytic.kv_cache import kv_elem_bytes, kv_spec
from vramplan.analytic.layout import rank_params
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.train import Moment
from vramplan.analytic.weights import weights_bytes
from vramplan.monotone import largest_true
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec
from vramplan.units import ceil_div, dtype_bits

__all__ = [
    "SAMPLING_BYTES_PER_ENTRY",
    "InferenceResult",
    "cache_bytes",
    "inference_step",
    "logits_bytes",
    "max_batch_size",
    "max_prompt_len",
    "prefill_transient_bytes",
]

# Top-k/top-p warpers per (row, vocabulary entry): sorted fp32 values 4, int64 indices 8,
# softmax 4, cumulative sum 4, masks 2, masked scores 4 (transformers ``TopPLogitsWarper``).
SAMPLING_BYTES_PER_ENTRY = 26


@dataclass
class InferenceResult:
    moments: list[Moment]
    peak: Moment
    assumptions: list[str]
    prompt_cache_bytes: int
    final_cache_bytes: int


def cache_bytes(m: ModelSpec, batch: int, tokens: int, c: int, tp: int, kv_dtype: str, prefill: bool) -> int:
    """DynamicCache bytes for ``batch`` sequences of ``tokens`` tokens on one rank.

    Full-attention layers hold every token.  Sliding layers hold their window at decode, but
    during prefill the view keeps the whole prompt's storage alive.
    """
    spec = kv_spec(m, kv_dtype, c, tp)
    total = 0
    for la in spec.layers:
        held = tokens if (la.window is None or prefill) else min(tokens, la.window)
        total += held * spec.layer_bytes_per_token(la)
    return total * batch


def logits_bytes(m: ModelSpec, batch: int, c: int, tp: int) -> int:
    """Last-position logits (c), their fp32 copy (4) and the sampling temporaries, per row.

    Llama-3-8B, batch 8: 8 * 128,256 * (2 + 4 + 26) B = 32.8 MB.  The LM head output is
    gathered to the whole vocabulary under tensor parallelism.
    """
    return batch * m.vocab_size * (c + 4 + SAMPLING_BYTES_PER_ENTRY)


def _mlp_width(m: ModelSpec, tp: int) -> int:
    if m.moe is not None:
        # routed experts run one after another on their tokens; the widest live set is one
        # expert's gated MLP over (at most) all tokens plus the router logits
        per = 3 * ceil_div(m.moe.expert_intermediate_size, tp) + m.moe.num_experts
        return max(per, 3 * ceil_div(m.moe.shared_intermediate_size, tp))
    inter = ceil_div(max(ls.intermediate_size for ls in m.layers), tp)
    return 3 * inter if m.mlp_gated else 2 * inter


def prefill_transient_bytes(r: Resolved, batch: int, prompt: int, c: int, tp: int, attention: str) -> int:
    """The running layer's live tensors during prefill (beyond weights, cache and logits)."""
    m = r.model
    t = batch * prompt
    h = m.hidden_size
    heads = ceil_div(m.num_attention_heads, tp)
    kv_heads = max(1, ceil_div(m.num_kv_heads, tp))
    q = heads * (m.q_width // max(1, m.num_attention_heads))
    kv = kv_heads * m.head_dim if m.mla is None else ceil_div(m.kv_width, tp)
    mlp = (2 * h + _mlp_width(m, tp)) * t * c
    # q, k, v projections, rotary copies of q and k, attention output, o_proj output
    attn = (2 * h + 2 * q + 3 * kv + kv + q + h) * t * c
    if attention == "eager":
        attn += batch * heads * prompt * prompt * (2 * c + 4)  # scores, + mask, fp32 softmax, cast
        attn += batch * prompt * prompt * c  # the 4-D additive causal mask
        attn += 2 * batch * heads * prompt * m.head_dim * c if kv_heads < heads else 0  # repeat_kv
    return max(mlp, attn)


def inference_step(r: Resolved) -> InferenceResult:
    s, m, gpu = r.scenario, r.model, r.gpu
    inf, par = s.inference, s.parallel
    c = dtype_bits(inf.dtype) // 8
    tp = par.tp
    rp = rank_params(m, tp, 1, par.ep, 0, None)
    quant = inf.quantization
    weights = weights_bytes(rp, c, quant)
    b, p, n = inf.batch_size, inf.prompt_len, inf.new_tokens
    total_tokens = p + n
    kv_prompt = cache_bytes(m, b, p, c, tp, inf.kv_cache_dtype, prefill=True)
    kv_final = cache_bytes(m, b, total_tokens, c, tp, inf.kv_cache_dtype, prefill=False)
    attention = "eager" if inf.attention == "eager" else inf.attention
    ws = cublas_workspace_bytes(gpu, handles=1)
    dequant = 0
    if quant in ("nf4", "nf4-dq", "fp4", "int8") and b * p > 1:
        dequant = rp.largest_linear * c  # bitsandbytes dequantizes a layer's weight for multi-token inputs
    logits = logits_bytes(m, b, c, tp)
    transient = prefill_transient_bytes(r, b, p, c, tp, attention)

    pre = Moment("prefill")
    pre.add("weights", "parameters", weights)
    pre.add("kv_cache", "prompt", kv_prompt)
    if transient >= logits:
        pre.add("activations", "running layer", transient)
    else:
        pre.add("temporaries", "last-token logits and sampling", logits)
    pre.add("temporaries", "dequantized weight", dequant)
    pre.add("other", "cuBLAS workspace", ws)

    dec = Moment("decode")
    dec.add("weights", "parameters", weights)
    dec.add("kv_cache", "all tokens", kv_final)
    spec = kv_spec(m, inf.kv_cache_dtype, c, tp)
    full_layer = max((spec.layer_bytes_per_token(la) for la in spec.layers if la.window is None), default=0)
    growth = b * total_tokens * full_layer // 2  # one layer's keys (then values), old and new together
    dec.add("temporaries", "cache growth (torch.cat of one layer)", growth)
    dec.add("temporaries", "last-token logits and sampling", logits)
    dec.add("other", "cuBLAS workspace", ws)
    moments = [pre, dec]
    peak = max(moments, key=lambda mo: mo.total)
    elem = kv_elem_bytes(inf.kv_cache_dtype, c)
    assumptions = [
        "Hugging Face generate (transformers 5.x) with DynamicCache: per-layer tensors grown by torch.cat",
        f"weights in {inf.dtype}" + (f", linear weights quantized as {quant}" if quant != "none" else ""),
        f"KV cache {spec.describe()} ({elem} B per element)",
        f"attention: {attention}; logits for the last position only (logits_to_keep=1), copied to fp32",
        "sampling with top-k/top-p warpers (greedy decoding needs about 26 B less per vocabulary entry and row)",
        "prompts of equal length (no padding mask)",
    ]
    return InferenceResult(moments, peak, assumptions, kv_prompt, kv_final)


def _fits(r: Resolved, batch: int, prompt: int) -> bool:
    from vramplan.analytic.engine import estimate

    inf = r.scenario.inference.model_copy(update={"batch_size": batch, "prompt_len": prompt})
    sc = r.scenario.model_copy(update={"inference": inf})
    return estimate(Resolved(sc, r.model, r.gpu)).fits


def _largest(known_ok: int, upper: int, ok: Callable[[int], bool]) -> int:
    """Largest x in [known_ok, upper] with ok(x) true, given ok(known_ok) (ok is monotone)."""
    found = largest_true(known_ok, upper, ok)
    return known_ok if found is None else found


def max_batch_size(r: Resolved, limit: int = 1 << 20) -> int:
    """The largest batch (at the scenario's prompt and new tokens) that fits; 0 if none does."""
    p = r.scenario.inference.prompt_len
    if not _fits(r, 1, p):
        return 0
    hi = 1
    while hi < limit and _fits(r, min(limit, hi * 2), p):
        hi = min(limit, hi * 2)
    return _largest(hi, min(limit, hi * 2), lambda b: _fits(r, b, p))


def max_prompt_len(r: Resolved, limit: int | None = None) -> int:
    """The longest prompt (at the scenario's batch and new tokens) that fits; 0 if none does.

    Bounded by the model's context: prompt + new tokens <= max_position_embeddings.
    """
    b = r.scenario.inference.batch_size
    cap = max(0, (limit or r.model.max_position_embeddings) - r.scenario.inference.new_tokens)
    if cap < 1 or not _fits(r, b, 1):
        return 0
    if _fits(r, b, cap):
        return cap
    return _largest(1, cap, lambda p: _fits(r, b, p))
