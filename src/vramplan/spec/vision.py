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

import math

from vramplan.errors import Problem
from vramplan.facts.quantization import quant_format
from vramplan.facts.transformers import PackedAttention, qwen_vl_packed_attention
from vramplan.facts.vllm_multimodal import mm_profile_read, mm_v0_read
from vramplan.facts.vllm_releases import parse_release
from vramplan.spec.model import ModelSpec, VisionSpec
from vramplan.spec.scenario import Scenario
from vramplan.spec.vision_quant import tower_quantized_linears, transformers_unmatched
from vramplan.units import GiB

__all__ = ["anyres_grid", "cross_attention_notes", "image_grid", "image_problems", "image_size", "image_tiles", "image_tokens",
           "images_per_sample", "internvl_tiles", "phi4_hd_crops", "pixtral_grid", "select_best_resolution", "smart_resize", "tower_held", "vision_notes"]


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's processor resize (transformers 5.24 ``models/qwen2_vl/image_processing_qwen2_vl.py``
    ``smart_resize``): both sides multiples of ``factor`` (patch x merge), the area within [min, max] pixels,
    the aspect ratio kept as closely as possible."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def select_best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """transformers 5.24 ``image_processing_utils.select_best_resolution``: the (height, width) of ``pinpoints``
    that keeps the most of the image once it is scaled to fit, then wastes the least padding (the first wins
    ties)."""
    best, most, least = pinpoints[0], 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (h, w), effective, wasted
    return best


def anyres_grid(v: VisionSpec, side: int) -> tuple[int, int]:
    """(tiles through the tower, image tokens) of a ``side`` x ``side`` image under LLaVA-NeXT's anyres.

    ``image_size_to_num_patches`` (modeling_llava_next.py): the best resolution's tiles of ``tile_size``
    (ceil(h / tile) x ceil(w / tile)) and the base image.  ``LlavaNextProcessor._get_number_of_features``: the
    tiles' patches unpadded to the image's aspect ratio (``_get_unpadded_features``), one newline token per row
    of them, and the base image's (tile / patch)^2 patches and class token, less ``dropped_tokens``."""
    h, w = select_best_resolution(side, side, v.grid_pinpoints)
    tiles = -(-h // v.tile_size) * -(-w // v.tile_size) + 1
    per_side = v.tile_size // v.patch_size
    cur_h, cur_w = per_side * (h // v.tile_size), per_side * (w // v.tile_size)
    if 1.0 > cur_w / cur_h:  # the image's aspect ratio (square) is wider than the grid's: unpad rows
        cur_h -= (cur_h - int(round(side * (cur_w / side), 7))) // 2 * 2
    else:
        cur_w -= (cur_w - int(round(side * (cur_h / side), 7))) // 2 * 2
    tokens = cur_h * cur_w + cur_h + per_side * per_side + v.extra_tokens - v.dropped_tokens
    return tiles, tokens


def pixtral_grid(v: VisionSpec, side: int) -> tuple[int, int]:
    """(patches through the tower, image tokens) of a ``side`` x ``side`` image under Pixtral's processor.

    ``PixtralImageProcessor`` (transformers 5.24 ``image_processing_pixtral.py`` ``get_resize_output_image_size``):
    ratio = side / longest_edge; above 1 the side becomes floor(side / ratio); ``_num_image_tokens`` rounds it up
    to a multiple of patch x merge (n merged patches a side).  The tower runs over (n x merge)^2 patches;
    ``PixtralProcessor._get_num_multimodal_tokens``: (n + 1) x n tokens, one ``[IMG]`` per merged patch and an
    ``[IMG_BREAK]`` (the last an ``[IMG_END]``) per row."""
    ratio = side / v.longest_edge
    if ratio > 1:
        side = math.floor(side / ratio)
    unit = v.patch_size * v.merge_size
    n = (side - 1) // unit + 1
    return (n * v.merge_size) ** 2, (n + 1) * n


def internvl_tiles(v: VisionSpec, side: int) -> int:
    """Tiles of a ``side`` x ``side`` image under ``GotOcr2ImageProcessor`` with ``crop_to_patches``.

    transformers 5.24 ``image_processing_got_ocr2.py``: ``get_all_supported_aspect_ratios`` lists the (columns,
    rows) grids of min_tiles to max_tiles tiles by area; ``get_optimal_tiled_canvas`` keeps the first with the
    image's aspect ratio (1 for a square) and moves to a larger one with the same ratio while the image's area
    exceeds half the grid's (``area > 0.5 x tile^2 x columns x rows``); ``get_number_of_image_patches`` adds the
    thumbnail when the grid has more than one tile."""
    grids = sorted(((c, r) for c in range(1, v.max_tiles + 1) for r in range(1, v.max_tiles + 1)
                    if v.min_tiles <= c * r <= v.max_tiles), key=lambda g: g[0] * g[1])
    best, best_diff, tile = (1, 1), float("inf"), v.image_size
    for c, r in grids:
        diff = abs(1 - c / r)
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and side * side > 0.5 * tile * tile * c * r:
            best = (c, r)
    n = best[0] * best[1]
    return n + 1 if n > 1 else 1


def phi4_hd_crops(v: VisionSpec, side: int | None) -> int:
    """Crops a side of a ``side`` x ``side`` image under ``Phi4MultimodalImageProcessor`` (transformers 5.24
    ``image_processing_phi4_multimodal.py`` ``dynamic_preprocess``, l.79-108): ceil(side / image_size) a side while
    that grid holds at most ``dynamic_hd`` crops; past it ``find_closest_aspect_ratio`` keeps the square grids' last
    (a tie on the ratio moves to the larger grid while the image's area exceeds half of it, which every square grid
    up to the largest does here: side > image_size x k).  A square image fills its grid exactly (no padding, the
    attention mask all ones).  None: the largest grid."""
    largest = math.isqrt(v.dynamic_hd)
    if side is None:
        return largest
    c = -(-side // v.image_size)
    return c if c * c <= v.dynamic_hd else largest


def image_tiles(v: VisionSpec, size: int | None) -> int:
    """Tower passes per image: LLaVA-NeXT's anyres tiles and base image (``anyres_grid``), Idefics3's tiles and
    whole image (``VisionSpec.fixed_tiles``), InternVL's tiles and thumbnail (``internvl_tiles``), else 1."""
    if v.max_tiles > 1:
        return internvl_tiles(v, size or v.max_tiles * v.image_size)
    if v.dynamic_hd:
        # Phi-4-multimodal: the whole image and its crops (image_processing_phi4_multimodal.py l.224)
        return 1 + phi4_hd_crops(v, size) ** 2
    return anyres_grid(v, size or v.image_size)[0] if v.grid_pinpoints else (v.fixed_tiles or 1)


def image_grid(v: VisionSpec, size: int | None) -> tuple[int, int]:
    """(patches through the tower, image tokens in the text) of one square image of ``size`` pixels a side.

    A fixed-resolution processor (Gemma 3: every image resized to ``v.image_size``) ignores ``size``.  A
    dynamic one (Qwen2.5-VL) resizes it with ``smart_resize`` (None: the largest image, ``v.image_size``);
    the tower runs over (h / patch) x (w / patch) patches and the merger makes one token of each
    merge x merge square (``Qwen2VLImageProcessor``: ``num_image_tokens = grid_t * grid_h * grid_w //
    merge_size**2``, one temporal patch per image)."""
    if v.grid_pinpoints:
        tiles, tokens = anyres_grid(v, size or v.image_size)
        return tiles * (v.tile_size // v.patch_size) ** 2, tokens
    if v.longest_edge:
        return pixtral_grid(v, size or v.image_size)
    if v.max_tiles > 1:
        # InternVL: each tile's patches through the tower, image_seq_length tokens per tile and <img>, </img>
        tiles = image_tiles(v, size)
        return tiles * v.patches_per_image, tiles * (v.tokens_per_image - 2) + 2
    if v.dynamic_hd:
        # Phi-4-multimodal: (1 + c^2) passes of image_size; tokens: the global image's and the crops' pooled patches,
        # one separator per pooled row of each and the global separator (spec/families/phi4_multimodal.py hd_tokens)
        c = phi4_hd_crops(v, size)
        pooled = (v.image_size // v.patch_size + 1) // v.merge_size
        return (1 + c * c) * v.patches_per_image, pooled * pooled + pooled + 1 + (c * pooled) ** 2 + c * pooled
    if not v.max_pixels:
        return v.patches_per_image, v.tokens_per_image
    side = size or v.image_size
    # a given image is resized as the released checkpoint's processor does (its preprocessor_config.json max_pixels,
    # which AutoProcessor.from_pretrained reads); without one, the processor class's default size stands
    h, w = smart_resize(side, side, v.patch_size * v.merge_size, v.min_pixels, processor_max_pixels(v, size))
    patches = (h // v.patch_size) * (w // v.patch_size)
    return patches, patches // (v.merge_size * v.merge_size)


def processor_max_pixels(v: VisionSpec, size: int | None) -> int:
    """The ``max_pixels`` ``smart_resize`` caps a given image at: the released checkpoint's (``checkpoint_max_pixels``,
    Qwen2-VL and Qwen2.5-VL Instruct: 12,845,056 in preprocessor_config.json) when known, else the processor class's;
    without a given image (``size`` None) the class's (the model's default image, ``VisionSpec.image_size``)."""
    if size and v.checkpoint_max_pixels:
        return v.checkpoint_max_pixels
    return v.max_pixels


def image_size(s: Scenario) -> int | None:
    """The side of the task's images in pixels (None: the model's default)."""
    if s.task == "train":
        return s.train.image_size
    if s.task == "inference":
        return s.inference.image_size
    return None


def images_per_sample(s: Scenario) -> int:
    """Images per sequence of the scenario's task (0 for serve, whose images are vLLM's own profiling)."""
    if s.task == "train":
        return s.train.images_per_sample
    if s.task == "inference":
        return s.inference.images_per_sample
    return 0


def packed_attention(s: Scenario, m: ModelSpec) -> PackedAttention | None:
    """How the run's transformers release attends over a packing tower's images (``VisionSpec.packs_images``:
    Qwen2-VL, Qwen2.5-VL), for a training or generate job with images: before 4.54 a non-flash attention runs
    over all the forward's patches at once (facts/transformers.py ``QWEN_VL_PACKED_ATTENTION``); None when each
    image attends alone (4.54 on, the release unset: the current one assumed) or flash's varlen kernel runs."""
    v = m.vision
    if v is None or not v.packs_images or s.task not in ("train", "inference") or images_per_sample(s) == 0:
        return None
    attention = s.train.attention if s.task == "train" else s.inference.attention
    return qwen_vl_packed_attention(s.software.transformers_version, attention)


def image_tokens(s: Scenario, m: ModelSpec) -> int:
    """Image tokens per sequence: images x the model's tokens per image (0 for a text-only model)."""
    return 0 if m.vision is None else images_per_sample(s) * image_grid(m.vision, image_size(s))[1]


def _prefix_lm_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """A prefix LM's attention (``VisionSpec.prefix_lm``, PaliGemma) the engines do not model, refused.

    ``PaliGemmaModel.forward`` (transformers 5.24 ``modeling_paligemma.py``) hands every layer a 4-D mask
    (``block_sequence_ids`` from the processor's ``token_type_ids``).  Eager adds it to the scores as it adds a
    causal mask; SDPA runs the memory-efficient kernel on it (``Traits.sdpa_mask_always``); both are modelled,
    in the language model and the SigLIP tower (SDPA without a mask there).  Not modelled: PaliGemma 2 under sdpa,
    whose Gemma 2 runs eager (``Traits.sdpa_dropped_in``) while its tower runs SDPA.  Flash: the class sets
    ``_supports_flash_attn = False``."""
    v = m.vision
    if v is None or not v.prefix_lm or s.task not in ("train", "inference"):
        return []
    want = s.train.attention if s.task == "train" else s.inference.attention
    dropped, release = m.traits.sdpa_dropped_in, s.software.transformers_version
    mixed = want == "sdpa" and (
        "sdpa" not in m.traits.attention_kernels or (dropped is not None and (release is None or release >= dropped)))
    if want == "eager" or (want == "sdpa" and not mixed):
        return []
    why = ("transformers 5.24 PaliGemma sets _supports_flash_attn = False (flash drops the bidirectional mask over "
           "the image and prefix)" if want == "flash" else
           "under sdpa its language model has no SDPA path in this transformers release and runs eager while the "
           "SigLIP tower runs SDPA, a mix that is not modelled")
    hint = "set {t}.attention: eager (the mask is added to the scores as a causal one is; modelled)"
    if want == "flash" and not mixed and "sdpa" in m.traits.attention_kernels and dropped is None:
        hint = "set {t}.attention: sdpa (the memory-efficient kernel on the mask; modelled) or eager"
    return [Problem(f"{s.task}.attention", f"{m.name} is a prefix LM: every forward hands the attention a 4-D mask "
                    f"over the image and prefix tokens; {why}", hint.format(t=s.task))]


def _block_mask_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Images through a tower that packs them under a block-diagonal mask (``VisionSpec.block_mask_unless_flash``,
    Pixtral: transformers 5.24 ``modeling_pixtral.py`` ``generate_block_attention_mask``) with eager attention, whose
    scores over the whole pack (with the mask added in the patch embeddings' dtype) are not modelled; flash (each
    image a varlen segment) and SDPA (the memory-efficient kernel on the mask, analytic/terms/vision.py) are."""
    v = m.vision
    if v is None or not v.block_mask_unless_flash or images_per_sample(s) == 0:
        return []
    want = s.train.attention if s.task == "train" else s.inference.attention
    if want != "eager":
        return []
    return [Problem(f"{s.task}.attention", f"{m.name}'s Pixtral tower packs the images of a forward into one "
                    "sequence and, with eager attention, scores the whole pack under a block-diagonal mask "
                    "(generate_block_attention_mask): not modelled",
                    f"set {s.task}.attention: sdpa or flash (both modelled), or {s.task}.images_per_sample: 0")]


def _unmodelled_task_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Serving (``VisionSpec.serve_refused``) or training the tower (``VisionSpec.train_refused``: full fine-tuning
    without ``freeze_vision_tower``) where the adapter says why it is not modelled."""
    v = m.vision
    if v is None:
        return []
    if s.task == "serve" and v.serve_refused:
        return [Problem("task", f"serving {m.name} is not modelled: {v.serve_refused}",
                        "estimate task: inference (Hugging Face generate, modelled with images) instead")]
    if s.task == "train" and v.train_refused and s.train.peft is None and not s.train.freeze_vision_tower:
        return [Problem("train.freeze_vision_tower", f"training {m.name}'s vision tower is not modelled: "
                        f"{v.train_refused}", "set train.freeze_vision_tower: true (the language model trained, the "
                        "towers frozen) or train.peft (LoRA on the language model)")]
    return []


def image_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Images for a model without a vision tower; more image tokens than the sequence holds; a prefix LM's
    attention other than eager; a packed tower's block mask."""
    prefix = _prefix_lm_problems(s, m) + _block_mask_problems(s, m) + _unmodelled_task_problems(s, m)
    if prefix:
        return prefix
    n = images_per_sample(s)
    if s.task == "train" and s.train.freeze_vision_tower and m.vision is None:
        return [Problem("train.freeze_vision_tower", f"{m.name} has no vision tower to freeze",
                        "set freeze_vision_tower: false, or name a vision-language model (model_type gemma3, qwen2_5_vl, qwen2_vl, qwen3_vl, qwen3_vl_moe, llava, llava_next, paligemma, mistral3, idefics3, smolvlm, internvl or phi4_multimodal)")]
    if n == 0:
        return []
    where = f"{s.task}.images_per_sample"
    if m.vision is not None and m.vision.images_refused:
        return [Problem(where, f"{n} image(s) per sequence, but {m.name} cannot take an image: "
                        f"{m.vision.images_refused}", "set images_per_sample: 0 (the language model alone)")]
    if m.vision is None:
        return [Problem(where, f"{n} image(s) per sequence, but {m.name} has no vision tower",
                        "set images_per_sample: 0, or name a vision-language model (model_type gemma3, qwen2_5_vl, qwen2_vl, qwen3_vl, qwen3_vl_moe, qwen3_omni_moe, llava, llava_next, paligemma, mistral3, idefics3, smolvlm, internvl or phi4_multimodal)")]
    length, name = (s.train.seq_len, "train.seq_len") if s.task == "train" else (s.inference.prompt_len,
                                                                                  "inference.prompt_len")
    tokens = image_tokens(s, m)
    if tokens > length:
        return [Problem(where, f"{n} image(s) of {tokens // n:,} tokens each are {tokens:,} tokens, "
                        f"more than {name} {length:,} (which counts the image tokens)",
                        f"raise {name} to at least {tokens:,} or give fewer images")]
    return []


def vision_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """The report's assumptions for a vision-language model: what is counted and what is not modelled."""
    v = m.vision
    if v is None:
        return []
    if v.cross_attention_tokens_per_image:
        return cross_attention_notes(s, m)
    n = images_per_sample(s)
    patches, tokens = image_grid(v, image_size(s))
    tiles = image_tiles(v, image_size(s))
    if v.grid_pinpoints:
        side = image_size(s) or v.image_size
        shape = (f"a {side} x {side} image resized and padded to its image_grid_pinpoints resolution and cut into "
                 f"{tiles - 1} tiles of {v.tile_size} x {v.tile_size}, and the whole image at {v.tile_size} x "
                 f"{v.tile_size}: {tiles} tower passes"
                 f"{'' if image_size(s) else '; image_size not given: the largest square of the grid'}")
    elif v.max_tiles > 1:
        side = image_size(s) or v.max_tiles * v.image_size
        shape = (f"a {side} x {side} image cut by GotOcr2ImageProcessor's crop_to_patches into "
                 f"{max(1, tiles - 1)} tile(s) of {v.image_size} x {v.image_size} (between {v.min_tiles} and "
                 f"{v.max_tiles}){', and a thumbnail' if tiles > 1 else ''}: {tiles} tower passes"
                 f"{'' if image_size(s) else '; image_size not given: the largest grid'}")
    elif v.dynamic_hd:
        side = image_size(s) or math.isqrt(v.dynamic_hd) * v.image_size
        shape = (f"a {side} x {side} image resized onto {tiles - 1} crop(s) of {v.image_size} x {v.image_size} "
                 f"(Phi4MultimodalImageProcessor.dynamic_preprocess, at most {v.dynamic_hd}), and the whole image at "
                 f"{v.image_size} x {v.image_size}: {tiles} tower passes, each 2 x 2 average-pooled"
                 f"{'' if image_size(s) else '; image_size not given: the largest grid'}")
    elif v.fixed_tiles > 1:
        shape = (f"every square image rescaled to a fixed longest edge and cut into {tiles - 1} tiles of "
                 f"{v.image_size} x {v.image_size}, and the whole image at {v.image_size} x {v.image_size}: {tiles} "
                 f"tower passes{'; image_size ignored' if image_size(s) else ''}")
    elif v.longest_edge:
        side = image_size(s) or v.image_size
        shape = (f"a {side} x {side} image scaled to fit longest_edge {v.longest_edge} and its sides rounded up to "
                 f"multiples of {v.patch_size * v.merge_size}; the image tokens count an [IMG_BREAK] per row and "
                 f"[IMG_END]{'' if image_size(s) else '; image_size not given: the largest image'}")
    elif v.max_pixels:
        side = image_size(s) or v.image_size
        cap = processor_max_pixels(v, image_size(s))
        if not image_size(s):
            why = "; image_size not given: the largest image of the processor class's default size"
            if v.checkpoint_max_pixels > v.max_pixels:
                why += (f" (the released checkpoints' preprocessor_config.json lets images up to "
                        f"{v.checkpoint_max_pixels:,} pixels through: set image_size)")
        elif cap != v.max_pixels:
            why = (" of the released checkpoints' preprocessor_config.json, which AutoProcessor.from_pretrained reads; "
                   f"the processor class's own default is {v.max_pixels:,}")
        else:
            why = ""
        shape = (f"a {side} x {side} image resized by the processor's smart_resize (min_pixels {v.min_pixels:,}, "
                 f"max_pixels {cap:,}{why})")
    else:
        shape = f"{v.image_size} x {v.image_size} (every image resized to it{'; image_size ignored' if image_size(s) else ''})"
    cls = f" and {tiles * v.extra_tokens} class token(s)" if v.extra_tokens else ""
    first = (f"vision tower: {m.vision_parameters:,} parameters (tower and projector), {tower_held(s, m)}; each image is {tokens:,} image tokens of the language model's sequence and "
             f"{patches:,} patches of {v.patch_size} x {v.patch_size} ({shape}){cls} through {v.num_layers} "
             "tower layers")
    out = [first, *([v.param_note] if v.param_note else []), *_tower_dequant_note(s, m)]
    if s.task != "serve" and (unmatched := transformers_unmatched(m)):
        out.append(f"not modelled: transformers 5.24 matches the skip entries {unmatched} from a module name's start "
                   "or as its suffix (should_convert_module), so they do not reach the tower's modules under their 5.x "
                   "names (model.<...>): its loader would build quantized linears where the checkpoint stores plain "
                   "weights; the estimate is the checkpoint as stored (as vLLM loads it)")
    if s.task == "serve" and s.serve.engine == "sglang":
        # SGLang sizes its pool from mem_fraction_static without a profiling run (serve/sglang.py): the tower runs
        # in the reserve outside the fraction, like every activation, which its default fraction scales for
        out.append("SGLang runs the vision tower in the reserve left outside mem_fraction_static (no profiling run "
                   "with dummy images); its activations are not in the estimate, as no SGLang activation is")
        return out
    if s.task == "serve":
        release = parse_release(s.serve.vllm_version)
        if not (mm_profile_read(release, v.checkpoint_max_pixels, v.fixed_image_profile)
                or (v.tower is not None and mm_v0_read(release, v.checkpoint_max_pixels, v.fixed_image_profile,
                                                       v.tower.mlp_gated))):
            # modelled (serve/vllm_mm.py): the serving report states the profile run instead
            out.append("not modelled: vLLM's encoder cache and the dummy images of its memory profiling run for a "
                       "vision-language model (the estimate is the language model's start-up)")
        if s.parallel.tp > 1 and v.linears:
            # vLLM's towers and projectors shard their linears over the tensor-parallel group in most families and
            # releases (mm_encoder_tp_mode "weights", the default from 0.10: QKVParallelLinear / ColumnParallelLinear
            # / RowParallelLinear in qwen2_vl.py, qwen2_5_vl.py, clip.py, siglip.py, idefics2_vision_model.py), but
            # not all (0.6.x shards CLIP and SigLIP only with xformers and heads divisible by tp; llava's projector
            # is an nn.Linear in 0.6.3; gemma3's, paligemma's, idefics3's and InternVL's projectors, and InternVL's
            # tower attention, stay whole in 0.11 and 0.33): the tower is counted whole on every rank, an upper bound
            elems = sum(i * o * next(p.count for p in m.params if p.name == name) for name, i, o in v.linears)
            # 2 B per element in a half-precision engine (the tower is held unquantized unless tower_held says so)
            share = elems * (s.parallel.tp - 1) // s.parallel.tp * (4 if s.serve.dtype == "fp32" else 2)
            out.append(f"not modelled: vLLM's tensor-parallel sharding of the vision tower's and projector's linears "
                       f"(by family and release): they are counted whole on each of the {s.parallel.tp} ranks, up to "
                       f"{share / GiB:.2f} GiB more weights per rank than a fully sharded tower (so up to that much "
                       "less KV cache)")
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
            out.extend(v.notes)
            projector = ("the projector's saved tensors are counted, the tower's backward temporaries are not"
                         if v.head_saved_per_token else "the projector's tensors after its first ones and the "
                         "tower's backward temporaries are not counted")
            out.append(f"vision tower activations: {n} image(s) of {patches:,} patches per sequence "
                       f"through {v.num_layers} encoder layers, saved as the decoder layers' terms of the tower's "
                       "shape from the forward to the embedding's backward (analytic/terms/vision.py); "
                       f"{projector}; the {n * tokens:,} image tokens are counted in seq_len")
        elif n:
            out.append(f"the frozen vision tower runs {n} image(s) per sequence without autograd recording, before the "
                       "language model's first layer: a moment of the step holds the resident terms, the text "
                       "embeddings and the tower's running layer, as generate's prefill counts it (analytic/terms/"
                       f"vision.py tower_forward_moment); the {n * tokens:,} image tokens are counted in seq_len")
        out.extend(_packed_notes(s, m, n, patches, frozen))
    elif n:
        out.extend(v.notes)
        out.extend(_packed_notes(s, m, n, patches, True))
        out.append(f"vision tower in the prefill: {n} image(s) per prompt of {patches:,} patches, its running "
                   "layer as a decoder layer's of the tower's shape, with the pixel values and the text embeddings "
                   "alive, before the prompt's cache exists (analytic/inference.py vision_moment); the "
                   f"{n * tokens:,} image tokens are counted in prompt_len and the KV cache")
    return out


def _packed_notes(s: Scenario, m: ModelSpec, images: int, patches: int, frozen: bool) -> list[str]:
    """What the report says of a packing tower's attention in a release before transformers 4.54
    (``packed_attention``); nothing otherwise."""
    packed = packed_attention(s, m)
    if packed is None:
        return []
    batch = s.train.micro_batch_size if s.task == "train" else s.inference.batch_size
    seq = batch * images * patches
    kernel = {"math": "SDPA's math kernel (q/k/v handed over 3-D, which the fused kernels refuse): fp32 scores and "
                      "softmax", "efficient": "SDPA's memory-efficient kernel with the mask",
              "eager": "eager attention: scores and their fp32 softmax"}[packed.kernel]
    note = (f"transformers {s.software.transformers} ({packed.source}; facts/transformers.py "
            f"QWEN_VL_PACKED_ATTENTION): the tower attends over the micro-batch's {seq:,} patches at once under a "
            f"block-diagonal mask, with {kernel}, not within each image as from 4.54")
    out = [note]
    if packed.kernel in ("math", "eager") and not frozen:
        # a trained tower's layer backward over the pack makes the scores' gradients (two heads x S^2 tensors beyond
        # its saved ones) and, under checkpointing, its recomputed forward the scores again: not in the terms
        heads = m.vision.num_attention_heads if m.vision is not None else 0
        out.append(f"not modelled: the trained tower's backward over the pack, whose layer holds the scores' "
                   f"gradients beside its saved tensors (about 8 x {heads} x {seq:,}^2 B = "
                   f"{8 * heads * seq * seq / GiB:,.2f} GiB), or, with checkpointing, its recomputed scores")
    return out


def tower_held(s: Scenario, m: ModelSpec) -> str:
    """How the tower's and projector's weights are held under the task's quantization (spec/vision_quant.py)."""
    quant: str = getattr(s, s.task).quantization
    v = m.vision
    if quant == "none" or v is None:
        return "held unquantized in the model's dtype"
    q = tower_quantized_linears(m) if "linear" in quant_format(quant).quantized_roles else 0
    cq = m.checkpoint_quant
    if q:
        n = sum(1 for *_, k in v.quantized_linears if k)
        skipped = sum(c - k for (name, *_, k) in v.quantized_linears
                      for c in [next(p.count for p in m.params if p.name == name)])
        how = ("the checkpoint stores them so, less the modules its quantization_config skips" if cq is not None
               else "vLLM hands the tower and projector the model's quant_config" if s.task == "serve"
               else "transformers' quantizers replace every nn.Linear but the LM head (get_keys_to_not_convert)")
        return (f"{q:,} of them in {n} linear weight group(s) of the tower and projector stored as {quant} like the "
                f"language model's linears ({how}{f'; {skipped} skipped instance(s) held unquantized' if skipped else ''}), "
                "the rest (patch embedding, norms, biases, positions) in the model's dtype")
    why = (f"{quant} quantizes the routed experts only" if "linear" not in quant_format(quant).quantized_roles
           else "GPTQ quantizes the decoder blocks only" if cq is not None and cq.method == "gptq"
           else "the checkpoint's quantization_config skips them" if cq is not None and v.linears
           else "no nn.Linear of the tower is listed")
    return f"held unquantized in the model's dtype ({why})"


def _tower_dequant_note(s: Scenario, m: ModelSpec) -> list[str]:
    """bitsandbytes 4-bit and HQQ dequantize a whole weight per forward: under images, the tower's largest
    quantized linear's temporary is not added to the tower's moments (the language model's is)."""
    quant: str = getattr(s, s.task).quantization
    v = m.vision
    if (quant == "none" or v is None or not images_per_sample(s) or s.task == "serve"
            or quant_format(quant).dequant != "whole_weight" or not tower_quantized_linears(m)):
        return []
    largest = max(i * o for _, i, o, n in v.quantized_linears if n)
    return [(f"not modelled: {quant} dequantizes each of the tower's quantized linears for its forward (a temporary "
             f"of up to {largest:,} weights in the compute dtype, the largest); it is not added to the tower's "
             "activations")]


def cross_attention_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """The report's assumptions for a model that reads its images through cross-attention layers (mllama;
    ``analytic/cross_attention.py``; training: ``analytic/terms/cross_attention.py``); serving is refused
    (``spec/checks.py``)."""
    v = m.vision
    assert v is not None
    if s.task == "train":
        return _cross_train_notes(s, m)
    n = images_per_sample(s)
    tiles = v.patches_per_image // (v.image_size // v.patch_size) ** 2
    positions = v.cross_attention_tokens_per_image // tiles
    out = [(f"vision model: {m.vision_parameters:,} parameters (tower and projector), held unquantized in the "
           f"model's dtype; each image is one <|image|> token of the language model's sequence (MllamaProcessor) "
           f"and is padded to max_image_tiles = {tiles} tiles of {v.image_size} x {v.image_size} "
           f"(MllamaImageProcessor pack_images){'; image_size ignored' if image_size(s) else ''}: "
           f"{tiles} x {positions:,} = {v.cross_attention_tokens_per_image:,} vision positions (patches and the "
           f"class token) whose keys and values each of the {len(v.cross_attention_layers)} cross-attention layers "
            "caches")]
    if n:
        padded = -(-positions // 8) * 8
        out.append(f"vision model in the prefill: {n} image(s) per prompt; the local ({v.num_layers - v.global_layers}"
                   f" layers) and global ({v.global_layers}) encoders run over each image's {tiles} x {padded:,} "
                   "positions (padded to a multiple of 8) under the aspect-ratio mask, with every local and global "
                   "layer's output kept until the vision output is assembled (MllamaVisionModel.forward, "
                   "MllamaVisionEncoder.forward); then the cross-attention mask's preparation; the vision output, "
                   "the projected states and the mask stay through the prompt's forward; the cross-attention cache "
                   "is counted whole from the first layer on (written at each cross-attention layer, an upper bound "
                   "before the last) and the KV cache line counts the self-attention layers' text tokens only; a "
                   "cross-attention layer repeats its keys and values to every head (a mask is given), except a "
                   "decode step's single query under sdpa, packed onto the KV heads (transformers' pack_gqa) "
                   "(analytic/cross_attention.py)")
        out.append("not modelled: the patch embedding's and tile embeddings' transient tensors before the first "
                   "vision layer, and the aspect-ratio mask's construction (two [S, S] tensors for a moment)")
    else:
        out.append("no image: the cross-attention layers are skipped (MllamaTextModel.forward) and cache nothing")
    return out


def _cross_train_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """``cross_attention_notes`` for a training step (``analytic/terms/cross_attention.py``)."""
    v = m.vision
    assert v is not None
    n = s.train.images_per_sample
    tiles = v.patches_per_image // (v.image_size // v.patch_size) ** 2
    positions = v.cross_attention_tokens_per_image // tiles
    frozen = ("frozen (PEFT)" if s.train.peft is not None else "frozen (train.freeze_vision_tower)"
              if s.train.freeze_vision_tower else "trained")
    out = [(f"vision model: {m.vision_parameters:,} parameters (tower and projector), {frozen}, held "
           f"unquantized in the model's dtype; each image is one <|image|> token of train.seq_len (MllamaProcessor) and "
           f"is padded to max_image_tiles = {tiles} tiles of {v.image_size} x {v.image_size} (MllamaImageProcessor "
           f"pack_images){'; image_size ignored' if s.train.image_size else ''}: {tiles} x {positions:,} = "
           f"{v.cross_attention_tokens_per_image:,} vision positions per image for the "
           f"{len(v.cross_attention_layers)} cross-attention layers")]
    if not n:
        out.append("no image: the cross-attention layers are skipped (MllamaTextModel.forward) and save nothing")
        return out
    out.append(f"cross-attention layers in training: {n} image(s) per sample, {n * v.cross_attention_tokens_per_image:,}"
               " vision positions; each layer saves its text-token tensors (q_proj's input, q_norm, the "
               "memory-efficient SDPA kernel's query, output and logsumexp, the mask as the kernel keeps it, the "
               "trained tanh gates' inputs, Llama's norms and MLP) and, per vision position, the keys and values "
               "repeated to every head (repeat_kv: a mask is given), k_norm's tensors when the keys require grad and "
               "LoRA's copies of k_proj's and v_proj's input; the projected vision states and the mask are shared "
               "(analytic/terms/cross_attention.py)")
    if frozen == "trained":
        out.append("vision model trained: its stem, local and global encoder layers (over every tile's positions "
                   "padded to a multiple of 8, never checkpointed: plain nn.Modules), the aspect-ratio mask (a "
                   "compute-dtype copy per layer under autocast), layernorm_post and the projector's input are saved "
                   "from the forward to the end of the backward (analytic/terms/cross_attention.py "
                   "trained_tower_bytes); not modelled: the projected states' gradient accumulated over the "
                   "cross-attention layers' backward, the vision model's backward temporaries, and under autocast "
                   "the compute-dtype copies of its and the projector's fp32 linear weights")
    out.append("not modelled: the vision model's own forward peak (every encoder layer's output kept until "
               "its output is assembled, analytic/cross_attention.py vision_model_bytes) comes before the language "
               "model's forward and is not a moment of the step; the cross-attention mask's preparation; LoRA "
               "adapters are taken on the language model's linears only")
    return out
