"""A training step of a model that reads its images through cross-attention layers (Llama 3.2 Vision, mllama;
transformers 5.24 ``models/mllama/modeling_mllama.py``), its vision model and projector frozen or trained
(``trained_tower_bytes``).

The language model's self-attention layers are Llama's and keep the engine's decoder-layer terms
(``analytic/activations.py``).  A cross-attention layer (``MllamaCrossAttentionDecoderLayer``) runs over the text
tokens like them, but its keys and values come from the projected vision states (``cross_attention_states``,
[b, L, h] with L = images x max_num_tiles x (patches + class token) per sample: 4 x 1,025 = 4,100 per image), so
what it saves splits into a part per text token (``cross_text_tensors``) and a part per vision position
(``cross_vision_tensors``):

* per text token: the input RMSNorm; ``q_proj``'s input; ``q_norm`` (``MllamaTextRMSNorm`` over head_dim: its fp32
  copy, its rsqrt per head and, for its weight's gradient, the normalised tensor); the memory-efficient SDPA
  kernel's query, output and fp32 logsumexp (a mask is given, so torch's SDPA cannot take flash:
  ``sdp_utils.cpp`` ``check_for_attn_mask``); ``o_proj``'s input (a view of the kernel's output under full
  fine-tuning, LoRA's copies under PEFT); the mask [b, 1, p, L] as the kernel keeps it (below); the trained
  gate's product ``cross_attn_attn_gate.tanh() * hidden_states`` keeps o_proj's output; the post-attention norm and
  the gated SiLU MLP (Llama's); ``full_text_row_masked_out_mask[:, 0] * hidden_states`` saves the mask (which
  exists anyway) and its output, in the promoted dtype of the MLP's output and the mask (the model's dtype), is
  kept by the trained ``cross_attn_mlp_gate`` product;
* per vision position: what ``k_proj`` and ``v_proj`` keep of their input (LoRA's copies under PEFT; under full
  fine-tuning the one ``cross_attention_states`` tensor that every layer's k_proj and v_proj save, counted once in
  ``cross_saved``), ``k_norm``'s tensors when the keys require grad, and the keys and values the kernel saves:
  ``sdpa_attention_forward`` (``integrations/sdpa_attention.py``) repeats K and V to every query head
  (``repeat_kv``: new tensors) because ``use_gqa_in_sdpa`` is False with a mask.

The mask: ``_prepare_cross_attention_mask`` builds [b, 1, p, L] in the model's dtype.  SDPA's memory-efficient
kernel keeps it; autocast casts it to the compute dtype first (one copy per layer) and aten ``preprocess_mask`` pads
a row of L keys to a multiple of 8 (``mem_efficient_mask_row``: 4,104 for 4,100), another copy per layer.  With
neither, the one mask is kept by every layer (``cross_saved``).

Frozen (``train.freeze_vision_tower`` or PEFT), the vision model and the projector record nothing; trained (full
fine-tuning), what they save is ``trained_tower_bytes``.  Their forward's own peak comes before the language
model's and is not a moment of the step (``spec/vision.py`` ``cross_attention_notes`` states it).  A sample without
image skips the cross-attention layers (``MllamaTextModel.forward``): they save nothing.
"""

from __future__ import annotations

from vramplan.analytic import activations as act
from vramplan.analytic.attention import mem_efficient_mask_row
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.cross_attention import cross_images
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, LOSS, TIED_EMBEDDING
from vramplan.spec.model import LayerSpec, ModelSpec

__all__ = ["cross_layer", "cross_saved", "cross_sequence", "cross_text_tensors", "cross_text_transient", "cross_vision_positions",
           "cross_vision_tensors", "cross_vision_transient", "gate_tensors", "mask_per_layer", "states_kept_by_lora",
           "tower_trained",
           "trained_tower_bytes"]


def cross_layer(c: StepContext, ls: LayerSpec) -> bool:
    """Whether ``ls`` is a cross-attention layer of the model."""
    v = c.m.vision
    return v is not None and bool(v.cross_attention_tokens_per_image) and ls.index in v.cross_attention_layers


def cross_vision_positions(c: StepContext) -> tuple[int, int]:
    """(L, b x L): the vision positions a sample's cross-attention layers attend to (images x tiles x positions),
    and the micro-batch's; (0, 0) without image."""
    ci = cross_images(c.m, c.s.train.micro_batch_size, c.s.train.images_per_sample)
    if ci is None:
        return 0, 0
    return ci.vision_tokens, ci.batch * ci.vision_tokens


def mask_per_layer(ctx: act.ActContext, vision_per_sample: int) -> bool:
    """Whether each cross-attention layer's kernel keeps its own copy of the mask: autocast casts the model-dtype
    mask to the compute dtype, or the kernel pads a row that is not a multiple of 8 keys (module docstring)."""
    return (ctx.autocast and ctx.residual_bytes != ctx.compute_bytes) or vision_per_sample % 8 != 0


def states_kept_by_lora(ctx: act.ActContext) -> bool:
    """LoRA on k_proj / v_proj keeps ``cross_attention_states`` itself, the one tensor of every layer: peft casts an
    adapter's input to the adapter's dtype (``_cast_input_dtype``), a no-op when it already is (fp32 without
    autocast), and without dropout lora_A saves that very input (``activations._adapter_input_tensors``)."""
    return (ctx.frozen_base and not ctx.autocast and ctx.compute_bytes == ctx.adapter_bytes and not ctx.lora_dropout
            and bool({"k_proj", "v_proj"} & ctx.lora_targets))


def _gates_trained(ctx: act.ActContext) -> bool:
    """The tanh gates are parameters of the language model: trained under full fine-tuning, frozen under PEFT."""
    return not ctx.frozen_base


def cross_text_tensors(m: ModelSpec, ls: LayerSpec, ctx: act.ActContext, vision_per_sample: int) -> list[act.SavedTensor]:
    """What a cross-attention layer saves per text token, record by record in the forward's order (module
    docstring); the attention part, then the MLP part."""
    c, r, h = ctx.compute_bytes, ctx.residual_bytes, m.hidden_size
    heads, qw = m.num_attention_heads, m.num_attention_heads * m.head_dim
    norms = act.norm_tensors(m, ctx)
    in_b = act._norm_out_bytes(m.norm, ctx)
    out = [t for t in norms if t.part == "attention"]
    out += act._linear_input_tensors("cross_attention.q", h, ("q_proj",), in_b, ctx)
    out.append(act.qk_norm_tensors(m, ctx, heads, qw, m.kv_width)[0]._replace(name="cross_attention.q_norm"))
    # the memory-efficient kernel's query, output and fp32 logsumexp (one per head and query)
    out += [act.SavedTensor("cross_attention.q", c * qw), act.SavedTensor("cross_attention.output", c * qw),
            act.SavedTensor("cross_attention.logsumexp", 4 * heads)]
    if ctx.frozen_base:
        out += act._adapter_input_tensors("cross_attention.o_proj", qw, ("o_proj",), c, ctx)
    if mask_per_layer(ctx, vision_per_sample):
        out.append(act.SavedTensor("cross_attention.mask", c * mem_efficient_mask_row(vision_per_sample)))
    if _gates_trained(ctx):
        # cross_attn_attn_gate.tanh() * o_proj's output: the gate's gradient needs o_proj's output
        out.append(act.SavedTensor("cross_attention.attn_gate_input", c * h))
    mlp = [t for t in norms if t.part == "mlp"] + act.mlp_tensors(m, ls, ctx)
    if _gates_trained(ctx):
        # (row mask x MLP output) in the promoted dtype of the MLP's output (ew) and the mask (the model's, r)
        mlp.append(act.SavedTensor("cross_attention.mlp_gate_input", max(ctx.ew, r) * h, 1, "mlp"))
    return [t for t in out + mlp if t.nbytes]


def cross_vision_tensors(m: ModelSpec, ctx: act.ActContext) -> list[act.SavedTensor]:
    """What a cross-attention layer saves per vision position of the micro-batch (module docstring)."""
    c, h = ctx.compute_bytes, m.hidden_size
    heads, qw, kvw = m.num_attention_heads, m.num_attention_heads * m.head_dim, m.kv_width
    out: list[act.SavedTensor] = []
    if ctx.frozen_base:
        # LoRA on k_proj / v_proj keeps its copies of cross_attention_states (the projector's output, in c), or the
        # states themselves (``states_kept_by_lora``: counted once, in ``cross_saved``)
        out += [t for t in act._adapter_input_tensors("cross_attention.kv", h, ("k_proj", "v_proj"), c, ctx)
                if not (states_kept_by_lora(ctx) and t.name == "cross_attention.kv.lora_input")]
    elif ctx.linear_input_bytes != c:
        # an fp8 linear keeps its own copy of the input per module
        out.append(act.SavedTensor("cross_attention.kv.input_cast", ctx.linear_input_bytes * h, 2))
    keys_grad = not ctx.frozen_base or "k_proj" in ctx.lora_targets
    if keys_grad:
        out.append(act.qk_norm_tensors(m, ctx, heads, qw, kvw)[1]._replace(name="cross_attention.k_norm"))
    kv = qw if m.num_kv_heads < heads else kvw  # repeat_kv to every head (a mask is given)
    out += [act.SavedTensor("cross_attention.k", c * kv), act.SavedTensor("cross_attention.v", c * kv)]
    return [t for t in out if t.nbytes]


def gate_tensors(param_bytes: int) -> tuple[act.SavedTensor, ...]:
    """The gates' ``tanh`` outputs (one element each, in the parameter's dtype): the products with the attention's and
    the MLP's outputs save them for those outputs' gradients, the gates trained or frozen (the latter read off
    transformers on the CPU with LoRA's forward, tests/test_mllama_train.py)."""
    return (act.SavedTensor("cross_attention.gate_tanh", param_bytes, 2),)


def cross_text_transient(m: ModelSpec, ctx: act.ActContext) -> int:
    """The attention backward's gradients per text token: the incoming and outgoing residual gradients (2rh), dO
    and dQ (2 c q) and the kernel's fp32 dQ accumulator (4 q); the keys' and values' are per vision position."""
    qw = m.num_attention_heads * m.head_dim
    return 2 * ctx.residual_bytes * m.hidden_size + 2 * ctx.compute_bytes * qw + 4 * qw


def cross_vision_transient(m: ModelSpec, ctx: act.ActContext) -> int:
    """The memory-efficient kernel's dK and dV per vision position, in the repeated (every head) width."""
    qw = m.num_attention_heads * m.head_dim
    kv = qw if m.num_kv_heads < m.num_attention_heads else m.kv_width
    return 2 * ctx.compute_bytes * kv


def cross_saved(c: StepContext) -> list[Term]:
    """The tensors every cross-attention layer shares, made in ``MllamaModel.forward`` before the language model.

    * ``cross_attention_states`` [b, L, h] (the projector's output, in the compute dtype): saved by every layer's
      k_proj and v_proj under full fine-tuning, and held by every checkpointed layer's arguments (transformers
      ``GradientCheckpointingLayer.__call__`` binds them in a ``partial``), to the first layer's backward;
      otherwise freed when the forward returns, before the loss.
    * the mask [b, 1, p, L] in the model's dtype, kept by every layer's kernel when none copies it
      (``mask_per_layer``) or held by the checkpointed layers' arguments; and the row mask [b, 1, p, 1].
    * the vision model's output ``image_outputs.last_hidden_state`` [b, m, T, P, vision_output_dim] in the model's
      dtype, returned in the model's output (``MultimodalCausalLMOutputWithPast``) until the Trainer drops it for the
      backward: alive at the forward's end only.
    """
    out = []
    for name, nbytes, to_loss in cross_sequence(c):
        out.append(Term(K.SAVED, nbytes, FORWARD, LOSS if to_loss else TIED_EMBEDDING, name))
    return out


def tower_trained(c: StepContext) -> bool:
    """The vision model and projector are trained: full fine-tuning without ``train.freeze_vision_tower``."""
    return c.peft is None and not c.frozen_prefixes


def trained_tower_bytes(c: StepContext) -> int:
    """What a trained vision model and projector save for the backward over the micro-batch's images (transformers
    5.24 ``MllamaVisionModel.forward``; its encoder layers are plain ``nn.Module``s, never checkpointed).  Per image,
    with T tiles of P positions padded to Pp (a multiple of 8), S = T x Pp, d the width, I the MLP's, r the residual
    (parameter) dtype, c the compute dtype and x = c when autocast casts (r != c), else r:

    * stem: the patch convolution's input (x per pixel), the aspect-ratio ids (int64), the gathered pre-tile
      embedding (r T d) and tile position embedding (r T P d) the gates' products keep, ``layernorm_pre``'s input and
      statistics ((r d + 8) T P);
    * each encoder layer, per position of S: the LayerNorms' inputs and statistics (2 (r d + 8)), q/k/v's input
      (3 x d, or one shared r d), q, k and v (3 c d), the memory-efficient kernel's logsumexp (4 per head) and
      output (c d: o_proj's input), fc1's input (x d), GELU's input and output (2 c I); a global layer's tanh gates
      keep o_proj's and fc2's outputs (2 c d);
    * the aspect-ratio mask [S, S] in the model's dtype: one, kept by every layer's kernel, or a compute-dtype copy
      per layer under autocast;
    * ``layernorm_post``'s input and statistics ((r d + 8) S), the post-tile embedding (r T d), the projector's input
      (x per element of T x P x vision_output_dim), the gates' tanh outputs (5 + 2 x global layers, in the
      parameters' dtype).

    Checked against ``saved_tensors_hooks`` on transformers' own module on the CPU (tests/test_mllama_train.py)."""
    v = c.m.vision
    images = c.s.train.micro_batch_size * c.s.train.images_per_sample
    if v is None or not images or not tower_trained(c) or not c.rp.has_embedding:
        return 0
    ctx = c.act
    r, cb = ctx.residual_bytes, ctx.compute_bytes
    x = cb if ctx.autocast and r != cb else r
    d, inter, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    per_tile = (v.image_size // v.patch_size) ** 2
    tiles = v.patches_per_image // per_tile
    positions = v.cross_attention_tokens_per_image // tiles
    seq = tiles * (-(-positions // 8) * 8)
    local, glob = v.num_layers - v.global_layers, v.global_layers
    stem = (x * tiles * v.num_channels * v.image_size ** 2 + 8 + r * tiles * d + r * tiles * positions * d
            + (r * d + 8) * tiles * positions)
    qkv_in = 3 * x * d if x != r else r * d
    layer = 2 * (r * d + 8) + qkv_in + 3 * cb * d + 4 * heads + cb * d + x * d + 2 * cb * inter
    layers = (local + glob) * layer * seq + glob * 2 * cb * d * seq
    mask = (local + glob) * cb * seq * seq if x != r else r * seq * seq
    tail = (r * d + 8) * seq + r * tiles * d + x * tiles * positions * v.output_dim
    gates = (5 + 2 * glob) * c.pol.param_bytes
    return images * (stem + layers + mask + tail) + gates


def cross_sequence(c: StepContext) -> tuple[tuple[str, int, bool], ...]:
    """``cross_saved``'s tensors as (term name, bytes, freed before the backward), in the order the forward makes
    them, for the allocator's event stream (analytic/events.py, with the tower's); empty for another model, a batch
    without image, or a stage without the embeddings."""
    v = c.m.vision
    per_sample, positions = cross_vision_positions(c)
    if v is None or not positions or not c.rp.has_embedding:
        return ()
    ctx, b, p = c.act, c.s.train.micro_batch_size, c.s.train.seq_len
    held = checkpoint_policy(c.s) == "full"
    out = [("saved.vision_output", ctx.residual_bytes * positions * v.output_dim, True)]
    tower = trained_tower_bytes(c)
    if tower:
        # freed by the vision model's backward, after the language model's (an upper bound: to the last layer's)
        out.insert(0, ("saved.vision_model", tower, False))
    if held or not ctx.frozen_base or states_kept_by_lora(ctx):
        out.append(("saved.cross_attention_states", ctx.compute_bytes * positions * c.m.hidden_size, False))
    mask = ctx.residual_bytes * b * p * per_sample
    row = ctx.residual_bytes * b * p
    out.append(("saved.cross_attention_mask", row + (mask if held or not mask_per_layer(ctx, per_sample) else 0),
                False))
    return tuple(out)
