"""The frozen prefix of a PEFT model without checkpointing: the layers before the first adapter save
little or nothing, because autograd records nothing until the first op with an input that requires
grad."""

from __future__ import annotations

from vramplan.analytic import activations as act
from vramplan.analytic.terms.context import StepContext
from vramplan.spec.defaults import checkpointing

__all__ = ["frozen_prefix"]

_INPUT_NORM_WEIGHT = "norm.input.weight_fp32"


def frozen_prefix(c: StepContext, full: list[int], dora: int, wx: act.WrappedExperts | None,
                  tensors: list[tuple[act.SavedTensor, ...]], mixer: tuple[act.SavedTensor, ...] = ()) -> set[int]:
    """Lower ``full`` (in place) for the frozen prefix, and each such layer's records in ``tensors`` with it;
    returns the layers whose attention records nothing.

    The frozen embeddings' output does not require grad (peft enables input gradients only with
    checkpointing), and autograd records nothing until the first op with an input that does (an
    adapter's weight): the first layer's input norm never, its attention block (and the norm after
    it) only when an attention module carries an adapter, its MLP only what its own adapters need
    (activations.frozen_input_mlp); a layer without any adapter leaves the residual stream frozen for
    the next one (DeepSeek's dense first layer under LoRA on the experts alone).
    """
    if c.peft is None or checkpointing(c.s) != "none" or not c.rp.has_embedding or not full:
        return set()
    if c.m.mamba is not None:
        return _hybrid_prefix(c, full, dora, wx, tensors, mixer)
    return _decoder_prefix(c, full, dora, wx, tensors)


def _decoder_prefix(c: StepContext, full: list[int], dora: int, wx: act.WrappedExperts | None,
                    tensors: list[tuple[act.SavedTensor, ...]]) -> set[int]:
    """``frozen_prefix`` for a model of attention and MLP layers."""
    m, ctx, tokens = c.m, c.act, c.tokens
    attention_idle: set[int] = set()
    # T5's attention modules are SelfAttention / EncDecAttention (modeling_t5.py T5LayerSelfAttention)
    attn_mods = {p.module for p in m.params if p.layer_span and ("attn" in p.name or "attention" in p.name.lower())}
    attn_adapted = bool(c.lt.linear & attn_mods)
    for j, ls in enumerate(c.layer_specs):
        dropped = act.frozen_input_eager_dropped(m, ls, ctx) if attn_adapted else frozenset()
        unsaved = act.frozen_input_eager_unsaved(m, ls, ctx) if attn_adapted else 0
        if attn_adapted and not m.parallel_residual:
            # the input norm records nothing: neither its per-token tensors nor its weight's fp32 tensor
            # (act.norm_weight_tensors), which the product keeps only for an input that requires grad
            weight = sum(t.total for t in tensors[j] if t.name == _INPUT_NORM_WEIGHT)
            norm = act.norm_saved_per_token(m, ctx) * tokens
            full[j] -= min(full[j], norm + weight + unsaved * tokens)
            tensors[j] = _first_adapted_tensors(tensors[j], norm, dropped)
            break
        mlp, mlp_live = act.frozen_input_mlp(m, ls, ctx)
        # a parallel block's attention reads the same frozen normalised input, adapters or not
        attn = act.attention_saved(m, ls, ctx) - unsaved if attn_adapted else 0
        live = mlp_live or attn_adapted
        wrapped = wx.prefix_saved if wx is not None and ls.moe else 0
        full[j] = (attn + mlp) * tokens + (dora if live else 0) + wrapped
        tensors[j] = _prefix_tensors(c, j, dropped if attn_adapted else None, mlp, tensors[j] if live else (), wrapped)
        if not attn_adapted:
            attention_idle.add(j)
        if live:
            break
    return attention_idle


def _hybrid_prefix(c: StepContext, full: list[int], dora: int, wx: act.WrappedExperts | None,
                   tensors: list[tuple[act.SavedTensor, ...]], mixer: tuple[act.SavedTensor, ...]) -> set[int]:
    """``frozen_prefix`` for a Mamba2 hybrid (``ModelSpec.mamba``): a mixer whose ``in_proj`` carries no adapter,
    on a frozen input, records nothing (its weights and its input need no gradient), and neither does the norm
    before it; a layer's MLP (an MLP-only or MoE block, or the MLP after a Bamba mixer) records what its own adapters
    need (``activations.frozen_input_mlp``); the walk stops at the first layer whose records make the residual
    stream require grad, and at the first attention (or adapted mixer), which is counted whole (its input norm's
    records included: an over-estimate of that one norm).  A layer that runs its attention beside its mixer
    (Falcon-H1) with no adapter on the mixer: that first layer's mixer, on the frozen input, records nothing (its
    records, ``mixer``, are taken out of the layer), its attention is counted whole."""
    m, ctx, tokens = c.m, c.act, c.tokens
    ms = m.mamba
    assert ms is not None
    idle: set[int] = set()
    mixers, ffn_only = frozenset(ms.layers), frozenset(ms.ffn_only_layers)
    # an adapter on either projection makes the mixer record: in_proj's lora_A needs its input, out_proj's its own,
    # and from there the residual stream requires grad (Bamba's, Granite 4.0-H's and LFM2's out_proj take adapters;
    # peft refuses Nemotron-H's and Falcon-H1's); the mixer is then counted whole, an over-estimate of what a frozen
    # in_proj leaves unrecorded before out_proj in that one layer
    # (a Mamba-1 mixer's x_proj too: its lora_A keeps the SiLU output)
    # (Qwen3-Next's Gated DeltaNet: in_proj_qkvz, in_proj_ba, out_proj)
    mixer_adapted = (bool({"in_proj", "out_proj", "in_proj_qkvz", "in_proj_ba"} & c.lt.linear)
                     or (ms.kind == "mamba1" and "x_proj" in c.lt.linear))
    for j, ls in enumerate(c.layer_specs):
        i = ls.index
        if i in mixers and ms.parallel_attention and not mixer_adapted and mixer:
            names = {t.name for t in mixer}
            full[j] -= min(full[j], act.total_bytes(mixer))
            tensors[j] = tuple(t for t in tensors[j] if t.name not in names)
        if i in mixers and (mixer_adapted or ms.parallel_attention):
            break
        if i not in mixers and i not in ffn_only:
            break  # an attention layer
        if i in mixers:
            idle.add(j)  # the mixer (the layer's "attention" part) records nothing and runs no backward
        if not ls.moe and not ls.intermediate_size:
            full[j], tensors[j] = 0, ()
            continue
        mlp, live = act.frozen_input_mlp(m, ls, ctx)
        wrapped = wx.prefix_saved if wx is not None and ls.moe else 0
        full[j] = mlp * tokens + (dora if live else 0) + wrapped
        tensors[j] = _prefix_tensors(c, j, None, mlp, tensors[j] if live else (), wrapped)
        if live:
            break
    return idle


def _first_adapted_tensors(layer: tuple[act.SavedTensor, ...], norm: int,
                           dropped: frozenset[str]) -> tuple[act.SavedTensor, ...]:
    """The records of the first layer whose attention carries an adapter: its input norm records nothing
    (``norm`` bytes less), and eager attention drops what only frozen inputs needed (``dropped``)."""
    out = []
    for t in layer:
        if t.name in dropped or t.name == _INPUT_NORM_WEIGHT:
            continue
        if t.name == "norm.input":
            t = t._replace(nbytes=t.nbytes - norm)
        if t.nbytes:
            out.append(t)
    return tuple(out)


def _prefix_tensors(c: StepContext, j: int, attention_dropped: frozenset[str] | None, mlp_per_token: int,
                    layer: tuple[act.SavedTensor, ...], wrapped_prefix: int) -> tuple[act.SavedTensor, ...]:
    """A frozen-prefix layer's records: its attention's (when an attention module is adapted) less the dropped
    ones, the MLP's (``frozen_input_mlp``, one record), DoRA's (from ``layer``, the layer's records when the
    layer records anything) and what the wrapped experts keep there."""
    m, ctx, tokens = c.m, c.act, c.tokens
    out: list[act.SavedTensor] = []
    if attention_dropped is not None:
        out += act.scaled((t for t in act.attention_tensors(m, c.layer_specs[j], ctx) if t.name not in attention_dropped),
                          tokens)
    out.append(act.SavedTensor("mlp.frozen_input", mlp_per_token * tokens, 1, "mlp"))
    out += [t for t in layer if t.name.startswith("dora.")]
    out.append(act.SavedTensor("experts.prefix_saved", wrapped_prefix, 1, "mlp"))
    return tuple(t for t in out if t.nbytes)
