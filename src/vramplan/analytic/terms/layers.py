"""What each decoder layer of the stage saves for its backward and frees during it (bytes), from
analytic/activations.py: computed once per stage and read by the saved-tensor and transient terms.

* ``full``: saved when the layer runs with autograd recording; ``kept``: saved during the forward
  (= ``full`` without checkpointing; the layer's input with full checkpointing; the non-recomputed
  part with attention-core or op-sac checkpointing, analytic/checkpointing.py);
* ``mlp_transient`` / ``attn_transient``: the gradients alive together in the MLP's / attention's
  backward;
* ``mlp_released``: freed before the MLP's elementwise backward (the output projection's input);
  ``released``: freed before the attention's backward (the MLP's saved tensors and the norm's);
* ``shared``: RoPE cos/sin, the eager mask, the embedding dropout mask (once for all layers);
* ``tensors``: each layer's ``full`` bytes as the saved tensors they are (analytic/activations.py
  ``SavedTensor`` records, in bytes), which the allocator's event stream allocates (analytic/events.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from vramplan.analytic import activations as act
from vramplan.analytic.checkpointing import checkpoint_policy, checkpointed_input_bytes, checkpointed_layer
from vramplan.analytic.moe_capacity import routed_rows
from vramplan.analytic.terms import cross_attention as cross
from vramplan.analytic.terms import encoder_decoder as encdec
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.frozen_prefix import frozen_prefix
from vramplan.analytic.terms.mamba1 import mamba1_scan_backward_per_token
from vramplan.analytic.terms.mamba2 import (
    frozen_mixer_dropped,
    kbit_fp32_path_tensor,
    mixer_adapter_inputs,
    mixer_backward_per_token,
    mixer_recompute_per_token,
    mixer_saved_tensors,
)
from vramplan.analytic.terms.shared_block import (
    checkpoint_embeddings_per_token,
    shared_block_attention_tensors,
    shared_block_mlp_tensors,
)
from vramplan.spec.model import LayerSpec, ModelSpec
from vramplan.units import ceil_div

__all__ = ["LayerActivations", "layer_activations"]


@dataclass(frozen=True)
class LayerActivations:
    full: tuple[int, ...]
    kept: tuple[int, ...]
    mlp_transient: tuple[int, ...]
    attn_transient: tuple[int, ...]
    released: tuple[int, ...]
    mlp_released: tuple[int, ...]
    shared: int
    host: int = 0  # checkpointed inputs kept in host memory (DeepSpeed partition+cpu), all layers
    # per layer: the records ``full`` sums (each layer's tuple sums to its ``full`` exactly)
    tensors: tuple[tuple[act.SavedTensor, ...], ...] = ()
    # per layer: full checkpointing keeps only its input and recomputes it (analytic/checkpointing.py)
    checkpointed: tuple[bool, ...] = ()
    # layers whose attention backward runs after some saved tensors are released: a moment of its own
    attention_split: tuple[bool, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_split", tuple(bool(x) for x in self.released))


def layer_activations(c: StepContext) -> LayerActivations:
    return c.memo("layer_activations", lambda: _compute(c))


@dataclass(frozen=True)
class _PerToken:
    """One layer kind's per-token values (analytic/activations.py)."""

    saved: int
    tensors: tuple[act.SavedTensor, ...]  # the records ``saved`` sums
    selective: int
    transients: tuple[int, int]
    released: int
    mlp_released: int
    # full checkpointing: the recomputed forward's moment (act.recompute_forward_bytes), per token and per layer
    recompute: tuple[int, int] = (0, 0)


def _per_token(c: StepContext) -> list[_PerToken]:
    return c.memo("layer_per_token", lambda: _compute_per_token(c))


def _compute_per_token(c: StepContext) -> list[_PerToken]:
    """Each layer's per-token values, computed once per kind of layer: they depend on what the layer
    computes (MoE or dense, its MLP width, its attention window), not on its index, and the layers of a
    model are mostly alike (80 identical ones in Llama 3 70B)."""
    policy = checkpoint_policy(c.s)
    m, ctx, selective = c.m, c.act, policy in ("attention-core", "op-sac")
    kept_per_token = act.op_sac_saved_per_token if policy == "op-sac" else act.selective_saved_per_token
    kinds: dict[tuple[bool, int, int | None, bool, bool, bool], _PerToken] = {}
    out = []
    for ls in c.layer_specs:
        kind = (ls.moe, ls.intermediate_size, ls.sliding_window, cross.cross_layer(c, ls), _mixer_layer(m, ls),
                _ffn_only_layer(m, ls))
        v = kinds.get(kind)
        if v is None and kind[3]:
            v = kinds[kind] = _cross_per_token(c, ls)
        elif v is None and kind[4]:
            v = kinds[kind] = _mixer_per_token(c, ls)
        elif v is None and kind[5]:
            v = kinds[kind] = _ffn_only_per_token(c, ls)
        elif v is None and m.mamba is not None and not _has_mlp(ls):
            v = kinds[kind] = _attention_only_per_token(c, ls)
        elif v is None:
            tensors = tuple(act.layer_tensors(m, ls, ctx))
            v = kinds[kind] = _PerToken(
                act.total_bytes(tensors), tensors,
                kept_per_token(m, ls, ctx) if selective else 0,
                act.backward_transients_per_token(m, ls, ctx),
                act.freed_before_attention_backward_per_token(m, ls, ctx),
                act.freed_before_mlp_backward_per_token(m, ls, ctx),
                (act.recompute_forward_bytes(m, ls, ctx, c.tokens) or (0, 0)) if policy == "full" else (0, 0))
        out.append(v)
    return out


def _cross_per_token(c: StepContext, ls: LayerSpec) -> _PerToken:
    """A cross-attention layer's per-text-token values (analytic/terms/cross_attention.py); nothing when the
    micro-batch holds no image (``MllamaTextModel.forward`` skips the layer)."""
    per_sample, _ = cross.cross_vision_positions(c)
    if not per_sample:
        return _PerToken(0, (), 0, (0, 0), 0, 0)
    m, ctx = c.m, c.act
    tensors = tuple(cross.cross_text_tensors(m, ls, ctx, per_sample))
    mlp_part = sum(t.total for t in tensors if t.part == "mlp")
    return _PerToken(act.total_bytes(tensors), tensors, 0,
                     (act.backward_transients_per_token(m, ls, ctx)[0], cross.cross_text_transient(m, ctx)),
                     mlp_part, act.freed_before_mlp_backward_per_token(m, ls, ctx))


def _mixer_layer(m: ModelSpec, ls: LayerSpec) -> bool:
    """Whether ``ls`` holds a Mamba2 mixer in the attention's place (``ModelSpec.mamba``); a layer that runs its
    attention beside its mixer (``MambaSpec.parallel_attention``) is an attention layer with the mixer's records
    added (``_has_mixer``)."""
    return m.mamba is not None and not m.mamba.parallel_attention and ls.index in m.mamba.layers


def _has_mixer(m: ModelSpec, ls: LayerSpec) -> bool:
    """Whether ``ls`` holds a Mamba2 mixer, in the attention's place or beside it."""
    return m.mamba is not None and ls.index in m.mamba.layers


def _ffn_only_layer(m: ModelSpec, ls: LayerSpec) -> bool:
    """Whether ``ls`` is a hybrid's MLP-only block (Nemotron-H's "-": one norm, then the MLP)."""
    return m.mamba is not None and ls.index in m.mamba.ffn_only_layers


def _has_mlp(ls: LayerSpec) -> bool:
    return ls.moe or ls.intermediate_size > 0


def _mixer_per_token(c: StepContext, ls: LayerSpec) -> _PerToken:
    """A hybrid model's mixer layer, per token, without its mixer: the input norm, the post-mixer norm and the MLP
    (as an attention layer has them), or the input norm alone in a block that holds the mixer alone (Nemotron-H's
    "M", ``LayerSpec.intermediate_size`` 0); the mixer's own tensors are not per token (its scan pads every
    sequence to a whole chunk) and are added per layer (``_full_saved``, analytic/terms/mamba2.py).  Before the
    mixer's backward the MLP's and the post-mixer norm's saved tensors are released; the mixer's backward holds
    the incoming and outgoing residual gradients (``2 r h``) beside what its own backward makes (not counted: see
    the assumption the report states)."""
    m, ctx = c.m, c.act
    if m.mamba is not None and ls.index in m.mamba.shared_attention_layers:
        return _shared_block_per_token(c, ls)
    if not _has_mlp(ls):
        norm = act.norm_saved_per_token(m, ctx)
        return _PerToken(norm, (act.SavedTensor("norm.input", norm),), 0,
                         (0, _mixer_transient(c) + mamba1_scan_backward_per_token(m.mamba)), 0, 0)
    norms = act.norm_tensors(m, ctx)
    tensors = tuple([t for t in norms if t.part == "attention"] + [t for t in norms if t.part == "mlp"]
                    + act.mlp_tensors(m, ls, ctx))
    mlp_part = act.norm_saved_per_token(m, ctx) + act.mlp_saved(m, ls, ctx)
    return _PerToken(act.total_bytes(tensors), tensors, 0,
                     (act.backward_transients_per_token(m, ls, ctx)[0],
                      _mixer_transient(c) + mamba1_scan_backward_per_token(m.mamba)),
                     mlp_part, act.freed_before_mlp_backward_per_token(m, ls, ctx))


def _mixer_transient(c: StepContext) -> int:
    """Per token, what a mixer layer holds beside its saved tensors in its backward: the backward's own gradients
    (``mixer_backward_per_token``), or, when checkpointing recomputes the mixer just before, the recomputed forward's
    temporaries over its output's incoming gradient (``mixer_recompute_per_token``), whichever is more."""
    m, ctx, t = c.m, c.act, c.s.train
    r = ctx.residual_bytes
    backward = mixer_backward_per_token(m.mamba, m.hidden_size, r, ctx.frozen_base, ctx.compute_bytes)
    if checkpoint_policy(c.s) == "none":
        return backward
    recompute = mixer_recompute_per_token(m.mamba, m.hidden_size, r, ctx.frozen_base, t.micro_batch_size, ctx.seq_len,
                                          ctx.autocast)
    return max(backward, r * m.hidden_size + recompute)


def _shared_block_per_token(c: StepContext, ls: LayerSpec) -> _PerToken:
    """A Zamba2 hybrid layer, per token, without its mixer (analytic/terms/shared_block.py): the shared block's
    attention part (its ``2 h`` norm, the attention, the q/k/v adapters), then its MLP part, the per-layer
    ``linear``'s input and the mixer's ``input_layernorm`` (part "mlp": with the mixer's records, freed before the
    shared attention's backward, which ends the layer's).  Transients: the larger of the mixer's residual gradients
    (``2 r h``) and the shared MLP's backward; then the shared attention's backward over its ``2 h`` input."""
    m, ctx = c.m, c.act
    norm = act.norm_saved_per_token(m, ctx)
    attn = shared_block_attention_tensors(m, ls, ctx)
    mlp = [*shared_block_mlp_tensors(m, ls, ctx), act.SavedTensor("norm.input", norm, 1, "mlp")]
    tensors = tuple(attn + mlp)
    mlp_part = act.total_bytes(mlp)
    wide = replace(m, hidden_size=2 * m.hidden_size)
    mlp_tr, _ = act.backward_transients_per_token(m, ls, ctx)
    _, attn_tr = act.backward_transients_per_token(wide, ls, ctx)
    return _PerToken(act.total_bytes(tensors), tensors, 0, (max(mlp_tr, 2 * ctx.residual_bytes * m.hidden_size), attn_tr),
                     mlp_part, act.freed_before_mlp_backward_per_token(m, ls, ctx))


def _ffn_only_per_token(c: StepContext, ls: LayerSpec) -> _PerToken:
    """A hybrid's MLP-only block (Nemotron-H's "-"): its norm and its MLP, both freed by the MLP's backward, which
    is the block's whole backward (no attention part: nothing released before one, no attention transient)."""
    m, ctx = c.m, c.act
    norm = act.norm_saved_per_token(m, ctx)
    tensors = (act.SavedTensor("norm.input", norm, 1, "mlp"), *act.mlp_tensors(m, ls, ctx))
    return _PerToken(act.total_bytes(tensors), tensors, 0, (act.backward_transients_per_token(m, ls, ctx)[0], 0),
                     0, act.freed_before_mlp_backward_per_token(m, ls, ctx))


def _attention_only_per_token(c: StepContext, ls: LayerSpec) -> _PerToken:
    """A hybrid's attention-only block (Nemotron-H's "*": one norm, then the attention, no MLP)."""
    m, ctx = c.m, c.act
    norm = act.norm_saved_per_token(m, ctx)
    tensors = (act.SavedTensor("norm.input", norm), *act.attention_tensors(m, ls, ctx))
    return _PerToken(act.total_bytes(tensors), tensors, 0, (0, act.backward_transients_per_token(m, ls, ctx)[1]),
                     0, 0)


def _mixer_tensors(c: StepContext) -> tuple[act.SavedTensor, ...]:
    """One mixer layer's saved tensors for the micro-batch (analytic/terms/mamba2.py); none without mixers."""
    ms = c.m.mamba
    if ms is None:
        return ()
    t = c.s.train
    half = t.precision in ("bf16-true", "fp16-true")

    def make() -> tuple[act.SavedTensor, ...]:
        got = mixer_saved_tensors(ms, c.m.hidden_size, c.act.compute_bytes, c.act.autocast, t.micro_batch_size,
                                  t.seq_len, half)
        if c.peft is None:
            return got
        # the frozen base keeps no projection input; each adapted projection's adapters keep theirs (peft's fp32
        # adapters: a cast copy each, or the input itself where no cast runs) and lora_A's output
        dropped = frozen_mixer_dropped(ms, frozenset(), c.act.compute_bytes < 4, t.micro_batch_size, c.act.autocast)
        kept = [x._replace(nbytes=x.nbytes - round(x.nbytes * dropped.get(x.name, 0))) for x in got]
        for name, modules, width in mixer_adapter_inputs(ms, c.m.hidden_size):
            if set(modules) & c.lt.linear:
                kept += act.scaled(act.mixer_adapter_tensors(name, width, modules, c.act.compute_bytes, c.act),
                                   t.micro_batch_size * t.seq_len)
        if ms.kind == "mamba2" and c.kbit and c.act.autocast:
            # bitsandbytes' linears return the fp32 input's dtype: the mixer runs from fp32 projections
            kept.append(kbit_fp32_path_tensor(ms, t.micro_batch_size, t.seq_len))
        return tuple(x for x in kept if x.nbytes)

    return c.memo("mixer_tensors", make)


def _cross_vision(c: StepContext) -> tuple[int, tuple[act.SavedTensor, ...], int]:
    """A cross-attention layer's bytes over the micro-batch's vision positions: (saved, their records, the
    attention backward's dK and dV); zeros for a model without cross-attention layers or a batch without image."""
    _, positions = cross.cross_vision_positions(c)
    if not positions:
        return 0, (), 0
    tensors = act.scaled(cross.cross_vision_tensors(c.m, c.act), positions) + cross.gate_tensors(
        c.pol.param_bytes if c.peft is None else c.pol.frozen_param_bytes)
    return act.total_bytes(tensors), tensors, cross.cross_vision_transient(c.m, c.act) * positions


def _full_saved(c: StepContext) -> tuple[list[int], int, act.WrappedExperts | None, list[tuple[act.SavedTensor, ...]]]:
    """Each layer's saved bytes with autograd recording; the DoRA share of each; the wrapped experts; each
    layer's records (the per-token records times the tokens, DoRA's and the wrapped experts')."""
    m, ctx, tokens, peft, lt, pol = c.m, c.act, c.tokens, c.peft, c.lt, c.pol
    per_token = _per_token(c)
    full = [v.saved * tokens for v in per_token]
    made: dict[int, tuple[act.SavedTensor, ...]] = {}  # alike layers share one tuple
    for v in per_token:
        if id(v) not in made:
            made[id(v)] = act.scaled(v.tensors, tokens)
    tensors = [made[id(v)] for v in per_token]
    # the norms' fp32 weight tensors, per layer whatever the tokens (act.norm_weight_tensors)
    weights: dict[int, tuple[act.SavedTensor, ...]] = {}
    for v in per_token:
        if id(v) not in weights:
            weights[id(v)] = tuple(act.norm_weight_tensors(m, ctx, v.tensors))
    if any(weights.values()):
        full = [f + act.total_bytes(weights[id(v)]) for f, v in zip(full, per_token, strict=True)]
        tensors = [ts + weights[id(v)] for ts, v in zip(tensors, per_token, strict=True)]
    dora = 0
    if peft is not None and peft.method == "dora":
        per_tok, const = _dora_saved(m, lt.linear, peft.rank, pol.compute_bytes if pol.autocast else 4, c.tp)
        dora = per_tok * tokens + const
        full = [f + dora for f in full]
        extra = _dora_tensors(per_tok * tokens, const)
        tensors = [ts + extra for ts in tensors]
    wx = None
    if m.moe is not None and (lt.experts_wrapped or lt.router_rank):
        wx = act.wrapped_experts(m, lt.gate_up_rank, lt.down_rank, lt.router_rank, pol.frozen_param_bytes,
                                 c.adapter, ctx)
        full = [f + (wx.saved if ls.moe else 0) for f, ls in zip(full, c.layer_specs, strict=True)]
        extra = _wrapped_tensors(wx)
        tensors = [ts + extra if ls.moe else ts for ts, ls in zip(tensors, c.layer_specs, strict=True)]
    ed_tensors = encdec.cross_tensors(c)
    if ed_tensors:
        # an encoder-decoder model: every decoder layer's cross-attention (analytic/terms/encoder_decoder.py)
        ed = act.total_bytes(ed_tensors)
        full = [f + ed for f in full]
        tensors = [ts + ed_tensors for ts in tensors]
    _add_mixer_records(c, full, tensors)
    vis, vis_tensors, _ = _cross_vision(c)
    _add_to_layers(c, full, tensors, lambda ls: cross.cross_layer(c, ls), vis, vis_tensors)
    cap = capacity_rows_bytes(c)
    _add_to_layers(c, full, tensors, lambda ls: ls.moe, cap,
                   (act.SavedTensor("mlp.experts.capacity_rows", cap, 1, "mlp"),))
    return full, dora, wx, tensors


def _add_mixer_records(c: StepContext, full: list[int], tensors: list[tuple[act.SavedTensor, ...]]) -> None:
    """A hybrid's mixer records, added in place to the layers that run a mixer (``_full_saved``)."""
    m = c.m
    mixer = _mixer_tensors(c)
    shared = m.mamba.shared_attention_layers if m.mamba is not None else ()
    _add_to_layers(c, full, tensors, lambda ls: _has_mixer(m, ls) and ls.index not in shared, act.total_bytes(mixer),
                   mixer)
    # a Zamba2 hybrid layer's mixer runs after its shared block: its backward comes first, its records freed before
    # the shared block's attention backward (analytic/terms/shared_block.py)
    _add_to_layers(c, full, tensors, lambda ls: ls.index in shared, act.total_bytes(mixer),
                   tuple(t._replace(part="mlp") for t in mixer))


def capacity_rows_bytes(c: StepContext) -> int:
    """Per MoE layer, the saved bytes of the routed rows an expert capacity adds beyond the balanced T x top_k
    (analytic/moe_capacity.py ``routed_rows``), each row saving what transformers >= 5's grouped experts save
    per routed token (activations.py ``grouped_experts_saved``); 0 without ``parallel.moe_expert_capacity_factor``."""
    par, moe = c.s.parallel, c.m.moe
    if moe is None or par.moe_expert_capacity_factor is None:
        return 0
    rows = routed_rows(c.tokens, moe.top_k, moe.num_experts, par.ep, par.moe_expert_capacity_factor,
                       par.moe_pad_to_capacity)
    return (rows - c.tokens * moe.top_k) * act.grouped_experts_saved(c.m, c.act)


def _add_to_layers(c: StepContext, full: list[int], tensors: list[tuple[act.SavedTensor, ...]],
                   which: Callable[[LayerSpec], bool], nbytes: int, extra: tuple[act.SavedTensor, ...]) -> None:
    """Adds ``extra`` (``nbytes``) to the saved bytes and records of the layers ``which`` marks (a hybrid's mixer
    layers, a vision model's cross-attention layers), in place."""
    if not nbytes:
        return
    for j, ls in enumerate(c.layer_specs):
        if which(ls):
            full[j] += nbytes
            tensors[j] = tensors[j] + extra


def _dora_tensors(scaled: int, identity: int) -> tuple[act.SavedTensor, ...]:
    """DoRA's records (``_dora_saved``): the scaled outputs (per token) and the identity pushed through lora_A;
    kept to the end of the layer's backward."""
    out = (act.SavedTensor("dora.scaled_outputs", scaled), act.SavedTensor("dora.identity", identity))
    return tuple(t for t in out if t.nbytes)


def _wrapped_tensors(wx: act.WrappedExperts) -> tuple[act.SavedTensor, ...]:
    """LoRA on the fused experts (``act.wrapped_experts``): the adapted stacks and their factor casts, the
    adapted router weight; released by the MLP's backward."""
    out = (act.SavedTensor("experts.adapted_gate_up", wx.gate_up, 1, "mlp"),
           act.SavedTensor("experts.gate_up_factor_casts", wx.gate_up_casts, 1, "mlp"),
           act.SavedTensor("experts.adapted_down", wx.down, 1, "mlp"),
           act.SavedTensor("experts.down_factor_casts", wx.down_casts, 1, "mlp"),
           act.SavedTensor("experts.adapted_router", wx.router, 1, "mlp"))
    return tuple(t for t in out if t.nbytes)


def _compute(c: StepContext) -> LayerActivations:
    m, ctx, tokens, specs = c.m, c.act, c.tokens, c.layer_specs
    ckpt = checkpoint_policy(c.s)
    full, dora, wx, tensors = _full_saved(c)
    per_token = _per_token(c)
    # what _full_saved adds beyond the per-token records (DoRA's outputs, LoRA on fused experts, a hybrid's mixer,
    # cross-attention, the norms' fp32 weight copies, capacity rows): none of it is the attention core
    extras = [f - v.saved * tokens for f, v in zip(full, per_token, strict=True)]
    attention_idle = frozen_prefix(c, full, dora, wx, tensors, _mixer_tensors(c))  # attention records nothing
    host = 0
    checkpointed = (False,) * len(specs)
    if ckpt == "full":
        # every n-th layer with train.checkpoint_every_n_layers (analytic/checkpointing.py); the others save all;
        # DeepSpeed's partitioned / CPU checkpointing keeps a slice of the input, on the device or the host
        on_device, on_host = checkpointed_input_bytes(c.s, act.checkpoint_saved_per_token(m, ctx) * tokens)
        checkpointed = tuple(checkpointed_layer(c.s, j) for j in range(len(specs)))
        # a cross-attention layer a batch without image skips keeps nothing (``full`` is 0)
        checkpointed = tuple(x and not (cross.cross_layer(c, specs[j]) and not full[j]) for j, x in enumerate(checkpointed))
        kept = [on_device if checkpointed[j] else full[j] for j in range(len(specs))]
        host = on_host * sum(checkpointed)
    elif ckpt in ("attention-core", "op-sac"):
        # the selective policies recompute inside the attention core (Megatron) or the ops their list leaves out
        # (torchtitan's op-level SAC); the extras are outside both and stay saved (an upper bound under op-SAC,
        # whose list may also drop some of them); never above what the layer saves without a policy
        kept = [min(full[j], v.selective * tokens + extras[j]) for j, v in enumerate(per_token)]
    else:
        kept = list(full)
    transients = [v.transients for v in per_token]
    mlp_transient = [tr[0] * tokens for tr in transients]
    if ckpt == "full":
        mlp_transient = _with_recompute(mlp_transient, per_token, checkpointed, tokens)
    attn_transient = [0 if j in attention_idle else tr[1] * tokens for j, tr in enumerate(transients)]
    vis_transient = _cross_vision(c)[2]
    if vis_transient:
        attn_transient = [t + (vis_transient if cross.cross_layer(c, ls) else 0) for t, ls in zip(attn_transient, specs, strict=True)]
    # with full checkpointing the layer is recomputed whole, so its MLP part is in ``full``
    released = _released(c, per_token)
    mlp_released = [v.mlp_released * tokens for v in per_token]
    if wx is not None and c.lt.experts_wrapped:
        for j, ls in enumerate(specs):
            if ls.moe:
                mlp_transient[j], mlp_released[j] = act.wrapped_experts_backward(
                    m, wx, ctx, tokens, mlp_transient[j], mlp_released[j])
    shared = act.shared_saved_per_token(m, ctx, ckpt, attention_recorded=len(attention_idle) < len(specs)) * tokens
    if ckpt == "full":
        # Zamba2: the embeddings' clone, an input of every checkpointed hybrid layer (analytic/terms/shared_block.py)
        shared += checkpoint_embeddings_per_token(m, ctx) * tokens
    return LayerActivations(tuple(full), tuple(kept), tuple(mlp_transient), tuple(attn_transient),
                            tuple(released), tuple(mlp_released), shared, host, tuple(tensors), checkpointed)


def _with_recompute(mlp_transient: list[int], per_token: list[_PerToken], checkpointed: tuple[bool, ...],
                    tokens: int) -> list[int]:
    """Full checkpointing: a recomputed layer's forward peaks inside it, just before the MLP's backward, with the
    layer's saved tensors and what it holds there (act.recompute_forward_bytes); the MLP point shows the larger of
    that moment and the backward's own (its records released before it given back), as the mixer layers' do
    (``_mixer_transient``)."""
    out = list(mlp_transient)
    for j, v in enumerate(per_token):
        per, fixed = v.recompute
        if checkpointed[j] and (per or fixed):
            out[j] = max(out[j], (per + v.mlp_released) * tokens + fixed)
    return out


def _released(c: StepContext, per_token: list[_PerToken]) -> list[int]:
    """Each layer's records released by its MLP's backward (``_compute``)."""
    m, tokens = c.m, c.tokens
    released = [v.released * tokens for v in per_token]
    if m.mamba is not None and m.mamba.shared_attention_layers:
        # a Zamba2 hybrid layer's mixer records, freed with its shared MLP's before the shared attention's backward
        mixer = act.total_bytes(_mixer_tensors(c))
        shared = m.mamba.shared_attention_layers
        released = [x + (mixer if ls.index in shared else 0) for x, ls in zip(released, c.layer_specs, strict=True)]
    return released


def _dora_saved(m: ModelSpec, tgt: frozenset[str], rank: int, x_bytes: int, tp: int) -> tuple[int, int]:
    """DoRA's saved tensors per layer: (per token, constant), from peft's ``DoraLinearLayer.forward``.

    Per target and token: the base output and the LoRA output, each saved by its multiplication
    with the magnitude scale (2 c out).  Constant per target: the identity ``x_eye [in, in]`` pushed
    through lora_A to form the low-rank weight, saved by lora_A (and its output [in, r] by lora_B),
    in the adapter input's dtype (the compute dtype under autocast).
    """
    per_tok = const = 0
    for p in m.params:
        if not (p.layer_span and p.module in tgt and p.in_features and p.role == "linear"):
            continue
        n = p.count // len(p.layer_span)
        out = ceil_div(p.out_features, tp) if p.tp == "column" else p.out_features
        fan_in = ceil_div(p.in_features, tp) if p.tp == "row" else p.in_features
        per_tok += n * 2 * x_bytes * out
        const += n * x_bytes * fan_in * (fan_in + rank)
    return per_tok, const
