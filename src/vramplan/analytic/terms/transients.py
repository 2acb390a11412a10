"""Each layer's backward temporaries: the gradients alive together in its MLP's backward, then in its
attention's (analytic/activations.py ``backward_transients_per_token``).

The two records hold each part's own bytes, which the event stream (analytic/events.py) allocates in
that part.  A layer that frees nothing between the two parts has no attention point on the timeline:
its one moment, the MLP point, stands for its whole backward and shows the larger of the two parts.
The attention part's excess over the MLP's is then a third record, ``transient.attention_over_mlp``,
alive at that point only: a bound of the moment, not an allocation (the stream does not read it).

Worked example (one layer, MLP part 100 B, attention part 160 B): split, the MLP point shows 100 and
the attention point 160; not split, the MLP point shows 100 + (160 - 100) = 160.
"""

from __future__ import annotations

from vramplan.analytic.moment import K
from vramplan.analytic.ssm_state import broadcast_product_bytes
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.terms.loss import loss
from vramplan.analytic.terms.mamba2 import mixer_recompute_per_token
from vramplan.analytic.timeline import FORWARD, LOSS, Loc, attention, layer_done, mlp
from vramplan.facts.torchtune import torchao_nf4_dequant_peak_bytes
from vramplan.facts.transformers import mamba2_scan_broadcasts
from vramplan.spec.defaults import checkpointing

__all__ = ["TORCHTUNE_NF4_NOTE", "layer_backward", "mixer_forward", "mixer_scan_products", "nf4_dequant"]

TORCHTUNE_NF4_NOTE = (
    "torchtune QLoRA: base linears in torchao's NF4Tensor (4-bit codes, an int8 scaler per 64 weights, a bf16 factor "
    "per 256 scalers; the LM head and embeddings in the model's dtype), no peft preparation; LinearNF4 keeps no input "
    "for the backward and dequantizes each weight in it (get_original_weight: 14 B per weight of the largest linear "
    "at its peak; torchao 0.7.0 dtypes/nf4tensor.py, facts/torchtune.py)")


def layer_backward(c: StepContext) -> list[Term]:
    la = layer_activations(c)
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j in range(len(la.kept) - 1, -1, -1):
        mt, at = la.mlp_transient[j], la.attn_transient[j]
        at_mlp, at_attention = mlp(j), attention(j)
        rows += [(mt, at_mlp, at_attention, "transient.mlp", j),
                 (at, at_attention, layer_done(j), "transient.attention", j)]
        if at > mt and not la.attention_split[j]:
            rows.append((at - mt, at_mlp, at_attention, "transient.attention_over_mlp", j))
    return device_terms(K.LAYER_BACKWARD, rows)


def nf4_dequant(c: StepContext) -> list[Term]:
    """torchtune's QLoRA: each layer's backward dequantizes its NF4 weights one at a time
    (``LinearNF4.backward``: ``grad_output @ weight.to(grad_output.dtype)``), and torchao's
    ``get_original_weight`` holds 14 n + 3 n / 64 + n / 8,192 bytes for an n-element weight at its peak
    (facts/torchtune.py, measured on CPU with torchao 0.7.0).  The largest linear's, at each layer's MLP
    point: a bound of that moment (the layer's MLP gradients counted beside it), not an allocation (the event
    stream does not read it).  Llama-2-7B: the MLP's 11,008 x 4,096 = 45,088,768 weights -> 631,242,752 +
    2,113,536 + 5,504 = 633,361,792 B."""
    if c.peft is None or c.quant == "none" or c.framework != "torchtune":
        return []
    nbytes = torchao_nf4_dequant_peak_bytes(c.rp.largest_linear)
    rows = [(nbytes, mlp(j), attention(j), "transient.nf4_dequant", j) for j in range(len(c.layer_specs) - 1, -1, -1)]
    return device_terms(K.LAYER_BACKWARD, rows)


def mixer_scan_products(c: StepContext) -> list[Term]:
    """transformers before 5.18 (``software.transformers``; facts/transformers.py ``mamba2_scan_broadcasts``): each
    Mamba2 mixer's backward meets its scan's largest broadcast product twice.  ``(C[..., None, :, :] * B[:, :,
    None]).sum(-1)`` and its like are a ``mul`` whose two inputs are broadcast; autograd's ``MulBackward0`` returns
    both input gradients at the product's full shape (``grad * other``, ``grad * self``: derivatives.yaml
    ``mul_tensor_backward``) and the engine reduces each to its input's shape only after the node returns
    (engine.cpp ``validate_outputs``: ``reduce_grad``), so two full-size fp32 gradients are alive together
    (analytic/ssm_state.py ``broadcast_product_bytes``).  At each mixer layer's attention point (the mixer takes
    the attention's place), as a bound of that moment, not an allocation (the event stream does not read it).  The
    forward's one product per layer (or the recomputation's, under checkpointing) is half of it and comes with
    fewer gradients alive."""
    ms = c.m.mamba
    if ms is None or ms.kind != "mamba2" or not mamba2_scan_broadcasts(c.s.software.transformers_version):
        return []
    t = c.s.train
    nbytes = 2 * broadcast_product_bytes(ms, t.micro_batch_size, t.seq_len)
    layers = set(ms.layers)
    rows = [(nbytes, attention(j), layer_done(j), "transient.mamba2_scan_products", j)
            for j in range(len(c.layer_specs) - 1, -1, -1) if j in layers]
    return device_terms(K.LAYER_BACKWARD, rows)


def mixer_forward(c: StepContext) -> list[Term]:
    """A Mamba2 mixer's forward holds its chunked scan's temporaries above what it keeps (``mixer_recompute_per_token``,
    read off ``NemotronHMamba2Mixer`` on the meta device, frozen or trained).  The last mixer's forward meets every
    earlier layer's saved tensors, not those of the layers after it, nor the loss's forward tensors, which come after
    its temporaries are freed.  So the forward's end, which holds every layer's records and the loss's, stands for
    that moment too: its excess over the loss's forward bytes and the later layers' records, alive at that point only
    (a bound of the moment, not an allocation: the event stream does not read it).  Without checkpointing (with it, the
    recomputed mixer's forward is its backward's: ``layers._mixer_transient``)."""
    ms = c.m.mamba
    if ms is None or ms.kind != "mamba2" or checkpointing(c.s) != "none":
        return []
    t = c.s.train
    ws = mixer_recompute_per_token(ms, c.m.hidden_size, c.act.residual_bytes, c.act.frozen_base, t.micro_batch_size,
                                   c.act.seq_len, c.act.autocast) * c.tokens
    head = sum(term.nbytes for term in loss(c) if term.key is K.LOSS_FORWARD)
    # the layers after the last mixer have not run yet at its forward: their records are not alive then, nor those of
    # its own layer's post-mixer norm and MLP (the records of part "mlp": Bamba's and Granite 4.0-H's blocks)
    mixers = [j for j, ls in enumerate(c.layer_specs) if ls.index in ms.layers]
    la = layer_activations(c)
    after = 0
    if mixers:
        last = mixers[-1]
        # without per-record lists (none here: layer_activations always gives them) nothing is taken off: over
        after = sum(la.full[last + 1:]) + (sum(x.total for x in la.tensors[last] if x.part == "mlp")
                                           if la.tensors else 0)
    extra = ws - head - after
    return [Term(K.LAYER_FORWARD, extra, FORWARD, LOSS, "transient.mixer_forward")] if extra > 0 else []
