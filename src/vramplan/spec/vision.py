"""Images in a vision-language model's batch: the checks and the report's assumptions.

A vision-language model (``ModelSpec.vision``, set by its family adapter: ``spec/families/gemma3.py``) holds a
vision tower and a projector; their parameters are in ``ModelSpec.params``, so weights, gradients and
optimizer states follow from them like every other parameter.  The images of a batch
(``train.images_per_sample``, ``inference.images_per_sample``) put ``tokens_per_image`` image tokens each into
the language model's sequence; ``seq_len`` / ``prompt_len`` count them (the processor writes them into the
input ids: transformers 5.24 ``Gemma3Processor``, ``full_image_sequence``).  What the engines do not model
is said as ``not modelled: `` assumptions (docs/models.md, Vision-language models).
"""

from __future__ import annotations

from vramplan.errors import Problem
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = ["image_problems", "image_tokens", "images_per_sample", "vision_notes"]


def images_per_sample(s: Scenario) -> int:
    """Images per sequence of the scenario's task (0 for serve, whose images are vLLM's own profiling)."""
    if s.task == "train":
        return s.train.images_per_sample
    if s.task == "inference":
        return s.inference.images_per_sample
    return 0


def image_tokens(s: Scenario, m: ModelSpec) -> int:
    """Image tokens per sequence: images x the model's tokens per image (0 for a text-only model)."""
    return 0 if m.vision is None else images_per_sample(s) * m.vision.tokens_per_image


def image_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Images for a model without a vision tower; more image tokens than the sequence holds."""
    n = images_per_sample(s)
    if s.task == "train" and s.train.freeze_vision_tower and m.vision is None:
        return [Problem("train.freeze_vision_tower", f"{m.name} has no vision tower to freeze",
                        "set freeze_vision_tower: false, or name a vision-language model (model_type gemma3)")]
    if n == 0:
        return []
    where = f"{s.task}.images_per_sample"
    if m.vision is None:
        return [Problem(where, f"{n} image(s) per sequence, but {m.name} has no vision tower",
                        "set images_per_sample: 0, or name a vision-language model (model_type gemma3)")]
    length, name = (s.train.seq_len, "train.seq_len") if s.task == "train" else (s.inference.prompt_len,
                                                                                  "inference.prompt_len")
    tokens = image_tokens(s, m)
    if tokens > length:
        return [Problem(where, f"{n} image(s) of {m.vision.tokens_per_image} tokens each are {tokens:,} tokens, "
                        f"more than {name} {length:,} (which counts the image tokens)",
                        f"raise {name} to at least {tokens:,} or give fewer images")]
    return []


def vision_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """The report's assumptions for a vision-language model: what is counted and what is not modelled."""
    v = m.vision
    if v is None:
        return []
    n = images_per_sample(s)
    first = (f"vision tower: {m.vision_parameters:,} parameters (tower and projector), held unquantized in the "
             f"model's dtype; each image is {v.tokens_per_image} image tokens of the language model's sequence and "
             f"{v.patches_per_image:,} patches ({v.image_size} x {v.image_size} in {v.patch_size} x {v.patch_size}) "
             f"through {v.num_layers} tower layers")
    out = [first]
    if s.task == "serve":
        out.append("not modelled: vLLM's encoder cache and the dummy images of its memory profiling run for a "
                   "vision-language model (the estimate is the language model's start-up)")
        return out
    if s.task == "train":
        frozen = s.train.peft is not None or s.train.freeze_vision_tower
        if s.train.peft is None and s.train.freeze_vision_tower:
            out.append("freeze_vision_tower: the vision tower and projector keep their weights but get no gradient "
                       "and no optimizer state (the HF Trainer's optimizer groups take only parameters that "
                       "require grad, Trainer.create_optimizer)")
        elif s.train.peft is None:
            out.append("the vision tower and projector are trained (their gradients and optimizer states are "
                       "counted; train.freeze_vision_tower freezes them)")
        else:
            out.append("not modelled: adapters peft would place on the vision tower's linears whose names match "
                       "target_modules (the tower is counted frozen, without adapters)")
        if not frozen and n == 0:
            out.append("not modelled: with no images in the batch the tower's parameters get no gradient (torch "
                       "leaves .grad None for parameters outside the graph) and AdamW creates no state for them; "
                       "they are counted as trained")
        if n and not frozen:
            out.append(f"vision tower activations: {n} image(s) of {v.patches_per_image:,} patches per sequence "
                       f"through {v.num_layers} encoder layers, saved as the decoder layers' terms of the tower's "
                       "shape from the forward to the embedding's backward (analytic/terms/vision.py); the "
                       f"projector's {v.tokens_per_image}-token tensors and the tower's backward temporaries are "
                       f"not counted; the {n * v.tokens_per_image:,} image tokens are counted in seq_len")
        elif n:
            out.append(f"the frozen vision tower runs {n} image(s) per sequence without autograd recording (its "
                       "forward's transient tensors, made before the language model's, are not counted); the "
                       f"{n * v.tokens_per_image:,} image tokens are counted in seq_len")
    elif n:
        out.append(f"not modelled: the vision tower's transient activations for {n} image(s) of "
                   f"{v.patches_per_image:,} patches in the prefill; the {n * v.tokens_per_image:,} image tokens "
                   "are counted in prompt_len and the KV cache")
    return out
