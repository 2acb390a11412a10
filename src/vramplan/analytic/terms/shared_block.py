"""What a Zamba2 hybrid layer's shared transformer block saves for its backward in training, per token, tensor by
tensor (``MambaSpec.shared_attention_layers``); the layer's Mamba2 mixer is analytic/terms/mamba2.py's.

Modelled: transformers 5.24's ``modeling_zamba2.py``.  ``Zamba2HybridLayer.forward`` (line 1031) runs
``shared_transformer`` (``Zamba2AttentionDecoderLayer.forward``, line 924), then the per-layer ``linear`` on its output,
then ``mamba_decoder`` (``Zamba2MambaDecoderLayer.forward``, line 976), which adds that output to the layer's input
before its ``input_layernorm`` and its mixer.  Notation: ``h`` hidden, ``c`` bytes of the compute dtype, ``r`` of the
residual stream (fp32 under autocast), ``I`` the MLP's intermediate width, ``R`` ``adapter_rank``; the block's
attention reads ``2 h`` (``attention_hidden_size``) and its heads are ``2 h / heads`` wide.  Per token:

* ``torch.concatenate([hidden_states, original_hidden_states])`` (line 959) saves nothing (cat keeps only sizes);
  ``input_layernorm`` over the ``2 h`` concatenation (``Zamba2RMSNorm.forward``, line 81: ``.to(float32)``, ``pow``,
  ``rsqrt``, ``weight * x.to(input_dtype)``) saves what an RMSNorm of width ``2 h`` saves: ``(4 + r) 2 h + 4``;
* ``Zamba2Attention.forward`` (line 281): ``q/k/v_proj`` read the normalized ``2 h`` input, and with
  ``use_shared_attention_adapter`` each adapter's first ``Linear(2h, R)`` reads it too (line 299-302): one shared
  input, or under autocast one half copy per consuming linear (3, or 6 with the adapters); each adapter's second
  linear saves the first one's output (``3 R c``); the attention core, RoPE (``use_mem_rope``) and ``o_proj``'s input
  are an attention layer's of ``heads x 2h/heads`` (analytic/activations.py ``attention_tensors``);
* ``pre_ff_layernorm`` over ``o_proj``'s output (in ``c``: ``(4 + c) h + 4``), its output in ``r``;
* ``Zamba2MLP.forward`` (line 902): ``gate_up_proj`` and the layer's adapter ``gate_up_proj_adapter_list`` (its first
  linear reads the same input; its second saves the rank-``R`` output, ``R c``), summed into one ``2 I`` tensor whose
  halves ``act_fn`` and the product save, the product saved by ``down_proj``: a gated MLP's records;
* the per-layer ``linear`` saves the MLP's output (``c h``); ``hidden_states + transformer_hidden_states`` saves nothing.

The mixer's side (``input_layernorm`` and the mixer) is the hybrid mixer layer's.  The backward runs the mixer's
first, then the MLP's, then the attention's: the records of the MLP's part (``pre_ff_layernorm``, the MLP, the
adapter's rank output, ``linear``'s input) and the mixer's are freed before the attention's backward.

``Zamba2Model.forward`` (line 1171) keeps ``original_hidden_states = torch.clone(inputs_embeds)`` for the forward;
cat saves nothing of it, but a checkpointed layer keeps its inputs, so under full checkpointing that one ``r h``
tensor is held until the last hybrid layer's backward (``checkpoint_embeddings_per_token``).

Checked storage by storage against autograd's graph of ``Zamba2AttentionDecoderLayer`` plus ``linear`` on the meta
device in bf16, fp32 and under autocast (tests/test_families_zamba2.py).
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic import activations as act
from vramplan.spec.model import LayerSpec, ModelSpec

__all__ = ["checkpoint_embeddings_per_token", "shared_block_attention_tensors", "shared_block_mlp_tensors"]

FP32 = 4
_ADAPTERS = ("linear_q_adapter_list", "linear_k_adapter_list", "linear_v_adapter_list")


def _wide(m: ModelSpec) -> ModelSpec:
    """The model seen by the shared block's attention: ``2 h`` wide input, the adapters' first linears reading it."""
    ms = m.mamba
    assert ms is not None
    mods = m.traits.qkv_modules + (_ADAPTERS if ms.shared_attention_adapters else ())
    return replace(m, hidden_size=2 * m.hidden_size, traits=replace(m.traits, qkv_modules=mods))


def shared_block_attention_tensors(m: ModelSpec, ls: LayerSpec, ctx: act.ActContext) -> list[act.SavedTensor]:
    """The shared block's attention part, per token (part "attention": freed by the layer's last backward)."""
    ms = m.mamba
    assert ms is not None
    wide = _wide(m)
    out = [act.SavedTensor("shared.norm.input", act.norm_saved_per_token(wide, ctx))]
    out += [t._replace(name="shared." + t.name) for t in act.attention_tensors(wide, ls, ctx)]
    if ms.shared_attention_adapters:
        # each adapter's second linear saves the first one's output (line 300-302)
        out.append(act.SavedTensor("shared.attention.adapter_rank_outputs", ctx.compute_bytes * ms.shared_adapter_rank,
                                   3))
    return out


def shared_block_mlp_tensors(m: ModelSpec, ls: LayerSpec, ctx: act.ActContext) -> list[act.SavedTensor]:
    """The shared block's MLP part and the per-layer ``linear``'s input, per token (part "mlp")."""
    ms = m.mamba
    assert ms is not None
    c, h = ctx.compute_bytes, m.hidden_size
    # pre_ff_layernorm's input is o_proj's output, in c: the fp32 copy, the normalized tensor in c, the rsqrt
    out = [act.SavedTensor("shared.norm.pre_ff", (FP32 + c) * h + FP32, 1, "mlp")]
    out += [t._replace(name="shared." + t.name, part="mlp")
            for t in act.gated_mlp_tensors(m, ls.intermediate_size, ctx, ("gate_up_proj", "gate_up_proj_adapter_list"))]
    out += [act.SavedTensor("shared.mlp.adapter_rank_output", c * ms.shared_adapter_rank, 1, "mlp"),
            act.SavedTensor("shared.linear.input", c * h, 1, "mlp")]
    return out


def checkpoint_embeddings_per_token(m: ModelSpec, ctx: act.ActContext) -> int:
    """Under full checkpointing, the embeddings' clone every hybrid layer's checkpoint keeps as an input (``r h``);
    0 for a model without shared blocks."""
    if m.mamba is None or not m.mamba.shared_attention_layers:
        return 0
    return ctx.residual_bytes * m.hidden_size
