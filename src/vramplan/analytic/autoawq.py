"""AutoAWQ's fused-module inference (``framework: autoawq``): the peak of a run, part by part.

``AutoAWQForCausalLM.from_quantized(..., fuse_layers=True)`` (AutoAWQ 0.1.6-0.2.3, github.com/casper-hansen/AutoAWQ,
each file read at its tag; facts/autoawq.py says what differs) replaces each Llama/Mistral decoder layer with a
``LlamaLikeBlock`` (``awq/modules/fused/block.py``) and the decoder with ``LlamaLikeModel``
(``awq/modules/fused/model.py``); the LM head stays transformers' ``LlamaForCausalLM`` head.  Notation: b batch,
p prompt tokens, n new tokens, L the window (``spec/autoawq.py`` ``autoawq_window``), l layers, H query heads,
G key/value heads, d head_dim = hidden / H, h hidden, q = H d, k = G d, I the MLP width, V the vocabulary; fp16
(2 B) throughout.

What lives on the GPU:

* **weights**: packed int4 ``qweight`` + fp16 ``scales`` + packed ``qzeros`` per linear (facts/quantization.py
  ``awq-4bit``, ``WQLinear_GEMM``), embeddings, norms and the LM head in fp16 (``weights_bytes``);
* **RoPE tables**: every ``QuantAttentionFused`` builds its own ``RoPE``, an ``nn.Parameter`` ``freqs_cis`` of
  ``precompute_freqs_cis(d, 2 L)``: [2L, d/2] complex64 (8 B), so 8 L d B per layer (attn.py ``RoPE.__init__``);
* **the window cache**: ``WindowedCache`` (cache.py) holds V [b, G, L, d] and K [b, G, d/8, L, 8] in fp16 for every
  layer, allocated at load whatever the prompt: 4 l b G L d B.  ``torch.zeros(shape).to(device).half()`` makes each
  on the GPU in fp32 first (4 B per element), freed after the cast.

Moments (each with the weights, the window cache, the RoPE tables and the caller's int64 input ids b p 8):

* **load** (``LlamaFuser.fuse_transformer``): the fused q/k/v of each layer is a ``torch.cat`` of the unfused
  ``q_proj``/``k_proj``/``v_proj`` buffers, which the old decoder layers keep until the loop ends and
  ``self.model.model`` is replaced; ``fuse_qkv`` first builds a ``WQLinear_GEMM`` whose zero buffers the concatenations
  replace.  Peak: every layer's fused q/k/v beside the originals, plus the last layer's cache being made (its K in
  fp32), or its fused linear's zero buffers and the concatenated ``qweight`` (``fuse_qkv``).  From 0.1.7 the old
  layers' transformers rotary caches are on the GPU too (``hf_rotary_bytes``; 0.1.6 dispatches after fusing).
* **prefill, attention** (``QuantAttentionFused.forward``, ``seqlen > 1``: explicit scores): alive at the softmax are
  the layer input and ``norm_out`` (2h), ``xqkv`` (q + 2k), the rotated q and k (q + k), ``keys_store``'s contiguous
  copy (k), ``repeat_interleave``'s K and V expanded to every head (2q; a copy even when G = H, repeats=1), per
  token, and per score (b H p^2): the scaled, masked fp16 scores (2), ``scores.float()`` (4) and the fp32 softmax
  (4): 10 B; plus the model's fp16 [1, 1, p, p] mask (``prepare_attention_mask``).  At ``o_proj`` the fp16
  probabilities (2 B per score), the attention output and its contiguous copy (2q) and o_proj's output (h).
* **prefill, MLP**: the block binds the layer input, ``norm_out``, the attention output, the returned
  ``attention_weight`` (bound to ``_``) and the residual (4h + q), and ``norm_2``'s output (h); 0.1.x's
  ``QuantFusedMLP.forward`` keeps ``gate_output`` and ``up_output`` bound while the activation and the product are
  made (4I); 0.2.x run transformers' ``LlamaMLP`` (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: 3I).
* 0.2.x ``WQLinear_GEMM`` dequantizes the whole weight to fp16 when b x tokens >= 1024 (gemm.py
  ``FP16_MATMUL_HEURISTIC_CONDITION``): the largest linear's fp16 copy beside its input and output.
* **prefill, head**: transformers' ``LlamaForCausalLM.forward`` runs the head on every position (b p V) and, in the
  releases before 4.45 that AutoAWQ 0.1.6-0.2.3 ran with, upcasts them all (``logits = logits.float()``): the final
  hidden states (h) and b p V (2 + 4).
* **decode**: the FasterTransformer ``single_query_attention`` kernel reads and writes the window in place; the step's
  head (b V (2 + 4)) and the previous call's outputs, which the caller still holds (``examples/benchmark.py``
  ``generate_torch``: ``out = model(inputs)``; transformers' ``generate`` before 4.42): the prompt's logits during
  the first decode step.  A step past the window rolls it by 100 (``roll_kv_n_steps``: ``torch.roll`` makes a new
  tensor while the old one lives): one layer's K (or V) more.
* **warm-up** (``inference.autoawq.warmup_matmul``, off by default: it belongs to ``examples/benchmark.py``, not to
  AutoAWQ): ``torch.randn((4096, 4096)).to(device)`` and ``torch.mm`` of it with itself, 2 x 64 MiB.

The prefill's RoPE (``RoPE.forward``: fp32 copies of q and k, their complex64 products and flattened copies) is a
candidate moment of the running layer too.  Below every moment here, so not counted (the report says so): the mask's
fp32 construction (``torch.full`` and ``torch.triu`` in fp32, 8 p^2 B, before the first layer, where a layer holds
10 B per score of each head) and the checkpoint's loading (``load_checkpoint_in_model`` places each tensor into its
own parameter: at most the weights).  Refused (``spec/autoawq.py``): AutoAWQ's multi-GPU device map and the fused
blocks of other families.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic.hf_buffers import causal_mask_buffer_bytes, rotary_tables_bytes
from vramplan.analytic.inference import (
    DEL_OUTPUTS_SINCE,
    LOGITS_TO_KEEP_SINCE,
    SAMPLING_BYTES_PER_ENTRY,
    InferenceResult,
)
from vramplan.analytic.layout import RankParams, rank_params
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.weights import quantized_linear_bytes, weights_bytes
from vramplan.errors import ScenarioError
from vramplan.facts.autoawq import AutoAwqRelease, autoawq_release
from vramplan.spec.autoawq import autoawq_problems, autoawq_window
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec

__all__ = [
    "ROLL_STEP",
    "WARMUP_BYTES",
    "AwqCall",
    "autoawq_assumptions",
    "autoawq_step",
    "fused_qkv_bytes",
    "hf_rotary_bytes",
    "rope_table_bytes",
    "window_cache_bytes",
]

C = 2  # fp16: from_quantized(torch_dtype=torch.float16), WindowedCache ``.half()``
# examples/benchmark.py ``warmup``: torch.randn((4096, 4096)) (fp32) on the GPU and torch.mm's fp32 output
WARMUP_BYTES = 2 * 4096 * 4096 * 4
# WindowedCache.roll_kv_n_steps(start_pos, n=100) at a decode step past the window (fused_utils.prepare_cache)
ROLL_STEP = 100
# transformers' generate stops holding the previous step's outputs (``del outputs``) from 4.42 (DEL_OUTPUTS_SINCE);
# from 4.45 generate computes the prompt's last position only and the head upcasts only with labels
# (LOGITS_TO_KEEP_SINCE; transformers 4.45.2 ``LlamaForCausalLM.forward``: ``if labels is not None: logits =
# logits.float()``)


def rope_table_bytes(m: ModelSpec, window: int) -> int:
    """Every layer's ``RoPE.freqs_cis``: [2 L, d/2] complex64, 8 L d B per layer.

    Mistral-7B (32 layers, d 128) with the 0.1.x default window of 32,768: 32 x 8 x 32,768 x 128 = 1,073,741,824 B.

    >>> from types import SimpleNamespace
    >>> rope_table_bytes(SimpleNamespace(num_layers=32, head_dim=128), 2048)  # type: ignore[arg-type]
    67108864
    """
    return m.num_layers * 2 * window * (m.head_dim // 2) * 8


def window_cache_bytes(m: ModelSpec, batch: int, window: int) -> int:
    """``WindowedCache``'s V [b, G, L, d] and K [b, G, d/8, L, 8] in fp16, every layer: 4 l b G L d B.

    Llama-2-7B (32 layers, 32 KV heads, d 128), batch 1, L 2048: 32 x 2 x 32 x 2048 x 128 x 2 = 1,073,741,824 B.
    """
    return m.num_layers * 2 * batch * m.num_kv_heads * window * m.head_dim * C


def fused_qkv_bytes(m: ModelSpec) -> tuple[int, int]:
    """One layer's fused q/k/v ``WQLinear_GEMM`` (AWQ-packed, facts/quantization.py) and its ``qweight`` alone.

    Llama-2-7B: h 4096, out 3 x 4096: 50,331,648 int4 weights, 25,165,824 B of qweight.
    """
    out = m.q_width + 2 * m.num_kv_heads * m.head_dim
    numel = m.hidden_size * out
    return quantized_linear_bytes(numel, out, "awq-4bit"), numel // 2


def hf_rotary_bytes(m: ModelSpec) -> int:
    """transformers' rotary buffers of the unfused layers, on the GPU while they are fused (AutoAWQ 0.1.7+).

    transformers 4.36.2 ``LlamaAttention._init_rope`` gives every attention a ``LlamaRotaryEmbedding`` (Mistral's
    the same) whose ``_set_cos_sin_cache(seq_len=max_position_embeddings, dtype=torch.get_default_dtype())``
    registers ``cos_cached`` and ``sin_cached`` [max_position_embeddings, d] and an fp32 ``inv_freq`` [d/2] (the same
    bytes in 4.37.2, 4.38.2 and 4.39.3, where they are ``_cos_cached``/``_sin_cached``);
    AutoAWQ builds the model with ``from_config(torch_dtype=torch.float16)``, which makes fp16 the default dtype
    (``PreTrainedModel._from_config``).  Llama-2-7B: 32 x (2 x 4096 x 128 x 2 + 64 x 4) = 67,117,056 B;
    Mistral-7B's 32,768 positions: 32 x (2 x 32768 x 128 x 2 + 64 x 4) = 536,879,104 B.
    An unset release is a 4.36-era one here (AutoAWQ's pins), so no version window applies.
    """
    return rotary_tables_bytes(m, m.num_layers, C)


@dataclass(frozen=True)
class AwqCall:
    """One AutoAWQ fused run as the terms read it."""

    r: Resolved
    row: AutoAwqRelease
    rp: RankParams
    batch: int
    prompt: int
    new: int
    window: int
    all_logits: bool    # the prefill's head runs on every prompt position
    upcast: bool        # ... and upcasts them all to fp32
    keeps_prev: bool    # the caller holds the previous call's outputs through the next forward

    @classmethod
    def of(cls, r: Resolved) -> AwqCall:
        s, m = r.scenario, r.model
        row = autoawq_release(s.software.autoawq)
        v, loop = s.software.transformers_version, s.inference.autoawq.loop
        # a direct model(ids) call passes no logits_to_keep: every position; generate keeps one from 4.45
        all_logits = loop == "forward" or v is None or v < LOGITS_TO_KEEP_SINCE
        early = v is None or v < LOGITS_TO_KEEP_SINCE
        return cls(r=r, row=row, rp=rank_params(m, 1, 1, 1, 0, None), batch=s.inference.batch_size,
                   prompt=s.inference.prompt_len, new=s.inference.new_tokens, window=autoawq_window(s, m, row),
                   all_logits=all_logits, upcast=all_logits and early and m.traits.upcasts_all_logits,
                   keeps_prev=loop == "forward" or v is None or v < DEL_OUTPUTS_SINCE)

    @property
    def m(self) -> ModelSpec:
        return self.r.model

    @property
    def generate(self) -> bool:
        return self.r.scenario.inference.autoawq.loop == "generate"

    def logits(self, positions: int) -> tuple[int, int]:
        """The head's output over ``positions`` rows per sequence: (at the upcast, kept by the outputs)."""
        every = self.batch * positions * self.m.vocab_size
        return every * (C + 4 if self.upcast else C), every * (4 if self.upcast else C)

    def dequant(self, tokens: int, numel: int) -> int:
        """0.2.x ``WQLinear_GEMM``'s fp16 copy of a ``numel`` weight when batch x tokens reaches the heuristic."""
        on = self.row.dequant_min_tokens and self.batch * tokens >= self.row.dequant_min_tokens
        return numel * C if on else 0


def _resident(a: AwqCall, mo: Moment, ids_tokens: int, cublas: bool = True) -> Moment:
    """What every moment after loading holds: weights, window cache, RoPE tables, input ids, cuBLAS' workspace."""
    mo.add(K.PARAMETERS, weights_bytes(a.rp, C, "awq-4bit"))
    mo.add(K.AWQ_ROPE_TABLES, rope_table_bytes(a.m, a.window))
    mo.add(K.AWQ_WINDOW_CACHE, window_cache_bytes(a.m, a.batch, a.window))
    mo.add(K.INPUT_IDS, a.batch * ids_tokens * 8)
    if cublas:
        mo.add(K.CUBLAS, cublas_workspace_bytes(a.r.gpu, handles=1))
    return mo


def load_moment(a: AwqCall) -> Moment:
    """``fuse_transformer``'s peak: all fused q/k/v beside the unfused originals, and the last layer's build."""
    m, layers = a.m, a.m.num_layers
    qkv, qweight = fused_qkv_bytes(m)
    cache_layer = window_cache_bytes(m, a.batch, a.window) // layers
    rope_layer = rope_table_bytes(m, a.window) // layers
    one = cache_layer // 2  # one layer's K (or V) in fp16
    # the last layer's K made in fp32 (4 B) before .half(), its RoPE table not yet built: 2 x one more than its fp16
    at_cache = 2 * one - rope_layer
    # fuse_qkv of the last layer: its zero buffers and the concatenated qweight, its cache and RoPE not yet built
    at_fuse = qweight - cache_layer - rope_layer
    mo = _resident(a, Moment("load"), 0, cublas=False)
    mo.add(K.AWQ_QKV_COPIES, layers * qkv)
    if a.row.dispatch_before_fuse:
        mo.add(K.AWQ_HF_ROTARY, hf_rotary_bytes(m))
        # transformers 4.38's LlamaModel.causal_mask of the unfused model, on the GPU while it is fused
        mo.add(K.AWQ_HF_CAUSAL_MASK, causal_mask_buffer_bytes(m, a.r.scenario.software.transformers_version))
    if max(at_cache, at_fuse) > 0:
        mo.add(K.AWQ_FUSE_BUILD, max(at_cache, at_fuse))
    return mo


def warmup_moment(a: AwqCall) -> Moment:
    """``examples/benchmark.py`` ``warmup``: two 4096 x 4096 fp32 tensors after loading."""
    return _resident(a, Moment("warm-up"), a.prompt).add(K.WARMUP_MATMUL, WARMUP_BYTES)


def _attention_layer(a: AwqCall) -> int:
    """The running fused attention's largest set: at the softmax, at ``o_proj``, at the fused q/k/v linear, or in
    ``RoPE.forward``'s fp32 temporaries (attn.py)."""
    m, b, p = a.m, a.batch, a.prompt
    t, h, q, k = b * p, m.hidden_size, m.q_width, m.num_kv_heads * m.head_dim
    scores = b * m.num_attention_heads * p * p
    bound = (2 * h + (q + 2 * k) + (q + k) + k + 2 * q) * t * C
    at_softmax = bound + scores * (C + 4 + 4)
    at_o_proj = bound + scores * C + (2 * q + h) * t * C + a.dequant(p, h * q)
    at_qkv = (2 * h + q + 2 * k) * t * C + a.dequant(p, h * (q + 2 * k))
    # RoPE.forward on the layer input, norm_out and xqkv (2h + q + 2k in fp16): xq_/xk_ in fp32 (.float() then
    # .contiguous()), the complex64 product and flatten(3)'s copy for q, then for k, then the fp16 type_as copies:
    # at most 12q + 4k, 8q + 12k or 10q + 10k bytes per token
    at_rope = ((2 * h + q + 2 * k) * C + max(12 * q + 4 * k, 8 * q + 12 * k, 10 * q + 10 * k)) * t
    return max(at_softmax, at_o_proj, at_qkv, at_rope)


def _mlp_layer(a: AwqCall) -> int:
    """The running block during its MLP: the block's bound tensors (5h + q) and the MLP's (module docstring)."""
    m, p = a.m, a.prompt
    t, h, i = a.batch * p, m.hidden_size, m.intermediate_size
    bound = (5 * h + m.q_width) * t * C
    if a.row.fused_mlp:
        # QuantFusedMLP: gate and up bound, the activation and the product (4I); then 3I + h at down_proj
        return bound + max(4 * i, 3 * i + h) * t * C
    w = a.dequant(p, h * i)
    # transformers' LlamaMLP: at up_proj the activation, up's output and the dequantized weight; 3I at the product;
    # at down_proj the product, its output and the dequantized weight
    return bound + max(2 * i * t * C + w, 3 * i * t * C, (i + h) * t * C + w)


def prefill_moments(a: AwqCall) -> list[Moment]:
    """The prompt's forward: the running layer (attention or MLP, with the kept mask) and the head."""
    m, b, p = a.m, a.batch, a.prompt
    mask = p * p * C  # prepare_attention_mask: [1, 1, p, p] in fp16, kept through the layer loop
    attn, mlp = _attention_layer(a), _mlp_layer(a)
    layer = _resident(a, Moment("prefill"), p).add(K.RUNNING_LAYER, max(attn, mlp) + mask)
    at_upcast, _ = a.logits(p if a.all_logits else 1)
    head = _resident(a, Moment("prefill"), p).add(K.FINAL_HIDDEN, b * p * m.hidden_size * C)
    head.add(K.PROMPT_LOGITS_FP32 if a.upcast else K.PROMPT_LOGITS, at_upcast)
    return [layer, head]


def decode_moments(a: AwqCall) -> list[Moment]:
    """The first and the last decode step, and the window's roll when a step passes it (module docstring)."""
    if a.new < 2:
        return []
    m, b = a.m, a.batch
    step_head, _ = a.logits(1)
    _, prompt_kept = a.logits(a.prompt if a.all_logits else 1)
    _, step_kept = a.logits(1)
    sampling = b * m.vocab_size * SAMPLING_BYTES_PER_ENTRY if a.generate else 0

    def step(phase: str, kept: int, j: int, roll: bool) -> Moment:
        # decode step j: generate's input_ids have grown to p + j tokens; a forward loop keeps the caller's prompt
        mo = _resident(a, Moment(phase), a.prompt + j if a.generate else a.prompt)
        mo.add(K.PREV_PROMPT_LOGITS if phase == "decode (first step)" else K.PREV_STEP_LOGITS,
               kept if a.keeps_prev else 0)
        if roll:
            # torch.roll of one layer's K (or V): the new tensor beside the old, before the step's forward
            return mo.add(K.CACHE_ROLL, window_cache_bytes(m, b, a.window) // m.num_layers // 2)
        return mo.add(K.LAST_LOGITS, step_head + sampling)

    out = [step("decode (first step)", prompt_kept, 1, False), step("decode", step_kept, a.new - 1, False)]
    if a.prompt + a.new - 1 > a.window:
        # decode step j (1-based) starts at position p + j - 1; the first past the window rolls it
        first = a.window - a.prompt + 1
        out.append(step("decode (first step)", prompt_kept, 1, True) if first == 1
                   else step("decode", step_kept, first, True))
    return out


def autoawq_assumptions(a: AwqCall) -> list[str]:
    """What the estimate of an AutoAWQ run assumes, each with its source."""
    s, row = a.r.scenario, a.row
    cfg = s.inference.autoawq
    default = "" if cfg.max_seq_len is not None else (
        f" (AutoAWQ {row.release}'s default: "
        + (f"{row.window_argument}={row.default_window})" if row.default_window is not None
           else f"{row.window_argument}=None takes the config's max_position_embeddings)"))
    loop = ("model(ids) once per token, greedy argmax (AutoAWQ examples/benchmark.py generate_torch)" if not a.generate
            else "model.generate over the fused model (transformers' generate, sampling warpers on the last row)")
    tf = s.software.transformers or "unset, taken as a release before 4.42 (AutoAWQ <= 0.2.3 requires >= 4.35.0)"
    notes = [
        f"AutoAWQ {row.release} fused inference (from_quantized fuse_layers=True; {row.source}): {loop}",
        (f"fused KV cache window of {a.window} positions{default}, preallocated in fp16 for batch {a.batch} at load "
        f"(WindowedCache); decode steps past it roll it by {ROLL_STEP}"),
        ("weights in fp16 with AWQ 4-bit linears (qweight, scales, qzeros; the q/k/v fused into one WQLinear_GEMM)"
         + ("" if a.r.scenario.inference.dtype == "fp16" else
            "; inference.dtype bf16 is not read: from_quantized loads torch.float16")),
        ("prefill attention with explicit fp16 scores and an fp32 softmax (QuantAttentionFused); decode with the "
        "FasterTransformer single_query_attention kernel (built on Linux), which reads the window in place"),
        f"transformers {tf}: the head's logits of every prompt position"
        + (", upcast to fp32" if a.upcast else "") if a.all_logits else "transformers' head on the last position",
        "MLP: " + ("AutoAWQ's QuantFusedMLP" if row.fused_mlp else
                   "transformers' LlamaMLP with WQLinear_GEMM, which dequantizes a weight to fp16 when batch x tokens"
                   f" >= {row.dequant_min_tokens}"),
        ("from_quantized(batch_size=...) equal to inference.batch_size: the window is made for that batch at load "
         "(0.1.8+ reallocate it, with both alive, when a call's batch differs: QuantAttentionFused.forward)"),
        ("peak since the process started: from_quantized's fusing counted (no reset_peak_memory_stats)"
         + ("; the unfused layers' transformers rotary caches on the GPU while fusing (load_checkpoint_and_dispatch "
            "first; read at transformers 4.36.2-4.39.3)" if row.dispatch_before_fuse else "")
         if cfg.load_in_peak else "peak reset after loading: from_quantized's fusing not counted"),
        ("the benchmark's warm-up matmul (2 x 64 MiB fp32) counted" if cfg.warmup_matmul
         else "no warm-up matmul (examples/benchmark.py runs one: set inference.autoawq.warmup_matmul)"),
("below the moments above, so not counted: the mask's fp32 construction (8 p^2 B before the layers, under a "
         "layer's 10 B per score) and the checkpoint's loading (each tensor placed into its own parameter)"),
    ]
    return notes


def autoawq_step(r: Resolved) -> InferenceResult:
    """The peak of an AutoAWQ fused run over its load, warm-up, prefill and decode moments (module docstring)."""
    # the solvers (plan/solvers.py) change the batch and the prompt of a resolved scenario without resolving it again:
    # check again what resolving checks, so that a prompt beyond the window is refused, never estimated
    if problems := autoawq_problems(r.scenario, r.model):
        raise ScenarioError(problems)
    a = AwqCall.of(r)
    cfg = r.scenario.inference.autoawq
    moments = ([load_moment(a)] if cfg.load_in_peak else []) + ([warmup_moment(a)] if cfg.warmup_matmul else [])
    moments += prefill_moments(a) + decode_moments(a)
    peak = max(moments, key=lambda mo: mo.total)
    cache = window_cache_bytes(a.m, a.batch, a.window)
    return InferenceResult(moments, peak, autoawq_assumptions(a), cache, cache)
