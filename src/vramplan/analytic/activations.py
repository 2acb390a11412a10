"""Activations: the tensors autograd saves for the backward pass, per decoder layer.

Derived op by op from the Hugging Face modeling code and PyTorch's autograd formulas
(``tools/autograd/derivatives.yaml``: a matmul saves its input only when its weight
needs a gradient, and its weight only when its input needs one; softmax saves its
output; SiLU/GELU save their input; dropout on CUDA saves a 1-byte mask).
Counted per token, then multiplied by the tokens on the GPU.

Worked example, Llama-2-7B layer, bf16-mixed (fp32 residual, bf16 compute), SDPA flash,
full fine-tuning, per token (h = 4096, I = 11008, 32 heads, 32 KV heads):

  input RMSNorm       x (fp32, 4h) + normalized x (fp32, 4h) + rsqrt (fp32, 4) =  32,772 B
  q/k/v inputs        autocast casts the fp32 input once per consumer: 3*2h  =  24,576 B
  q, k (after RoPE), v  2*(h + h + h)                                         =  24,576 B
  attention output    2h (SDPA-flash output, shared with o_proj's input)      =   8,192 B
  logsumexp           4 * 32 heads                                           =     128 B
  post-attn RMSNorm   4h + 4h + 4                                             =  32,772 B
  gate/up inputs      2*2h                                                    =  16,384 B
  MLP                 gate out, SiLU out, up out, product: 4*2I               =  88,064 B
                                                                              = 227,464 B/token/layer

The attention output is not copied for o_proj: PyTorch's CUDA flash and efficient kernels run on
[b, s, heads, d] buffers and return their output transposed to [b, heads, s, d] (aten/src/ATen/native/
transformers/cuda/attention.cu ``_scaled_dot_product_flash_attention_cuda``: ``q_t = query.transpose(1, 2)``
... ``output.transpose(1, 2)``), so transformers' ``attn_output.transpose(1, 2).contiguous()``
(integrations/sdpa_attention.py:195 at 5.24) and ``reshape(*input_shape, -1).contiguous()``
(modeling_llama.py:269) are views.  Eager attention's ``probs @ v`` is [b, heads, s, d] in memory, and
its transpose is copied (``_out_proj_input``).

Compare Korthikanti et al. (arXiv 2205.05198, eq. 2): sbh(34 + 5as/h) for GPT-3 blocks
in fp16 with dropout and LayerNorm; our count differs because Llama keeps an fp32
residual stream under autocast, casts per consumer, has a gated MLP and no dropout,
and flash attention saves no s x s term.  The docs (docs/conventions.md) compare both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from vramplan.spec.model import LayerSpec, ModelSpec
from vramplan.units import ceil_div


class SavedTensor(NamedTuple):
    """One kind of tensor autograd saves for the backward: ``copies`` tensors of ``nbytes`` each.

    ``nbytes`` is per token in the per-token functions below (``attention_tensors``, ``mlp_tensors``,
    ``norm_tensors``, ``layer_tensors``) and in bytes in a layer's list (analytic/terms/layers.py
    ``LayerActivations.tensors``).  ``part`` is its lifetime: made in the layer's forward, freed by the
    backward of that part of the layer ("mlp": the MLP's backward, which runs first; "attention": the
    attention's, which ends the layer's backward).  The closed form (``attention_saved``, ``mlp_saved``,
    ``norms_saved``, ``layer_saved_per_token``) is the sum of these records, and the allocator's event
    stream (analytic/events.py) allocates each of them: one model of the saved tensors.
    """

    name: str
    nbytes: int
    copies: int = 1  # equal tensors (one autocast copy per consuming projection)
    part: str = "attention"

    @property
    def total(self) -> int:
        return self.nbytes * self.copies


def total_bytes(tensors: Iterable[SavedTensor]) -> int:
    """The bytes of ``tensors`` (each record's ``nbytes x copies``)."""
    return sum(t.nbytes * t.copies for t in tensors)


def _T(name: str, nbytes: int, copies: int = 1) -> SavedTensor:
    return SavedTensor(name, nbytes, copies)


_tuple_new = tuple.__new__  # a record made without NamedTuple's ``_replace`` / ``__new__`` frames (a step makes hundreds)


def scaled(tensors: Iterable[SavedTensor], k: int) -> tuple[SavedTensor, ...]:
    """``tensors`` with every record's bytes times ``k`` (per token -> per layer: ``k`` = tokens)."""
    return tuple(_tuple_new(SavedTensor, (t[0], t[1] * k, t[2], t[3])) for t in tensors)


def _in_part(tensors: Iterable[SavedTensor], part: str) -> list[SavedTensor]:
    return [_tuple_new(SavedTensor, (t[0], t[1], t[2], part)) for t in tensors]


def _times(tensors: Iterable[SavedTensor], k: int) -> list[SavedTensor]:
    """Per routed token -> per token: each record holds the ``k`` routed rows of every token (one tensor)."""
    return list(scaled(tensors, k))


@dataclass(frozen=True)
class ActContext:
    compute_bytes: int  # c: matmul outputs, attention tensors
    residual_bytes: int  # r: residual stream dtype
    linear_input_bytes: int  # how a linear's saved input is stored (1 for fp8)
    autocast: bool
    attention: str  # resolved kernel: "flash" | "efficient" | "eager" | "math"
    gqa_repeat: bool  # K/V repeated to all heads before attention (eager/math)
    seq_len: int  # keys per query row (s for the s x s term)
    tp: int = 1
    ep: int = 1  # expert parallelism: whole experts per rank (else each expert is split over tp)
    sequence_parallel: bool = False
    frozen_base: bool = False  # PEFT: base linears do not need their inputs saved
    lora_targets: frozenset[str] = frozenset()
    lora_rank: int = 0
    lora_dropout: bool = False
    dora: bool = False
    dropout: bool = True  # training mode applies the config's dropout probabilities
    # dtype of linear outputs that feed elementwise ops (0: the compute dtype).  bitsandbytes'
    # Linear4bit/Linear8bitLt return ``out.to(input_dtype)``, so with fp32 hidden states (after
    # prepare_model_for_kbit_training) the MLP's SiLU and product run and are saved in fp32.
    elementwise_bytes: int = 0
    # dtype bytes of the routed experts' tensors: transformers >= 5 runs them through
    # ``torch.nn.functional.grouped_mm`` on ``input.to(weight.dtype)``, and grouped_mm is not on
    # autocast's lists, so fp32 expert weights (mixed precision) compute and save in fp32.
    expert_bytes: int = 0
    # QLoRA on MoE: the routed experts are per-expert bitsandbytes linears (as transformers 4.x held
    # them and replace_with_bnb_linear converted them; trace/quant.py ``QuantExperts``), run one
    # expert at a time by the eager experts loop instead of the grouped GEMMs.
    expert_loop: bool = False
    # transformers 5 + peft: LoRA on the fused experts / the router through ``ParamWrapper`` (layout.py
    # ``LoraTargets``): the adapted weight ``W + s B A`` requires grad, so the ops that use it save their input
    gate_up_wrapped: bool = False
    down_wrapped: bool = False
    router_wrapped: bool = False
    sdpa: bool = True  # attention through torch SDPA (False: the flash-attention package)
    adapter_bytes: int = 4  # LoRA adapters' dtype (peft keeps them in fp32)
    # bitsandbytes < 0.43.2: MatMul4Bit.forward kept its input for the backward whenever the input
    # required grad (``ctx.tensors = (A, B)``), although only B is needed;
    # bitsandbytes-foundation/bitsandbytes#1270 (released in 0.43.2, July 2024) made it (None, B).
    kbit_saves_input: bool = False
    # train.liger_kernels: Liger-Kernel's RMSNorm and SwiGLU replace transformers' (``liger_saved`` below)
    liger: bool = False
    # the peft LoRA layer class that wraps each adapted base linear: "Linear" (``peft.tuners.lora.layer``, a plain
    # base), "Linear4bit" / "Linear8bitLt" (``peft.tuners.lora.bnb``, a bitsandbytes base); "" for LoRA that peft's
    # layers do not run (torchtune's, Lit-GPT's, Unsloth's) or a base of another format
    peft_layer: str = ""
    # the dtype bitsandbytes' 4-bit weights were quantized from (``dequantize_4bit`` returns it: the load dtype)
    kbit_state_bytes: int = 2
    # the norms' weights as the forward sees them (4: fp32; 2: a half model, a frozen half base)
    norm_weight_bytes: int = 4

    @property
    def ew(self) -> int:
        return self.elementwise_bytes or self.compute_bytes


def _norm_saved(kind: str, ctx: ActContext) -> int:
    """Bytes per element a norm saves, including its input (the residual stream)."""
    r = ctx.residual_bytes
    if ctx.liger and kind == "rms":
        # LigerRMSNorm (Liger-Kernel v0.8.2 ops/rms_norm.py ``LigerRMSNormFunction.forward``):
        # ``ctx.save_for_backward(X, W, RSTD)``: the input in its own dtype and one fp32 rstd per row (4 B per
        # token, counted by ``_norm_stats`` as transformers' rsqrt is), whether or not the weight is trainable
        return r
    if kind == "rms":
        # LlamaRMSNorm: x.to(fp32) (saved by pow and mul; no copy when x is fp32), then
        # weight * x_normed.to(input_dtype) saves the normalized tensor in x's dtype, which is
        # needed only for the weight's gradient (not saved when the base is frozen).
        return 4 if ctx.frozen_base else 4 + r
    if kind == "rms_fp32":
        # GptOssRMSNorm (modeling_gpt_oss.py): x.to(fp32) as above, then ``(self.weight * x_normed).to(input_dtype)``
        # multiplies in fp32, so the normalized tensor its weight's gradient needs is fp32 whatever the residual
        # dtype.  Example, gpt-oss-20b h = 2880 in bf16-true: (4 + 4) * 2880 = 23,040 B per token per norm
        # (Llama's form saves 4 + 2).
        return 4 if ctx.frozen_base else 8
    if kind == "gemma_rms":
        # GemmaRMSNorm: x.float() and the fp32 normalized tensor (multiplied by 1 + weight; the
        # latter is saved for the weight's gradient only).
        return 4 if ctx.frozen_base else 8
    if kind == "layer_fp32":
        # CohereLayerNorm (modeling_cohere.py): x.to(fp32); (x - mean).pow(2) saves the fp32 difference (4);
        # (x - mean) is computed a second time and saved by the multiplication with rsqrt (4); weight *
        # normalized saves the fp32 normalized tensor (4) for the weight's gradient only.  Per element 12 B
        # (8 with a frozen weight), whatever the residual dtype.  Example, Command-R h = 8192, full
        # fine-tuning: 12 * 8192 = 98,304 B per token for its one norm per layer.
        return 8 if ctx.frozen_base else 12
    if kind == "layer_nonparam":
        # OlmoLayerNorm (modeling_olmo.py): F.layer_norm(x.to(fp32)) without weight saves its fp32 input
        # (the residual itself when it is fp32), and nothing for a weight.  Example, OLMo-7B h = 4096:
        # 4 * 4096 = 16,384 B per token per norm, also in bf16-true (where nn.LayerNorm would save 2 B).
        return 4
    # LayerNorm: autocast runs layer_norm in fp32 (input cast if needed), saving the fp32 input.
    return 4 if ctx.autocast else r


def layer_norm_saved(m: ModelSpec, ctx: ActContext) -> int:
    """Bytes per element one of the layer's norms saves.

    A post-norm layer (``Traits.post_norms``: OLMo-2, EXAONE 4: ``residual + norm(sublayer(x))``) normalizes
    the sublayer's output, in the compute dtype c, instead of the residual stream: ``x.to(fp32)`` is a copy
    (4 B, saved by pow and mul), and ``weight * x_normed.to(input_dtype)`` saves the normalized tensor in c for
    the weight's gradient only.  Example, EXAONE-4.0-1.2B h = 2048 under bf16 mixed precision:
    (4 + 2) x 2048 = 12,288 B per token per norm (a pre-norm on the fp32 residual saves 8 x 2048).
    """
    if m.traits.post_norms and m.norm == "rms":
        return _post_rms_saved(ctx)
    return _norm_saved(m.norm, ctx)


def _post_rms_saved(ctx: ActContext) -> int:
    """Bytes per element Llama's RMSNorm saves on a sublayer's output (compute dtype): the fp32 copy, and the
    normalized tensor in the compute dtype for the weight's gradient (none for a frozen weight)."""
    return 4 if ctx.frozen_base else 4 + ctx.compute_bytes


def _norm_stats(kind: str) -> int:
    """Bytes per token a norm saves besides its per-element tensors: its per-row statistics, in fp32.

    RMSNorm (Llama, Gemma, gpt-oss, DeepSeek's low-rank norms) and CohereLayerNorm compute
    ``x * torch.rsqrt(variance + eps)``: ``mul`` saves both operands and ``rsqrt`` its result
    (derivatives.yaml ``rsqrt: -0.5 * grad * result.pow(3)``), one fp32 value per row, 4 B per token,
    whether or not the weight is trainable (the input's gradient needs it).  LayerNorm
    (``native_layer_norm``, and OLMo's weightless ``F.layer_norm``) saves the row's ``mean`` and ``rstd``,
    in the accumulation type (fp32 for half inputs: aten/src/ATen/native/cuda/layer_norm_kernel.cu
    ``RowwiseMomentsCUDAKernel`` writes ``T_ACC* mean, T_ACC* rstd``): 8 B per token.  Checked with
    ``torch.autograd.graph.saved_tensors_hooks`` on transformers 5.24's ``LlamaRMSNorm`` (a [b, s, 1] fp32
    tensor beside the fp32 input and the normalized one) and on ``F.layer_norm`` (two [b, s, 1] fp32).
    """
    return 8 if kind in ("layer", "layer_nonparam") else 4


def norm_saved_per_token(m: ModelSpec, ctx: ActContext) -> int:
    """Bytes per token one of the model's norms saves: its per-element tensors and its row statistics."""
    return layer_norm_saved(m, ctx) * m.hidden_size + _norm_stats(m.norm)


def _norm_out_bytes(kind: str, ctx: ActContext) -> int:
    if kind == "layer" and ctx.autocast:
        return 4
    # RMSNorm and the fp32 LayerNorms of Cohere and OLMo return ``.to(input_dtype)``: the residual's dtype
    return ctx.residual_bytes


def _linear_inputs(width: int, modules: tuple[str, ...], in_bytes: int, ctx: ActContext) -> int:
    """Saved bytes per token for the shared input of ``modules`` (e.g. q,k,v)."""
    return total_bytes(_linear_input_tensors("input", width, modules, in_bytes, ctx))


def _linear_input_tensors(name: str, width: int, modules: tuple[str, ...], in_bytes: int,
                          ctx: ActContext) -> list[SavedTensor]:
    """``_linear_inputs`` as records named ``name``: one autocast (or fp8) copy per consumer, or the shared
    input itself; with a frozen base, what the adapters keep (``_adapter_input_tensors``)."""
    c = ctx.compute_bytes
    casts = ctx.autocast and in_bytes != c
    if not ctx.frozen_base:
        if casts or ctx.linear_input_bytes != in_bytes:
            return [_T(f"{name}.input_cast", ctx.linear_input_bytes * width, len(modules))]  # one cast per consumer
        return [_T(f"{name}.input", in_bytes * width)]
    return _adapter_input_tensors(name, width, modules, in_bytes, ctx)


def _adapter_inputs(width: int, modules: tuple[str, ...], in_bytes: int, ctx: ActContext) -> int:
    """Frozen base: what the LoRA adapters on ``modules`` save, per token (``_adapter_input_tensors``)."""
    return total_bytes(_adapter_input_tensors("lora", width, modules, in_bytes, ctx))


def _adapter_input_tensors(name: str, width: int, modules: tuple[str, ...], in_bytes: int,
                           ctx: ActContext, input_saved: bool = False) -> list[SavedTensor]:
    """Frozen base: what the LoRA adapters on ``modules`` save, per token, as records named ``name``.

    peft keeps adapters in fp32 (``get_peft_model(autocast_adapter_dtype=True)``) and casts each
    adapter's input to that dtype (``_cast_input_dtype``); under autocast the matmul casts it back
    to the compute dtype, one copy per adapter, saved by lora_A.  Without autocast the fp32 copy is
    saved (and, when the input already is fp32, the input itself, shared).  LoRA dropout adds its
    1-byte mask; lora_A's output is saved by lora_B.

    peft's LoRA over a bitsandbytes linear (``lora/bnb.py``) casts the input only without autocast
    (``requires_conversion = not torch.is_autocast_enabled()``), and autocast's cast of a tensor already in the
    compute dtype is that tensor: without dropout every adapter then saves the input itself, one tensor, and
    nothing more when another op saves it already (``input_saved``: o_proj's input is the attention kernel's
    saved output, flash or memory-efficient SDPA).  The traced engine, QLoRA on Llama-2-7B's layers: o_proj's
    adapter adds lora_A's output only.
    """
    c, a = ctx.compute_bytes, ctx.adapter_bytes
    hit = [m for m in modules if m in ctx.lora_targets]
    per = c if ctx.autocast else a
    kbit = _kbit_inputs(width, modules, in_bytes, ctx, shared=bool(hit) and not ctx.lora_dropout and per == in_bytes)
    out = [_T(f"{name}.kbit_input", kbit)] if kbit else []
    if not hit:
        return out
    n = len(hit)
    if ctx.lora_dropout:
        out += [_T(f"{name}.lora_dropout_mask", width, n), _T(f"{name}.lora_input", per * width, n)]
    elif ctx.peft_layer in ("Linear4bit", "Linear8bitLt") and ctx.autocast and in_bytes == c:
        if not input_saved:
            out.append(_T(f"{name}.lora_input", in_bytes * width))  # the input itself, shared by the adapters
    elif not ctx.autocast and in_bytes == a:
        out.append(_T(f"{name}.lora_input", in_bytes * width))  # no cast: every adapter saves the same input
    else:
        out.append(_T(f"{name}.lora_input", per * width, n))
    out.append(_T(f"{name}.lora_a_output", per * ctx.lora_rank, n))  # lora_A output, saved by lora_B
    return out


def mixer_adapter_tensors(name: str, width: int, modules: tuple[str, ...], in_bytes: int,
                          ctx: ActContext) -> list[SavedTensor]:
    """Frozen base: what the LoRA adapters on a mixer's ``modules`` (which read one input of ``width`` features in
    ``in_bytes``) save, per token, as the attention's and the MLP's adapters do (``_adapter_input_tensors``: fp32
    adapters' input copies, or the input itself where no cast runs; dropout; lora_A's output)."""
    return _adapter_input_tensors(name, width, modules, in_bytes, ctx)


def _kbit_inputs(width: int, modules: tuple[str, ...], in_bytes: int, ctx: ActContext, shared: bool) -> int:
    """What old bitsandbytes' 4-bit linears on ``modules`` keep of their input, per token.

    ``MatMul4Bit`` (< 0.43.2) keeps the input ``Linear4bit.forward`` hands it, ``x.to(compute_dtype)``,
    as a plain attribute (``ctx.tensors = (A, B)``, bitsandbytes/autograd/_functions.py), not through
    ``save_for_backward``: the autograd engine frees a node's saved variables once the node has run
    (``PyNode::release_variables`` clears ``saved_variables`` only), while ``ctx.tensors`` lives as long as
    the graph does, so these inputs are not released as the layer's backward passes
    (``freed_before_mlp_backward_per_token``, ``freed_before_attention_backward_per_token``).
    On its first call the layer makes an fp32 or bf16 input's dtype its compute dtype
    (``Linear4bit.set_compute_type``, bitsandbytes/nn/modules.py since 0.41.0; Lightning's plugin, which
    requires >= 0.41.0, resets ``compute_type_is_set`` for it): only an fp16 input under an fp32 compute
    dtype is cast, which a scenario's dtypes never give.  So every linear keeps the very tensor it
    received: one tensor shared by all ``modules``, nothing new if an adapter already keeps that tensor
    (``shared``), in the input's own dtype.  Example, Lit-GPT Llama-2-7B in bf16: the q/k/v input, the
    attention output, the MLP input and the 11,008-wide product, i.e. (3 x 4096 + 11008) x 2 B = 46,592 B
    per token per layer; at 1,304 tokens over 32 layers that is 1.94 GB.  With fp32 hidden states
    (``prepare_model_for_kbit_training`` under fp16/bf16 autocast) the fp32 inputs are kept: Mistral-7B,
    4 x 4096 (q/k/v) + 4 x 4096 (gate/up) + 4 x 14,336 (the fp32 product into down_proj) = 90,112 B per
    token and layer, where casting per module would have kept 3 x 2 x 4096 + 2 x 2 x 4096 + 2 x 14,336
    = 69,632 B.
    """
    if not ctx.kbit_saves_input:
        return 0
    return 0 if shared else in_bytes * width


def _out_proj_input(width: int, module: str, ctx: ActContext) -> int:
    """The attention output's transpose(1, 2).contiguous() copy, as the output projection saves it
    (full fine-tuning) or as its adapter saves it (frozen base)."""
    return total_bytes(_out_proj_input_tensors(width, module, ctx))


def _out_proj_input_tensors(width: int, module: str, ctx: ActContext) -> list[SavedTensor]:
    if not ctx.frozen_base:
        return [_T("attention.o_proj.input", ctx.compute_bytes * width)]
    return _adapter_input_tensors("attention.o_proj", width, (module,), ctx.compute_bytes, ctx)


def _act_saved(act: str, ctx: ActContext) -> tuple[int, int]:
    """(bytes saved per element by the activation, dtype bytes of its output)."""
    c = ctx.compute_bytes
    if act in ("gelu_new", "gelu_fast"):
        # NewGELUActivation: 0.5*x*(1+tanh(k*(x+0.044715*x^3))), a chain of eager ops. Under
        # autocast pow runs in fp32: saved fp32 x (pow), tanh out, 0.5*x (c), 1+tanh -> 12 + c.
        return (12 + c, 4) if ctx.autocast else (4 * c, c)
    if act == "quick_gelu":
        return 2 * c, c
    if act == "relu2" and ctx.autocast:
        # ReLUSquaredActivation (transformers activations.py): relu saves its output (c); ``torch.square`` is
        # ``pow(x, 2)``, on autocast's fp32 list, so it saves an fp32 copy of that output (4) and returns fp32
        # (Nemotron-H's MLP blocks; without autocast pow saves the relu output itself)
        return c + 4, 4
    return c, c  # silu/gelu/gelu_pytorch_tanh/relu: one saved tensor (input or output)


def _dropout(p: float, ctx: ActContext) -> int:
    """A CUDA dropout saves a 1-byte mask; its output is counted where a consumer saves it."""
    return 1 if (ctx.dropout and p > 0) else 0


def attention_saved(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """Per token: q/k/v inputs and tensors, the kernel's saved state, the output (``attention_tensors``)."""
    return total_bytes(attention_tensors(m, layer, ctx))


def attention_tensors(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> list[SavedTensor]:
    """What the attention block saves, per token, tensor by tensor in the order the forward makes them
    (the norm before it is ``norm_tensors``'s)."""
    c, tp = ctx.compute_bytes, ctx.tp
    heads = ceil_div(m.num_attention_heads, tp)
    in_b = _norm_out_bytes(m.norm, ctx)
    width_in = m.hidden_size  # with sequence parallelism the input is all-gathered before the linear
    if m.mla is not None:
        return _mla_tensors(m, ctx, heads, in_b)
    qw = heads * m.head_dim
    kvw = max(1, ceil_div(m.num_kv_heads, tp)) * m.head_dim
    out = _linear_input_tensors("attention.qkv", width_in, m.traits.qkv_modules, in_b, ctx)
    if m.qk_norm:
        out += qk_norm_tensors(m, ctx, heads, qw, kvw)
    if m.traits.fused_qkv_view and ctx.attention != "math":
        # a fused QKV projection whose q and k are rotated into new tensors: the value handed to the
        # kernel is a view of the fused output, which keeps the whole [q|k|v] buffer alive
        out.append(_T("attention.fused_qkv_buffer", c * (qw + kvw)))
    o_name = m.traits.out_proj_module
    window = layer.sliding_window
    s_keys = min(ctx.seq_len, window) if (window and ctx.attention in ("flash",)) else ctx.seq_len
    if ctx.attention in ("flash", "efficient"):
        # q, k, v as the kernel saves them (no GQA repeat, except Lit-GPT's copy to every query head:
        # analytic/attention.py ``litgpt_kv_repeated``); the output (o_proj's input is a view of it: HF
        # transposes a BSHD buffer); the logsumexp, fp32 per head and query
        kv_saved = qw if ctx.gqa_repeat else kvw
        out += [_T("attention.q", c * qw), _T("attention.k", c * kv_saved), _T("attention.v", c * kv_saved),
                _T("attention.output", c * qw), _T("attention.logsumexp", 4 * heads)]
        if ctx.frozen_base:
            out += _adapter_input_tensors("attention.o_proj", qw, (o_name,), c, ctx, input_saved=True)
        # (transformers' modeling code: Lit-GPT's own attention, ``ctx.gqa_repeat`` under a fused kernel, passes no
        # mask in training and has copied K/V already)
        if ctx.sdpa and ((window and ctx.seq_len >= window) or (m.traits.sdpa_mask_always and not ctx.gqa_repeat)):
            # transformers builds an explicit sliding-window mask once the sequence reaches the window (and a
            # prefix LM's on every forward, Traits.sdpa_mask_always);
            # SDPA then runs the memory-efficient kernel, which keeps the mask (converted to the query
            # dtype, [b, 1, s, s]), and transformers repeats K/V to every head (no enable_gqa with a mask)
            out += [_T("attention.window_mask", c * ctx.seq_len), _T("attention.kv_repeated", c * (qw - kv_saved), 2)]
    elif ctx.attention == "math":
        out += _sdpa_math_tensors(m, ctx, heads, qw, kvw, s_keys)
        out += _out_proj_input_tensors(qw, o_name, ctx)
    else:
        out += _eager_tensors(m, ctx, heads, qw, kvw, s_keys)
        out += _out_proj_input_tensors(qw, o_name, ctx)
    if _dropout(m.hidden_dropout, ctx):
        out.append(_T("attention.residual_dropout_mask", m.hidden_size))
    return [t for t in out if t.nbytes]


def qk_norm_tensors(m: ModelSpec, ctx: ActContext, heads: int, qw: int, kvw: int) -> list[SavedTensor]:
    """The q and k norms, per token: their per-element tensors and one row statistic per normalized row.

    They normalize ``q_proj``/``k_proj``'s output, in the compute dtype c.  Per element: an RMSNorm's fp32
    copy (4; the output itself when c is fp32) and, for its weight's gradient only, the normalized tensor in c
    (Llama's ``weight * x.to(input_dtype)``) or fp32 (GemmaRMSNorm's ``x * (1 + weight)`` and OLMo-2's
    ``(weight * x).to(input_dtype)``, norm kinds "gemma_rms" and "rms_fp32").  Rows: one per head
    (``RMSNorm(head_dim)`` on ``[b, s, heads, head_dim]``: Qwen3, Gemma 3, GLM-4-MoE, EXAONE 4) or one per
    token (``Traits.qk_norm_full_width``: OLMo-2, OLMoE), each keeping its ``_norm_stats`` (RMSNorm's fp32
    rsqrt, 4 B).  Checked with ``torch.autograd.graph.saved_tensors_hooks`` on transformers 5.24 (tests/
    test_saved_norms.py): a Qwen3 layer with 4 heads and 2 KV heads keeps [b, s, 4, 1] and [b, s, 2, 1]
    fp32 tensors beside the normalized ones.  Example, Qwen3-8B (32 heads, 8 KV heads, head_dim 128) under
    bf16 mixed precision: q (4 + 2) x 4096 + 4 x 32 = 24,704 B and k (4 + 2) x 1024 + 4 x 8 = 6,176 B per token.
    """
    kind = m.norm
    c = ctx.compute_bytes
    if kind == "layer_fp32":
        # CohereLayerNorm over (heads, head_dim), the layer's norm kind (see ``_norm_saved``): 12 B, 8 frozen
        per = 8 if ctx.frozen_base else 12
    elif kind in ("gemma_rms", "rms_fp32") or (m.traits.qk_norm_after_rope and ctx.autocast):
        # (HunYuan under autocast: q_proj's half output times the fp32 cos/sin is fp32 before the norm, whose
        # input, kept by its pow and rsqrt multiply, and fp32 normalized tensor, kept by the weight's multiply,
        # are 4 + 4 B per element)
        per = 4 if ctx.frozen_base else 8
    else:
        per = 4 if ctx.frozen_base else 4 + c
    stats = _norm_stats(kind)
    kv_heads = kvw // m.head_dim
    q_rows, k_rows = (1, 1) if m.traits.qk_norm_full_width else (heads, kv_heads)
    return [_T("attention.q_norm", per * qw + stats * q_rows), _T("attention.k_norm", per * kvw + stats * k_rows)]


def _eager_tensors(m: ModelSpec, ctx: ActContext, heads: int, qw: int, kvw: int, s_keys: int) -> list[SavedTensor]:
    """Eager attention's q, k, v (repeated to every head when ``gqa_repeat``), its probabilities (and their
    soft-capped scores, their dropout), per token."""
    c = ctx.compute_bytes
    kv_saved = qw if ctx.gqa_repeat else kvw
    out = [_T("attention.q", c * qw), _T("attention.k", c * kv_saved), _T("attention.v", c * kv_saved)]
    probs = heads * s_keys
    out += eager_softmax_tensors(m, ctx, heads, s_keys)
    if m.traits.attn_logit_softcap:
        # Gemma 2 soft-caps the scores (attn_logit_softcapping, 50 by default): tanh saves its output
        out.append(_T("attention.softcap_output", c * probs))
    if ctx.dropout and m.attention_dropout > 0:
        # the AV matmul saves the dropped probabilities (mask + output) instead of the cast ones
        out = [t for t in out if t.name != "attention.probs_cast"]
        out += [_T("attention.probs_dropout_mask", probs), _T("attention.dropped_probs", c * probs)]
    return out


def _softmax_bytes(m: ModelSpec, ctx: ActContext) -> int:
    """dtype bytes of eager attention's probabilities as the softmax saves them.

    Llama-style ``eager_attention_forward`` calls ``softmax(dtype=torch.float32)``.  gpt-oss
    (modeling_gpt_oss.py) concatenates the per-head sink logits (a parameter) to the scores and calls
    ``softmax(combined_logits, dtype=combined_logits.dtype)``: ``torch.cat`` is on autocast's
    promote-to-widest list, so the probabilities are fp32 when the sinks are (trainable fp32 parameters
    under mixed precision, which ``residual_bytes`` shares with the embeddings) and in the compute dtype
    otherwise (bf16-true, or a frozen bf16 base).  GPT-2 (``softmax(attn_weights, dim=-1)``) and Falcon
    (``softmax(..., dtype=hidden_states.dtype)``, hidden_states the LayerNorm's output), ``Traits.
    eager_softmax_compute_dtype``: fp32 under autocast (softmax and layer_norm are on its fp32 list), else the
    compute dtype (transformers 5.24 modeling_gpt2.py ``eager_attention_forward``, modeling_falcon.py
    ``FalconAttention.forward``).
    """
    if m.traits.eager_softmax_compute_dtype and not ctx.autocast:
        return ctx.compute_bytes
    if not m.attention_sinks:
        return 4
    return max(ctx.compute_bytes, ctx.residual_bytes) if ctx.autocast else ctx.compute_bytes


def probs_cast_saved(m: ModelSpec, ctx: ActContext) -> bool:
    """Whether the AV matmul saves a copy of the probabilities of its own (cast to the compute dtype)
    rather than a view of the softmax output."""
    return _softmax_bytes(m, ctx) != ctx.compute_bytes


def eager_softmax_saved(m: ModelSpec, ctx: ActContext, heads: int, s_keys: int) -> int:
    """Per token: eager attention's softmax output and its compute-dtype copy for the AV matmul.

    Llama-style: scores -> softmax(dtype=fp32), saved (4 B per score) -> ``.to(c)``, saved by the AV
    matmul (c B) when c < 4.  gpt-oss: the softmax runs over the keys and one sink column (s + 1 scores per
    query, in ``_softmax_bytes``); ``combined_logits - combined_logits.max(dim=-1, keepdim=True).values``
    saves max's int64 indices (8 B per head and query); the sink column is dropped by a view
    (``probs[..., :-1]``), so the AV matmul saves a view of the softmax output unless the cast to the value
    dtype copies it.  Example, gpt-oss-20b (64 heads) at s = 4096 under bf16 mixed precision, full
    fine-tuning: 64 x (4 x 4097 + 2 x 4096 + 8) = 1,573,632 B per token per layer.
    """
    return total_bytes(eager_softmax_tensors(m, ctx, heads, s_keys))


def eager_softmax_tensors(m: ModelSpec, ctx: ActContext, heads: int, s_keys: int) -> list[SavedTensor]:
    """``eager_softmax_saved`` as records: the softmax output, its compute-dtype copy, gpt-oss's max indices."""
    c = ctx.compute_bytes
    probs = heads * s_keys
    p = _softmax_bytes(m, ctx)
    if not m.attention_sinks:
        return [_T("attention.softmax", p * probs), _T("attention.probs_cast", c * probs if c < p else 0)]
    return [_T("attention.softmax", p * heads * (s_keys + 1)), _T("attention.probs_cast", c * probs if p != c else 0),
            _T("attention.max_indices", 8 * heads)]


def frozen_input_eager_unsaved(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """Per token: what eager attention with separate q/k/v projections does not save in the layer where the
    frozen prefix ends (its input does not require grad, some of q/k/v carry adapters).

    Only the adapted projections' outputs require grad, and each op saves only what the gradients of its
    inputs that do need (derivatives.yaml): ``q @ k^T`` saves the query for the key's gradient and the
    (repeated) key for the query's; the softmax keeps its output only if the scores require grad (q or k
    adapted), and the AV matmul the values for the probabilities' gradient and the probabilities (their
    compute-dtype copy) for the values'.  SDPA's kernels save q, k, v and the output whenever any of them
    requires grad, so nothing changes there.  Example, LoRA on q_proj and v_proj (the default): the
    rotated query is not kept, c x heads x head_dim per token.
    """
    dropped = frozen_input_eager_dropped(m, layer, ctx)
    if not dropped:
        return 0
    return total_bytes(t for t in attention_tensors(m, layer, ctx) if t.name in dropped)


def frozen_input_eager_dropped(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> frozenset[str]:
    """The names of the ``attention_tensors`` records that ``frozen_input_eager_unsaved`` counts as not saved."""
    if ctx.attention != "eager" or m.mla is not None or not any(p.module == "q_proj" for p in m.params):
        return frozenset()
    t = ctx.lora_targets
    q, k, v = "q_proj" in t, "k_proj" in t, "v_proj" in t
    # q @ k^T saves the query for the key's gradient and the key for the query's
    out = ({"attention.q"} if not k else set()) | ({"attention.k"} if not q else set())
    if ctx.dropout and m.attention_dropout > 0:
        return frozenset(out)
    if not (q or k):
        # the scores do not require grad: no softmax output kept for its own backward, no values for the
        # probabilities' gradient; the AV matmul still keeps the probabilities (the cast copy, or a view of
        # the softmax output) when the values require grad
        out.add("attention.v")
        if probs_cast_saved(m, ctx) or not v:
            out |= {"attention.softmax", "attention.max_indices"}
    if not v:
        out.add("attention.probs_cast")
    return frozenset(out)


def _sdpa_math_tensors(m: ModelSpec, ctx: ActContext, heads: int, qw: int, kvw: int,
                       s_keys: int) -> list[SavedTensor]:
    """SDPA's math backend (attention.cpp ``_scaled_dot_product_attention_math``), per token.

    Half inputs are upcast to fp32 (``allowFP16BF16ReductionMathSDP`` is off by default; ``.to`` saves
    nothing), the query and the transposed keys are scaled (new tensors) and two matmuls run around
    ``_safe_softmax``.  FalconAttention (``Traits.mqa_sdpa_math``) hands over one K/V head, which ``matmul``
    broadcasts: its ``_matmul_impl`` expands the operand to every head and reshapes ``[b, heads, ...]`` to
    ``[b * heads, ...]`` for ``bmm``, which saves both operands.  That reshape is a view while the
    micro-batch is 1 (a size-1 dimension takes no part in the strides, so the stride-0 head dimension
    merges), and a copy to every head otherwise (``ctx.gqa_repeat``, analytic/attention.py
    ``mqa_kv_copied``).  Saved: the fp32 scaled query (its view, or at b > 1 its copy: Falcon's query is a
    transposed view whose heads do not merge with the batch), the fp32 scaled keys and fp32 values (one head,
    or copied to every head), the fp32 softmax output.  The model's own q, k, v are saved by nothing (RoPE's
    products save cos and sin only).  Traced on the meta device with transformers 5.24 (Falcon-7B, bf16,
    LoRA on query_key_value, 256 tokens): 4 x 4,544 + 4 x 64 + 4 x 64 + 4 x 71 x 256 B per token at b = 1,
    3 x 4 x 4,544 + 4 x 71 x 256 at b = 2; within 516 B of an H100's measured saved activations
    (benchmarks/gpu/h100-2026-11-26, falcon7b-lora-r16).
    """
    if not m.traits.mqa_sdpa_math:
        return _sdpa_math_gqa_tensors(m, ctx, heads, qw, s_keys)
    kv = qw if ctx.gqa_repeat else kvw
    out = [_T("attention.math_q_scaled", 4 * qw), _T("attention.math_k_scaled", 4 * kv),
           _T("attention.math_v_fp32", 4 * kv), _T("attention.softmax", 4 * heads * s_keys)]
    # no dropout: FalconAttention's rotary path passes ``dropout_p=0.0`` to SDPA whatever attention_dropout says
    return out


def _sdpa_math_gqa_tensors(m: ModelSpec, ctx: ActContext, heads: int, qw: int, s_keys: int) -> list[SavedTensor]:
    """SDPA's math kernel on grouped K/V handed over with ``enable_gqa=True`` (``gqa_math_fallback``), per token.

    ``_scaled_dot_product_attention_math`` (torch 2.11 attention.cpp) upcasts half inputs to fp32 (``.to``
    saves nothing), scales the query (``query * sqrt(scale)``, a new tensor), repeats K and V to every query
    head (``pre_process_group_query_attention_input``: ``repeat_interleave``), scales the repeated keys (a new
    tensor) and runs matmul -> ``_safe_softmax`` -> matmul.  Saved: the scaled query and scaled keys (the first
    matmul's operands), the repeated values and the softmax output (the second's), all fp32 and per query
    head.  The model's own q, k, v are not saved by anything (RoPE's products save cos and sin only), and
    the output's contiguous copy is ``o_proj``'s input.  Measured on an H200 (Qwen3-0.6B, fp32, 16/8 heads):
    2 q - 2 kv + heads s more per layer and token than the memory-efficient kernel's saved set
    (benchmarks/gpu/h200-2026-11-26).
    """
    out = [_T("attention.math_q_scaled", 4 * qw), _T("attention.math_k_scaled", 4 * qw),
           _T("attention.math_v_repeated", 4 * qw), _T("attention.softmax", 4 * heads * s_keys)]
    if ctx.dropout and m.attention_dropout > 0:
        out += [_T("attention.probs_dropout_mask", heads * s_keys), _T("attention.dropped_probs", 4 * heads * s_keys)]
    return out


def _mla_tensors(m: ModelSpec, ctx: ActContext, heads: int, in_b: int) -> list[SavedTensor]:
    """DeepSeek MLA (modeling_deepseek_v3.py), efficient-attention kernel, per token.

    The low-rank norms save their fp32 input (and, for their weight's gradient, the normalized tensor);
    ``kv_b_proj``'s output is split into the key's no-RoPE part and the value, and the value handed to
    the kernel is a view of it, which keeps the whole [k_nope | v] buffer; the output projection saves
    its input (or its adapter does).
    """
    assert m.mla is not None
    c, a = ctx.compute_bytes, m.mla
    h = m.hidden_size
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    norm = 4 if ctx.frozen_base else 4 + c
    stats = _norm_stats("rms")  # the low-rank norms are RMSNorms (DeepseekV2RMSNorm, DeepseekV3RMSNorm)
    if a.q_lora_rank:
        out = _linear_input_tensors("attention.q_a_kv_a", h, ("q_a_proj", "kv_a_proj_with_mqa"), in_b, ctx)
        out.append(_T("attention.q_a_norm", norm * a.q_lora_rank + stats))
        out += _linear_input_tensors("attention.q_b", a.q_lora_rank, ("q_b_proj",), c, ctx)
    else:
        out = _linear_input_tensors("attention.q_kv_a", h, ("q_proj", "kv_a_proj_with_mqa"), in_b, ctx)
    out.append(_T("attention.kv_a_norm", norm * a.kv_lora_rank + stats))
    out += _linear_input_tensors("attention.kv_b", a.kv_lora_rank, ("kv_b_proj",), c, ctx)
    # query and key after RoPE and concatenation; kv_b_proj's output, kept by the value view
    out += [_T("attention.q", c * heads * qk), _T("attention.k", c * heads * qk),
            _T("attention.kv_b_output", c * heads * (a.qk_nope_head_dim + a.v_head_dim))]
    out += _out_proj_input_tensors(heads * a.v_head_dim, "o_proj", ctx)  # the kernel's output
    out.append(_T("attention.logsumexp", 4 * heads))
    return [t for t in out if t.nbytes]


def mlp_saved(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """Per token: what the MLP (dense, or the router and experts of a MoE layer) saves (``mlp_tensors``)."""
    return total_bytes(mlp_tensors(m, layer, ctx))


def mlp_tensors(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> list[SavedTensor]:
    """What the MLP saves, per token, tensor by tensor in the order the forward makes them (part "mlp")."""
    in_b = _norm_out_bytes(m.norm, ctx)
    if layer.moe and m.moe is not None:
        out = _moe_tensors(m, ctx, in_b)
    elif m.mlp_gated:
        out = _gated_tensors(m, ceil_div(layer.intermediate_size, ctx.tp), in_b, ctx)
    else:
        out = _fc_tensors(m, ceil_div(layer.intermediate_size, ctx.tp), in_b, ctx)
    if _shares_attention_input(m, in_b, ctx):
        # one norm feeds attention and MLP (parallel block) and no cast copies it per consumer: the MLP's
        # first linear saves the very tensor the attention's projections saved (its one input record)
        out = out[1:]
    if _dropout(m.hidden_dropout, ctx):
        out.append(_T("mlp.residual_dropout_mask", m.hidden_size))
    return _in_part((t for t in out if t.nbytes), "mlp")


def _gated_tensors(m: ModelSpec, inter: int, in_b: int, ctx: ActContext, name: str = "mlp",
                   mods: tuple[str, ...] | None = None) -> list[SavedTensor]:
    """A gated MLP (dense, or the shared experts) of ``inter`` intermediate width, per token."""
    c, ew = ctx.compute_bytes, ctx.ew
    act_saved, _ = _act_saved(m.hidden_act, ctx)
    out = _linear_input_tensors(f"{name}.gate_up", m.hidden_size, mods or _gate_up_modules(m), in_b, ctx)
    if ctx.liger:
        # LigerSiLUMulFunction (Liger-Kernel v0.8.2 ops/swiglu.py) saves only its inputs, the gate and up outputs
        # (``ctx.save_for_backward(a, b)``), and recomputes silu(gate) in its backward: 2 ew against
        # transformers' gate, silu output and up (3 ew); liger_kernels is refused for MoE families
        out += [_T(f"{name}.gate_output", ew * inter), _T(f"{name}.up_output", ew * inter)]
    else:
        # gate out (saved by the activation), activation out and up out (saved by the product), in ew (fp32 when
        # bitsandbytes linears return the fp32 hidden states' dtype), then the product (down_proj's input)
        out += [_T(f"{name}.gate_output", (act_saved - c + ew) * inter), _T(f"{name}.act_output", ew * inter),
                _T(f"{name}.up_output", ew * inter)]
    if not ctx.frozen_base:
        out.append(_T(f"{name}.down.input", c * inter))
    else:
        out += _adapter_input_tensors(f"{name}.down", inter, ("down_proj",), ew, ctx)
    return out


def gated_mlp_tensors(m: ModelSpec, inter: int, ctx: ActContext, mods: tuple[str, ...]) -> list[SavedTensor]:
    """A gated MLP of ``inter`` intermediate width after one of the model's norms, whose input ``mods`` read (one
    cast copy each under autocast), per token (Zamba2's shared block: analytic/terms/shared_block.py)."""
    return _gated_tensors(m, ceil_div(inter, ctx.tp), _norm_out_bytes(m.norm, ctx), ctx, "mlp", mods)


def _fc_tensors(m: ModelSpec, inter: int, in_b: int, ctx: ActContext, name: str = "mlp") -> list[SavedTensor]:
    """A non-gated MLP (fc1, activation, fc2), per token (``name``: the records' prefix; a plain shared expert's
    "mlp.shared")."""
    c = ctx.compute_bytes
    act_saved, act_out = _act_saved(m.hidden_act, ctx)
    fc1, fc2 = _fc_names(m)
    if ctx.elementwise_bytes and m.traits.fc_act_in_output_dtype:
        # bitsandbytes' fc1 returns the fp32 hidden states' dtype: the activation runs and saves in ew
        # bytes (NewGELU's chain then keeps four fp32 tensors: x, tanh, 0.5 x and 1 + tanh)
        ew = ctx.elementwise_bytes
        act_saved, act_out = (4 * ew, ew) if m.hidden_act in ("gelu_new", "gelu_fast") else (ew, ew)
    out = _linear_input_tensors(f"{name}.fc1", m.hidden_size, (fc1,), in_b, ctx)
    out.append(_T(f"{name}.activation", act_saved * inter))
    # ReLU saves its output, which is also fc2's input: one tensor, counted once
    if ctx.frozen_base:
        out += _adapter_input_tensors(f"{name}.fc2", inter, (fc2,), act_out, ctx)
    elif m.hidden_act != "relu":
        out.append(_T(f"{name}.fc2.input", (c if act_out != c or ctx.autocast else act_out) * inter))
    return out


def _moe_tensors(m: ModelSpec, ctx: ActContext, in_b: int) -> list[SavedTensor]:
    """A MoE layer's router, routed experts (all routed rows of a kind in one record) and shared experts."""
    assert m.moe is not None
    e, c, h = m.moe, ctx.compute_bytes, m.hidden_size
    if m.traits.fp32_router:
        # ERNIE 4.5's router runs with autocast disabled: F.linear(x.float(), W.float()) keeps the fp32 input
        # (x itself when the norm output is fp32, else a copy) for its weight's gradient
        out = [_T("mlp.router.fp32_input", 4 * h)] if not ctx.frozen_base or ctx.router_wrapped else []
        out += _router_tensors(m, ctx)
    else:
        out = _linear_input_tensors("mlp.router", h, ("gate",), in_b, ctx) + _router_tensors(m, ctx)
    if m.traits.moe_input_jitter and ctx.dropout:
        # PhiMoE in training: ``hidden_states *= torch.empty_like(hidden_states).uniform_(...)`` in the block
        # and again in the router; each in-place mul keeps its noise tensor (the norm output's dtype)
        out += [_T("mlp.jitter_noise.block", in_b * h), _T("mlp.jitter_noise.router", in_b * h)]
    if ctx.router_wrapped and ctx.frozen_base:
        # F.linear(x, W + s B A) keeps x for the adapted weight's gradient: the autocast copy, or x itself
        out.append(_T("mlp.router.adapted_input", (c if ctx.autocast else in_b) * h))
    if ctx.expert_loop:
        act_saved, _ = _act_saved(m.hidden_act, ctx)
        out += _times(_expert_loop_tensors(m, ctx, in_b, act_saved), e.top_k)
    else:
        out += _times(_grouped_experts_tensors(m, ctx), e.top_k)
    if e.shared_intermediate_size and not e.gated:
        out += _fc_tensors(m, ceil_div(e.shared_intermediate_size, ctx.tp), in_b, ctx, "mlp.shared")
    elif e.shared_intermediate_size:
        out += _gated_tensors(m, ceil_div(e.shared_intermediate_size, ctx.tp), in_b, ctx, "mlp.shared",
                              ("gate_proj", "up_proj"))
    return out


def _fc_names(m: ModelSpec) -> tuple[str, str]:
    """The module names of a non-gated MLP's two linears."""
    return m.traits.fc_modules


def _gate_up_modules(m: ModelSpec) -> tuple[str, ...]:
    """A gated MLP's input linears: one fused ``gate_up_proj`` (phi3) or ``gate_proj`` and ``up_proj``."""
    return ("gate_up_proj",) if m.traits.fused_gate_up else ("gate_proj", "up_proj")


def _mlp_adapted(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> tuple[bool, bool, bool, bool]:
    """(gate, up, down, router) of this layer's MLP carry an adapter whose weight needs a gradient.

    Dense and shared-expert MLPs, and the per-expert linears of the experts loop: ``lora.Linear`` on the
    named modules (``layout.lora_targets`` has already dropped the names peft moves to the fused experts).
    transformers 5's fused experts: peft's ``ParamWrapper`` on ``gate_up_proj`` / ``down_proj``.  For a
    non-gated MLP, (fc1, fc1, fc2, False).
    """
    t = ctx.lora_targets
    if layer.moe and m.moe is not None:
        if ctx.expert_loop:
            return "gate_proj" in t, "up_proj" in t, "down_proj" in t, ctx.router_wrapped
        return ctx.gate_up_wrapped, ctx.gate_up_wrapped, ctx.down_wrapped, ctx.router_wrapped
    if not m.mlp_gated:
        fc1, fc2 = _fc_names(m)
        return fc1 in t, fc1 in t, fc2 in t, False
    if m.traits.fused_gate_up:
        return "gate_up_proj" in t, "gate_up_proj" in t, "down_proj" in t, False
    return "gate_proj" in t, "up_proj" in t, "down_proj" in t, False


def frozen_input_mlp(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> tuple[int, bool]:
    """The MLP of a layer in the frozen prefix: (bytes saved per token, whether its output requires grad).

    Under PEFT without checkpointing the frozen embeddings' output does not require grad (peft enables
    input gradients only with checkpointing), and neither does anything computed from it by frozen
    weights.  Autograd records an op only when one of its inputs requires grad, and then saves only what
    the gradients of those inputs need (derivatives.yaml; e.g. ``mul``: ``self`` for ``other``'s gradient,
    ``other`` for ``self``'s; ``mm``: the input for the weight's gradient).  So an MLP whose input is frozen
    saves, per token (g, u, d: gate, up, down carry adapters; I the intermediate width):

    * each adapter's input (lora_A's weight needs it) and lora_A's output, as ``_adapter_inputs``;
      old bitsandbytes' 4-bit matmul keeps nothing, its input not requiring grad;
    * gated MLP: the gate output (saved by the activation) and the up output (saved by the product for
      the activation output's gradient) if g; the activation output (saved for the up output's
      gradient) if u; the product only as the down adapter's input;
    * routed experts (transformers 5 ``grouped_mm_experts_forward``): with gate_up adapted, its gathered
      input, its output and the gating's tensors as in any layer; with down adapted, the product (the
      adapted weight's gradient needs it); the down output only if the routing weights require grad
      (a router adapter), as ``proj_out * sample_weights_g`` saves ``proj_out`` for their gradient;
      without a router adapter the router records nothing (its logits, softmax and top-k do not require
      grad).  The adapted stacks themselves are not kept (``WrappedExperts.prefix_saved``);
    * the experts loop (4-bit per-expert linears): the same per expert;
    * shared experts: as the gated MLP (their names carry no adapter on transformers 5).

    Worked example, the shrunken Qwen3-MoE of the engine matrix (h = 256, I = 96, top-2, bf16 experts)
    with LoRA on down_proj only: the product 2 x 2 x 96 = 384 B per token, where a layer whose input
    requires grad saves 2 x (2 x 2 x 96 + 2 x 96 + 2 x 96 + 2 x 256) + (2 + 4) x 8 = 2,608 B.
    """
    if layer.moe and m.moe is not None:
        return _frozen_input_moe(m, layer, ctx)
    c, h = ctx.compute_bytes, m.hidden_size
    in_b = _norm_out_bytes(m.norm, ctx)
    frozen_in = replace(ctx, kbit_saves_input=False)
    g, u, d, _ = _mlp_adapted(m, layer, ctx)
    act_saved, _ = _act_saved(m.hidden_act, ctx)
    ew = ctx.ew
    saved = 0
    inter = ceil_div(layer.intermediate_size, ctx.tp)
    if m.mlp_gated:
        mods = _gate_up_modules(m)
        saved += _adapter_inputs(h, mods, in_b, frozen_in)
        if ctx.liger:
            # LigerSiLUMulFunction is recorded when gate or up requires grad, and then saves both (mlp_saved)
            saved += 2 * ew * inter if (g or u) else 0
        else:
            saved += ((act_saved - c + ew) * g + ew * g + ew * u) * inter
        saved += _adapter_inputs(inter, ("down_proj",), ew, replace(
            ctx, kbit_saves_input=ctx.kbit_saves_input and (g or u)))
    else:
        saved += _frozen_input_fc(m, inter, in_b, ctx, g)
    live = g or u or d
    if live:
        saved += _dropout(m.hidden_dropout, ctx) * h
    return saved, live


def _frozen_input_fc(m: ModelSpec, inter: int, in_b: int, ctx: ActContext, fc1_adapted: bool) -> int:
    """Per token, what a plain MLP (fc1, activation, fc2: ``Traits.fc_modules``) of ``inter`` intermediate width saves
    on a frozen input (``frozen_input_mlp``): the adapters' inputs, and the activation's tensors only when fc1's
    adapter makes its output require grad."""
    fc1, fc2 = _fc_names(m)
    act_saved, act_out = _act_saved(m.hidden_act, ctx)
    if ctx.elementwise_bytes and m.traits.fc_act_in_output_dtype:
        ew = ctx.elementwise_bytes  # as mlp_saved: bitsandbytes' fc1 returns fp32
        act_saved, act_out = (4 * ew, ew) if m.hidden_act in ("gelu_new", "gelu_fast") else (ew, ew)
    saved = _adapter_inputs(m.hidden_size, (fc1,), in_b, replace(ctx, kbit_saves_input=False))
    saved += act_saved * inter if fc1_adapted else 0
    return saved + _adapter_inputs(inter, (fc2,), act_out,
                                   replace(ctx, kbit_saves_input=ctx.kbit_saves_input and fc1_adapted))


def _frozen_input_moe(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> tuple[int, bool]:
    """``frozen_input_mlp`` for a MoE layer: the router (when adapted), the routed experts per routed token
    and the shared experts."""
    assert m.moe is not None
    c, h, e = ctx.compute_bytes, m.hidden_size, m.moe
    in_b = _norm_out_bytes(m.norm, ctx)
    g, u, d, rw = _mlp_adapted(m, layer, ctx)
    saved = 0
    if rw:
        # F.linear(x, W + s B A) keeps x for the adapted weight's gradient; the logits require grad
        saved += (c if ctx.autocast else in_b) * h + _router_saved(m, ctx)
    per, exp_live = _frozen_input_routed(m, ctx, (g, u, d, rw), in_b)
    saved += e.top_k * per
    live = exp_live or rw
    if e.shared_intermediate_size and not e.gated:
        # a plain shared expert (NemotronHMLP: the model's fc_modules up_proj and down_proj), as a plain dense MLP
        fc1, fc2 = _fc_names(m)
        su = fc1 in ctx.lora_targets
        saved += _frozen_input_fc(m, ceil_div(e.shared_intermediate_size, ctx.tp), in_b, ctx, su)
        live = live or su or fc2 in ctx.lora_targets
    elif e.shared_intermediate_size:
        si = ceil_div(e.shared_intermediate_size, ctx.tp)
        act_saved, _ = _act_saved(m.hidden_act, ctx)
        ew = ctx.ew
        sg, su, sd = ("gate_proj" in ctx.lora_targets, "up_proj" in ctx.lora_targets,
                      "down_proj" in ctx.lora_targets)
        saved += _adapter_inputs(h, ("gate_proj", "up_proj"), in_b, replace(ctx, kbit_saves_input=False))
        saved += ((act_saved - c + ew) * sg + ew * sg + ew * su) * si
        saved += _adapter_inputs(si, ("down_proj",), ew, replace(
            ctx, kbit_saves_input=ctx.kbit_saves_input and (sg or su)))
        live = live or sg or su or sd
    return saved, live


def _frozen_input_routed(m: ModelSpec, ctx: ActContext, adapted: tuple[bool, bool, bool, bool],
                         in_b: int) -> tuple[int, bool]:
    """Per routed token of a MoE layer in the frozen prefix: (bytes saved, whether the experts' output requires
    grad), for the experts loop (per-expert 4-bit linears) or transformers 5's grouped experts."""
    g, u, d, rw = adapted
    c, h = ctx.compute_bytes, m.hidden_size
    ei = _expert_inter(m, ctx)
    if not ctx.expert_loop:
        w = ctx.expert_bytes or c
        if m.moe is not None and m.moe.gated:
            inner = w * 2 * ei + w * ei + w * ei * _gate_extra(m)
        else:  # plain experts: the activation's saved tensor (``_grouped_experts_tensors``)
            inner = _plain_expert_act_saved(m, ctx, w) * ei
        per = (w * h + inner) if g else 0
        per += w * ei if d else 0
        per += w * h if rw else 0
        return per, g or d
    act_saved, _ = _act_saved(m.hidden_act, ctx)
    ew = ctx.ew
    per = _adapter_inputs(h, ("gate_proj", "up_proj"), in_b, replace(ctx, kbit_saves_input=False))
    per += ((act_saved - c + ew) * g + ew * g + ew * u) * ei
    exp_live = g or u or d
    if exp_live:
        per += _adapter_inputs(ei, ("down_proj",), ew, replace(ctx, kbit_saves_input=ctx.kbit_saves_input and (g or u)))
        per += ew * h + 8 + 8 + 4  # the product saved by index_add_, the gathers' indices and weight
    per += ew * h if rw else 0  # the down output, for the routing weight's gradient
    return per, exp_live


def _shares_attention_input(m: ModelSpec, in_b: int, ctx: ActContext) -> bool:
    """A parallel block with one norm (phi, Command-R, StableLM's parallel variant) whose output reaches the
    linears uncast (no autocast cast, no fp8 copy) and is saved once for attention and MLP together."""
    one_norm = m.traits.shared_norm_output
    casts = ctx.autocast and in_b != ctx.compute_bytes
    return one_norm and not ctx.frozen_base and not casts and ctx.linear_input_bytes == in_b


def _router_saved(m: ModelSpec, ctx: ActContext) -> int:
    """Per token: what the router keeps beyond its input (``_router_tensors``)."""
    return total_bytes(_router_tensors(m, ctx))


def _router_tensors(m: ModelSpec, ctx: ActContext) -> list[SavedTensor]:
    """Per token: what the router keeps beyond its input.

    Mixtral/Qwen-MoE/DeepSeek: the logits (c) and the fp32 softmax probabilities over all experts.
    gpt-oss (``GptOssTopKRouter``): ``topk`` on the logits first, which saves only its int64 indices (8 B
    per selected expert), then the softmax over the top-k values, which saves its k-wide output (c).
    """
    assert m.moe is not None
    c = ctx.compute_bytes
    if m.traits.router_topk_first:
        return [_T("mlp.router.topk_indices", 8 * m.moe.top_k), _T("mlp.router.softmax", c * m.moe.top_k)]
    if m.traits.fp32_router:
        # Ernie4_5_MoeTopKRouter: the fp32 softmax over all experts (saved), then topk on it plus the correction
        # bias, and gather (int64 index, 8 B per selected expert) of the k probabilities
        return [_T("mlp.router.softmax", 4 * m.moe.num_experts), _T("mlp.router.topk_indices", 8 * m.moe.top_k)]
    if m.traits.sparsemixer_router:
        # PhiMoE's sparsemixer (modeling_phimoe.py, training): PhimoeMultiplier keeps the logits (c) and each
        # round's softmax over the masked logits (fp32 under autocast: 2 x 4), each masked_fill its bool mask
        # (2 x 1), per expert; per round the gathered weight (4), the int64 expert index (8) and mask_for_one (4)
        e = m.moe.num_experts
        return [_T("mlp.router.logits", c * e), _T("mlp.router.sparsemixer_softmax", 8 * e),
                _T("mlp.router.sparsemixer_masks", 2 * e), _T("mlp.router.sparsemixer_rounds", 2 * (4 + 8 + 4))]
    return [_T("mlp.router.logits", c * m.moe.num_experts), _T("mlp.router.softmax", 4 * m.moe.num_experts)]


def _plain_expert_act_saved(m: ModelSpec, ctx: ActContext, w: int) -> int:
    """Bytes per element a plain expert's activation saves when it runs in the experts' dtype ``w`` (the up
    projection's output dtype: ``_grouped_mm`` computes in the weight's dtype).  ReLU^2 under autocast: ``relu`` saves
    its output and ``pow`` (autocast's fp32 list) an fp32 copy of it, none when the experts are fp32 already (mixed
    precision's fp32 weights); otherwise ``_act_saved`` with w in the compute dtype's place."""
    if m.hidden_act == "relu2" and ctx.autocast:
        return w + (0 if w == 4 else 4)
    return _act_saved(m.hidden_act, ctx)[0] - ctx.compute_bytes + w


def _gate_extra(m: ModelSpec) -> int:
    """Intermediate-width tensors per routed token that an expert's gating saves beyond SiLU's
    (the gate/up output, the activation output and the product).

    gpt-oss's ``GptOssExperts._apply_gate`` (modeling_gpt_oss.py): ``gate.clamp(max=limit)`` and
    ``up.clamp(-limit, limit)`` save the gate/up output (counted), ``gate * torch.sigmoid(gate * alpha)``
    saves the clamped gate and the sigmoid's output, ``(up + 1) * glu`` saves ``up + 1`` and ``glu``
    (the activation output's place): three more I-wide tensors.
    """
    return 3 if m.traits.clamped_glu_experts else 0


def _expert_inter(m: ModelSpec, ctx: ActContext) -> int:
    """One expert's intermediate width on this rank: split over tp like a dense MLP (transformers'
    ``moe_tp_experts`` plan: ``packed_colwise`` gate_up, ``rowwise`` down) unless experts are
    distributed whole by expert parallelism."""
    assert m.moe is not None
    ei = m.moe.expert_intermediate_size
    return ei if ctx.ep > 1 else ceil_div(ei, ctx.tp)


def grouped_experts_saved(m: ModelSpec, ctx: ActContext) -> int:
    """Per routed token: what transformers >= 5's grouped experts save (``_grouped_experts_tensors``)."""
    return total_bytes(_grouped_experts_tensors(m, ctx))


def _grouped_experts_tensors(m: ModelSpec, ctx: ActContext) -> list[SavedTensor]:
    """Per routed token (token x top_k): transformers >= 5 ``grouped_mm_experts_forward``.

    Tokens are sorted by expert and gathered (top_k rows per token), then two grouped GEMMs run in
    the experts' dtype w.
    """
    assert m.moe is not None
    h, ei = m.hidden_size, _expert_inter(m, ctx)
    w = ctx.expert_bytes or ctx.compute_bytes
    gate_up = not ctx.frozen_base or ctx.gate_up_wrapped  # the weight (or its LoRA-adapted copy) needs a gradient
    down = not ctx.frozen_base or ctx.down_wrapped
    if not m.moe.gated:
        # plain experts (``has_gate=False``): ``act_fn`` on the up output, then down.  The activation saves what
        # ``_act_saved`` says with the experts' dtype w in the compute dtype's place (ReLU^2: ``relu`` saves its
        # output; under autocast ``square`` is ``pow``, on the fp32 list, and saves an fp32 copy of it); the down
        # projection's ``_grouped_mm`` casts its input to the weight's dtype (``input.to(weight.dtype)``: grouped_mm
        # is not autocast-enabled), a w-byte tensor saved for the weight's gradient
        return [_T("mlp.experts.gathered_input", w * h if gate_up else 0),
                _T("mlp.experts.act_saved", _plain_expert_act_saved(m, ctx, w) * ei),
                _T("mlp.experts.down_input", w * ei if down else 0),
                _T("mlp.experts.down_output", w * h)]
    return [
        _T("mlp.experts.gathered_input", w * h if gate_up else 0),  # saved for the weight gradient
        _T("mlp.experts.gate_up_output", w * 2 * ei),  # SiLU saves the gate half, the product the up half
        _T("mlp.experts.act_output", w * ei),  # saved by the product
        _T("mlp.experts.clamped_glu", w * ei * _gate_extra(m)),  # gpt-oss's clamped SwiGLU
        _T("mlp.experts.down_input", w * ei if down else 0),  # the product, saved for down's weight gradient
        _T("mlp.experts.down_output", w * h),  # saved by the multiplication with the routing weight
    ]


@dataclass(frozen=True)
class WrappedExperts:
    """Bytes per MoE layer of LoRA on transformers 5's fused experts (``wrapped_experts``)."""

    gate_up: int  # the adapted gate_up_proj stack, E x 2I x h (0: not adapted)
    gate_up_casts: int  # its two factors cast to the experts' dtype
    down: int  # the adapted down_proj stack, E x h x I
    down_casts: int
    router: int  # the adapted router weight and, under autocast, its factors' half casts
    router_casts: int = 0  # the part of ``router`` that is the factors' half casts

    @property
    def saved(self) -> int:
        return self.gate_up + self.gate_up_casts + self.down + self.down_casts + self.router

    @property
    def prefix_saved(self) -> int:
        """What a layer of the frozen prefix (``frozen_input_mlp``) keeps: the adapted stacks and router
        weight are saved by their matmul only for the gradient of its input, which does not require grad
        there; the factor casts are saved by ``baddbmm`` (and the router's ``B @ A``) for the adapters'
        own gradients.  But with gate_up adapted its output, down's input, requires grad, so a wrapped
        down's grouped GEMM keeps its adapted stack for that input's gradient (the shrunken ERNIE 4.5 and
        Mixtral of the engine matrix with LoRA on gate, up and down: -6.3% and -3.0% of the traced engine
        without it, tests/test_trace_matrix.py)."""
        return self.gate_up_casts + self.down_casts + self.router_casts + (self.down if self.gate_up else 0)


def wrapped_experts(m: ModelSpec, gate_up_rank: int, down_rank: int, router_rank: int, w: int,
                    adapter_bytes: int, ctx: ActContext) -> WrappedExperts:
    """What LoRA on transformers 5's fused experts keeps per MoE layer, from the forward to its backward.

    peft's ``ParamWrapper`` (tuners/lora/layer.py) registers a parametrization on each targeted 3-D
    parameter for the forward: ``_LoraFactorsProxy`` returns ``torch.baddbmm(W, lhs, rhs, alpha=s)``, a
    new tensor the size of the whole expert stack in the experts' dtype ``w`` (``lhs``/``rhs`` are lora_B
    and lora_A reshaped per expert and cast to ``w`` by ``get_delta_factors``: copies when the adapters
    are fp32).  The grouped GEMM keeps that adapted weight for its input gradient, and baddbmm keeps the
    two factors, until the layer's backward.  The router's 2-D weight goes through
    ``_LoraParameterProxy``: ``W + (B @ A) s`` (E x h) is kept by the router's linear, and under autocast
    the matmul keeps its half casts of A and B.  (``register_parametrization`` also evaluates each
    parametrization once to check it: a stack-sized temporary freed at once, below the backward's peak.)

    Worked example (Mixtral-8x7B, bf16 weights, fp32 adapters, r = 16, all-linear: gate_up rank 32):
    gate_up 2 x 8 x 28672 x 4096 = 1.88 GB + casts 2 x 8 x 32 x (28672 + 4096) = 16.8 MB; down
    2 x 8 x 4096 x 14336 = 0.94 GB + 2 x 8 x 16 x 18432 = 4.7 MB: 2.82 GB per layer, 90 GB over 32 layers.
    """
    assert m.moe is not None
    e = m.moe
    n_exp = ceil_div(e.num_experts, ctx.ep)
    inter = _expert_inter(m, ctx)
    h = m.hidden_size
    cast = w != adapter_bytes
    router = router_casts = 0
    if router_rank:
        router_casts = ctx.compute_bytes * router_rank * (h + e.num_experts) if ctx.autocast else 0
        router = w * e.num_experts * h + router_casts
    return WrappedExperts(
        gate_up=w * n_exp * 2 * inter * h if gate_up_rank else 0,
        gate_up_casts=w * n_exp * gate_up_rank * (2 * inter + h) if cast else 0,
        down=w * n_exp * h * inter if down_rank else 0,
        down_casts=w * n_exp * down_rank * (h + inter) if cast else 0,
        router=router, router_casts=router_casts)


def wrapped_experts_backward(m: ModelSpec, wx: WrappedExperts, ctx: ActContext, tokens: int,
                             transient: int, released: int) -> tuple[int, int]:
    """The MLP backward of a MoE layer whose fused experts carry LoRA: (transient, released) bytes such
    that ``alive - released + transient`` is the largest of its three moments.

    ``transient``/``released`` are the closed-form elementwise moment's (``backward_transients_per_token``,
    ``freed_before_mlp_backward_per_token``, times the tokens).  Each adapted projection's backward makes
    the gradient of its adapted weight (the size of the stack) next to its input gradient:

    * down first, with nothing of the layer released yet: the incoming residual gradient (r h), the
      gradient of the down output (w h) and of its input (w I) per routed token, and dW_down;
    * the elementwise moment, by which down's adapted weight and factors are released too;
    * gate_up last: the gradient of its output (2 w I) and input (w h) per routed token, and dW_gate_up.
    """
    assert m.moe is not None
    k, h, ei = m.moe.top_k, m.hidden_size, _expert_inter(m, ctx)
    w, r = ctx.expert_bytes or ctx.compute_bytes, ctx.residual_bytes
    rel = released + wx.down + wx.down_casts
    moments = [transient]
    if wx.down:
        moments.append(rel + wx.down + tokens * (r * h + w * k * (h + ei)))
    if wx.gate_up:
        moments.append(wx.gate_up + tokens * (r * h + w * k * (2 * ei + h)))
    return max(moments), rel


def _expert_loop_tensors(m: ModelSpec, ctx: ActContext, in_b: int, act_saved: int) -> list[SavedTensor]:
    """Per routed token (token x top_k): the eager experts loop over per-expert bitsandbytes linears
    (QLoRA; ``MixtralExperts.forward``, modeling_mixtral.py:68-92, with 4.x's per-expert MLP).

    Each ``Linear4bit`` returns ``out.to(input dtype)``, so with the fp32 hidden states of
    ``prepare_model_for_kbit_training`` every tensor below is in ``ew`` (fp32 under autocast), as in
    the dense QLoRA MLP.  The frozen projections save no input; their adapters (if targeted) do.

    * gate output (saved by the activation), activation output and up output (saved by the product);
    * down output, saved by the multiplication with the routing weight (both operands need grads);
    * that product, saved by ``index_add_`` (derivatives.yaml expresses the source's gradient
      through ``source``);
    * the int64 top-k position and token index from ``torch.where`` (saved by the gathers) and the
      gathered fp32 routing weight: 8 + 8 + 4 bytes.

    Worked example (Mixtral-8x7B, fp16-mixed QLoRA, attention-only adapters, ew = 4): 3 * 4 * 14336
    + 2 * 4 * 4096 + 20 = 204,820 bytes per routed token; top-2 -> 409,640 bytes per token and layer.
    """
    assert m.moe is not None
    h, ei, c, ew = m.hidden_size, _expert_inter(m, ctx), ctx.compute_bytes, ctx.ew
    out = _adapter_input_tensors("mlp.experts.gate_up", h, ("gate_proj", "up_proj"), in_b, ctx)
    out += [_T("mlp.experts.gate_output", (act_saved - c + ew) * ei), _T("mlp.experts.act_output", ew * ei),
            _T("mlp.experts.up_output", ew * ei)]
    out += _adapter_input_tensors("mlp.experts.down", ei, ("down_proj",), ew, ctx)
    out += [_T("mlp.experts.down_output", ew * h), _T("mlp.experts.weighted_output", ew * h),
            _T("mlp.experts.routing_indices", 8 + 8), _T("mlp.experts.routing_weight", 4)]
    return out


def norms_saved(m: ModelSpec, ctx: ActContext) -> int:
    """The layer's norms (their inputs included) per token (``norm_tensors``, without sequence parallelism)."""
    return total_bytes(norm_tensors(m, ctx))


def norm_tensors(m: ModelSpec, ctx: ActContext) -> list[SavedTensor]:
    """The layer's norms (their inputs included) per token, one record per norm: the input norm (part
    "attention"), the post-attention norm (part "mlp": freed before the attention's backward); Gemma's
    sandwich norms two in each part; a parallel block's norm(s) in the attention part."""
    per = norm_saved_per_token(m, ctx)
    if m.sandwich_norms:
        # the post-sublayer norms normalize the sublayer's output: Gemma's multiply in fp32 (as the pre-norms), GLM-4's
        # are Llama's RMSNorm (``Traits.sandwich_post_rms``: GLM-4-9B h = 4096 under bf16 mixed precision saves
        # (4 + 2) x 4096 + 4 = 24,580 B per token in each, against 8 x 4096 + 4 in a norm of the fp32 residual)
        post = (_post_rms_saved(ctx) * m.hidden_size + _norm_stats(m.norm) if m.traits.sandwich_post_rms
                and m.norm == "rms" else per)
        return [_T("norm.input", per), _T("norm.post_attention", post),
                SavedTensor("norm.pre_feedforward", per, 1, "mlp"), SavedTensor("norm.post_feedforward", post, 1, "mlp")]
    if m.parallel_residual:
        # GPT-NeoX / Falcon: attention and MLP read the same layer input; its norm(s) save
        # that one input (LayerNorm saves only its input, mean and rstd).  Under autocast a half
        # residual (a frozen base) is cast to fp32 by each LayerNorm (layer_norm is on autocast's fp32
        # list), so two norms (GPT-NeoX's input_layernorm and post_attention_layernorm, Falcon's
        # ln_attn and ln_mlp) save two copies.
        if m.norm == "layer" and ctx.autocast and ctx.residual_bytes != 4:
            return [_T("norm.input", per, max(1, len({p.module for p in m.params if p.role == "norm" and p.layer_span
                                                      and "attn." not in p.name and "attention." not in p.name})))]
        return [_T("norm.input", per)]
    return [_T("norm.input", per), SavedTensor("norm.post_attention", per, 1, "mlp")]


def _sliced(tensors: list[SavedTensor], tp: int) -> list[SavedTensor]:
    """Sequence parallelism: each rank keeps 1/tp of the tokens of ``tensors``; ``ceil_div(total, tp)`` in all,
    each record its share (the last one the rounding)."""
    total = ceil_div(total_bytes(tensors), tp)
    out = [t._replace(nbytes=t.total // tp, copies=1) for t in tensors]
    last = out[-1]
    out[-1] = last._replace(nbytes=last.nbytes + total - total_bytes(out))
    return out


def norm_weight_tensors(m: ModelSpec, ctx: ActContext, layer: Iterable[SavedTensor]) -> list[SavedTensor]:
    """The fp32 tensors made from a norm's weight that its product keeps for the input's gradient, one record per
    norm call of the layer (``layer``: the layer's per-token records, whose norms are named ``norm.*``,
    ``attention.q_norm`` and ``attention.k_norm``), in bytes per layer whatever the tokens.

    * "gemma_rms" (transformers 5.24 modeling_gemma3.py line 132, modeling_gemma2.py line 62, modeling_gemma.py
      line 77): ``output * (1.0 + self.weight.float())``: the sum is a new fp32 tensor of the weight's width
      whatever the weight's dtype, saved by the multiplication for ``output``'s gradient (``1.0 + w`` and the
      ``.float()`` copy of a half weight before it are the add's inputs, not saved);
    * "layer_fp32" (CohereLayerNorm, modeling_cohere.py line 64) and the norms with ``Traits.norm_weight_to_fp32``
      (NemotronHRMSNorm, modeling_nemotron_h.py line 633): ``self.weight.to(torch.float32) * hidden_states``: a
      copy when the weight is half (``norm_weight_bytes`` 2), saved the same way; an fp32 weight is its own
      ``.to`` (no copy, nothing new saved);
    * other norms multiply by the weight itself (a parameter: no new storage).

    Width: the hidden size for the layer's own norms; a q/k norm's weight (``RMSNorm(head_dim)`` in Gemma 3,
    ``(heads, head_dim)`` in Cohere), read from the model's parameters.  Checked against the trace of the real
    modules: Gemma 3 shrunk to h 256 (head_dim 64) keeps 4 x 1,024 + 2 x 256 = 4,608 B per layer this way, and
    Gemma-3-1B (h 1,152, head_dim 256) 4 x 4,608 + 2 x 1,024 = 20,480 B.
    """
    cast = (m.norm == "layer_fp32" or m.traits.norm_weight_to_fp32) and ctx.norm_weight_bytes < 4
    if not (cast or m.norm == "gemma_rms"):
        return []
    width = {p.module: p.numel for p in m.params if p.role == "norm" and p.layer_span}
    out = []
    for t in layer:
        if t.name.startswith("norm."):
            n = m.hidden_size * t.copies
        elif t.name in ("attention.q_norm", "attention.k_norm"):
            n = width.get(t.name.split(".")[1], 0)
        else:
            continue
        out.append(SavedTensor(t.name + ".weight_fp32", 4 * n, 1, t.part))
    return [t for t in out if t.nbytes]


def layer_tensors(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> list[SavedTensor]:
    """Everything one layer saves for backward, per token on this GPU, record by record: the attention part
    (its norm, the attention) then the MLP part (its norm, the MLP), each in the order the forward makes
    them.  ``layer_saved_per_token`` is their sum."""
    norms = norm_tensors(m, ctx)
    if ctx.sequence_parallel and ctx.tp > 1:
        norms = _sliced(norms, ctx.tp)
    attn = [t for t in norms if t.part == "attention"] + attention_tensors(m, layer, ctx)
    return attn + [t for t in norms if t.part == "mlp"] + mlp_tensors(m, layer, ctx)


def layer_saved_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """Everything one layer saves for backward, per token on this GPU (the sum of ``layer_tensors``).

    With sequence parallelism (Megatron, arXiv 2205.05198 section 4.2.2) the norm and
    residual tensors are split over the tp ranks as well.
    """
    return total_bytes(layer_tensors(m, layer, ctx))


def layer_backward_transient_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """Gradient tensors alive together inside one layer's backward, per token (the larger of the
    MLP's and the attention's; see ``backward_transients_per_token``)."""
    return max(backward_transients_per_token(m, layer, ctx))


def freed_before_attention_backward_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """What a layer's backward has released when it reaches the attention: the MLP's saved tensors
    and the post-attention norm's (the MLP runs last in the forward, so first in the backward).

    Models with a parallel residual (GPT-NeoX, Falcon) run both branches from one input, so
    nothing is counted as released for them.
    """
    if m.parallel_residual:
        return 0
    # the norms the MLP's part holds (``norm_tensors``: the post-attention norm, or a sandwich's pre- and
    # post-feedforward norms)
    norms = sum(t.nbytes * t.copies for t in norm_tensors(m, ctx) if t.part == "mlp")
    if ctx.sequence_parallel and ctx.tp > 1:
        norms = ceil_div(norms, ctx.tp)
    freed = mlp_saved(m, layer, ctx) + norms - _mlp_kbit_inputs(m, layer, ctx)
    if ctx.attention == "eager" and m.mla is None:
        # eager attention's backward reaches the softmax after the output projection's and the
        # probabilities-times-values backward: their saved input, the cast (or dropped) probabilities
        # and the values are released by then
        c = ctx.compute_bytes
        heads = ceil_div(m.num_attention_heads, ctx.tp)
        qw = heads * m.head_dim
        kvw = max(1, ceil_div(m.num_kv_heads, ctx.tp)) * m.head_dim
        probs = heads * (min(ctx.seq_len, layer.sliding_window) if (
            layer.sliding_window and ctx.attention == "flash") else ctx.seq_len)
        o_name = m.traits.out_proj_module
        freed += _out_proj_input(qw, o_name, ctx) + c * (qw if ctx.gqa_repeat else kvw)
        dropped = ctx.dropout and m.attention_dropout > 0
        freed += c * probs if (dropped or probs_cast_saved(m, ctx)) else 0
    return freed


def freed_before_mlp_backward_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """What the MLP's backward has released by the time its elementwise gradients peak: the output
    projection's saved input (its backward runs first); for MoE also the experts' down output."""
    c = ctx.compute_bytes
    if layer.moe and m.moe is not None:
        e = m.moe
        if ctx.expert_loop:
            # the loop's backward starts with the last expert alone: its down output and the product
            # saved by index_add_ (top_k * T / E of the routed tokens)
            return ceil_div(e.top_k * 2 * ctx.ew * m.hidden_size, e.num_experts)
        w = ctx.expert_bytes or c
        down = not ctx.frozen_base or ctx.down_wrapped
        per_routed = w * m.hidden_size + (w * _expert_inter(m, ctx) if down else 0)
        return e.top_k * per_routed
    inter = ceil_div(layer.intermediate_size, ctx.tp)
    if m.mlp_gated:
        if not ctx.frozen_base:
            return c * inter
        # old bitsandbytes' kept input is not released by the down projection's backward (see _kbit_inputs)
        return _adapter_inputs(inter, ("down_proj",), ctx.ew, ctx) - _kbit_inputs(
            inter, ("down_proj",), ctx.ew, ctx, shared=_kbit_shared(("down_proj",), ctx.ew, ctx))
    return 0


def _kbit_shared(modules: tuple[str, ...], in_bytes: int, ctx: ActContext) -> bool:
    """Whether an adapter on ``modules`` already keeps the very input tensor (as ``_adapter_inputs`` decides)."""
    per = ctx.compute_bytes if ctx.autocast else ctx.adapter_bytes
    return any(mod in ctx.lora_targets for mod in modules) and not ctx.lora_dropout and per == in_bytes


def _mlp_kbit_inputs(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """The dense gated MLP's inputs kept by old bitsandbytes (gate/up's shared input, down's input), per token:
    held by the autograd graph until it is freed, so not released as the MLP's backward passes."""
    if not (ctx.kbit_saves_input and ctx.frozen_base and m.mlp_gated) or layer.moe:
        return 0
    inter = ceil_div(layer.intermediate_size, ctx.tp)
    in_b = _norm_out_bytes(m.norm, ctx)
    mods = _gate_up_modules(m)
    return (_kbit_inputs(m.hidden_size, mods, in_b, ctx, shared=_kbit_shared(mods, in_b, ctx))
            + _kbit_inputs(inter, ("down_proj",), ctx.ew, ctx, shared=_kbit_shared(("down_proj",), ctx.ew, ctx)))


def backward_transients_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> tuple[int, int]:
    """(MLP, attention) gradient tensors alive together inside one layer's backward, per token.

    The gated MLP's backward holds the incoming residual gradient (r*h), the product's
    gradient and the two gradients it splits into (3 intermediate-size tensors), and the
    outgoing gradient of the layer input (r*h).  Flash attention's backward holds dO, dQ,
    dK, dV and an fp32 dQ accumulator (flash-attention 2, ``dq_accum``); eager attention
    adds the gradient of the scores in the compute dtype and in fp32.
    """
    c, r, h = ctx.compute_bytes, ctx.residual_bytes, m.hidden_size
    heads = ceil_div(m.num_attention_heads, ctx.tp)
    ew = ctx.ew
    if layer.moe and m.moe is not None and ctx.expert_loop:
        # the experts loop runs its backward one expert at a time: one expert's share of the routed
        # tokens (top_k * T / E) holds its elementwise gradients at once
        inter = ceil_div(_expert_inter(m, ctx) * m.moe.top_k, m.moe.num_experts)
    elif layer.moe and m.moe is not None:
        inter = _expert_inter(m, ctx) * m.moe.top_k
        ew = ctx.expert_bytes or ew
    else:
        inter = ceil_div(layer.intermediate_size, ctx.tp)
    # Liger's SwiGLU backward writes the gate's and up's gradients into its saved inputs (``swiglu_backward``
    # returns a and b): only the product's gradient is a new intermediate-size tensor
    mlp = 2 * r * h + (1 if ctx.liger and not layer.moe else 3) * ew * inter
    qw = heads * m.head_dim
    # K/V copied to every query head before a fused kernel (Lit-GPT, ``ctx.gqa_repeat``): its dK and dV are as wide
    # as the copies, summed into the K/V heads' gradients after the kernel
    kv = qw if ctx.gqa_repeat and ctx.attention in ("flash", "efficient") else m.kv_width
    attn = 2 * r * h + c * (2 * qw + 2 * kv) + 4 * qw
    if ctx.attention in ("eager", "math"):
        attn += (4 + c) * heads * ctx.seq_len
    return mlp, attn


def recompute_forward_bytes(m: ModelSpec, layer: LayerSpec, ctx: ActContext,
                            tokens: int = 1) -> tuple[int, int] | None:
    """Full checkpointing, peft's LoRA on a dense gated MLP's layer: what the recomputed layer's forward holds at its
    peak beside the layer's saved tensors, as (bytes per token, bytes per layer), at its largest for ``tokens``
    tokens in the micro-batch; (0, 0) where it is known not to exceed the MLP backward's moment (plain LoRA with no
    adapter in the MLP); None where it is not derived (the caller keeps the MLP backward's transients, the report
    says so).

    The backward reaches the layer at its output's gradient (``r h``); the first node to need a saved tensor is
    lora_B's matmul, after the ``* scaling`` product has made its gradient (``c h``), and its unpacking recomputes
    the layer (torch.utils.checkpoint, non-reentrant).  At the down projection the recomputed forward holds,
    besides what it saves: the layer's input and the residual when the norms copy them to fp32 (``2 r h``;
    LlamaDecoderLayer's ``hidden_states`` and ``residual``: a norm saves its fp32 copy; with an fp32 residual it
    saves the tensor itself), the norm's output (the MLP's ``x``: the frozen gate/up save their adapters' casts,
    not it) and the product ``act(gate) * up`` (``ew I``: the frozen down_proj saves nothing, its adapter a cast).

    * peft's ``lora.Linear`` over a plain linear: the base projection's output (``c h``) and
      ``_cast_input_dtype``'s copy of the product in the adapter's dtype (``a I``, bound to ``x`` in
      ``Linear.forward`` until it returns; with LoRA dropout, dropout's output beside it while lora_A runs:
      ``2 a I``).  Llama-2-7B's layer in bf16 under autocast, fp32 adapters, no dropout: 2 x 4,096 x 2 +
      3 x 2 x 4,096 + 2 x 11,008 + 2 x 4,096 + 4 x 11,008 = 115,200 B per token.
    * peft's ``lora.Linear4bit`` over bitsandbytes' 4-bit linear, inside the base matmul, before the adapter
      runs (so less the adapter's records, ``mlp_released``): ``MatMul4Bit.forward`` runs
      ``linear(A, dequantize_4bit(B).to(A.dtype))``, the weight dequantized in its load dtype (``q``) and copied
      to the input's (``ew``), then cast by autocast to ``c`` with the input (``c I``) and the output (``c h``).
      Llama-2-7B's layer with fp32 hidden states (prepare_model_for_kbit_training), bf16 weights: per token
      4 x 4,096 + 2 x 4,096 + 4 x 4,096 + 4 x 11,008 + 2 x 11,008 + 2 x 4,096 - 22,048 = 93,152 B, per layer
      (4 + 2) x 4,096 x 11,008 = 270,532,608 B.  Then, in the adapter, the base output cast back to the input's
      dtype and ``result.clone()`` (``2 ew h``), with dropout its output (``ew I``): the larger moment for the
      micro-batch's tokens (the adapter's at long sequences).

    All read off the traced engine, which runs peft's and transformers' modules on the meta device
    (benchmarks/recompute_moment.py, Llama-2-7B's layers: LoRA and QLoRA on every linear 0.929 and 0.888 of its peak
    before, 1.002 and 1.001 now; QLoRA on q_proj and v_proj 0.946 before, 0.9995 now).
    """
    if not _recompute_derived(m, layer, ctx):
        return None
    h, inter, r, c, a, ew = m.hidden_size, layer.intermediate_size, ctx.residual_bytes, ctx.compute_bytes, \
        ctx.adapter_bytes, ctx.ew
    copied = 2 * r * h if r != 4 else 0
    norm_out = _norm_out_bytes(m.norm, ctx)
    q = ctx.kbit_state_bytes
    weight = (ew if ew != q else q) * h * inter + (c * h * inter if ew != c else 0)
    if "down_proj" not in ctx.lora_targets:
        if {"gate_proj", "up_proj"} & ctx.lora_targets:
            return None
        if ctx.peft_layer == "Linear":
            # plain LoRA outside the MLP: at up_proj the recompute holds the gradients (r h + c I), the layer's
            # input and residual copies (2 r h, when r < 4) and the norm's output (r h), at most 4 r h + c I beside
            # up's output, which the MLP backward's 2 r h + 3 ew I covers whenever h <= I, as in every gated MLP
            # (the traced engine at Llama-2-7B's layers: 1.0004)
            return 0, 0
        # no adapter in the MLP, 4-bit base: down's MatMul4Bit backward needs no saved tensor (bitsandbytes keeps
        # the packed weight as a ctx attribute) and makes the product's gradient (cast to the input's dtype, ew I);
        # the product's backward then unpacks the activation and up outputs, and torch's early stop ends the
        # recompute at that product: its peak is up_proj's matmul, with the layer's gradient, the norm's output,
        # the weight dequantized and cast, the input cast (c h) and the output (c I), before up's output (ew I,
        # saved).  Llama-2-7B, fp32 hidden states: 4 x 4,096 + 4 x 4,096 + 2 x 4,096 + 2 x 11,008 = 62,976 B a
        # token and 270,532,608 B of weight
        cast_in = c * h if norm_out != c else 0
        return r * h + copied + norm_out * h + cast_in + c * inter, weight
    incoming = r * h + c * h
    held = copied + norm_out * h + ew * inter
    if ctx.peft_layer == "Linear":
        cast = a * inter * (2 if ctx.lora_dropout else 1) if a != ew else 0
        return incoming + held + c * h + cast, 0
    return _bnb4_down_moment(incoming + held, inter, weight, tokens, m, ctx)


def _recompute_derived(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> bool:
    """Whether ``recompute_forward_bytes`` is derived for ``layer``: peft's LoRA (plain or 4-bit bitsandbytes) under
    autocast, a Llama-style dense gated MLP after an RMSNorm, no tensor parallelism, no Liger kernels."""
    peft_layers = ctx.peft_layer in ("Linear", "Linear4bit") and ctx.autocast and ctx.tp == 1 and not ctx.liger
    llama_style = (not layer.moe and m.mlp_gated and m.norm == "rms"
                   and not (m.sandwich_norms or m.parallel_residual or m.traits.post_norms or m.traits.fused_gate_up))
    return peft_layers and llama_style


def _bnb4_down_moment(alive: int, inter: int, weight: int, tokens: int, m: ModelSpec,
                      ctx: ActContext) -> tuple[int, int]:
    """QLoRA with an adapter on down_proj: inside its MatMul4Bit (the input cast ``c I`` if the product is not in the
    compute dtype, the output ``c h``, the weight, less the adapter's records not made yet), or after it in the
    adapter (the base output cast back to the input's dtype and its clone, ``result.clone()``, and with LoRA dropout
    dropout's output beside the cast lora_A saves): the larger for ``tokens`` tokens.  ``alive``: the gradients and
    the held intermediates, per token."""
    h, c, ew = m.hidden_size, ctx.compute_bytes, ctx.ew
    adapter = total_bytes(_adapter_input_tensors("mlp.down", inter, ("down_proj",), ew, ctx))
    in_base = alive + (c * inter if ew != c else 0) + c * h - adapter
    in_adapter = alive + 2 * ew * h + (ew * inter if ctx.lora_dropout else 0)
    return (in_base, weight) if in_base * tokens + weight >= in_adapter * tokens else (in_adapter, 0)


def checkpoint_saved_per_token(m: ModelSpec, ctx: ActContext) -> int:
    """Full activation checkpointing keeps only each layer's input (the residual stream)."""
    width = m.hidden_size if not (ctx.sequence_parallel and ctx.tp > 1) else ceil_div(m.hidden_size, ctx.tp)
    return ctx.residual_bytes * width


def selective_saved_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """Selective recomputation (arXiv 2205.05198 section 5): drop the s x s attention tensors.

    With flash/efficient attention nothing quadratic is saved, so this equals no checkpointing.
    """
    full = layer_saved_per_token(m, layer, ctx)
    if ctx.attention in ("flash", "efficient"):
        return full
    heads = ceil_div(m.num_attention_heads, ctx.tp)
    c = ctx.compute_bytes
    probs = heads * ctx.seq_len
    quadratic = eager_softmax_saved(m, ctx, heads, ctx.seq_len)
    if ctx.dropout and m.attention_dropout > 0:
        quadratic += probs * (1 + c)
    return full - quadratic


def op_sac_saved_per_token(m: ModelSpec, layer: LayerSpec, ctx: ActContext) -> int:
    """torchtitan's op-level selective checkpointing: what one dense layer keeps, per token on this GPU.

    ``_apply_op_sac`` (torchtitan/distributed/activation_checkpoint.py) saves the outputs of the ops on the
    model's ``_op_sac_save_list`` and recomputes the rest: ``aten.mm`` except every second one (the policy
    counts the layer's mm calls and skips the even ones), the SDPA kernels (flash/efficient: the output and
    the fp32 logsumexp; math: the output and the attention weights), plus the checkpoint's input.  A linear
    with a bias runs ``aten.addmm``, which is not on the list and not counted.  The layer's linears run in
    the order the adapter lists them (q, k, v, o, then gate, up, down).

    Worked example, Llama-2-7B layer in bf16 with flash (h = 4096, I = 11008, 32 heads of 128): input 2 h
    + q (1st mm) 2 h + v (3rd) 2 h + gate (5th) 2 I + down (7th) 2 h + SDPA output 2 h + logsumexp 4 x 32
    = 5 x 8,192 + 22,016 + 128 = 63,104 bytes per token.
    """
    saved = checkpoint_saved_per_token(m, ctx)
    c = ctx.compute_bytes
    names = {p.name for p in m.params}
    count = 0
    for p in m.params:
        if p.role != "linear" or layer.index not in p.layer_span or not p.out_features:
            continue
        if p.name.removesuffix(".weight") + ".bias" in names:
            continue  # addmm: not on the save list
        count += 1
        if count % 2:
            saved += c * (ceil_div(p.out_features, ctx.tp) if p.tp == "column" else p.out_features)
    heads = ceil_div(m.num_attention_heads, ctx.tp)
    if ctx.attention in ("flash", "efficient"):
        saved += c * heads * m.head_dim + 4 * heads
    elif ctx.attention == "math":
        saved += c * heads * m.head_dim + c * heads * ctx.seq_len
    return saved


def shared_saved_per_token(m: ModelSpec, ctx: ActContext, checkpointing: str = "none",
                           attention_recorded: bool = True) -> int:
    """Tensors shared by all layers: RoPE cos/sin, an eager attention mask, embedding dropout.

    The 4-D additive mask [b, 1, s, s] (compute dtype) that transformers builds for eager attention
    (masking_utils ``create_causal_mask``) is only added to the scores, and an addition saves neither
    operand (derivatives.yaml ``add.Tensor``), so without checkpointing nothing keeps it past the model's
    forward.  A checkpointed layer (full, or the selective attention core) saves its inputs, the mask
    among them, until its backward: then the masks are kept, one per kind the layers use (gpt-oss and
    Gemma 2/3 build a sliding-window mask and a full one, ``causal_mask_mapping``).

    RoPE's cos and sin are saved by the multiplications with q and k, for q's and k's gradients: not at
    all when no layer's attention records anything (``attention_recorded`` False: a frozen prefix that
    reaches past the last layer's attention, e.g. LoRA on the experts of a two-layer DeepSeek whose dense
    first layer carries no adapter).
    """
    c = ctx.compute_bytes
    out = 0
    recomputed = checkpointing in ("full", "selective", "attention-core", "op-sac")
    if m.position == "rope" and attention_recorded and (recomputed or not m.traits.rotary_per_layer_copy):
        # GLM's products save each layer's own copies instead (analytic/terms/saved.py ``rotary_layer_copies``); a
        # checkpointed layer keeps the shared pair among its inputs.  The pair covers the rotated dims only
        # (``partial_rotary_factor``: GLM's half, Qwen3-Next's quarter)
        out += 2 * c * int(m.head_dim * m.partial_rotary_factor)
    if ctx.attention in ("eager", "math") and recomputed:
        kinds = len({ls.sliding_window for ls in m.layers}) or 1
        out += kinds * c * ctx.seq_len
    elif m.traits.sdpa_mask_always and ctx.sdpa and not ctx.gqa_repeat and recomputed:
        # the checkpointed layers keep their inputs, the prefix LM's boolean mask among them (one byte per key)
        out += ctx.seq_len
    if m.traits.embedding_dropout and ctx.dropout and m.hidden_dropout > 0:
        # GPT-2, BERT and OPT drop the embeddings with the hidden dropout probability, StarCoder2 with
        # embedding_dropout (0.1 in the published configs, as is its residual_dropout, which hidden_dropout
        # holds): a 1-byte mask per element
        out += m.hidden_size
    return out
