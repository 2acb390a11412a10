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
fp32 upcast, the rotary products, the cache update, SDPA's output, the gated MLP), op by op as the traced engine
records them (``_layer``), for the prefill over the whole prompt and for every decode step, and replays them through
the allocator's rules (``vramplan.alloc.replay_compact``).  The engine keeps its own count of the live bytes (the
replay's simplified layer is not a second estimate of them) and takes from the replay only the cached excess,
``peak reserved - peak allocated`` of the replay (``fragmentation_bytes``).

A hybrid whose mixer kind is in ``REPLAYED_MIXERS`` (LFM2's gated short convolution) is replayed too: its
convolution blocks (``_short_conv_layer``) beside its attention layers (``_layer``), as transformers 5.24's
``modeling_lfm2.py`` and ``cache_utils.py`` make them, and the convolution state made once beside the attention
layers' growing cache.  On LFM2's H100 run (benchmarks/gpu/h100-2026-11-27f) the replayed reserved bytes are -1.8%
from the measured.  The dense decoders' attention layers were written until 2026-11-27 in a simplified order (the
first cache update storing the new tensors, a copy of SDPA's output, the norm's fp32 product freed before the
weight's product, the layer's input freed after the attention, no cuBLAS workspace, separate projections for
Phi-3's fused ones); in the release's order the 21 replayed generate runs recorded on H100/H200 are 2.1% from the
measured reserved bytes on average (4.0% before), the worst -12.0% (OLMo 2, whose post-norm layer is not the replayed
one; -21.9% before, SmolLM2-1.7B batch 64).  Still simplified: Gemma 2/3's sandwich norms and fp32 weight product
(written as Llama's norms: modelling them moved Gemma 3 1B from -1.8% to -4.7% and the Gemma 2 calls not at all),
OLMo 2's post-norms, OPT's LayerNorm and learned positions, a sliding layer's cache (replayed as growing with every
token, where ``DynamicSlidingWindowLayer`` keeps at most the window: no measured call moved with it), and the
prompt's embeddings and RoPE tables (kept for the whole call, where the forward frees them at its return).

What is replayed is a dense decoder with full or sliding-window attention layers, or LFM2; a mixture of experts,
another hybrid (Mamba2, Mamba, gated DeltaNet, lightning attention, RG-LRU, RWKV), Gemma 3n's AltUp layers, a vision tower's images, quantized weights, tensor parallelism, Lit-GPT's
preallocated cache and transformers' legacy (< 4.42) cache are not, and ``applies`` says so.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vramplan.alloc import replay_compact
from vramplan.analytic.layout import rank_layer_tensors, rank_tensors
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.stream import AllocStream
from vramplan.spec.lora_match import experts_are_parameters

if TYPE_CHECKING:
    from vramplan.analytic.inference import GenerateCall

__all__ = ["REPLAYED_DECODE_STEPS", "REPLAYED_MIXERS", "CachedExcess", "applies", "cached_excess",
           "generate_stream", "growth_note", "weight_tensors"]

# Decode steps replayed.  The cached excess is set by the prefill's holes and by each step's reallocation of
# every layer's keys and values.  It can stay flat (Llama 3 8B b8 p2048, Qwen2.5 7B b32 p1024: the same bytes
# from step 1 to 512), shrink as the live cache grows into cached blocks (Phi-3.5-mini b16 p2048: 4.39 ->
# 2.99 GiB at step 512) or keep growing (SmolLM2-1.7B b64 p512: 12.45 GiB reserved after 2 steps, 21.78
# after 127; measured on an H200: 26.54).  Up to this many steps every step is replayed; a longer call
# continues the growth of the last half of the replayed steps (never a shrink) to its last step.  64 keeps an
# estimate near 0.1 s, which the largest-batch and longest-prompt searches (about 20 estimates) need.
REPLAYED_DECODE_STEPS = 64


# The mixer kinds (``MambaSpec.kind``) whose layers are replayed beside attention layers: LFM2's gated short
# convolution (``_short_conv_layer``).  Other hybrids (Mamba2, Gated DeltaNet, lightning attention, RG-LRU, Mamba-1,
# RWKV-4) are not, and their reports say the cached excess is not replayed.
REPLAYED_MIXERS = ("short_conv",)


def applies(g: GenerateCall) -> bool:
    """True for the calls the replay describes (module docstring)."""
    m, s = g.m, g.r.scenario
    return (not g.lit and not g.gen.legacy_cache and g.tp == 1 and m.moe is None
            and (m.mamba is None or m.mamba.kind in REPLAYED_MIXERS)
            and m.mla is None and s.inference.quantization == "none" and s.inference.images_per_sample == 0
            and not (m.vision is not None and m.vision.cross_attention_layers) and g.attention in ("sdpa", "flash") and g.new >= 2
            and g.beams == 1  # beam search's reorder_cache copies are not in the replayed stream
            and m.altup is None and not m.kv_reuse_layers  # Gemma 3n's layers are not the replayed layer
            # the replayed sliding layer is 4.56's DynamicSlidingWindowLayer (not an earlier release's cache)
            and g.sliding_cache == "window")


def _rms_norm(st: AllocStream, tokens: int, h: int, c: int) -> int:
    """``LlamaRMSNorm`` (``modeling_llama.py`` 5.24 lines 63-67): the fp32 copy, ``pow(2)`` (freed after the mean),
    the normalised fp32 product, its cast back and the weight's product; returns the output's id.  The normalised
    product stays bound to ``hidden_states`` until the return (``return self.weight * hidden_states.to(input_dtype)``),
    so it is freed with the cast after the weight's product, as the traced engine records.  In fp32 the ``.to``
    calls are no-ops."""
    if c == 4:
        st.free(st.alloc(tokens * h * 4))  # pow(2)
        return st.alloc(tokens * h * 4)
    h32 = st.alloc(tokens * h * 4)
    st.free(st.alloc(tokens * h * 4))  # pow(2)
    normed = st.alloc(tokens * h * 4)
    st.free(h32)
    cast = st.alloc(tokens * h * c)
    out = st.alloc(tokens * h * c)
    st.free_all((cast, normed))
    return out


def _rotate(st: AllocStream, nbytes: int, cat_copy: bool = False) -> int:
    """``apply_rotary_pos_emb`` on one of q/k: ``x * cos``, ``rotate_half`` (a negated half and a cat),
    ``* sin`` and the sum; returns the rotated tensor's id (the input is freed by the caller).  ``cat_copy``
    (``Traits.rotary_cat_copy``): the sum concatenated with the passed-through part, a copy, the sum then freed."""
    a = st.alloc(nbytes)
    neg = st.alloc(nbytes // 2)
    cat = st.alloc(nbytes)
    st.free(neg)
    b = st.alloc(nbytes)
    st.free(cat)
    out = st.alloc(nbytes)
    st.free_all((a, b))
    if cat_copy:
        embed = st.alloc(nbytes)
        st.free(out)
        return embed
    return out


def _layer(st: AllocStream, g: GenerateCall, tokens: int, res: int, k_old: int, v_old: int,
           keys: int) -> tuple[int, int, int]:
    """One attention layer over ``tokens`` rows; ``keys`` the cache's length after it (the prefill's: the prompt).
    Returns (the layer's output, the cache's keys, its values).

    Written as transformers 5.24 runs ``LlamaDecoderLayer``/``LlamaAttention`` (``modeling_llama.py``), LFM2's
    ``Lfm2Attention`` and Phi-3's ``Phi3Attention``/``Phi3MLP``, op by op as the traced engine records them:

    * the projections: q, k and v each (with ``qk_norm`` the query's and the key's each go through an RMSNorm over
      the head dim before the rotation, the projection freed once the norm returns, and the value's comes after
      them); a fused projection (``Traits.fused_qkv_view``, Phi-3's ``qkv_proj``) is one tensor whose q, k and v
      are views, bound to ``qkv`` until the attention returns;
    * ``apply_rotary_pos_emb`` rotates both q and k before the attention rebinds its query and key
      (``query_states, key_states = apply_rotary_pos_emb(...)``, line 249), so both projections are freed after
      both rotations;
    * ``DynamicLayer.update`` (``cache_utils.py`` 5.24 lines 113-137) concatenates at every update, the first one
      included (``lazy_initialization`` makes empty tensors, then ``self.keys = torch.cat([self.keys,
      key_states], dim=-2)``): the prefill's keys and values are copies, each old tensor freed as its new one is
      bound, and the rotated key and the value freed once ``update`` returns, after both concatenations;
    * SDPA's output (flash and memory-efficient kernels) is laid out as ``(b, p, heads, d)``, so that
      ``attn_output.transpose(1, 2).contiguous()`` (``integrations/sdpa_attention.py`` 5.24 line 195) copies
      nothing; the rotated query and that output are freed when the attention returns, after ``o_proj``, and the
      norm's output with them (``hidden_states`` is rebound to the attention's output, line 299) and ``qkv`` with them;
    * the model's loop holds the layer's input (``hidden_states = decoder_layer(hidden_states, ...)``, line 394)
      until the layer returns, past ``residual = hidden_states`` (line 311)."""
    m, c, b = g.m, g.c, g.batch
    h, d = m.hidden_size, m.head_dim
    q, kv = m.num_attention_heads * d, m.num_kv_heads * d
    normed = _rms_norm(st, tokens, h, c)
    qkv = -1
    if m.traits.fused_qkv_view:
        qkv = st.alloc(tokens * (q + 2 * kv) * c)  # q, k and v are its views
        qq = kk = vv = -1
    elif m.qk_norm:
        raw = st.alloc(tokens * q * c)
        qq = _rms_norm(st, tokens * m.num_attention_heads, d, c)
        st.free(raw)
        raw = st.alloc(tokens * kv * c)
        kk = _rms_norm(st, tokens * m.num_kv_heads, d, c)
        st.free(raw)
        vv = st.alloc(tokens * kv * c)
    else:
        qq, kk, vv = st.alloc(tokens * q * c), st.alloc(tokens * kv * c), st.alloc(tokens * kv * c)
    q_rot = _rotate(st, tokens * q * c, m.traits.rotary_cat_copy)
    k_rot = _rotate(st, tokens * kv * c, m.traits.rotary_cat_copy)
    st.free_all((qq, kk))
    keys_id = st.alloc(b * keys * kv * c)  # torch.cat([self.keys, key_states], dim=-2)
    st.free(k_old)
    values_id = st.alloc(b * keys * kv * c)
    st.free(v_old)
    st.free_all((k_rot, vv))
    out = st.alloc(tokens * q * c)  # SDPA's output
    o = st.alloc(tokens * h * c)  # o_proj
    st.free_all((out, qkv, q_rot, normed))
    mid = st.alloc(tokens * h * c)  # residual + attention
    st.free(o)
    new = _mlp_half(st, g, tokens, mid)
    st.free(res)
    return new, keys_id, values_id


def _mlp_half(st: AllocStream, g: GenerateCall, tokens: int, mid: int) -> int:
    """The layer's second half after ``mid`` (its input plus the mixer's output): the norm, the (gated) MLP and
    the residual sum; returns the layer's output.  A fused ``gate_up_proj`` (``Traits.fused_gate_up``,
    ``Phi3MLP.forward``, ``modeling_phi3.py`` 5.24 lines 59-64): its output (twice the width; ``gate`` and ``up`` its
    views, bound until the return), the activation of ``gate``, the product (the activation freed), ``down_proj``."""
    m, c = g.m, g.c
    h = m.hidden_size
    inter = max(ls.intermediate_size for ls in m.layers)
    normed2 = _rms_norm(st, tokens, h, c)
    held = -1
    if m.mlp_gated and m.traits.fused_gate_up:
        held = st.alloc(tokens * 2 * inter * c)  # gate_up_proj
        act = st.alloc(tokens * inter * c)
        prod = st.alloc(tokens * inter * c)
        st.free(act)
    elif m.mlp_gated:
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
    st.free_all((prod, held, normed2))
    new = st.alloc(tokens * h * c)  # residual + MLP
    st.free_all((down, mid))
    return new


def _short_conv_layer(st: AllocStream, g: GenerateCall, tokens: int, res: int, state: int) -> tuple[int, int]:
    """An LFM2 convolution block over ``tokens`` rows (``Lfm2DecoderLayer`` with ``Lfm2ShortConv``,
    ``modeling_lfm2.py`` 5.24, its torch ``causal_conv1d_fn``/``causal_conv1d_update``); ``state`` the layer's
    convolution state (-1 at the prefill, which makes it).  Returns (the layer's output, the state).

    Prefill: ``operator_norm``; ``in_proj``'s output ``BCx`` (3 h a row; B, C and x are its views); ``B * x``;
    ``update_conv_state``'s lazy ``torch.zeros`` of ``b x h x conv_L_cache`` (kept: the cache's tensor, filled by
    ``copy_``; the prompt is returned as it is); ``F.conv1d``'s padded output ``b x h x (p + k - 1)``, after which
    ``B * x`` is unbound; ``y = C * conv`` (the elementwise product takes the layout of ``C``, a view of
    ``BCx.transpose(-1, -2)``, so that ``y.transpose(-1, -2).contiguous()`` copies nothing: the traced engine sees
    no copy there), ``out_proj``'s output (``y`` freed); at the return the convolution's output and ``BCx``, then
    the norm's output.  Decode: ``causal_conv1d_update`` concatenates the state and the token (``b x h x (k + 1)``), copies
    its last ``k`` columns into the state and convolves it (``b x h x 2``), the concatenation freed at its
    return."""
    m, c, b = g.m, g.c, g.batch
    ms = m.mamba
    assert ms is not None
    h, k = m.hidden_size, ms.conv_kernel
    normed = _rms_norm(st, tokens, h, c)
    bcx = st.alloc(tokens * 3 * h * c)
    bx = st.alloc(tokens * h * c)
    if state < 0:
        state = st.alloc(b * h * k * c)  # LinearAttentionLayer.lazy_initialization's zeros
        conv = st.alloc(b * h * (tokens // b + k - 1) * c)
    else:
        cat = st.alloc(b * h * (k + 1) * c)  # torch.cat([conv_state, hidden_states], dim=-1)
        conv = st.alloc(b * h * 2 * c)
        st.free(cat)
    st.free(bx)
    y = st.alloc(tokens * h * c)  # C * hidden_states, laid out as C (b, p, h): the transpose is contiguous
    out = st.alloc(tokens * h * c)  # out_proj
    st.free_all((y, conv, bcx, normed))
    mid = st.alloc(tokens * h * c)  # hidden_states + residual
    st.free(out)
    new = _mlp_half(st, g, tokens, mid)
    st.free(res)  # the model's loop held the layer's input (``_layer``)
    return new, state


def _any_layer(st: AllocStream, g: GenerateCall, i: int, tokens: int, res: int, keys: list[int],
               values: list[int], length: int) -> int:
    """Layer ``i`` over ``tokens`` rows, the cache ``length`` tokens long after it: a mixer layer's state is held
    in ``keys[i]`` (``values[i]`` unused), an attention layer's keys and values in both; returns its output."""
    ms = g.m.mamba
    if ms is not None and i in ms.layers:
        if ms.kind not in REPLAYED_MIXERS:
            raise ValueError(f"{ms.kind} layers are not replayed (REPLAYED_MIXERS: {', '.join(REPLAYED_MIXERS)})")
        out, keys[i] = _short_conv_layer(st, g, tokens, res, keys[i])
        return out
    out, keys[i], values[i] = _layer(st, g, tokens, res, keys[i], values[i], length)
    return out


def generate_stream(g: GenerateCall, weights: list[int], steps: int | None = None) -> list[int]:
    """The call's allocations: ``weights`` (bytes per tensor, in build order), the prompt's embeddings and
    RoPE tables, the prefill's layers, the last position's logits, then the decode steps (all, or the first
    ``steps``)."""
    m, c, b, p = g.m, g.c, g.batch, g.prompt
    st = AllocStream()
    for nbytes in weights:
        st.alloc(nbytes)
    # the first matmul's cuBLAS workspace, taken from the caching allocator (``getCUDABlasLtWorkspace``) and
    # kept: the traced engine records it before the embedding
    st.alloc(cublas_workspace_bytes(g.r.gpu, handles=1))
    h, vocab = m.hidden_size, m.vocab_size
    embeds = st.alloc(b * p * h * c)  # inputs_embeds, kept by the decoder's forward
    st.alloc(p * m.head_dim * c)  # RoPE cos
    st.alloc(p * m.head_dim * c)  # RoPE sin
    keys = [-1] * len(m.layers)
    values = [-1] * len(m.layers)
    res = embeds
    for i in range(len(m.layers)):
        res = _any_layer(st, g, i, b * p, -1 if res == embeds else res, keys, values, p)
    final = _rms_norm(st, b * p, h, c)
    st.free(res)
    logits = st.alloc(b * vocab * c)  # logits_to_keep=1
    scores = st.alloc(b * vocab * 4)  # generate's fp32 copy of the last position's logits
    st.free_all((logits, final))
    last = g.new - 1 if steps is None else min(steps, g.new - 1)
    for step in range(1, last + 1):
        x = st.alloc(b * h * c)
        for i in range(len(m.layers)):
            x = _any_layer(st, g, i, b, x, keys, values, p + step)
        final = _rms_norm(st, b, h, c)
        st.free(x)
        logits = st.alloc(b * vocab * c)
        new_scores = st.alloc(b * vocab * 4)
        st.free_all((logits, final, scores))
        scores = new_scores
    return st.events


def weight_tensors(g: GenerateCall) -> list[int]:
    """Bytes of each parameter tensor in the order ``from_config``/``from_pretrained`` builds them: the
    embedding, each layer's own tensors (a hybrid's mixer layer holds no attention projections, a dense first layer
    no experts; transformers 5's experts one tensor per projection), then the rest (final norm, an untied head)."""
    _, outside = rank_tensors(g.m, g.rp, g.tp)
    s = g.r.scenario
    fused = experts_are_parameters(g.m, s.software.fused_moe_experts, s.inference.quantization)
    per_layer = [n * g.c for t in rank_layer_tensors(g.m, g.rp, g.tp, fused) for n in t]
    return [n * g.c for n in outside[:1]] + per_layer + [n * g.c for n in outside[1:]]


# The replays already made: the stream reads the model, the element size, the rows, the prompt, the steps, the
# weight tensors, the GPU's cuBLAS workspace and the release's sliding-window cache, nothing else of the call
# (``generate_stream``, ``_layer``), so calls that agree on these replay the same stream -- the same job on every
# catalog GPU (plan/every_gpu.py), or a search that moves only the GPU count.  Bounded: the least recently used
# result goes first.
_EXCESS: OrderedDict[tuple[object, ...], int] = OrderedDict()
_EXCESS_MAX = 256


def _excess(g: GenerateCall, weights: list[int], steps: int) -> int:
    key = (g.m, g.c, g.batch, g.prompt, min(steps, g.new - 1), tuple(weights),
           cublas_workspace_bytes(g.r.gpu, handles=1), g.sliding_cache)
    got = _EXCESS.get(key)
    if got is None:
        rr = replay_compact(generate_stream(g, weights, steps))
        got = max(0, rr.peak_reserved_bytes - rr.peak_allocated_bytes)
        _EXCESS[key] = got
        if len(_EXCESS) > _EXCESS_MAX:
            _EXCESS.popitem(last=False)
    else:
        _EXCESS.move_to_end(key)
    return got


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
    the excess past the replayed steps is an extrapolation, so the band is widened."""
    return (f"not modelled: the allocator's cached excess still grows in the second half of the decode steps "
            f"({growth_bytes / 2**30:.2f} GiB), continued to the last step as it grew there; the one such call "
            "measured (SmolLM2-1.7B, batch 64, 128 new tokens, benchmarks/gpu/README.md) kept 1.0% less reserved "
            "than this estimate (22% more with the replay's former simplified layer)")
