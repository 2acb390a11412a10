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

A hybrid model (``ModelSpec.mamba``, Bamba) caches keys and values in its attention layers only; its Mamba2
mixer layers keep a fixed-size convolution and SSM state per sequence, counted in the prefill and decode
moments, and the prefill's running layer is the larger of an attention layer and a mixer's chunked scan
(``analytic/ssm_state.py``).

Decode (one token per step; the peak is at the last step, cache length L = prompt + new - 1:
the prefill makes the first new token and each decode step feeds the previous one back):

* the cache of all tokens (sliding layers: their window);
* cache growth: ``DynamicLayer.update`` does ``self.keys = torch.cat([self.keys, k])``,
  so the old and the new key tensor of one layer coexist (then the same for values):
  one layer's K at full length is transient; ``DynamicSlidingWindowLayer.update`` makes both
  new tensors before it drops either old one: a sliding layer's K and V at its window
  (``cache_growth_bytes``), the larger of the two;
* the last-token logits, their fp32 copy and the sampling temporaries as above.

Older transformers releases (``software.transformers``; :class:`GenerateBehaviour`):

* before 4.42 (later for some families) ``generate`` kept the cache as the legacy tuple of
  per-layer (key, value) tensors: the model builds the next step's tuple with ``torch.cat``
  while ``model_kwargs`` still holds the previous one, so at the end of each decode step the
  whole cache exists twice, L - 1 and L tokens (transformers issue #25930, PR #30536; 4.42's
  ``generate`` passes a ``DynamicCache`` instead, "to avoid back and forth from legacy format");
  it also kept the previous step's ``outputs`` (no ``del outputs``), so the prompt's logits
  live through the first decode step;
* before 4.45 the prefill computed the logits of every prompt position (``num_logits_to_keep``
  arrived with PR #31292) and the Llama-style families upcast them all to fp32
  (``logits = logits.float()``): b * p * V * (c + 4) at the upcast.

Llama-2-13B fp16, batch 16, 512 + 512 tokens (optimum's GPTQ benchmark ran transformers 4.32):
the cache of 1,024 tokens is 16 * 1024 * 40 * 2 * 5120 * 2 B = 13.42 GB, and the legacy tuple adds
the 1,023-token copy, 13.41 GB: 53.4 GB with the weights instead of 40.0 GB (measured 54.0 GB).

Lit-GPT (``framework: lightning``) differs in its head, its quantization and its cache: see the Lit-GPT
section below.  bitsandbytes' multi-token forward dequantizes the largest quantized linear
(``bnb_dequant_bytes``, ``bnb_compute_dtype``).

``inference_step`` composes the terms below: ``GenerateCall.of`` reads the scenario once,
``call_terms`` computes the terms every moment shares, ``prefill_moment`` and ``decode_moment``
place them.  The solvers for the largest batch and the longest prompt that fit
(``max_batch_size``, ``max_prompt_len``) live with the other solvers in ``vramplan.plan.solvers``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from vramplan.analytic.altup import (
    altup_expansion_bytes,
    altup_layer_bytes,
    eager_kept_bytes,
    per_layer_inputs_bytes,
    sliding_sdpa_mask_bytes,
)
from vramplan.analytic.attention import (
    BF16_MATH_NOTE,
    MQA_MATH_NOTE,
    bf16_math_fallback,
    falls_back_to_eager,
    gqa_math_fallback,
    gqa_math_note,
    mem_efficient_mask_row,
    mqa_math,
    sdpa_repeats_kv,
)
from vramplan.analytic.cross_attention import (
    CrossImages,
    cross_images,
    cross_kv_bytes,
    cross_layer_bytes,
    cross_probs_bytes,
    mask_prep_bytes,
    vision_model_bytes,
)
from vramplan.analytic.generate_replay import applies, cached_excess, growth_note
from vramplan.analytic.hf_buffers import (
    causal_mask_buffer_bytes,
    hf_buffer_notes,
    rope_cache_bytes,
)
from vramplan.analytic.kv_cache import attention_layers, kv_elem_bytes, kv_spec
from vramplan.analytic.layout import (
    BNB_4BIT_FORMATS,
    BNB_FORMATS,
    RankParams,
    rank_params,
)
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.ssm_state import (
    broadcast_product_bytes,
    mixer_buffer_bytes,
    mixer_decode_bytes,
    mixer_prefill_bytes,
    ssm_state_bytes,
    ssm_state_layer_bytes,
)
from vramplan.analytic.weights import quantized_linear_bytes, weights_bytes
from vramplan.errors import Problem, ScenarioError
from vramplan.facts.quantization import quant_format
from vramplan.facts.transformers import CURRENT_RELEASE_NOTE, OWN_MODEL_FRAMEWORKS, mamba2_scan_broadcasts
from vramplan.spec.load import Resolved
from vramplan.spec.lora_match import quantized_expert_loop
from vramplan.spec.model import ModelSpec, Traits
from vramplan.units import ceil_div, dtype_bits

__all__ = [
    "BEAM_EXTRA_BYTES_PER_ENTRY",
    "SAMPLING_BYTES_PER_ENTRY",
    "CallTerms",
    "GenerateBehaviour",
    "GenerateCall",
    "InferenceResult",
    "add_weights",
    "beam_logits_bytes",
    "beam_note",
    "beam_state_bytes",
    "beam_terms",
    "bnb_compute_dtype",
    "bnb_dequant_bytes",
    "cache_bytes",
    "cache_growth_bytes",
    "call_logits_bytes",
    "call_terms",
    "decode_moment",
    "dequant_term",
    "generate_behaviour",
    "hf_buffer_terms",
    "hqq_dequant_bytes",
    "inference_assumptions",
    "inference_step",
    "kept_embeddings_bytes",
    "kv_terms",
    "litgpt_head_params",
    "litgpt_kv_bytes",
    "logits_bytes",
    "prefill_layer_bytes",
    "prefill_moment",
    "prefill_transient_bytes",
    "prompt_logits_terms",
    "repeated_kv_bytes",
    "rope_bytes",
    "softmax_bytes_per_score",
    "tower_forward_bytes",
    "weights_term",
]

# Top-k/top-p warpers per (row, vocabulary entry): sorted fp32 values 4, int64 indices 8,
# softmax 4, cumulative sum 4, masks 2, masked scores 4 (transformers ``TopPLogitsWarper``).
SAMPLING_BYTES_PER_ENTRY = 26
# Beam search (transformers 5.24 ``GenerationMixin._beam_search``), per (row, vocabulary entry) beyond ``logits_bytes``:
# the step's ``log_probs = log_softmax(logits)`` (fp32) is a new tensor beside the fp32 ``logits`` copy, and the
# logits processors (the warpers, under beam sampling) run over it.  (Deterministic beam search applies no warper:
# c + 4 + 4 B at ``log_softmax`` instead of c + 4 + 4 + 26; the larger is counted, as for sampling.)
BEAM_EXTRA_BYTES_PER_ENTRY = 4


# the transformers release from which ``generate`` passes a ``DynamicCache`` updated in place instead of
# the legacy tuple, and whether the 4.44 causal-LM head upcast all logits (``logits.float()``), are traits
# of each family (``Traits.dynamic_cache_since``, ``Traits.upcasts_all_logits``, set by its adapter).
# ``del outputs`` after each step (so the prompt's logits do not live into the next forward): 4.42.0
DEL_OUTPUTS_SINCE = (4, 42)
# ``num_logits_to_keep=1`` at prefill (PR #31292, generation/utils.py 4.45.0)
LOGITS_TO_KEEP_SINCE = (4, 45)
# the first release whose ``DynamicCache`` keeps a sliding layer's window only (``DynamicSlidingWindowLayer``,
# transformers PR #40039: cache_utils.py 4.56.0:165; 4.55.4's ``DynamicCache`` has one ``torch.cat``-grown tensor
# per layer holding every token) and that ignores a checkpoint's ``cache_implementation: "hybrid"`` (generation/utils.py
# 4.56.0:1728-1732: "prior to this PR, models with sliding window attention were forced to have
# cache_implementation='hybrid' (the static sliding window cache)")
SLIDING_WINDOW_CACHE_SINCE = (4, 56)

SlidingCache = Literal["window", "all", "static"]

@dataclass(frozen=True)
class GenerateBehaviour:
    """What a transformers release's ``generate`` keeps alive (module docstring)."""

    legacy_cache: bool      # the previous step's cache tuple alive while the next one is built
    keeps_outputs: bool     # the previous step's outputs (the prompt's logits) alive through the next forward
    all_logits: bool        # the prefill computes the logits of every prompt position
    float_logits: bool      # ... and upcasts them all to fp32
    # what a sliding-window layer's cache holds: its window ("window", DynamicSlidingWindowLayer), every token
    # ("all", the DynamicCache of releases before 4.56), or a HybridCache allocated before the prefill for the
    # prompt and new tokens, the window on sliding layers ("static", before 4.56 for checkpoints whose
    # generation_config.json names cache_implementation "hybrid": ``Traits.static_hybrid_cache_before``)
    sliding_cache: SlidingCache = "window"


def generate_behaviour(traits: Traits, version: tuple[int, ...] | None) -> GenerateBehaviour:
    """The behaviour of ``version`` (None: the current release) for a model family (its adapter's traits).

    >>> from vramplan.spec.model import Traits
    >>> generate_behaviour(Traits(upcasts_all_logits=True), (4, 32))
    GenerateBehaviour(legacy_cache=True, keeps_outputs=True, all_logits=True, float_logits=True, sliding_cache='all')
    >>> [generate_behaviour(Traits(static_hybrid_cache_before=(4, 56)), v).sliding_cache for v in ((4, 50), (4, 56))]
    ['static', 'window']
    >>> generate_behaviour(Traits(), None).legacy_cache
    False
    >>> late = Traits(upcasts_all_logits=True, logits_to_keep_since=(5, 0), float_logits_before=(4, 46))
    >>> b45, b46 = generate_behaviour(late, (4, 45)), generate_behaviour(late, (4, 46))
    >>> (b45.all_logits, b45.float_logits), (b46.all_logits, b46.float_logits)
    ((True, True), (True, False))
    """
    if version is None:
        return GenerateBehaviour(False, False, traits.head_on_every_position, False)
    # ``LOGITS_TO_KEEP_SINCE`` for most families; a family whose forward took it later says so
    # (``Traits.logits_to_keep_since``: Qwen2-VL 5.0, Qwen2.5-VL 4.54)
    since = max(LOGITS_TO_KEEP_SINCE, traits.logits_to_keep_since)
    all_logits = version < since or traits.head_on_every_position
    static = bool(traits.static_hybrid_cache_before) and version < traits.static_hybrid_cache_before
    sliding: SlidingCache = ("static" if static else "all" if version < SLIDING_WINDOW_CACHE_SINCE else "window")
    return GenerateBehaviour(
        sliding_cache=sliding,
        # a HybridCache is built by generate (or the model's forward) whatever the release's default cache
        legacy_cache=not static and version < traits.dynamic_cache_since,
        keeps_outputs=version < DEL_OUTPUTS_SINCE,
        all_logits=all_logits,
        float_logits=(all_logits and traits.upcasts_all_logits
                      and version < max(LOGITS_TO_KEEP_SINCE, traits.float_logits_before)),
    )


@dataclass
class InferenceResult:
    moments: list[Moment]
    peak: Moment
    assumptions: list[str]
    prompt_cache_bytes: int
    final_cache_bytes: int
    # blocks the caching allocator holds cached beyond the live tensors (analytic/generate_replay.py)
    fragmentation_bytes: int = 0


def cache_bytes(m: ModelSpec, batch: int, tokens: int, c: int, tp: int, kv_dtype: str, prefill: bool,
                sliding: SlidingCache = "window") -> int:
    """DynamicCache bytes for ``batch`` sequences of ``tokens`` tokens on one rank.

    Full-attention layers hold every token.  Sliding layers hold their window at decode, but
    during prefill the view keeps the whole prompt's storage alive; before transformers 4.56 (``sliding`` "all")
    they held every token like the others.  A HybridCache (``sliding`` "static") is allocated before the prefill
    for ``tokens`` slots on full layers and ``min(window, tokens)`` on sliding ones (``HybridCache.__init__``,
    cache_utils.py 4.50.0:1711: ``max_cache_len = min(self.config.sliding_window, max_cache_len)`` for a sliding
    layer), whatever the step.

    Gemma 2 2B (26 layers, 13 sliding with a 4,096 window, 4 KV heads x 256, bf16: 4,096 B per token and layer),
    one sequence, 2,048 prompt + 8,192 new tokens, "static": 13 x 10,240 x 4,096 + 13 x 4,096 x 4,096 =
    763,363,328 B from the prefill on.
    """
    spec = kv_spec(m, kv_dtype, c, tp)
    total = 0
    for la in spec.layers:
        if la.window is None:
            held = tokens
        elif sliding == "static":
            held = min(tokens, la.window)
        else:
            held = tokens if (prefill or sliding == "all") else min(tokens, la.window)
        total += held * spec.layer_bytes_per_token(la)
    return total * batch


def beam_state_bytes(rows: int, max_length: int, decoder_prompt: int, decode: bool) -> int:
    """Beam search's token and beam-index buffers over ``rows`` = batch x num_beams sequences of ``max_length``
    tokens, ``decoder_prompt`` of them given (transformers 5.24 ``GenerationMixin._beam_search``).

    Before the prefill (``decode`` False): ``running_sequences`` and its clone ``sequences`` (int64, rows x
    max_length each) and ``running_beam_indices`` and its clone ``beam_indices`` (int32, rows x (max_length -
    decoder_prompt) each): 16 rows L + 8 rows G, G = max_length - decoder_prompt.
    At a step's ``_update_finished_beams`` (``decode`` True), in rows x L int64: ``sequences`` 1, the next
    ``running_sequences`` 1, ``topk_running_sequences`` 2 (2 x num_beams candidates: one EOS id), ``merged_sequences``
    3 (``torch.cat`` of the finished and the candidates), its gather 1, and ``flat_running_sequences`` 1 (the
    reshape of a non-contiguous slice copies it, kept until the next step): 9 x 8 = 72 rows L; the int32 beam
    indices likewise without the flat copy, 8 x 4 = 32 rows G.  The scores (rows floats) are negligible.

    Batch 2 x 4 beams, prompt 512, 512 new tokens: 72 x 8 x 1,024 + 32 x 8 x 512 = 720,896 B.
    """
    generated = max_length - decoder_prompt
    if not decode:
        return 16 * rows * max_length + 8 * rows * generated
    return 72 * rows * max_length + 32 * rows * generated


def logits_bytes(m: ModelSpec, batch: int, c: int, tp: int) -> int:
    """Last-position logits (c), their fp32 copy (4) and the sampling temporaries, per row.

    Llama-3-8B, batch 8: 8 * 128,256 * (2 + 4 + 26) B = 32.8 MB.  The LM head output is
    gathered to the whole vocabulary under tensor parallelism.
    """
    return batch * m.vocab_size * (c + 4 + SAMPLING_BYTES_PER_ENTRY)


# Family differences in the prefill's live tensors are traits (``ModelSpec.traits``): a softmax in the compute
# dtype (GPT-2's ``eager_attention_forward``, Falcon), the attention output kept through the MLP (``GPT2Block``),
# and the hidden-sized tensors alive through the MLP (Llama 3; GPT-2 4; StableLM 5, see
# ``Traits.hidden_kept_through_mlp``).
# MLP activations written as a chain of elementwise ops: ``NewGELUActivation`` (gelu_new) computes
# 0.5 x, x ** 3, 0.044715 x ** 3 ... with the fc output: four I-sized tensors alive at once
CHAINED_ACTIVATIONS = frozenset({"gelu_new", "gelu_fast"})


def _grouped_experts_width(m: ModelSpec, tp: int) -> int:
    """Elements per token alive at once in transformers 5's ``grouped_mm_experts_forward`` (integrations/moe.py).

    All T x k routed rows go through one grouped GEMM per projection.  Per routed row (h hidden, I one
    expert's intermediate width):

    * at the gating: the gathered input (``selected_hidden_states_g``, bound to the end: h), the gate/up
      output (2I), and the gating's live tensors: SiLU's output and the product (2I), or gpt-oss's
      ``_apply_gate`` (the two clamped halves, ``glu``, ``up + 1`` and the product: 5I) together with the
      gathered gate/up biases (``selected_biases``, 2I, bound until the down projection rebinds it);
    * at the end: the gathered input, the down output, ``proj_out * sample_weights_g`` and its
      ``[inv_perm]`` copy (4h), plus gpt-oss's gathered down biases (h).

    Plus the router logits (E).  Example, Mixtral-8x7B (h 4096, I 14336, top-2, 8 experts):
    2 x (4096 + 4 x 14336) + 8 = 122,888 elements per token.

    Plain experts (``has_gate=False``, Nemotron 3): the up output (I) and the activation's (ReLU^2: the ReLU output,
    then the square while it is bound: 2I) beside the gathered input, h + 3I at most.
    """
    assert m.moe is not None
    e = m.moe
    h, ei = m.hidden_size, ceil_div(e.expert_intermediate_size, tp)
    if not e.gated:
        gate, tail = h + 3 * ei, 4 * h
    elif m.traits.clamped_glu_experts:
        gate, tail = h + 2 * ei + 2 * ei + 5 * ei, 5 * h
    else:
        gate, tail = h + 2 * ei + 2 * ei, 4 * h
    return e.top_k * max(gate, tail) + e.num_experts


def _mlp_width(m: ModelSpec, tp: int, grouped: bool = True) -> int:
    """I-sized tensors alive at once inside the MLP, times I (per token).  ``grouped``: transformers 5's fused
    experts (grouped GEMMs over all routed rows); else the experts loop of 4.x (and of bitsandbytes'
    per-expert linears)."""
    if m.moe is not None:
        if grouped:
            # the shared expert: a gated MLP's 3 I, or a plain one's (ReLU^2: the fc output, the ReLU output and its
            # square, 3 I as the dense branch below says)
            return max(_grouped_experts_width(m, tp), 3 * ceil_div(m.moe.shared_intermediate_size, tp))
        # routed experts run one after another on their tokens; the widest live set is one
        # expert's gated MLP over (at most) all tokens plus the router logits
        per = 3 * ceil_div(m.moe.expert_intermediate_size, tp) + m.moe.num_experts
        return max(per, 3 * ceil_div(m.moe.shared_intermediate_size, tp))
    inter = ceil_div(max(ls.intermediate_size for ls in m.layers), tp)
    if m.mlp_gated and m.traits.fused_gate_up:
        # Phi3MLP / GlmMLP (transformers 5.24 modeling_phi3.py lines 59-64): gate_up_proj's output (2 I, gate and up
        # its views, bound until the return), act(gate) and the product
        return 4 * inter
    if m.mlp_gated:
        return 3 * inter  # act(gate), up and their product (LlamaMLP)
    if m.hidden_act in ("quick_gelu", "relu2"):
        # QuickGELUActivation (transformers 5.24 activations.py): input * torch.sigmoid(1.702 * input); during the
        # sigmoid the fc output, 1.702 x and the sigmoid are alive, then the fc output, the sigmoid and the product.
        # ReLUSquaredActivation: relu(input), then torch.square of it while the fc output is alive
        return 3 * inter
    return (4 if m.hidden_act in CHAINED_ACTIVATIONS else 2) * inter  # fc output and the activation's


def kept_embeddings_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """The embedding output, bound to ``inputs_embeds`` in the decoder's ``forward`` for the whole layer loop.

    ``LlamaModel.forward`` (and every decoder in transformers 5) does ``inputs_embeds =
    self.embed_tokens(input_ids)`` and then ``hidden_states = inputs_embeds``; the loop rebinds
    ``hidden_states`` but ``inputs_embeds`` keeps the first tensor alive until the forward returns:
    b p h c.  Learned positions add their embedding of the positions (one row per position,
    batch 1: ``wpe(position_ids)``): p h c.  Llama-3-8B, 8 x 1024 tokens, bf16: 8 x 1024 x 4096 x 2
    = 67,108,864 B.
    """
    out = batch * prompt * m.hidden_size * c
    if m.mamba is not None and m.mamba.shared_attention_layers:
        # Zamba2Model.forward also keeps ``original_hidden_states = torch.clone(inputs_embeds)`` for its shared
        # blocks' input (modeling_zamba2.py, transformers 5.24): a second b p h c
        out *= 2
    if m.position == "learned":
        out += prompt * m.hidden_size * c
    return out


def rope_bytes(m: ModelSpec, prompt: int, c: int) -> int:
    """RoPE's cos and sin for the prompt, shared by all layers: 2 p d c.

    ``LlamaRotaryEmbedding.forward`` computes them in fp32 for ``position_ids`` (batch 1 in
    ``generate``: ``cache_position.unsqueeze(0)``) and returns ``cos.to(x.dtype)``,
    ``sin.to(x.dtype)``; the fp32 intermediates are freed.  1024 tokens, head_dim 128, bf16:
    2 x 1024 x 128 x 2 = 524,288 B.  A partial rotary (``partial_rotary_factor``: GLM's 0.5) makes them over the
    rotated dims only (``Glm4RotaryEmbedding``: ``dim = int(head_dim * partial_rotary_factor)``).
    """
    return 2 * prompt * int(m.head_dim * m.partial_rotary_factor) * c if m.position == "rope" else 0


def softmax_bytes_per_score(m: ModelSpec, dtype: str) -> int:
    """Bytes per attention score alive at eager attention's peak, for a ``dtype`` forward.

    Upcasting models (``softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)``): the
    masked scores (c) and the fp32 softmax output (4), plus the fp32 copy of the input that ATen's
    ``softmax`` makes (aten/src/ATen/native/SoftMax.cpp) unless the input is fp16 on CUDA, which
    runs the fused half-to-float kernel, or already fp32: bf16 2 + 4 + 4 = 10, fp16 6, fp32 8.
    Compute-dtype softmax (GPT-2, Falcon): the matmul output and its scaled or masked copy, 2c.
    """
    c = dtype_bits(dtype) // 8
    if m.traits.eager_softmax_compute_dtype:
        return 2 * c
    if m.attention_sinks:
        # gpt-oss (modeling_gpt_oss.py ``eager_attention_forward``): the masked scores stay bound to
        # ``attn_weights`` while ``torch.cat`` appends the sink column, the max is subtracted (a new tensor)
        # and the softmax runs in the scores' dtype: three compute-dtype tensors per score
        return 3 * c
    return c + 4 + (4 if dtype == "bf16" else 0)


# ---- Lit-GPT (``framework: lightning``) -------------------------------------------------------------
#
# Lit-GPT's generate/base.py (Lightning-AI/lit-gpt, October 2023, commit 8641822 of the resource tables)
# runs its own GPT, not transformers, and quantizes through Lightning Fabric's ``BitsandbytesPrecision``:
#
# * lit_gpt/model.py ``GPT.__init__`` builds ``lm_head = nn.Linear(n_embd, padded_vocab_size)`` next to
#   ``transformer.wte = nn.Embedding(...)``: the head is its own parameter even for checkpoints that tie it
#   (Falcon), and it is an ``nn.Linear``;
# * lightning/fabric/plugins/precision/bitsandbytes.py swaps every ``torch.nn.Linear`` created under
#   ``fabric.init_module`` for a bitsandbytes linear (``_ClassReplacementContextManager``; ``ignore_modules``
#   is empty unless given, and Lit-GPT gives none), so the LM head is quantized too, unlike transformers'
#   integration, which skips it;
# * its ``_Linear4bit`` quantizes ``weight.contiguous().to(device="cuda", dtype=torch.half)`` (the comment
#   there points at bitsandbytes 0.41.0 ``Params4bit.cuda``), so the quantization state records fp16 and
#   bitsandbytes' ``MatMul4Bit.forward`` (multi-token inputs) runs ``F.dequantize_4bit(B, state).to(A.dtype)``:
#   an fp16 [out, in] weight, then its copy in the bf16 compute dtype, both alive during the cast;
# * ``model.max_seq_length = prompt + max_new_tokens`` and ``model.set_kv_cache(batch_size=1)`` preallocate
#   every layer's ``KVCache`` buffers (``torch.zeros(B, heads, max_seq_length, head_size)``) before the
#   prompt runs, written in place by ``index_copy_``; ``build_kv_cache`` takes ``heads = 1 if
#   n_query_groups == 1 else n_head``: grouped-query models cache K and V expanded to every query head
#   (``CausalSelfAttention.forward`` expands them before the cache).


def litgpt_head_params(m: ModelSpec, rank_lm_head: int, tp: int) -> int:
    """Elements of Lit-GPT's LM head on one rank: its own ``nn.Linear`` even when the checkpoint ties it.

    Falcon-40B (tied in transformers): 65,024 x 8,192 = 532,676,608 elements that transformers shares
    with the input embedding and Lit-GPT holds a second time.
    """
    return rank_lm_head if rank_lm_head else ceil_div(m.vocab_size, tp) * m.hidden_size


def litgpt_kv_bytes(m: ModelSpec, batch: int, tokens: int, elem: int, tp: int) -> int:
    """Lit-GPT's preallocated KV cache: every layer's K and V for ``tokens`` positions, K/V heads expanded.

    ``heads`` is 1 for multi-query models and the number of query heads otherwise.  Llama-2-70B (64
    heads, 8 KV groups, head_size 128, 80 layers), 58 positions, bf16: 80 x 2 x 64 x 58 x 128 x 2 B
    = 152,043,520 B, where transformers' cache of the 8 KV heads would take 19,005,440 B.
    """
    heads = 1 if m.num_kv_heads == 1 else m.num_attention_heads
    return m.num_layers * 2 * batch * ceil_div(heads, tp) * tokens * m.head_dim * elem


def bnb_compute_dtype(model_dtype: str, configured: str | None) -> str:
    """The dtype bitsandbytes' 4-bit linears compute in.

    ``Linear4bit.set_compute_type`` (bitsandbytes/nn/modules.py, since 0.41.0) runs on a layer's first
    call: an fp32 or bf16 input's dtype becomes the compute dtype; an fp16 input keeps the configured one
    (transformers' ``bnb_4bit_compute_dtype``, fp32 by default: bitsandbytes then warns of slow
    inference).  The hidden states reach the linears in the model's dtype.

    >>> bnb_compute_dtype("fp16", "fp32"), bnb_compute_dtype("bf16", "fp32"), bnb_compute_dtype("fp16", None)
    ('fp32', 'bf16', 'fp16')
    """
    if model_dtype in ("fp32", "bf16") or configured is None:
        return model_dtype
    return configured


def bnb_dequant_bytes(largest: int, quant: str, state_dtype: str, compute_dtype: str) -> int:
    """The dequantized weight of the largest bitsandbytes linear during a multi-token forward.

    4-bit: ``MatMul4Bit.forward`` runs ``linear(A, F.dequantize_4bit(B, state).to(A.dtype).t())``;
    ``dequantize_4bit`` returns the dtype the weight was quantized from (``state_dtype``: the load dtype
    with transformers, fp16 with Lightning's plugin), and ``.to`` copies it into the compute dtype unless
    they are the same, both alive during the cast.  8-bit (``Linear8bitLt``): one copy in ``state_dtype``.
    Llama-2-7B's Lit-GPT head (131,072,000 weights) from fp16 into bf16: 131,072,000 x (2 + 2) =
    524,288,000 B.  OctoCoder's 6,144 x 24,576 ``c_fc`` loaded in fp16 under the default fp32 compute dtype:
    150,994,944 x (2 + 4) = 905,969,664 B, where an fp16 compute dtype needs 301,989,888 B.
    """
    q = dtype_bits(state_dtype) // 8
    if quant in BNB_4BIT_FORMATS and compute_dtype != state_dtype:
        return largest * (q + dtype_bits(compute_dtype) // 8)
    return largest * q


def _falcon_eager_prefill(m: ModelSpec, t: int, h: int, q: int, kv: int, batch: int, heads: int, prompt: int,
                          c: int) -> tuple[int, int]:
    """Falcon's eager prefill layer (``Traits.eager_probs_kept_by_loop``): the attention's bytes, and what the MLP's
    moment holds more."""
    # Falcon (``Traits.eager_probs_kept_by_loop``), at the softmax: the layer input, the LayerNorm's output and the
    # rotated query (2h + q); the fused query_key_value output, which ``fused_qkv`` keeps (q + 2kv); no K/V
    # repeat (matmul broadcasts the one head; its per-head copy at b > 1 is freed inside the matmul); per score,
    # the raw scores (bound), their masked copy, the softmax output and the previous block's probabilities,
    # kept by the model's loop: 4 c.  Through the MLP the block's own probabilities and the previous block's
    # (2 c per score).  Traced on the meta device (transformers 5.24 Falcon-7B, tests/test_falcon_mqa_saved.py)
    masks = len({ls.sliding_window for ls in m.layers}) * batch * prompt * prompt * c
    attn = (2 * h + 2 * q + 2 * kv) * t * c + 4 * batch * heads * prompt * prompt * c + masks
    extra = 2 * batch * heads * prompt * prompt * c + masks
    return attn, extra


def _mqa_math_prefill(t: int, h: int, q: int, kv: int, batch: int, heads: int, prompt: int, c: int) -> int:
    """Falcon's one K/V head on SDPA's math kernel during prefill: the attention's bytes."""
    # FalconAttention's one K/V head on SDPA's math kernel (analytic/attention.py ``mqa_math``), at the softmax:
    # the layer input, the LayerNorm's output and the rotated query (2h + q, compute dtype); the fused
    # query_key_value output, which ``fused_qkv`` keeps until the attention returns (q + 2kv); the kernel's
    # fp32 copies of q, k, v (4q + 8kv: ``.to(kFloat)``, C++ locals alive to its end) and its scaled query
    # (4q; the scaled keys and their per-head copy are freed by the first matmul); the fp32 scores and the
    # softmax output with one byte per score more below the dispatcher (9 b heads p^2, as the grouped case
    # measured); the model's boolean causal mask [p, p] and SDPA's conversion of it to the query dtype,
    # expanded to the batch (p^2 + b p^2 c).  Traced on the meta device (transformers 5.24 Falcon-7B):
    # every tensor but the one byte per score
    attn = (2 * h + q + q + 2 * kv) * t * c + (8 * q + 8 * kv) * t + 9 * batch * heads * prompt * prompt
    attn += prompt * prompt + batch * prompt * prompt * c
    return attn


def prefill_layer_bytes(r: Resolved, batch: int, prompt: int, c: int, tp: int, attention: str,
                        keys: int | None = None, causal: bool = True) -> int:
    """The running layer's own live tensors during prefill (beyond the shared ones, weights, cache, logits).

    Per token (h hidden, q the query width, kv the key/value width on this rank):

    * MLP: the layer's input (still bound to ``hidden_states`` in the decoder loop), the residual
      after attention, the normalised input and the MLP's I-sized tensors (``_mlp_width``);
      GPT-2 also keeps the attention output, StableLM its normalised input as well
      (``Traits.hidden_kept_through_mlp``): 3h (4h, 5h) + width;
    * RMSNorm (half dtypes): the layer input, the residual and the fp32 upcast and product (2hc + 8h);
    * attention, sdpa/flash: the layer input and the normalised input (2h), the rotated queries
      (q), the attention output and its contiguous copy (2q), o_proj's output (h);
    * eager attention adds to the MLP's moment the attention probabilities (b heads p^2 c), which
      the decoder layer keeps bound to ``_``, and the 4-D mask (b p^2 c), kept by the model;
    * attention, eager: the layer input and normalised input (2h), the rotated queries (q, or the
      fused c_attn output q + 2kv for GPT-2), ``repeat_kv``'s copies of K and V to every query head
      (2q) when 1 < kv heads < heads (one K/V head: ``repeat_kv`` returns a stride-0 view, no copy), the 4-D additive mask (b p^2 c) and the scores
      (b heads p^2 ``softmax_bytes_per_score``).

    ``keys``: the key slots (default the prompt); a HybridCache (< 4.56, ``GenerateBehaviour.sliding_cache``
    "static") hands the attention its whole buffer (``HybridCache.update`` returns ``k_out`` of ``max_cache_len``);
    ``causal``: False when the caller hands the math kernel a mask it counts itself (``tower_forward_bytes``)."""
    m = r.model
    t = batch * prompt
    h = m.hidden_size
    heads = ceil_div(m.num_attention_heads, tp)
    kv_heads = max(1, ceil_div(m.num_kv_heads, tp))
    q = heads * (m.q_width // max(1, m.num_attention_heads))
    kv = kv_heads * m.head_dim if m.mla is None else ceil_div(m.kv_width, tp)
    hidden_kept = m.traits.hidden_kept_through_mlp
    s = r.scenario
    # DBRX's experts loop over their slices in every release (Traits.sliced_expert_loop)
    grouped = (s.software.fused_moe_experts and not quantized_expert_loop(m, s.inference.quantization)
               and not m.traits.sliced_expert_loop)
    mlp = (hidden_kept * h + _mlp_width(m, tp, grouped)) * t * c
    if attention == "eager" and m.traits.eager_probs_kept_by_loop:
        attn, extra = _falcon_eager_prefill(m, t, h, q, kv, batch, heads, prompt, c)
        mlp += extra
    elif attention == "eager":
        attn, kept = _eager_prefill(r, batch, prompt, prompt if keys is None else keys, c, (h, q, kv, heads, kv_heads))
        mlp += kept
    elif attention == "math" and mqa_math(m):
        attn = _mqa_math_prefill(t, h, q, kv, batch, heads, prompt, c)
    elif attention == "math":
        # SDPA's math kernel on grouped K/V (analytic/attention.py ``gqa_math_fallback``), at its softmax: the
        # layer input, the normalised input and the rotated queries (2h + q, compute dtype); the fp32 scaled
        # query, scaled repeated keys and repeated values (3 x 4q, ``_scaled_dot_product_attention_math``
        # upcasts half inputs); the fp32 scores and the softmax's output (2 x b heads p^2 x 4); one byte per
        # score more that the softmax holds below the dispatcher (measured on an H200, torch 2.11: max_memory_
        # allocated exceeded every tensor the dispatcher saw by b heads p^2 + cuBLAS' workspace on both fp32
        # GQA prompts of benchmarks/gpu/h200-2026-11-26-check, 1,645,612,488 and 438,242,728 B; one bool per
        # score, as ``_safe_softmax``'s all -inf row check would hold, though which kernel allocates it was not
        # read in torch's source); and the causal mask it builds for is_causal, bool then the query dtype
        # ([p, p]: 1 + 4 bytes per key and query)
        attn = (2 * h + q) * t * c + 12 * q * t + 9 * batch * heads * prompt * prompt + 5 * prompt * prompt * causal
    else:
        # + repeat_kv's copies of K and V before SDPA in transformers < 4.54 (analytic/attention.py)
        attn = (3 * h + 3 * q) * t * c + (2 * q * t * c if attention == "sdpa" and keys is None and sdpa_repeats_kv(r.scenario, m) else 0)
        if keys is not None and attention == "sdpa":
            # over a HybridCache the model builds one 4-D mask of every slot (Gemma2Model._update_causal_mask,
            # modeling_gemma2.py 4.45.0:939-952: target_length = past_key_values.get_max_length()), kept for all
            # layers; with a mask the SDPA path's repeat_kv copies K and V to every query head over every slot
            attn += batch * prompt * keys * c + (2 * q * batch * keys * c if 1 < kv_heads < heads else 0)
            mlp += batch * prompt * keys * c
        if m.traits.sdpa_mask_always:
            # a mask on every forward (PaliGemma's prefix LM): K and V repeated to every head (2q), the boolean
            # [b, 1, p, p] mask the model keeps for all layers and its copy in the query dtype SDPA makes for the
            # memory-efficient kernel (aten ``convert_boolean_attn_mask``); the boolean one is alive through the MLP
            kept_mask = batch * prompt * prompt
            attn += 2 * q * t * c + kept_mask + batch * prompt * prompt * c
            mlp += kept_mask
    norm = 0
    if m.norm in ("rms", "rms_fp32") and c < 4:
        # the post-attention RMSNorm (``LlamaRMSNorm``: ``hidden_states.to(torch.float32)``, then
        # ``hidden_states * torch.rsqrt(variance + eps)``): the layer input and the residual (2 h c) with
        # the fp32 copy and its normalised fp32 product (8 h).  Tensor parallelism divides the MLP's and
        # the attention's widths but not this, so at tp >= 4 it can be the layer's largest moment
        norm = (2 * c + 8) * h * t
    return max(mlp, attn, norm)


def prefill_transient_bytes(r: Resolved, batch: int, prompt: int, c: int, tp: int, attention: str) -> int:
    """Everything alive during prefill beyond weights, cache and logits: the shared tensors and the layer's."""
    m = r.model
    return (kept_embeddings_bytes(m, batch, prompt, c) + rope_bytes(m, prompt, c)
            + prefill_layer_bytes(r, batch, prompt, c, tp, attention))


@dataclass(frozen=True)
class GenerateCall:
    """One ``generate`` call as the terms below read it: the scenario and what follows from it once."""

    r: Resolved
    rp: RankParams          # this rank's parameters (tensor and expert parallelism applied)
    c: int                  # bytes per element of the compute dtype
    tp: int
    batch: int
    prompt: int
    new: int                # new tokens
    lit: bool               # Lit-GPT's own generate loop (``framework: lightning``)
    attention: str          # the attention kernel that runs
    gen: GenerateBehaviour  # what the transformers release keeps alive
    beams: int = 1          # num_beams: ``batch`` is the rows, batch_size x num_beams

    @classmethod
    def of(cls, r: Resolved) -> GenerateCall:
        s, m = r.scenario, r.model
        inf = s.inference
        lit = s.effective_framework == "lightning"
        if lit and inf.num_beams > 1:
            raise ScenarioError([Problem("inference.num_beams", f"is {inf.num_beams}: Lit-GPT's generate "
                                         "(litgpt/generate/base.py) samples one sequence per prompt and has no beam "
                                         "search", "set inference.num_beams: 1, or framework: hf-trainer to run "
                                         "transformers' generate")])
        # a family without an SDPA path falls back to eager attention (transformers' ``_supports_sdpa``)
        attention: str = "eager" if inf.attention == "eager" or falls_back_to_eager(inf.attention, m, s.software.transformers_version) else inf.attention
        if attention == "sdpa" and (gqa_math_fallback(s, m, dtype_bits(inf.dtype) // 8, r.gpu)
                                    or bf16_math_fallback(inf.dtype, r.gpu) or mqa_math(m)):
            attention = "math"
        return cls(
            r=r, rp=rank_params(m, s.parallel.tp, 1, s.parallel.ep, 0, None), c=dtype_bits(inf.dtype) // 8,
            tp=s.parallel.tp, batch=inf.batch_size * inf.num_beams, prompt=inf.prompt_len, new=inf.new_tokens, lit=lit,
            attention=attention,
            # Lit-GPT runs its own generate loop: transformers' release does not apply
            gen=generate_behaviour(m.traits, None if lit else s.software.transformers_version),
            beams=inf.num_beams,
        )

    @property
    def sequences(self) -> int:
        """The prompts: batch_size (``batch`` is the rows, batch_size x num_beams)."""
        return self.batch // self.beams

    @property
    def m(self) -> ModelSpec:
        return self.r.model

    @property
    def quant(self) -> str:
        return self.r.scenario.inference.quantization

    @property
    def kv_dtype(self) -> str:
        return self.r.scenario.inference.kv_cache_dtype

    def cross(self) -> CrossImages | None:
        """The call's images through a cross-attention model's vision model (None: no such model or no image)."""
        return cross_images(self.m, self.batch, self.r.scenario.inference.images_per_sample)

    @property
    def static_slots(self) -> int:
        """A HybridCache's slots per sequence: ``max_length - 1`` from 4.49 (``max_cache_length =
        generation_config.max_length - 1``, generation/utils.py 4.50.0:2188), ``max_length`` before."""
        v = self.r.scenario.software.transformers_version
        return self.prompt + self.new - (1 if v is not None and v >= (4, 49) else 0)

    @property
    def sliding_cache(self) -> SlidingCache:
        """The release's ``GenerateBehaviour.sliding_cache`` for a model with sliding-window layers; "window" (no
        difference between releases) for one without."""
        return self.gen.sliding_cache if any(ls.sliding_window for ls in self.m.layers) else "window"

    def cache(self, tokens: int, prefill: bool) -> int:
        """transformers' ``DynamicCache`` of the batch at ``tokens`` tokens (``cache_bytes``); a release's
        HybridCache holds the whole call's slots from the start (``sliding_cache``)."""
        mode = self.sliding_cache
        if mode == "static":
            return cache_bytes(self.m, self.batch, self.static_slots, self.c, self.tp, self.kv_dtype, False,
                               "static")
        return cache_bytes(self.m, self.batch, tokens, self.c, self.tp, self.kv_dtype, prefill, mode)


@dataclass(frozen=True)
class CallTerms:
    """The terms the moments of one call share, each computed once."""

    weights: int
    largest_linear: int      # elements of the largest linear weight (bitsandbytes dequantizes it)
    kv_prompt: int           # the cache after the prompt
    kv_final: int            # the cache at the last decode step
    logits: int              # last-token logits, their fp32 copy and sampling (``logits_bytes``)
    cublas: int
    prompt_logits_peak: int  # every prompt position's logits at the upcast (``prompt_logits_terms``)
    prompt_logits_kept: int  # ... and what ``outputs`` keeps of them afterwards
    ssm_state: int = 0       # a hybrid model's mixer state, every sequence (``analytic/ssm_state.py``)
    kv_cross: int = 0        # a cross-attention model's image keys and values (``analytic/cross_attention.py``)
    beam_prefill: int = 0    # beam search's buffers before the prefill (``beam_state_bytes``)
    beam_decode: int = 0     # ... and at a decode step's update of the finished beams
    hf_rope: int = 0         # older transformers' per-layer rotary buffers (analytic/hf_buffers.py)
    hf_mask: int = 0         # ... and 4.38's causal_mask buffer
    release_mask: int = 0    # ... and the (batch, 1, P, P) mask 4.38 makes from it at every forward


def hf_buffer_terms(g: GenerateCall) -> tuple[int, int]:
    """The buffers ``software.transformers`` registers at construction (analytic/hf_buffers.py), in the model's
    dtype, on this rank (every layer: tensor parallelism leaves buffers whole); none for Lit-GPT's own model."""
    s = g.r.scenario
    version = s.software.transformers_version
    if g.lit or s.effective_framework in OWN_MODEL_FRAMEWORKS or version is None:
        return 0, 0
    return (rope_cache_bytes(g.m, version, len(g.rp.layers) or g.m.num_layers, g.c),
            causal_mask_buffer_bytes(g.m, version))


def repeated_kv_bytes(g: GenerateCall, tokens: int) -> int:
    """A decode step's ``repeat_kv`` of one layer's cache under SDPA in transformers before 4.54
    (``sdpa_repeats_kv``): the keys and the values repeated to every query head over the cached tokens, both alive
    at the kernel, 2 x batch x tokens x q width x c; 0 otherwise."""
    if g.attention != "sdpa" or g.lit or not sdpa_repeats_kv(g.r.scenario, g.m):
        return 0
    q = ceil_div(g.m.num_attention_heads, g.tp) * g.m.head_dim
    return 2 * g.batch * tokens * q * g.c


def add_weights(mo: Moment, t: CallTerms) -> None:
    """The weights on this rank and the buffers the model holds beside them."""
    mo.add(K.PARAMETERS, t.weights)
    mo.add(K.HF_ROPE_BUFFERS, t.hf_rope)
    mo.add(K.HF_CAUSAL_MASK, t.hf_mask)


def weights_term(g: GenerateCall) -> tuple[int, int]:
    """The weights on this rank (``weights_bytes``) and the largest linear weight's elements.

    Lit-GPT's own LM head replaces transformers' in both figures (``litgpt_head_params``).
    """
    weights = weights_bytes(g.rp, g.c, g.quant)
    largest = g.rp.largest_linear
    if g.lit:
        # Lit-GPT's own LM head, quantized with the other linears by BitsandbytesPrecision (see above)
        head = litgpt_head_params(g.m, g.rp.lm_head, g.tp)
        head_q = g.quant in BNB_FORMATS
        head_bytes = quantized_linear_bytes(head, ceil_div(g.m.vocab_size, g.tp), g.quant) if head_q else head * g.c
        weights += head_bytes - g.rp.lm_head * g.c
        if head_q:
            largest = max(largest, head)
    return weights, largest


def kv_terms(g: GenerateCall) -> tuple[int, int]:
    """The KV cache after the prompt and at the last decode step (cache length p + n - 1)."""
    if g.lit:
        # preallocated for prompt + new tokens before the prompt runs, written in place (no growth)
        elem = kv_elem_bytes(g.kv_dtype, g.c)
        kv = litgpt_kv_bytes(g.m, g.batch, g.prompt + g.new, elem, g.tp)
        return kv, kv
    return g.cache(g.prompt, prefill=True), g.cache(max(g.prompt, g.prompt + g.new - 1), prefill=False)


def hqq_dequant_bytes(largest: int, dtype: str) -> int:
    """HQQ's dequantized weight of the largest linear, at every forward (prefill and decode alike).

    hqq 0.2.8 ``HQQLinear.forward_pytorch_backprop`` -> ``matmul`` -> ``dequantize`` -> ``Quantizer.dequantize``:
    ``W_r`` (the unpacked codes in the compute dtype, ``[numel / group, group]``), then
    ``((W_r - zero) * scale)``: the difference and the product are new tensors of the same size while ``W_r`` is
    still bound, three copies at once in the compute dtype (the model's dtype).  A 4096 x 4096 linear in fp16:
    16,777,216 x 3 x 2 = 100,663,296 B.

    >>> hqq_dequant_bytes(4096 * 4096, "fp16")
    100663296
    """
    return quant_format("hqq-4bit").forward_weight_copies * largest * (dtype_bits(dtype) // 8)


def _forward_weight_copies(quant: str) -> int:
    """The format's whole-weight copies at every forward (``QuantFormat.forward_weight_copies``; 0 unquantized)."""
    return quant_format(quant).forward_weight_copies if quant != "none" else 0


def dequant_term(g: GenerateCall, largest_linear: int) -> int:
    """bitsandbytes' dequantized weight during the multi-token prefill (``bnb_dequant_bytes``), HQQ's
    (``hqq_dequant_bytes``) and torchao int8 weight-only's cast copy at every forward; else 0."""
    if copies := _forward_weight_copies(g.quant):
        # the row's whole-weight copies in the model's dtype (facts/quantization.py; HQQ: hqq_dequant_bytes)
        return copies * largest_linear * (dtype_bits(g.r.scenario.inference.dtype) // 8)
    if g.quant not in BNB_FORMATS or g.batch * g.prompt <= 1:
        return 0
    # bitsandbytes dequantizes a layer's weight for multi-token inputs (bnb_dequant_bytes)
    # the weights are quantized from the load dtype, from fp16 by Lightning's plugin (see above)
    inf = g.r.scenario.inference
    compute = bnb_compute_dtype(inf.dtype, inf.bnb_compute_dtype)
    return bnb_dequant_bytes(largest_linear, g.quant, "fp16" if g.lit else inf.dtype, compute)


def prompt_logits_terms(g: GenerateCall) -> tuple[int, int]:
    """The prompt's logits when the prefill computes them all (releases before 4.45): (at the upcast, kept).

    The head's output (c) and its fp32 copy at the upcast, then the copy alone (kept by ``outputs``);
    the last row's processing is as in ``logits_bytes``.  (0, 0) when only the last position is computed.
    """
    if not g.gen.all_logits:
        return 0, 0
    every = g.batch * g.prompt * g.m.vocab_size
    peak = every * (g.c + 4 if g.gen.float_logits and g.c < 4 else g.c)
    return peak, every * (4 if g.gen.float_logits else g.c)


def call_terms(g: GenerateCall) -> CallTerms:
    """The terms of ``g`` that the prefill and decode moments share."""
    weights, largest = weights_term(g)
    kv_prompt, kv_final = kv_terms(g)
    prompt_peak, prompt_kept = prompt_logits_terms(g)
    beam = beam_terms(g, g.prompt + g.new, g.prompt)
    rope, mask = hf_buffer_terms(g)
    # 4.38's _update_causal_mask: the buffer repeated over the rows in the model's dtype at every forward (eager and
    # SDPA; flash-attention-2 returns before it), alive while the forward runs
    four_d = g.batch * g.m.max_position_embeddings ** 2 * g.c if mask and g.attention != "flash" else 0
    return CallTerms(weights=weights, largest_linear=largest, kv_prompt=kv_prompt, kv_final=kv_final,
                     logits=call_logits_bytes(g), cublas=cublas_workspace_bytes(g.r.gpu, handles=1),
                     prompt_logits_peak=prompt_peak, prompt_logits_kept=prompt_kept,
                     ssm_state=ssm_state_bytes(g.m, g.batch, g.c), kv_cross=cross_kv_bytes(g.m, g.cross(), g.c),
                     beam_prefill=beam[0], beam_decode=beam[1], hf_rope=rope, hf_mask=mask, release_mask=four_d)


def beam_logits_bytes(g: GenerateCall) -> int:
    """Beam search's ``log_probs`` beside the call's logits (``BEAM_EXTRA_BYTES_PER_ENTRY``); 0 without beams."""
    return g.batch * g.m.vocab_size * BEAM_EXTRA_BYTES_PER_ENTRY if g.beams > 1 else 0


def call_logits_bytes(g: GenerateCall) -> int:
    """``logits_bytes`` of the call's rows, with beam search's ``log_probs`` (``beam_logits_bytes``)."""
    return logits_bytes(g.m, g.batch, g.c, g.tp) + beam_logits_bytes(g)


def beam_terms(g: GenerateCall, max_length: int, decoder_prompt: int) -> tuple[int, int]:
    """Beam search's buffers (``beam_state_bytes``) before the prefill and at a decode step; (0, 0) without beams."""
    if g.beams == 1:
        return 0, 0
    return (beam_state_bytes(g.batch, max_length, decoder_prompt, decode=False),
            beam_state_bytes(g.batch, max_length, decoder_prompt, decode=True))


def prefill_moment(g: GenerateCall, t: CallTerms) -> Moment:
    """The prefill's peak: the running layer's tensors, or the head's output once the layers are done.

    Both sides hold the weights, the prompt's cache and cuBLAS' workspace; the larger of (kept
    embeddings + RoPE + the running layer) and (final hidden states + logits) is the moment.
    """
    m, b, p, c = g.m, g.batch, g.prompt, g.c
    # a hybrid model's running layer is its attention layer's or its Mamba2 mixer's, the larger
    mixer = mixer_prefill_bytes(m, b, p, c)
    if (m.mamba is not None and m.mamba.kind == "mamba2"
            and mamba2_scan_broadcasts(g.r.scenario.software.transformers_version)):
        # before transformers 5.18 the scan also materializes its broadcast products, the largest while the scan's
        # other locals live (analytic/ssm_state.py ``broadcast_product_bytes``): counted over the locals at the
        # scan's end, a bound from above (some of them are made after the largest product is freed)
        mixer += broadcast_product_bytes(m.mamba, b, p)
    if m.mamba is not None and m.mamba.kind == "rwkv4":
        # an RWKV-4 block's term is the whole block's, its input included (analytic/ssm_state.py): no attention layer
        layer = mixer
    else:
        # a release's preallocated HybridCache gives the prefill's attention every key slot (``prefill_layer_bytes``)
        keys = g.static_slots if g.sliding_cache == "static" else None
        layer = max(prefill_layer_bytes(g.r, b, p, c, g.tp, g.attention, keys) + parallel_mixer_kept_bytes(m, b, p, c)
                    + shared_block_extra_bytes(m, b, p, c),
                    mixer + parallel_mixer_input_bytes(m, b, p, c) + shared_block_output_bytes(m, b, p, c))
    ci = g.cross()
    if ci is not None:
        layer = max(layer, _cross_running(g, ci, layer))
    embeds = kept_embeddings_bytes(m, b, p, c)
    rope = rope_bytes(m, p, c)
    kept = {}
    if m.altup is not None:
        # Gemma 3n (analytic/altup.py): its running layer holds AltUp's streams, and the model's forward keeps the
        # per-layer inputs, AltUp's projections, one cos/sin pair per layer type (modeling_gemma3n.py:1697) and,
        # under SDPA, the sliding layers' mask
        eager = (eager_kept_bytes(m, b, p, c, ceil_div(m.num_attention_heads, g.tp)) if g.attention == "eager"
                 else (0, 0))
        layer = altup_layer_bytes(m, b, p, c, prefill_layer_bytes(g.r, b, p, c, g.tp, g.attention), eager)
        rope *= len({ls.sliding_window for ls in m.layers})
        kept = {K.PER_LAYER_INPUTS: per_layer_inputs_bytes(m, b, p, c),
                K.ALTUP_EXPANSION: altup_expansion_bytes(m, b, p, c),
                K.SLIDING_MASK: sliding_sdpa_mask_bytes(m, p, g.attention)}
    # after the decoder's forward returns, its outputs keep the final hidden states (b p h c) while the LM
    # head runs on the last position; in fp32 under residual_in_fp32 (the final norm's fp32 input promotes its product)
    final_hidden = b * p * m.hidden_size * (4 if m.traits.residual_in_fp32 else c)
    prefill_logits = t.logits
    if g.lit:
        # Lit-GPT's ``GPT.forward`` returns ``lm_head(x)`` for every prompt position (b p V c); ``sample``
        # then takes ``logits[0, -1]``
        prefill_logits += b * p * ceil_div(m.vocab_size, g.tp) * c
    pre = Moment("prefill")
    add_weights(pre, t)
    pre.add(K.RELEASE_MASK, t.release_mask)
    pre.add(K.KV_PROMPT, t.kv_prompt)
    # every mixer's state, as after the last mixer layer (an upper bound while an earlier layer runs)
    pre.add(K.SSM_STATE, t.ssm_state)
    pre.add(K.MIXER_BUFFERS, mixer_buffer_bytes(m, c))
    _add_cross_kept(g, t, pre, p)
    if embeds + rope + sum(kept.values()) + layer >= final_hidden + prefill_logits + t.prompt_logits_peak:
        pre.add(K.INPUTS_EMBEDS, embeds)
        pre.add(K.ROPE, rope)
        for key, nbytes in kept.items():
            pre.add(key, nbytes)
        pre.add(K.RUNNING_LAYER, layer)
    else:
        pre.add(K.FINAL_HIDDEN, final_hidden)
        if g.gen.all_logits:
            fp32 = t.prompt_logits_peak > t.prompt_logits_kept
            pre.add(K.PROMPT_LOGITS_FP32 if fp32 else K.PROMPT_LOGITS, t.prompt_logits_peak)
        pre.add(K.LOGITS_SAMPLING if g.lit else K.LAST_LOGITS, prefill_logits)
    pre.add(K.DEQUANT, dequant_term(g, t.largest_linear))
    pre.add(K.BEAM_STATE, t.beam_prefill)
    pre.add(K.CUBLAS, t.cublas)
    return pre


def _eager_prefill(r: Resolved, batch: int, prompt: int, keys: int, c: int,
                   widths: tuple[int, int, int, int, int]) -> tuple[int, int]:
    """Eager attention's running tensors at prefill and what the MLP's moment keeps of them (``prefill_layer_bytes``):
    (attention, kept), ``widths`` = (hidden, q width, kv width, heads, kv heads) on this rank, ``keys`` the key slots
    the cache hands back (the prompt, or a HybridCache's whole buffer)."""
    m = r.model
    h, q, kv, heads, kv_heads = widths
    t = batch * prompt
    qkv = (q + 2 * kv) if m.traits.keeps_attn_output else q
    repeat = 2 * q if 1 < kv_heads < heads else 0
    # repeat_kv copies every key slot the cache hands back
    attn = (2 * h + qkv) * t * c + repeat * batch * keys * c
    attn += batch * heads * prompt * keys * softmax_bytes_per_score(m, r.scenario.inference.dtype)
    # the 4-D additive causal masks, one per kind the layers use (gpt-oss, Gemma 2/3: sliding and full,
    # masking_utils via ``causal_mask_mapping``), all built before the first layer
    masks = len({ls.sliding_window for ls in m.layers}) * batch * prompt * keys * c
    # the decoder layer binds the returned probabilities (``hidden_states, _ = self.self_attn(...)``)
    # until it returns, and the model's forward keeps the masks: both are alive through the MLP
    return attn + masks, batch * heads * prompt * keys * c + masks


def parallel_mixer_kept_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """What a layer that runs attention beside its mixer (``MambaSpec.parallel_attention``) holds beyond an attention
    layer's tensors, from its attention to its end: ``FalconH1DecoderLayer.forward`` (transformers 5.24) keeps the
    mixer's scaled output bound to ``mamba_hidden_states`` until it returns, and hands the attention
    ``hidden_states * attention_in_multiplier`` (a new tensor, alive until the attention returns), whose place
    ``attention_hidden_states`` (bound until the layer returns) takes through the post-attention norm and the MLP:
    ``2 b p h c`` in every phase of the attention layer's count (``prefill_layer_bytes``); 0 for other models."""
    if m.mamba is None or not m.mamba.parallel_attention:
        return 0
    return 2 * batch * prompt * m.hidden_size * c


def parallel_mixer_input_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """The layer's tensors beside its mixer's while the mixer of a parallel layer runs: the layer's input (the
    residual) and its normalized input, which the attention reads after the mixer (``2 b p h c``); 0 for other
    models (whose running mixer's terms count the mixer's own tensors only)."""
    if m.mamba is None or not m.mamba.parallel_attention:
        return 0
    return 2 * batch * prompt * m.hidden_size * c


def shared_block_extra_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """What a shared transformer block run ahead of a mixer (``MambaSpec.shared_attention_layers``, Zamba2) holds
    beyond an attention layer's tensors (``prefill_layer_bytes``), the larger of its two phases, a bound from above
    (transformers 5.24 ``modeling_zamba2.py``): ``Zamba2AttentionDecoderLayer.forward`` normalizes the concatenation of
    the layer's input with the embeddings, ``2 h`` wide where a Llama layer's normalized input is ``h`` (``+ h``, the
    concatenation itself freed when its normalized copy is rebound); ``Zamba2MLP.forward`` adds the layer's adapter
    output to ``gate_up_proj``'s (``gate_up_state + adapter(hidden_state)``): both ``2 I`` wide and their sum, where
    Llama's MLP holds its gate and up projections (``+ 2 I``).  0 for other models."""
    if m.mamba is None or not m.mamba.shared_attention_layers:
        return 0
    return batch * prompt * max(m.hidden_size, 2 * m.intermediate_size) * c


def shared_block_output_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """The shared block's output that a Zamba2 hybrid layer holds while its mixer runs: ``Zamba2HybridLayer.forward``
    binds ``transformer_hidden_states`` (the per-layer ``linear``'s output, ``b p h``) until ``mamba_decoder``
    returns; 0 for other models."""
    if m.mamba is None or not m.mamba.shared_attention_layers:
        return 0
    return batch * prompt * m.hidden_size * c


def cache_growth_bytes(g: GenerateCall, tokens: int) -> int:
    """The larger of a full-attention layer's keys (then values), old and new together during ``torch.cat``, and a
    sliding layer's old keys and values, held until both new ones exist.

    transformers 5.24 cache_utils.py: ``DynamicLayer.update`` (:136-137) rebinds ``self.keys`` before it concatenates
    the values, so one half of a full layer (its keys) is held twice; ``DynamicSlidingWindowLayer.update``
    (:242-247) makes ``full_key_states`` and ``full_value_states`` before it rebinds either, so the old storage of
    both, ``min(tokens - 1, window)`` tokens, stays alive beside the new.  Mistral-7B's window 4096, 32 sequences
    at 8,192 tokens: 32 x 4,096 x 2 x 8 heads x 128 x 2 B = 536,870,912 B, where no layer of full attention adds
    anything.
    """
    spec = kv_spec(g.m, g.kv_dtype, g.c, g.tp)
    mode = g.sliding_cache
    if mode == "static":
        # a HybridCache's full layers are written in place; a sliding layer's ``_sliding_update`` gathers its
        # window into new ``k_out`` and ``v_out`` (``k_out[:, :, indices]``, cache_utils.py 4.50.0:1741-1743), which
        # the attention uses: one sliding layer's window of keys and values beside the cache
        return max(g.batch * min(la.window, g.static_slots) * spec.layer_bytes_per_token(la)
                   for la in spec.layers if la.window)
    # before 4.56 (``mode`` "all") a sliding layer is a DynamicCache layer like the others
    full_layer = max((spec.layer_bytes_per_token(la) for la in spec.layers if la.window is None or mode == "all"),
                     default=0)
    sliding = max((min(tokens - 1, la.window) * spec.layer_bytes_per_token(la) for la in spec.layers
                   if la.window and mode != "all"), default=0)
    return max(g.batch * tokens * full_layer // 2, g.batch * sliding)


def decode_moment(g: GenerateCall, t: CallTerms, phase: str, tokens: int, prompt_logits: int) -> Moment:
    """The end of the decode step that brings the cache to ``tokens`` tokens."""
    mo = Moment(phase)
    add_weights(mo, t)
    mo.add(K.RELEASE_MASK, t.release_mask)
    # Lit-GPT's buffers are preallocated for every token and written in place (no growth)
    mo.add(K.KV_ALL, t.kv_final if g.lit else g.cache(tokens, prefill=False))
    if g.gen.legacy_cache:
        # the previous step's tuple, still held by generate's model_kwargs
        mo.add(K.KV_LEGACY, g.cache(tokens - 1, prefill=False))
    elif not g.lit:
        # one layer's keys (then values), old and new together, or a hybrid model's mixer updating its state
        # in place, whichever layer holds more at once
        growth, update = cache_growth_bytes(g, tokens), mixer_decode_bytes(g.m, g.batch, g.c)
        # transformers < 4.54 under SDPA: a layer's cached keys, then values, repeated to every query head
        repeated = repeated_kv_bytes(g, tokens)
        ci = g.cross()
        cross = 0 if ci is None else cross_layer_bytes(g.m, ci, 1, g.c, g.attention, prefill=False)
        if cross > max(growth, update, repeated):
            mo.add(K.CROSS_LAYER_DECODE, cross)
        elif repeated > max(growth, update):
            mo.add(K.KV_REPEATED, repeated)
        else:
            mo.add(K.MIXER_STATE_UPDATE if update > growth else K.CACHE_GROWTH, max(growth, update))
    if (ci := g.cross()) is not None:
        mo.add(K.KV_CROSS, t.kv_cross)
        # the step's one-row mask [b, 1, 1, L] (c) and generate's kept inputs, the mask grown to the step's tokens
        mo.add(K.CROSS_MASK, ci.batch * ci.vision_tokens * g.c)
        mo.add(K.IMAGE_INPUTS, _image_inputs(ci, tokens))
    mo.add(K.SSM_STATE, t.ssm_state)
    mo.add(K.MIXER_BUFFERS, mixer_buffer_bytes(g.m, g.c))
    mo.add(K.PREV_PROMPT_LOGITS, prompt_logits)
    mo.add(K.LAST_LOGITS, t.logits)
    mo.add(K.BEAM_STATE, t.beam_decode)
    if _forward_weight_copies(g.quant):
        # HQQ and torchao's int8 weight-only linear copy the whole weight for a single token too (no gemv path)
        mo.add(K.DEQUANT, dequant_term(g, t.largest_linear))
    mo.add(K.CUBLAS, t.cublas)
    return mo


def vision_moment(g: GenerateCall, t: CallTerms) -> Moment | None:
    """A vision-language model's image encoding, before the language model's layers (None: no image).

    ``Gemma3Model.forward`` / ``Qwen2_5_VLModel.forward`` (transformers 5.24) embed the prompt's text
    (``inputs_embeds``, kept) and then run the vision tower over the images without grad
    (``tower_forward_bytes``).  Nothing of the prompt's cache exists yet.
    """
    inf = g.r.scenario.inference
    if g.m.vision is None or g.m.vision.tower is None or inf.images_per_sample == 0:
        return None
    mo = Moment("prefill")  # the images are encoded in the prefill forward, before its decoder layers
    add_weights(mo, t)
    mo.add(K.INPUTS_EMBEDS, kept_embeddings_bytes(g.m, g.batch, g.prompt, g.c))
    mo.add(K.VISION_TOWER, tower_forward_bytes(g.r, g.batch * inf.images_per_sample, inf.image_size, g.c,
                                               g.attention))
    mo.add(K.DEQUANT, dequant_term(g, t.largest_linear))
    mo.add(K.CUBLAS, t.cublas)
    return mo


def tower_forward_bytes(r: Resolved, images: int, image_size: int | None, c: int, attention: str) -> int:
    """What a vision tower's forward holds without grad while its last layer runs over ``images`` images: the
    running layer, the hidden states and tables the vision model binds through its blocks, and the pixel values
    (compute dtype).

    The tower's layers are transformer blocks: the running layer is ``prefill_layer_bytes`` of the tower's layer
    shape (``VisionSpec.tower``) over its patches, with ``attention`` (the language model's kernel).  The
    attention runs within each image (each of LLaVA-NeXT's tiles, with any class token), except in a packing tower:
    Pixtral under SDPA (``block_mask_unless_flash``) and Qwen2-VL / Qwen2.5-VL before transformers 4.54
    (``spec/vision.py packed_attention``) attend over all the images' patches at once, ``S`` of them, under a
    block-diagonal mask: the running layer is then one pass over ``S`` with the release's kernel, and the masks it
    holds are counted (``_packed_mask_bytes``).  While the last layer runs the forward also holds the encoder's
    input and any selected hidden state (``VisionSpec.kept_hidden_states``), Qwen3-VL's DeepStack features
    (``kept_merged_elements``), the rotary tables and interpolated positions (``held_per_patch``)."""
    from vramplan.spec.vision import image_grid, image_tiles, packed_attention

    v = r.model.vision
    assert v is not None and v.tower is not None
    patches, _ = image_grid(v, image_size)
    tower = replace(r, model=v.tower)
    # the tower runs once per image (LLaVA-NeXT: per tile, image_tiles) over its patches and any class token
    # (CLIP's, VisionSpec.extra_tokens)
    tiles = image_tiles(v, image_size)
    packed = packed_attention(r.scenario, r.model)
    seq = images * patches
    if packed is not None:
        layer = prefill_layer_bytes(tower, 1, seq, c, 1, packed.kernel, causal=False)
        layer += _packed_mask_bytes(seq, c, packed.kernel, packed.bool_mask)
    else:
        layer = images * tiles * prefill_layer_bytes(tower, 1, patches // tiles + v.extra_tokens, c, 1, attention)
    # hidden states held while the tower's last layer runs (VisionSpec.kept_hidden_states: the encoder's input, a
    # selected state) and Qwen3-VL's DeepStack features (VisionSpec.kept_merged_elements)
    layer += v.kept_hidden_states * images * (patches + tiles * v.extra_tokens) * v.hidden_size * c
    layer += v.kept_merged_elements * images * (patches // v.merge_size ** 2) * c
    # the rotary tables and interpolated positions bound through the blocks (VisionSpec.held_per_patch)
    layer += sum(n * {"fp32": 4, "int64": 8}.get(kind, c) for kind, n in v.held_per_patch) * images * patches
    if v.block_mask_unless_flash and attention == "sdpa":
        # Pixtral packs the batch's images into one sequence under a block-diagonal mask in the model's dtype, kept
        # through the tower's layers (generate_block_attention_mask), and SDPA's memory-efficient kernel takes a
        # padded copy of it per call when its rows are unaligned (aten preprocess_mask)
        layer += _packed_mask_bytes(seq, c, "efficient", bool_mask=False)
    pixels = images * patches * v.num_channels * v.temporal_patch_size * v.patch_size ** 2 * c
    return layer + pixels


def _packed_mask_bytes(seq: int, c: int, kernel: str, bool_mask: bool) -> int:
    """The masks alive while a packing tower's layer attends over ``seq`` patches (Pixtral under SDPA; Qwen-VL before
    transformers 4.54, facts/transformers.py ``QWEN_VL_PACKED_ATTENTION``), beside what ``prefill_layer_bytes``
    counts: the ``[1, S, S]`` mask, one byte per score when built as bool (SDPA's dispatcher then converts it to the query's
    dtype, aten ``convert_boolean_attn_mask``: c more), else c; the memory-efficient kernel's padded copy when
    the rows are not a multiple of 8 (aten ``preprocess_mask``, ``mem_efficient_mask_row``).  Eager's mask is in
    ``prefill_layer_bytes``' eager terms already (the 4-D additive mask)."""
    if kernel == "eager":
        return 0
    mask = (1 + c) * seq * seq if bool_mask else c * seq * seq
    if kernel == "efficient" and seq % 8:
        mask += c * seq * mem_efficient_mask_row(seq)
    return mask


def _image_inputs(ci: CrossImages, tokens: int) -> int:
    """generate's ``model_kwargs``: the fp32 pixel values (``pack_images``), the int64 aspect-ratio ids [b, m] and
    mask [b, m, T], and the int64 cross-attention mask [b, tokens, m, T], one row longer per step
    (``_update_model_kwargs_for_generation``)."""
    aspect = ci.images * (1 + ci.tiles) * 8
    return ci.images * ci.pixels * 4 + aspect + ci.batch * tokens * ci.per_sample * ci.tiles * 8


def _vision_states(g: GenerateCall, ci: CrossImages) -> int:
    """The vision model's output ([b, m, T, P, vision_output_dim], ``image_outputs``) and the projector's
    ([b, L, h], ``cross_attention_states``), alive through the prompt's forward."""
    return ci.batch * ci.vision_tokens * (ci.out_dim + g.m.hidden_size) * g.c


def _cross_running(g: GenerateCall, ci: CrossImages, self_layer: int) -> int:
    """A cross-attention layer's running tensors over the prompt; under eager its probabilities stay through the
    MLP, whose tensors are bounded by the self-attention layer's (``prefill_layer_bytes``)."""
    c, p = g.c, g.prompt
    return max(cross_layer_bytes(g.m, ci, p, c, g.attention), cross_probs_bytes(g.m, ci, p, c, g.attention) + self_layer)


def _add_cross_kept(g: GenerateCall, t: CallTerms, mo: Moment, prompt: int) -> None:
    """What a cross-attention model keeps through the prompt's forward (nothing for another model): the images'
    K/V (the whole cross cache, as at the last cross-attention layer), the states, the mask and generate's inputs."""
    ci = g.cross()
    if ci is None:
        return
    mo.add(K.KV_CROSS, t.kv_cross)
    mo.add(K.VISION_STATES, _vision_states(g, ci))
    # the kept mask [b, 1, p, L] and full_text_row_masked_out_mask [b, 1, p, 1], both in the model dtype
    mo.add(K.CROSS_MASK, ci.batch * prompt * (ci.vision_tokens + 1) * g.c)
    mo.add(K.IMAGE_INPUTS, _image_inputs(ci, prompt))


def cross_vision_moments(g: GenerateCall, t: CallTerms) -> list[Moment]:
    """A cross-attention model's vision model and its cross-attention mask's preparation, before the language
    model's layers (``analytic/cross_attention.py``); [] for another model or no image."""
    ci = g.cross()
    if ci is None:
        return []
    if g.attention == "math" and bf16_math_fallback(g.r.scenario.inference.dtype, g.r.gpu):
        # SDPA's math kernel in the vision model and the cross-attention layers too (their masks do not change the
        # kernel there): its s x s scores are not modelled for them
        raise ScenarioError([Problem("inference.dtype", f"{g.m.name} in bf16 on a GPU before sm80: SDPA runs its math "
                                     "kernel in the vision model and the cross-attention layers as well, whose "
                                     "scores are not modelled for a cross-attention model",
                                     "set inference.dtype: fp16 (the memory-efficient kernel takes it), or "
                                     "inference.attention: eager")])
    tower = Moment("prefill")
    add_weights(tower, t)
    tower.add(K.IMAGE_INPUTS, _image_inputs(ci, g.prompt))
    tower.add(K.VISION_TOWER, vision_model_bytes(ci, g.c, g.attention))
    tower.add(K.CUBLAS, t.cublas)
    mask = Moment("prefill")
    add_weights(mask, t)
    mask.add(K.IMAGE_INPUTS, _image_inputs(ci, g.prompt))
    mask.add(K.VISION_STATES, _vision_states(g, ci))
    mask.add(K.CROSS_MASK, mask_prep_bytes(ci, g.prompt, g.c))
    mask.add(K.CUBLAS, t.cublas)
    return [tower, mask]


def inference_step(r: Resolved) -> InferenceResult:
    """The peak of one ``generate`` call over its prefill moment and its decode moments (module docstring)."""
    g = GenerateCall.of(r)
    t = call_terms(g)
    vision = vision_moment(g, t)
    moments = ([vision] if vision is not None else []) + cross_vision_moments(g, t) + [prefill_moment(g, t)]
    # generate runs one forward per new token: the prefill makes the first, each decode step feeds the last
    # one back, so n tokens take n - 1 decode steps and the cache ends at p + n - 1 tokens
    if g.new >= 2:
        moments.append(decode_moment(g, t, "decode", g.prompt + g.new - 1, 0))
        if g.gen.keeps_outputs and t.prompt_logits_kept:
            moments.append(decode_moment(g, t, "decode (first step)", g.prompt + 1, t.prompt_logits_kept))
    peak = max(moments, key=lambda mo: mo.total)
    excess = cached_excess(g)
    notes = inference_assumptions(g, t.kv_final) + [REPLAY_NOTE if applies(g) else PACKED_NOTE]
    sw = g.r.scenario.software
    notes += hf_buffer_notes(g.m, sw.transformers, sw.transformers_version, t.hf_rope, t.hf_mask,
                             g.attention != "flash")
    if sw.transformers is None and not g.lit and g.r.scenario.effective_framework not in OWN_MODEL_FRAMEWORKS:
        notes.append(CURRENT_RELEASE_NOTE)
    ms = g.m.mamba
    if not applies(g) and ms is not None and attention_layers(g.m):
        # a replayed mixer kind (LFM2) outside the replayed settings (eager attention, beams, quantized weights...)
        # is as unreplayed as the others: its packed reserved bytes were 15.9% under on the H100 run
        notes.append(HYBRID_EXCESS_NOTE)
    if excess.late_growth_bytes > peak.total // 100:
        # growth of more than 1% of the call's peak (rounding moves a few MiB; SmolLM2-1.7B at batch 64 grew by
        # half its peak)
        notes.append(growth_note(excess.late_growth_bytes))
    return InferenceResult(moments, peak, notes, t.kv_prompt + t.kv_cross, t.kv_final + t.kv_cross, excess.bytes)


REPLAY_NOTE = ("reserved bytes: the call's allocations (prefill, then each decode step's torch.cat of the cache) "
               "replayed through PyTorch's caching-allocator rules; the blocks it keeps cached beyond the live "
               "tensors are added to the peak (analytic/generate_replay.py)")
PACKED_NOTE = ("reserved bytes: the peak's tensors packed into empty allocator segments; the blocks the allocator "
               "keeps cached as the cache grows are not replayed for this model or setting (a dense model's "
               "generate is; the traced engine replays every call)")


HYBRID_EXCESS_NOTE = (
    "not modelled: the blocks the caching allocator keeps cached during this hybrid model's generate (its mixer "
    "layers' prefill temporaries beside the attention layers' growing cache) are not replayed for its mixer kind "
    "or for this setting (analytic/generate_replay.py REPLAYED_MIXERS, applies); measured on an H100 "
    "(benchmarks/gpu/h100-2026-11-27f), "
    "this estimate's reserved bytes were 4% to 23% under max_memory_reserved on such calls")


def _runner_note(g: GenerateCall, attention_free: bool = False) -> str:
    """Which generate loop runs, and what its release keeps alive."""
    if g.lit:
        runner = ("Lit-GPT generate (its own GPT): its own LM head, KV cache preallocated for prompt + new "
                  "tokens with K/V expanded to every query head (multi-query: one)")
        if g.quant in BNB_FORMATS:
            runner += ("; Lightning BitsandbytesPrecision quantizes every nn.Linear, the LM head included, "
                       "from fp16")
        return runner
    version = g.r.scenario.software.transformers
    if attention_free:
        # generate makes the model's own cache (MambaCache in 4.x, the mixer layers' LinearAttentionLayer in 5.x)
        cache = "the model's own cache of mixer states (no attention layer, no DynamicCache)"
    if version is None:
        return ("Hugging Face generate (transformers 5.x) with "
                + (cache if attention_free else "DynamicCache: per-layer tensors grown by torch.cat"))
    gen = g.gen
    return (f"Hugging Face generate of transformers {version}: "
            + (cache if attention_free else
               "the legacy cache tuple (the previous step's cache alive while the next is built)"
               if gen.legacy_cache else
               (f"HybridCache allocated before the prefill for {g.static_slots:,} slots (the window on sliding "
                "layers), as the checkpoint's generation_config.json (or the config class's default) names "
                "cache_implementation 'hybrid' and releases before 4.56 honour it (generation/utils.py "
                "4.56.0:1728-1732); the 4-D masks over it are counted as one, per release not read")
               if g.sliding_cache == "static" else
               ("DynamicCache (per-layer tensors grown by torch.cat; before 4.56 a sliding-window layer keeps every "
                "token, DynamicSlidingWindowLayer came in 4.56.0)" + _hybrid_config_note(g))
               if g.sliding_cache == "all" else "DynamicCache (per-layer tensors grown by torch.cat)")
            + ("; logits of every prompt position at prefill" + (", upcast to fp32" if gen.float_logits else "")
               if gen.all_logits else ""))


def _hybrid_config_note(g: GenerateCall) -> str:
    """Where a family's config class stopped naming the HybridCache before 4.56 (``Traits.static_hybrid_cache_before``:
    Cohere2 from 4.53), the checkpoint's generation_config.json decides and is not read: say the DynamicCache is
    assumed."""
    before, version = g.m.traits.static_hybrid_cache_before, g.r.scenario.software.transformers_version
    if not before or version is None or version < before:
        return ""
    return (f"; assumed: from {'.'.join(map(str, before))} its config class no longer names cache_implementation "
            "'hybrid', and a checkpoint whose generation_config.json does would run a HybridCache preallocated for "
            "the whole call (not read)")


def _mixer_kind_notes(g: GenerateCall) -> list[str] | None:
    """The state and prefill notes of the mixer kinds other than Mamba2 (RG-LRU, lightning attention, gated short
    convolution, Gated DeltaNet); None for Mamba2's, which ``hybrid_notes`` writes."""
    ms = g.m.mamba
    assert ms is not None
    if ms.kind == "rg_lru":
        conv, ssm = ssm_state_layer_bytes(g.m, g.c)
        window = max((ls.sliding_window or 0) for ls in g.m.layers)
        return [(f"{len(ms.layers)} of {g.m.num_layers} layers are RG-LRU recurrent blocks without a KV cache: each "
                 f"keeps per sequence, on the module (not in the cache), conv1d_state of {ms.conv_dim} x "
                 f"{ms.conv_kernel - 1} in {g.c} B ({conv:,} B; a view of {ms.conv_kernel} columns from the first "
                 f"decode step on) and the RG-LRU's fp32 recurrent_states of {ms.conv_dim} ({ssm:,} B); the "
                 f"{g.m.num_layers - len(ms.layers)} local attention blocks keep keys and values of at most their "
                 f"{window}-token window (DynamicSlidingWindowLayer)"),
                ("the RG-LRU runs transformers' _rnn_scan, a Python loop over the tokens: the prefill's running block "
                 "holds its two branches, the padded convolution's output and the RG-LRU's gates and products "
                 "(analytic/ssm_state.py)")]
    if ms.kind == "lightning":
        _, linear = ssm_state_layer_bytes(g.m, g.c)
        return [(f"{len(ms.layers)} of {g.m.num_layers} layers are lightning (linear) attention without a KV cache: "
                 f"each keeps per sequence a state of {ms.n_heads} x {ms.head_dim} x {ms.head_dim} in {g.c} B "
                 f"({linear:,} B) in MiniMaxCache.linear_cache; the KV cache counts the softmax attention layers only"),
                (f"the lightning layers' prefill runs block-wise (block_size {ms.chunk_size}): the running layer holds "
                 "the activated qkv projection, the blocks' outputs, their concatenation and the fp32 RMSNorm "
                 "(analytic/ssm_state.py)")]
    if ms.kind == "short_conv":
        conv, _ = ssm_state_layer_bytes(g.m, g.c)
        return [(f"{len(ms.layers)} of {g.m.num_layers} layers are gated short-convolution blocks without a KV cache: "
                 f"each keeps per sequence a convolution state of {ms.conv_dim} x {ms.conv_kernel} in {g.c} B "
                 f"({conv:,} B), transformers 5.24's LinearAttentionLayer; the KV cache counts the attention layers "
                 "only; the blocks run transformers' torch causal_conv1d_fn / causal_conv1d_update (as without the "
                 "causal-conv1d package and use_kernels=True), the prefill's running block holding its input, "
                 "in_proj's output, the padded convolution and the gated product (analytic/ssm_state.py)")]
    if ms.kind == "gated_deltanet":
        conv, ssm = ssm_state_layer_bytes(g.m, g.c)
        return [(f"{len(ms.layers)} of {g.m.num_layers} layers are Gated DeltaNet linear attention without a KV cache: "
                 f"each keeps per sequence a convolution state of {ms.conv_dim} x {ms.conv_kernel} in {g.c} B "
                 f"({conv:,} B) and an fp32 recurrent state of {ms.n_heads} x {ms.state_size} x {ms.head_dim} "
                 f"({ssm:,} B), transformers 5.24's LinearAttentionLayer; the KV cache counts the attention layers "
                 "only; the layers run transformers' torch torch_chunk_gated_delta_rule / "
                 "torch_recurrent_gated_delta_rule and causal_conv1d_fn / causal_conv1d_update (as without the fla "
                 "and causal-conv1d packages and use_kernels=True), the prefill's running layer holding the chunked "
                 f"rule's fp32 chunk tensors (chunk {ms.chunk_size}), a decode step's its state update's three fp32 "
                 "copies of the state (analytic/ssm_state.py)")]
    return None


def hybrid_notes(g: GenerateCall) -> list[str]:
    """What a hybrid model's estimate assumes of its Mamba2 mixers (none for an attention-only model)."""
    ms = g.m.mamba
    if ms is None:
        return []
    if ms.kind == "mamba1":
        return _mamba1_notes(g)
    if ms.kind == "rwkv4":
        return _rwkv_notes(g)
    kind_notes = _mixer_kind_notes(g)
    if kind_notes is not None:
        return kind_notes
    conv, ssm = ssm_state_layer_bytes(g.m, g.c)
    held = (f"a convolution state of {ms.conv_dim} x {ms.conv_kernel} in {g.c} B ({conv:,} B) and an "
            f"fp32 SSM state of {ms.n_heads} x {ms.head_dim} x {ms.state_size} ({ssm:,} B)")
    if ms.parallel_attention:
        state = (f"each of the {g.m.num_layers} layers runs attention and a Mamba2 mixer side by side and keeps both "
                 f"its KV cache and, per sequence, {held} (transformers 5.24's LinearAttentionAndFullAttentionLayer); "
                 "the prefill's running layer holds the mixer's tensors, or the attention's beside the mixer's output "
                 "and the attention's scaled input")
    elif ms.shared_attention_layers:
        state = (f"each of the {g.m.num_layers} layers runs a Mamba2 mixer and keeps per sequence {held} "
                 f"(transformers 5.24's LinearAttentionLayer); {len(ms.shared_attention_layers)} of them first run a "
                 "shared transformer block and keep its KV cache too (LinearAttentionAndFullAttentionLayer); the "
                 "prefill's running layer holds the mixer's tensors beside the block's output, or the block's "
                 "(its 2 x hidden normalized input or its adapter's gate_up sum, a bound from above), and the model "
                 "keeps a clone of the embeddings for its blocks")
    else:
        state = (f"{len(ms.layers)} of {g.m.num_layers} layers are Mamba2 mixers without a KV cache: each keeps per "
                 f"sequence {held}, transformers 5.24's LinearAttentionLayer; the KV cache counts the attention "
                 "layers only")
    scan = ("the mixers run transformers' torch scan (mamba2_chunk_scan, as without the mamba-ssm package and use_kernels=True): "
            f"the prefill's running mixer holds its fp32 chunk tensors (chunk {ms.chunk_size}), a decode step's "
            "mixer its state update's temporaries (mamba2_selective_state_update)")
    version = g.r.scenario.software.transformers
    if mamba2_scan_broadcasts(g.r.scenario.software.transformers_version):
        scan += (f"; transformers {version} (before 5.18) materializes the scan's broadcast products, the largest "
                 f"{broadcast_product_bytes(ms, g.batch, g.prompt):,} B in fp32, counted at the prefill")
    elif version is None:
        scan += ("; the einsum scan of transformers 5.18 and later (before 5.18 the scan materializes broadcast "
                 f"products, {broadcast_product_bytes(ms, g.batch, g.prompt):,} B here: set software.transformers "
                 "for an older release)")
    # the traced engine sees the scan's einsums make transient copies that these terms leave out: the analytic
    # peak is up to 5% below the trace's on transformers' Bamba test shapes (tests/test_families_hybrid.py); on an
    # H100 (transformers 5.24, a synthetic Bamba, 8 x 2,048 prompt tokens) the peak was 1.8% under
    # (benchmarks/gpu/h100-2026-11-27d-tf524), so it is stated as not modelled (the band widens)
    copies = ("not modelled: the transient copies the Mamba2 scan's einsums make at prefill (the traced engine, "
              "which sees them, is up to 5% higher on transformers' Bamba test shapes; a synthetic Bamba's generate "
              "on an H100 under transformers 5.24 peaked 1.8% above this estimate)")
    parallel = []
    if ms.parallel_attention:
        width = 2 * ms.intermediate_size + 2 * ms.n_groups * ms.state_size + ms.n_heads
        parallel = [(f"not counted: each mixer's non-persistent mup_vector buffer ({width:,} elements a layer, "
                    "FalconH1Model.__init__), the LM head's multiplied copy of the logits (lm_head_multiplier, one "
                    "row per sequence at each step) and the muP multipliers' short-lived copies inside the layer "
                    "(the key's, the MLP gate's and down projection's, the mixer's scaled input before in_proj)")]
    return [state, scan, copies, *parallel, *_residual_note(g)]


def _residual_note(g: GenerateCall) -> list[str]:
    """What ``residual_in_fp32`` keeps in fp32 (none without it)."""
    if not g.m.traits.residual_in_fp32:
        return []
    note = ("residual_in_fp32: the residual stream between blocks is fp32, counted in the final hidden states "
            "(the running mixer's terms count the mixer's own tensors, not its block's input and output)")
    return [note]


def _mamba1_notes(g: GenerateCall) -> list[str]:
    """What a Mamba-1 model's estimate assumes of its mixers (analytic/ssm_state.py)."""
    ms = g.m.mamba
    assert ms is not None
    conv, ssm = ssm_state_layer_bytes(g.m, g.c)
    state = (f"{len(ms.layers)} Mamba mixer layers without a KV cache: each keeps per sequence a convolution state of "
             f"{ms.intermediate_size} x {ms.conv_kernel} in {g.c} B ({conv:,} B) and an fp32 SSM state of "
             f"{ms.intermediate_size} x {ms.state_size} ({ssm:,} B), transformers 5.24's LinearAttentionLayer")
    scan = ("the mixers run transformers' torch scan (mamba_selective_scan's recurrent loop, as without the "
            "mamba-ssm package and use_kernels=True): the prefill's running mixer holds its fp32 discretized A, B and "
            "B x (prompt x intermediate x state each), a decode step's mixer its state update's fp32 temporaries")
    copies = ("not modelled: transient copies made inside the scan's operations; no published measurement of a "
              "Mamba model checks this estimate yet")
    notes = [state, scan, copies]
    if ms.bc_dt_norms and not ms.bc_dt_norm_params:
        notes.append(f"FalconMamba's dt, B and C norms hold their weights as non-persistent buffers "
                     f"({ms.intermediate_size + 2 * ms.state_size} elements per layer), not counted in the weights")
    return notes + _residual_note(g)


def _rwkv_notes(g: GenerateCall) -> list[str]:
    """What an RWKV-4 model's estimate assumes (analytic/ssm_state.py)."""
    ms = g.m.mamba
    assert ms is not None
    conv, ssm = ssm_state_layer_bytes(g.m, g.c)
    return [(f"{len(ms.layers)} RWKV-4 blocks without a KV cache: RwkvModel's state keeps per layer and sequence two "
             f"token-shift vectors of {ms.intermediate_size} in {g.c} B ({conv:,} B) and the wkv numerator, denominator "
             f"and maximum of {ms.n_heads} in fp32 ({ssm:,} B)"),
            ("the blocks run transformers' torch wkv loop (rwkv_linear_attention_cpu, as without the hub kernel, "
             "which needs the kernels package and ninja): the prefill's running block holds its input, the mixed "
             "and projected key, value and receptance and the feed-forward's squared ReLU (analytic/ssm_state.py); "
             "with more than one sequence its one-token decode step broadcasts the 2-D shift state to one position per "
             "sequence (logits of batch x batch rows), counted as a prefill block of batch positions"),
            ("not counted: time_decay and time_first stay fp32 when the model is loaded in a half dtype "
             f"(_keep_in_fp32_modules), {2 * g.m.hidden_size * g.m.num_layers:,} elements counted in "
             "the model's dtype")]


def _math_notes(g: GenerateCall) -> list[str]:
    """Why SDPA runs its math kernel, when it does (analytic/attention.py)."""
    if g.attention != "math":
        return []
    if mqa_math(g.m):
        return [MQA_MATH_NOTE]
    if bf16_math_fallback(g.r.scenario.inference.dtype, g.r.gpu):
        return [BF16_MATH_NOTE]
    return [gqa_math_note(g.r.scenario)]


def inference_assumptions(g: GenerateCall, kv_final: int) -> list[str]:
    """What the report assumes: the generate loop, dtypes, the cache, attention and the logits."""
    inf = g.r.scenario.inference
    elem = kv_elem_bytes(inf.kv_cache_dtype, g.c)
    if g.lit:
        cache_note = f"KV cache {kv_final:,} B ({elem} B per element)"
        logits_note = "logits for every prompt position (Lit-GPT's forward), then the last row"
    else:
        cache_note = f"KV cache {kv_spec(g.m, inf.kv_cache_dtype, g.c, g.tp).describe()} ({elem} B per element)"
        logits_note = ("logits of every prompt position" if g.gen.all_logits
                       else "logits for the last position only (logits_to_keep=1), copied to fp32")
    quant = inf.quantization
    attention_free = not g.lit and not attention_layers(g.m)
    if attention_free:
        # a state-space model (Mamba, Falcon-Mamba, RWKV): generate makes the model's own cache of mixer states
        # (hybrid_notes), no DynamicCache and no attention kernel runs
        cache_note = "no attention layers: no KV cache (each mixer layer's state above instead)"
    return [
        *hybrid_notes(g),
        _runner_note(g, attention_free),
        f"weights in {inf.dtype}" + (f", linear weights quantized as {quant}" if quant != "none" else ""),
        cache_note,
        (f"attention: none; {logits_note}" if attention_free else f"attention: {g.attention}; {logits_note}"),
        ("sampling with top-k/top-p warpers (greedy decoding needs about 26 B less per vocabulary entry and row)"
         if g.beams == 1 else beam_note(g)),
        "prompts of equal length (no padding mask)",
        *_math_notes(g),
    ]


def beam_note(g: GenerateCall) -> str:
    """What beam search adds, and what is assumed of it (``BEAM_EXTRA_BYTES_PER_ENTRY``, ``beam_state_bytes``)."""
    return (f"beam search, {g.beams} beams: every tensor of the call over {g.sequences:,} x {g.beams} = {g.batch:,} "
            "rows (transformers 5.24 _expand_inputs_for_generation), the cache reordered after each step "
            "(DynamicLayer.reorder_cache: one layer's keys, then values, copied by index_select, no larger than the "
            "cache growth), the step's fp32 log_softmax beside its logits and the beams' token and index buffers "
            "(_beam_search); beam sampling's warpers are counted (deterministic beam search, do_sample false, needs "
            "about 26 B less per vocabulary entry and row); before transformers 4.50 BeamSearchScorer's loop kept "
            "fewer buffers (its input_ids gather and cat), so its figure is an upper bound there")
