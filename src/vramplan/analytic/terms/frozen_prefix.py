"""The frozen prefix of a PEFT model without checkpointing: the layers before the first adapter save
little or nothing, because autograd records nothing until the first op with an input that requires
grad."""

from __future__ import annotations

from vramplan.analytic import activations as act
from vramplan.analytic.terms.context import StepContext

__all__ = ["frozen_prefix"]


def frozen_prefix(c: StepContext, full: list[int], dora: int, wx: act.WrappedExperts | None) -> set[int]:
    """Lower ``full`` (in place) for the frozen prefix; returns the layers whose attention records nothing.

    The frozen embeddings' output does not require grad (peft enables input gradients only with
    checkpointing), and autograd records nothing until the first op with an input that does (an
    adapter's weight): the first layer's input norm never, its attention block (and the norm after
    it) only when an attention module carries an adapter, its MLP only what its own adapters need
    (activations.frozen_input_mlp); a layer without any adapter leaves the residual stream frozen for
    the next one (DeepSeek's dense first layer under LoRA on the experts alone).
    """
    m, ctx, tokens = c.m, c.act, c.tokens
    attention_idle: set[int] = set()
    if c.peft is None or c.s.train.gradient_checkpointing != "none" or not c.rp.has_embedding or not full:
        return attention_idle
    attn_mods = {p.module for p in m.params if p.layer_span and ("attn" in p.name or "attention" in p.name)}
    attn_adapted = bool(c.lt.linear & attn_mods)
    for j, ls in enumerate(c.layer_specs):
        unsaved = act.frozen_input_eager_unsaved(m, ls, ctx) if attn_adapted else 0
        if attn_adapted and not m.parallel_residual:
            full[j] -= min(full[j], (act.layer_norm_saved(m, ctx) * m.hidden_size + unsaved) * tokens)
            break
        mlp, mlp_live = act.frozen_input_mlp(m, ls, ctx)
        # a parallel block's attention reads the same frozen normalised input, adapters or not
        attn = act.attention_saved(m, ls, ctx) - unsaved if attn_adapted else 0
        live = mlp_live or attn_adapted
        full[j] = (attn + mlp) * tokens + (dora if live else 0) + (
            wx.prefix_saved if wx is not None and ls.moe else 0)
        if not attn_adapted:
            attention_idle.add(j)
        if live:
            break
    return attention_idle
