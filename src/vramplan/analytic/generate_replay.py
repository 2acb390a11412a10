"""The caching allocator's cache during Hugging Face ``generate``: the prefill's holes and the cache's growth.

``generate`` with a ``DynamicCache`` grows each layer's keys and values by ``torch.cat`` at every decode step
(``DynamicLayer.update``): a new tensor one token longer is allocated while the old one is alive, then the old
one is freed.  The freed block is one token too small for the next step's tensor, so PyTorch's caching
allocator (``CUDACachingAllocator.cpp``: best fit among cached blocks, splitting, merging only with free
neighbours) keeps carving new blocks out of the holes the prefill's activations left and out of new
segments, while the blocks it frees stay cached.  ``max_memory_reserved`` (and nvidia-smi) therefore exceed
the live tensors: measured on an H200 (benchmarks/gpu/h200-2026-11-26), by 0.2 to 4.1 GB (1% to 19% of the
reserved bytes), which packing the peak's tensors into empty segments does not see.

This module writes the call's allocations in the order transformers 5's decoder layer makes them
(``LlamaDecoderLayer``/``LlamaRMSNorm``/``apply_rotary_pos_emb``/``sdpa_attention_forward``/``LlamaMLP``: the
fp32 upcast, the rotary products, the cache update, the attention output's contiguous copy, the gated MLP),
for the prefill over the whole prompt and for every decode step, and replays them through the allocator's
rules (``vramplan.alloc.replay_compact``).  The engine keeps its own count of the live bytes (the
replay's simplified layer is not a second estimate of them) and takes from the replay only the cached
excess, ``peak reserved - peak allocated`` of the replay (``fragmentation_bytes``).

What is replayed is a dense decoder with full or sliding-window attention layers; a mixture of experts,
a hybrid (Mamba) model, Gemma 3n's AltUp layers, a vision tower's images, quantized weights, tensor parallelism, Lit-GPT's
preallocated cache and transformers' legacy (< 4.42) cache are not, and ``applies`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vramplan.alloc import replay_compact
from vramplan.analytic.layout import rank_tensors
from vramplan.analytic.stream import AllocStream

if TYPE_CHECKING:
    from vramplan.analytic.inference import GenerateCall

__all__ = ["REPLAYED_DECODE_STEPS", "CachedExcess", "applies", "cached_excess",
           "generate_stream", "growth_note", "weight_tensors"]

# Decode steps replayed.  The cached excess is set by the prefill's holes and by each step's reallocation of
# every layer's keys and values.  It can stay flat (Llama 3 8B b8 p2048, Qwen2.5 7B b32 p1024: the same bytes
# from step 1 to 512), shrink as the live cache grows into cached blocks (Phi-3.5-mini b16 p2048: 4.39 ->
# 2.99 GiB at step 512) or keep growing (SmolLM2-1.7B b64 p512: 12.45 GiB reserved after 2 steps, 21.78
# after 127; measured on an H200: 26.54).  Up to this many steps every step is replayed; a longer call
# continues the growth of the last half of the replayed steps (never a shrink) to its last step.  64 keeps an
# estimate near 0.1 s, which the largest-batch and longest-prompt searches (about 20 estimates) need.
REPLAYED_DECODE_STEPS = 64


def applies(g: GenerateCall) -> bool:
    """True for the calls the replay describes (module docstring)."""
    m, s = g.m, g.r.scenario
    return (not g.lit and not g.gen.legacy_cache and g.tp == 1 and m.moe is None and m.mamba is None
            and m.mla is None and s.inference.quantization == "none" and s.inference.images_per_sample == 0
            and not (m.vision is not None and m.vision.cross_attention_layers) and g.attention in ("sdpa", "flash") and g.new >= 2
            and g.beams == 1  # beam search's reorder_cache copies are not in the replayed stream
            and m.altup is None and not m.kv_reuse_layers  # Gemma 3n's layers are not the replayed layer
            # the replayed sliding layer is 4.56's DynamicSlidingWindowLayer (not an earlier release's cache)
            and g.sliding_cache == "window")


def _rms_norm(st: AllocStream, tokens: int, h: int, c: int) -> int:
    """``LlamaRMSNorm``: the fp32 copy, ``pow(2)`` (freed after the mean), the normalised fp32 product, its
    cast back and the weight's product; returns the output's id.  In fp32 the ``.to`` calls are no-ops."""
    if c == 4:
        st.free(st.alloc(tokens * h * 4))  # pow(2)
        return st.alloc(tokens * h * 4)
    h32 = st.alloc(tokens * h * 4)
    st.free(st.alloc(tokens * h * 4))  # pow(2)
    normed = st.alloc(tokens * h * 4)
    st.free(h32)
    cast = st.alloc(tokens * h * c)
    st.free(normed)
    out = st.alloc(tokens * h * c)
    st.free(cast)
    return out


def _rotate(st: AllocStream, nbytes: int) -> int:
    """``apply_rotary_pos_emb`` on one of q/k: ``x * cos``, ``rotate_half`` (a negated half and a cat),
    ``* sin`` and the sum; returns the rotated tensor's id (the input is freed by the caller)."""
    a = st.alloc(nbytes)
    neg = st.alloc(nbytes // 2)
    cat = st.alloc(nbytes)
    st.free(neg)
    b = st.alloc(nbytes)
    st.free(cat)
    out = st.alloc(nbytes)
    st.free_all((a, b))
    return out


def _layer(st: AllocStream, g: GenerateCall, tokens: int, res: int, k_old: int, v_old: int, keys: int
           ) -> tuple[int, int, int]:
    """One decoder layer over ``tokens`` rows; ``keys`` the cache's length after it (the prefill's: the prompt).
    Returns (the layer's output, the cache's keys, its values)."""
    m, c, b = g.m, g.c, g.batch
    h, d = m.hidden_size, m.head_dim
    q, kv = m.num_attention_heads * d, m.num_kv_heads * d
    inter = max(ls.intermediate_size for ls in m.layers)
    normed = _rms_norm(st, tokens, h, c)
    qq, kk, vv = st.alloc(tokens * q * c), st.alloc(tokens * kv * c), st.alloc(tokens * kv * c)
    q_rot = _rotate(st, tokens * q * c)
    st.free(qq)
    k_rot = _rotate(st, tokens * kv * c)
    st.free(kk)
    if k_old < 0:
        keys_id, values_id = k_rot, vv  # the first update stores the tensors themselves
    else:
        keys_id = st.alloc(b * keys * kv * c)  # torch.cat([old, new], dim=-2)
        st.free_all((k_old, k_rot))
        values_id = st.alloc(b * keys * kv * c)
        st.free_all((v_old, vv))
    out = st.alloc(tokens * q * c)
    st.free(q_rot)
    contiguous = st.alloc(tokens * q * c)  # attn_output.transpose(1, 2).contiguous()
    st.free(out)
    o = st.alloc(tokens * h * c)
    st.free_all((contiguous, normed))
    mid = st.alloc(tokens * h * c)  # residual + attention
    st.free_all((o, res))
    normed2 = _rms_norm(st, tokens, h, c)
    if m.mlp_gated:
        gate = st.alloc(tokens * inter * c)
        act = st.alloc(tokens * inter * c)
        st.free(gate)
        up = st.alloc(tokens * inter * c)
        prod = st.alloc(tokens * inter * c)
        st.free_all((act, up))
    else:
        fc = st.alloc(tokens * inter * c)
        prod = st.alloc(tokens * inter * c)
        st.free(fc)
    down = st.alloc(tokens * h * c)
    st.free_all((prod, normed2))
    new = st.alloc(tokens * h * c)  # residual + MLP
    st.free_all((down, mid))
    return new, keys_id, values_id


def generate_stream(g: GenerateCall, weights: list[int], steps: int | None = None) -> list[int]:
    """The call's allocations: ``weights`` (bytes per tensor, in build order), the prompt's embeddings and
    RoPE tables, the prefill's layers, the last position's logits, then the decode steps (all, or the first
    ``steps``)."""
    m, c, b, p = g.m, g.c, g.batch, g.prompt
    st = AllocStream()
    for nbytes in weights:
        st.alloc(nbytes)
    h, vocab = m.hidden_size, m.vocab_size
    embeds = st.alloc(b * p * h * c)  # inputs_embeds, kept by the decoder's forward
    st.alloc(p * m.head_dim * c)  # RoPE cos
    st.alloc(p * m.head_dim * c)  # RoPE sin
    keys = [-1] * len(m.layers)
    values = [-1] * len(m.layers)
    res = embeds
    for i in range(len(m.layers)):
        out, keys[i], values[i] = _layer(st, g, b * p, -1 if res == embeds else res, -1, -1, p)
        res = out
    final = _rms_norm(st, b * p, h, c)
    st.free(res)
    logits = st.alloc(b * vocab * c)  # logits_to_keep=1
    scores = st.alloc(b * vocab * 4)  # generate's fp32 copy of the last position's logits
    st.free_all((logits, final))
    last = g.new - 1 if steps is None else min(steps, g.new - 1)
    for step in range(1, last + 1):
        x = st.alloc(b * h * c)
        for i in range(len(m.layers)):
            x_new, keys[i], values[i] = _layer(st, g, b, x, keys[i], values[i], p + step)
            x = x_new
        final = _rms_norm(st, b, h, c)
        st.free(x)
        logits = st.alloc(b * vocab * c)
        new_scores = st.alloc(b * vocab * 4)
        st.free_all((logits, final, scores))
        scores = new_scores
    return st.events


def weight_tensors(g: GenerateCall) -> list[int]:
    """Bytes of each parameter tensor in the order ``from_config``/``from_pretrained`` builds them: the
    embedding, each layer's tensors, then the rest (final norm, an untied head)."""
    inner, outside = rank_tensors(g.m, g.rp, g.tp)
    return ([n * g.c for n in outside[:1]] + [n * g.c for n, _ in inner] * len(g.rp.layers)
            + [n * g.c for n in outside[1:]])


def _excess(g: GenerateCall, weights: list[int], steps: int) -> int:
    rr = replay_compact(generate_stream(g, weights, steps))
    return max(0, rr.peak_reserved_bytes - rr.peak_allocated_bytes)


@dataclass(frozen=True)
class CachedExcess:
    """What the replay says of a call: the cached excess at its most, and how much of it the second half of the
    replayed decode steps added (0: the excess was set by the prefill and the first steps)."""

    bytes: int = 0
    late_growth_bytes: int = 0


def cached_excess(g: GenerateCall) -> CachedExcess:
    """Bytes the allocator holds cached beyond the live tensors at its most: the replay's peak reserved minus
    its peak allocated (nothing when ``applies`` is False); past ``REPLAYED_DECODE_STEPS`` decode steps, the
    growth per step of the replay's second half continued to the last step."""
    if not applies(g):
        return CachedExcess()
    weights = weight_tensors(g)
    steps = min(REPLAYED_DECODE_STEPS, g.new - 1)
    excess = _excess(g, weights, steps)
    growth = max(0, excess - _excess(g, weights, steps // 2)) if steps >= 2 else 0
    extra_steps = g.new - 1 - steps
    if extra_steps > 0:
        excess += growth * extra_steps // (steps - steps // 2)
    return CachedExcess(excess, growth)


def growth_note(growth_bytes: int) -> str:
    """The report's statement when the excess still grows late in the call (``CachedExcess.late_growth_bytes``):
    the one such call measured was under-predicted, so the band is widened."""
    return (f"not modelled: the allocator's cached excess still grows in the second half of the decode steps "
            f"({growth_bytes / 2**30:.2f} GiB); the one such call measured (SmolLM2-1.7B, batch 64, 128 new tokens, "
            "benchmarks/gpu/README.md) kept 28% more reserved than this estimate, whose per-step small tensors are "
            "simplified")
