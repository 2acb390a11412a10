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
from vramplan.analytic.attention import mem_efficient_mask_row
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import END, FORWARD, LOSS, TIED_EMBEDDING
from vramplan.spec.model import ModelSpec, VisionSpec
from vramplan.spec.vision import image_grid, image_tiles, packed_attention

__all__ = ["frozen_tower_forward_bytes", "tower_forward_moment", "tower_saved", "tower_sequence", "tower_tensors",
           "tower_unused"]


def tower_sequence(c: StepContext) -> tuple[tuple[int, bool], ...]:
    """The tower's saved tensors on this stage, in bytes, in the order the forward makes them, each with whether
    it belongs to a layer after the hidden state the projector takes (``VisionSpec.unused_layers``: freed before
    the backward); empty when the tower is frozen, the batch holds no image, or the stage has no embeddings."""
    return c.memo("vision_tower_sequence", lambda: _compute(c))


def tower_tensors(c: StepContext) -> tuple[int, ...]:
    """The saved tensors the backward uses, alive from the forward to the embedding's backward."""
    return tuple(n for n, unused in tower_sequence(c) if not unused)


def tower_unused(c: StepContext) -> tuple[int, ...]:
    """The saved tensors of the layers after the selected one, alive to the forward's end."""
    return tuple(n for n, unused in tower_sequence(c) if unused)


def _saved(entries: tuple[tuple[str, int], ...], tower: ModelSpec, ctx: act.ActContext,
           tokens: int) -> list[int]:
    """``VisionSpec``'s (kind, elements) entries over ``tokens`` tokens, in bytes."""
    cast = ctx.compute_bytes if ctx.autocast and ctx.residual_bytes != ctx.compute_bytes else 0
    per_kind = {"residual": ctx.residual_bytes, "compute": ctx.compute_bytes, "cast": cast}
    out = []
    for kind, n in entries:
        each = act.norm_saved_per_token(tower, ctx) if kind == "norm" else per_kind[kind]
        out.append(each * n * tokens)
    return out


def _block_mask(v: VisionSpec, ctx: act.ActContext, sdpa: bool, seq: int, full: bool) -> tuple[list[int], list[int]]:
    """(shared, per layer) bytes of the block-diagonal mask a packing tower (``VisionSpec.block_mask_unless_flash``,
    Pixtral) hands SDPA over its ``seq`` packed patches; nothing under flash (varlen segments, no mask).

    ``generate_block_attention_mask`` (transformers 5.24 ``modeling_pixtral.py``) builds it once per forward in the
    patch embeddings' dtype (the residual stream's: ``ln_pre``'s output).  Under autocast with a residual dtype
    other than the compute dtype, SDPA's autocast cast makes a compute-dtype copy per layer, which the
    memory-efficient kernel saves (padded to ``mem_efficient_mask_row`` keys when unaligned); without autocast every
    layer's kernel saves the one mask, or a padded copy of it per layer when its rows are unaligned.  With full
    checkpointing each layer keeps its inputs, the one mask among them, and the kernel's copies are recomputed."""
    if not (v.block_mask_unless_flash and sdpa):
        return [], []
    if full:
        return [ctx.residual_bytes * seq * seq], []
    padded = ctx.compute_bytes * seq * mem_efficient_mask_row(seq)
    if (ctx.autocast and ctx.residual_bytes != ctx.compute_bytes) or seq % 8:
        return [], [padded]
    return [padded], []


def _compute(c: StepContext) -> tuple[tuple[int, bool], ...]:
    v = c.m.vision
    images = c.s.train.images_per_sample
    if v is None or v.tower is None or images == 0 or c.peft is not None or c.frozen_prefixes or not c.rp.has_embedding:
        return ()
    tower = v.tower
    ctx = replace(c.act, tp=1, sequence_parallel=False, frozen_base=False,
                  lora_targets=frozenset(), lora_rank=0, lora_dropout=False, dora=False, elementwise_bytes=0,
                  kbit_saves_input=False, liger=False, gqa_repeat=False)
    per_image = image_grid(v, c.s.train.image_size)[0]
    # the tower's passes per image (LLaVA-NeXT's tiles, else 1), each over its patches and any class token; the
    # attention runs within a pass
    passes = c.s.train.micro_batch_size * images * image_tiles(v, c.s.train.image_size)
    per_pass = per_image // image_tiles(v, c.s.train.image_size) + v.extra_tokens
    packed = packed_attention(c.s, c.m)
    if v.block_mask_unless_flash or packed is not None:
        # Pixtral runs the micro-batch's images as one packed sequence (PixtralVisionModel.forward's torch.cat);
        # Qwen2-VL / Qwen2.5-VL before transformers 4.54 attend over theirs at once under a block-diagonal mask
        passes, per_pass = 1, passes * per_pass
    ctx = replace(ctx, seq_len=per_pass)
    if packed is not None:
        # the release's kernel over the pack (facts/transformers.py QWEN_VL_PACKED_ATTENTION): SDPA's math kernel
        # on 3-D q/k/v (fp32 scaled q, k, v and the fp32 softmax saved: activations.py _sdpa_math_gqa_tensors),
        # the memory-efficient kernel with the mask, or eager's fp32 softmax and its cast
        ctx = replace(ctx, attention=packed.kernel)
    mb_images = c.s.train.micro_batch_size * images
    patches = mb_images * per_image
    seq = passes * per_pass
    resid = ctx.residual_bytes * tower.hidden_size
    # the patch embedding's input, cast to the compute dtype
    out = [(ctx.compute_bytes * v.num_channels * v.temporal_patch_size * v.patch_size**2 * patches, False)]
    out += [(n, False) for n in _saved(v.stem_saved_per_token, tower, ctx, seq)]
    shared, per_layer = _block_mask(v, ctx, c.s.train.attention == "sdpa", seq, checkpoint_policy(c.s) == "full")
    if packed is not None and packed.kernel == "efficient" and checkpoint_policy(c.s) != "full":
        # each layer builds its [1, S, S] mask (bool, converted by SDPA to the query's dtype, or in the value's
        # dtype) and the memory-efficient kernel keeps it, or its padded copy, for the backward
        per_layer = [ctx.compute_bytes * seq * mem_efficient_mask_row(seq)]
    out += [(n, False) for n in shared]
    if checkpoint_policy(c.s) == "full":
        layer = [resid * seq]  # each checkpointed layer keeps its input
    else:
        layer = [t.nbytes * seq for t in act.layer_tensors(tower, tower.layers[0], ctx) for _ in range(t.copies)]
        layer += _saved(v.layer_saved_per_token, tower, ctx, seq)
    layer += per_layer
    used = tower.num_layers - v.unused_layers
    out += [(n, False) for n in layer * used] + [(n, True) for n in layer * v.unused_layers]
    out += [(n, True) for n in _saved(v.unused_saved_per_image, tower, ctx, passes)]
    out += [(n, False) for n in _saved(v.head_saved_per_patch, tower, ctx, patches)]
    # the projector's rows: each pass's tokens less those it does not take (LLaVA's class token)
    out += [(n, False) for n in _saved(v.head_saved_per_token, tower, ctx, passes * (per_pass - v.dropped_tokens))]
    return tuple(x for x in out if x[0]) * c.in_flight


def tower_saved(c: StepContext) -> list[Term]:
    """The vision tower's saved tensors, from the forward's start to the embedding's backward; those of the layers
    after the selected hidden state to the loss (freed with the model output before the backward)."""
    out = []
    tensors = tower_tensors(c)
    if tensors:
        out.append(Term(K.SAVED, sum(tensors), FORWARD, TIED_EMBEDDING, "saved.vision_tower", tensors=tensors))
    unused = tower_unused(c)
    if unused:
        out.append(Term(K.SAVED, sum(unused), FORWARD, LOSS, "saved.vision_tower_unused", tensors=unused))
    return out


def frozen_tower_forward_bytes(c: StepContext) -> int:
    """What a frozen tower's forward holds (PEFT, or ``train.freeze_vision_tower``) while its last layer runs over the
    micro-batch's images without autograd recording (analytic/inference.py ``tower_forward_bytes``, the generate
    prefill's rule), on the stage with the embeddings; 0 for a trained tower (its forward's records are
    ``tower_sequence``'s saved tensors), no image, or another stage.

    The frozen tower runs before the language model's first layer (``Qwen2_5_VLModel.forward``: the text embeddings,
    then ``get_image_features``), so nothing of the step's activations exists yet: the moment is the step's resident
    terms with this (``tower_forward_moment``).  A packing tower of a release before transformers 4.54 attends over
    all the micro-batch's patches at once (spec/vision.py ``packed_attention``): its running layer is quadratic in
    them."""
    from vramplan.analytic.inference import tower_forward_bytes

    v, t = c.m.vision, c.s.train
    if v is None or v.tower is None or t.images_per_sample == 0 or not c.rp.has_embedding:
        return 0
    if c.peft is None and not c.frozen_prefixes:
        return 0
    r = c.r
    # eager's bytes per score read the forward's dtype from the inference section (softmax_bytes_per_score): the
    # step's compute dtype, fp32 when the step computes in fp32
    dtype = c.pol.half if c.act.compute_bytes == 2 else "fp32"
    if r.scenario.inference.dtype != dtype:
        r = replace(r, scenario=r.scenario.model_copy(update={
            "inference": r.scenario.inference.model_copy(update={"dtype": dtype})}))
    return tower_forward_bytes(r, t.micro_batch_size * t.images_per_sample, t.image_size, c.act.compute_bytes,
                               c.act.attention)


def tower_forward_moment(c: StepContext, terms: list[Term]) -> Moment | None:
    """The frozen tower's forward as a moment of the step (None without one, ``frozen_tower_forward_bytes``): the
    device terms resident through the step (born at its start and alive to its end: weights, optimizer states,
    master weights, workspaces and buckets, and gradients where they live through the forward, accumulated or
    preallocated), the sharded units gathered for the forward (``K.GATHERED`` born at it), the text embeddings the
    forward keeps ([b, s, h] in the residual dtype), and the tower's running tensors (``K.VISION_TOWER``)."""
    tower = frozen_tower_forward_bytes(c)
    if not tower:
        return None
    mo = Moment("forward")
    for key, nbytes, born, dies, _name, _layer, where, fields, _tensors in terms:
        if where == "device" and born is FORWARD and (dies is END or key is K.GATHERED):
            mo.add(key, nbytes, **dict(fields))
    t = c.s.train
    mo.add(K.INPUTS_EMBEDS, c.act.residual_bytes * t.micro_batch_size * t.seq_len * c.m.hidden_size)
    mo.add(K.VISION_TOWER, tower)
    return mo
