"""The vision tower's saved activations in a training step of a vision-language model (``ModelSpec.vision``).

``Gemma3Model.forward`` (transformers 5.24 ``modeling_gemma3.py``) runs ``get_image_features`` (the SigLIP
tower, then the projector) before the language model and scatters the image features into the input
embeddings (``masked_scatter``), so the tower's saved tensors are made before the first decoder layer and
freed by the tower's backward, which runs once the gradient reaches the input embeddings: after the first
decoder layer's backward, with the embedding's (``TIED_EMBEDDING``), as ``saved.shared``.

Per image the tower runs over ``patches_per_image`` tokens (Gemma 3: (896 / 14)^2 = 4096) through its
``num_layers`` encoder layers.  Each ``SiglipEncoderLayer`` is a pre-norm transformer block (LayerNorm,
biased q/k/v/out_proj, bidirectional attention, LayerNorm, fc1 -> gelu_pytorch_tanh -> fc2), the structure
the engine's decoder layers have, so its saved tensors are ``analytic/activations.py`` ``layer_tensors`` of
the tower's layer shape (``VisionSpec.tower``) with the keys per query row set to the patches of one image
(the attention runs within an image; SiglipAttention has no mask, so SDPA takes the same kernel as the
language model's).  Around the layers: the patch convolution's input (the pixels, cast to the compute dtype
under autocast: ``channels x patch^2`` per patch), the post-layernorm's saved tensors, and the average pool's
input (``AvgPool2d`` saves it; the post-layernorm's output, kept in the residual dtype).

With full checkpointing transformers checkpoints every ``GradientCheckpointingLayer``, ``SiglipEncoderLayer``
included: each tower layer keeps only its input (residual bytes x hidden per patch).

Counted only when the tower is trained (full fine-tuning, no PEFT, no ``train.freeze_vision_tower``) and the
batch holds images, on the first
pipeline stage (the one that holds the embeddings); a frozen tower (PEFT) runs without autograd recording
anything, and its forward's transient tensors come before the language model's and are not counted.  The
projector's tensors on ``tokens_per_image`` tokens (256 x 1152 per image, against 4096 x 1152 per tower
layer) and the tower's backward temporaries (after the language model's activations are freed) are not
counted; the report says so (spec/vision.py).

Example, google/gemma-3-4b-it, bf16-mixed, SDPA flash, one image: per patch and layer the LayerNorm saves
its fp32 input and two fp32 statistics, q/k/v's bf16 input, flash's q, k, v, output and logsumexp, the
MLP's input, GELU input and fc2 input (``layer_tensors``); times 4096 patches and 27 layers.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic import activations as act
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, TIED_EMBEDDING
from vramplan.spec.vision import image_grid

__all__ = ["tower_saved", "tower_tensors"]


def tower_tensors(c: StepContext) -> tuple[int, ...]:
    """The tower's saved tensors on this stage, in bytes, in the order the forward makes them (empty when the
    tower is frozen, the batch holds no image, or the stage has no embeddings)."""
    return c.memo("vision_tower_tensors", lambda: _compute(c))


def _compute(c: StepContext) -> tuple[int, ...]:
    v = c.m.vision
    images = c.s.train.images_per_sample
    if v is None or v.tower is None or images == 0 or c.peft is not None or c.frozen_prefixes or not c.rp.has_embedding:
        return ()
    tower = v.tower
    ctx = replace(c.act, tp=1, sequence_parallel=False, frozen_base=False,
                  lora_targets=frozenset(), lora_rank=0, lora_dropout=False, dora=False, elementwise_bytes=0,
                  kbit_saves_input=False, liger=False, gqa_repeat=False)
    per_image, _ = image_grid(v, c.s.train.image_size)
    ctx = replace(ctx, seq_len=per_image)
    patches = c.s.train.micro_batch_size * images * per_image
    resid = ctx.residual_bytes * tower.hidden_size
    # the patch embedding's input, cast to the compute dtype
    out = [ctx.compute_bytes * v.num_channels * v.temporal_patch_size * v.patch_size**2 * patches]
    if checkpoint_policy(c.s) == "full":
        out += [resid * patches] * tower.num_layers  # each checkpointed layer keeps its input
    else:
        layer = [t.nbytes * patches for t in act.layer_tensors(tower, tower.layers[0], ctx) for _ in range(t.copies)]
        out += layer * tower.num_layers
    per_kind = {"residual": ctx.residual_bytes, "compute": ctx.compute_bytes}
    for kind, n in v.head_saved_per_patch:
        each = act.norm_saved_per_token(tower, ctx) if kind == "norm" else per_kind[kind]
        out.append(each * n * patches)
    return tuple(x for x in out if x) * c.in_flight


def tower_saved(c: StepContext) -> list[Term]:
    """The vision tower's saved tensors, from the forward's start to the embedding's backward."""
    tensors = tower_tensors(c)
    if not tensors:
        return []
    return [Term(K.SAVED, sum(tensors), FORWARD, TIED_EMBEDDING, "saved.vision_tower", tensors=tensors)]
