"""The one validator every command and the Python API run after the schema: contradictions between
settings, what the GPU's generation can run, and the bounds of the command line's own numbers.

``contradictions`` and ``capability_problems`` are called from ``catalog.resolve.resolve`` (so
``estimate``, ``serve``, ``generate``, ``trace``, ``measure``, ``compare`` and the API all refuse the
same inputs); ``section_conflicts`` refuses options that set another task's section (every command
that takes scenario options, through ``cli.common``); ``capability_notes`` and ``ignored_sections`` add
to a report's assumptions what runs but differs from the request; ``number_problems`` bounds an option of a command that is not a scenario field (``--top``,
``--margin``, ``--requests``), so every command words a bad number the same way.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from vramplan.errors import Problem
from vramplan.facts.mx_training import MIN_CAPABILITY as MX_MIN_CAPABILITY
from vramplan.facts.quantization import bnb_formats
from vramplan.facts.trainer_frameworks import trainer_framework
from vramplan.facts.transformers import OWN_MODEL_FRAMEWORKS, first_release, release_tuple
from vramplan.facts.trl import SFT_USE_CACHE_OFF_SINCE
from vramplan.facts.vllm_releases import (
    AUTO_DTYPE_FALLBACK_FROM,
    MLLAMA_SERVED,
    MLLAMA_SOURCES,
    parse_release,
    release_text,
)
from vramplan.spec.defaults import (
    PRE_AMPERE,
    checkpointing,
    served_dtype,
    torchtitan_fsdp2,
    with_served_dtype,
    with_trainer_defaults,
)
from vramplan.spec.fields import changed_fields
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.model import AudioSpec, ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = [
    "FP8_COMPUTE_ARCHITECTURES", "PRE_AMPERE", "TASK_SECTIONS", "VLLM_FP8_WEIGHT_ARCHITECTURES",
    "analytic_unmodelled_problems", "axolotl_problems", "capability_notes", "capability_problems", "chunked_attention_as_full",
    "chunked_attention_notes", "contradictions", "cross_attention_problems", "encoder_decoder_problems",
    "every_token_expert_problems", "expert_loop_problems", "fp32_router_weight_problems", "held_module_notes",
    "held_module_problems", "hybrid_problems", "ignored_sections",
    "linear_mixer_analytic_problems", "litgpt_problems", "number_problems", "section_conflicts",
    "unmodelled_layer_problems", "unused_settings",
]

# FP8 matmuls need fp8 tensor cores: compute capability 8.9 (Ada) or 9.0+ (Hopper, Blackwell); Transformer
# Engine's ``_check_fp8_support`` (transformer_engine/pytorch/fp8.py) refuses below 8.9, and transformers'
# ``FineGrainedFP8HfQuantizer.validate_environment`` (quantizer_finegrained_fp8.py) likewise.  AMD: CDNA3
# (MI300, gfx942) is the first with fp8; CDNA4 (MI350/MI355X, gfx950) keeps it (and adds fp6/fp4).
FP8_COMPUTE_ARCHITECTURES = frozenset({"ada", "hopper", "blackwell", "cdna3", "cdna4"})
# vLLM's fp8 weights also run on Ampere, weight-only (W8A16) through the Marlin kernels (vLLM docs,
# "FP8 W8A8": "Ampere GPUs are supported for W8A16 (weight-only FP8) utilizing Marlin kernels").
VLLM_FP8_WEIGHT_ARCHITECTURES = FP8_COMPUTE_ARCHITECTURES | {"ampere"}
TASK_SECTIONS = ("train", "inference", "serve")
# NVIDIA generations before Ampere (compute capability < 8.0) have no bf16 tensor cores.


def _section_settings(s: Scenario, section: str) -> list[str]:
    """The keys of a task's own section that differ from their defaults (a scenario dumped with every
    section, as a report's ``scenario`` is, holds the other tasks' defaults and is not refused).  The defaults are
    the section's as the scenario resolves them (a null trainer default filled in, spec/defaults.py)."""
    part = getattr(s, section)
    default = getattr(with_served_dtype(with_trainer_defaults(s.model_copy(update={section: type(part)()})), None),
                      section)
    return sorted(changed_fields(getattr(with_trainer_defaults(s), section), defaults=default))


def contradictions(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Settings that cannot hold together in any input: expert parallelism on a model with no experts, a
    transformers release older than the model's family.
    (A task's section given for another task is refused where options are typed, ``section_conflicts``, and
    stated as an assumption for a document, ``ignored_sections``.)"""
    out: list[Problem] = []
    first = first_release(m.model_type)
    if s.software.transformers is not None and first is not None \
            and release_tuple(s.software.transformers) < release_tuple(first):
        major_minor = ".".join(first.split(".")[:2])
        out.append(Problem(
            "software.transformers",
            f"transformers {s.software.transformers} has no built-in {m.model_type!r} model for {m.name}: the type "
            f"first shipped in transformers {first} (facts/data/transformers_model_types.json, read off the release "
            "wheels), and vramplan models transformers' own code, never a repository's remote code",
            f"set software.transformers to {major_minor} or later, or drop it for the current release's behaviour"))
    if s.parallel.ep > 1 and m.moe is None:
        out.append(Problem("parallel.ep", f"ep={s.parallel.ep}, but {m.name} is a dense model (no experts to split)",
                           "drop ep (expert parallelism needs a mixture-of-experts model)"))
    return out + hybrid_problems(s, m) + cross_attention_problems(s, m) + encoder_decoder_problems(s, m) \
        + expert_loop_problems(s, m) + fp32_router_weight_problems(s, m) + litgpt_problems(s) + axolotl_problems(s) \
        + unmodelled_layer_problems(s, m) + held_module_problems(s, m)


def _held(m: ModelSpec) -> tuple[str, int]:
    """The held modules in words and their parameters."""
    held = m.traits.held_modules
    count = sum(p.total for p in m.params if p.name.startswith(tuple(prefix for prefix, _ in held)))
    names = [what for _, what in held]
    return (", ".join(names[:-1]) + " and " if len(names) > 1 else "") + names[-1], count


def held_module_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Full fine-tuning and serving of a model that holds modules beside its language model and vision tower which no
    estimated task runs (``Traits.held_modules``: Qwen3-Omni's audio encoder, and with ``enable_audio_output`` its
    talker and Code2Wav, transformers 5.24 modeling_qwen3_omni_moe.py).  Generate and PEFT training of the language
    model are estimated (``held_module_notes``)."""
    if not m.traits.held_modules or s.task == "inference" or (s.task == "train" and s.train.peft is not None):
        return []
    what, count = _held(m)
    if s.task == "train":
        return [Problem("train.peft", f"full fine-tuning of {m.name} is not modelled: it holds {what} ({count:,} "
                        "parameters) beside its language model and vision tower, which a text-and-image step never "
                        "runs: they would be counted with gradients and optimizer states that AdamW never creates "
                        "for them (no gradient reaches them), and whether a script freezes them is not known",
                        "set train.peft (LoRA, DoRA or QLoRA on the Thinker's language model), or estimate task: "
                        "inference")]
    return [Problem("task", f"serving {m.name} is not modelled: its serving engines run the Thinker, the talker and "
                    f"Code2Wav as separate stages, and the model holds {what} ({count:,} parameters) beside its "
                    "language model; vramplan's vLLM, SGLang and llama.cpp layouts were not read for it",
                    "estimate task: inference (Hugging Face generate of the Thinker)")]


def held_module_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """What a generate or PEFT training estimate of a model with held modules counts and leaves out
    (``held_module_problems``)."""
    if not m.traits.held_modules or s.task not in ("inference", "train"):
        return []
    what, count = _held(m)
    if s.task == "train":
        out = [(f"held, not run: {what} ({count:,} parameters; no audio input is modelled): frozen under PEFT, the "
                "analytic engine counts their weights, not their activations; the step is the Thinker's text (and "
                "image) forward and backward"),
               ("not modelled: adapters PEFT would place on the held modules' linears whose names match "
                "target_modules (the audio encoder's q_proj, k_proj, v_proj, the talker's and Code2Wav's attention "
                "and MLP projections): their fp32 adapter weights are not counted; they get no gradient and no optimizer "
                "state, as those modules do not run")]
        if s.train.quantization != "none":
            out.append(f"not modelled: train.quantization {s.train.quantization} of the held modules' nn.Linear "
                       "weights: they are counted in the model's dtype (an overestimate)")
        return out
    out = [(f"held, not run: {what} ({count:,} parameters; no audio input is modelled): the analytic engine counts "
           "their weights, not their activations; generate is the Thinker's text generate (as model.thinker.generate "
           "or generate(return_audio=False)), its prompt's logits computed at every position "
           "(Qwen3OmniMoeThinkerForConditionalGeneration.forward takes no logits_to_keep)")]
    if s.inference.quantization != "none":
        # transformers' quantizers replace every nn.Linear outside modules_to_not_convert, the held modules' too
        out.append(f"not modelled: inference.quantization {s.inference.quantization} of the held modules' nn.Linear "
                   "weights: they are counted in the model's dtype (an overestimate)")
    if any(prefix == "talker." for prefix, _ in m.traits.held_modules):
        out.append("not modelled: speech output. With the talker built (enable_audio_output), "
                   "Qwen3OmniMoeForConditionalGeneration.generate defaults to return_audio=True (transformers 5.24 "
                   "modeling_qwen3_omni_moe.py:4088-4089, 4099-4121): the Thinker then also keeps every step's hidden "
                   "states (output_hidden_states, :4154) and the talker's and Code2Wav's generate follow; pass "
                   "return_audio=False for the estimate to hold")
    return out


def fp32_router_weight_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Half-precision training of a model whose router weight transformers builds in fp32 (``Traits.fp32_router_weight``:
    HunYuan-MoE, transformers 5.24 ``HunYuanMoEV1Gate``: ``nn.Linear(..., dtype=torch.float32)``, then
    ``hidden_states.float()`` before it), refused: its fp32 weight, gradient and optimizer state among half ones,
    and the fp32 input copy the linear saves, are not modelled.  Under autocast (bf16-mixed, fp16-mixed) every weight
    is fp32 and the linear saves its half-precision cast of the input, as any router's: estimated."""
    if s.task != "train" or not m.traits.fp32_router_weight or s.train.precision not in ("bf16-true", "fp16-true"):
        return []
    return [Problem("train.precision", f"{m.name}'s router weight is built in fp32 (HunYuanMoEV1Gate) and runs on an "
                    f"fp32 copy of its input; {s.train.precision} training, with that fp32 weight among half ones, is "
                    "not estimated", "use bf16-mixed (fp32 weights under autocast), which is estimated")]


def expert_loop_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Training a model whose experts are slices of 2-D parameters run in an eager loop (``Traits.sliced_expert_loop``:
    DBRX, transformers 5.24 ``modeling_dbrx.py`` ``DbrxExperts.forward``), refused rather than answered with the
    grouped experts' saved tensors.  Under autocast with fp32 hidden states the loop's ``index_add_`` refuses the
    half-precision expert output (torch: "index_add_(): self (Float) and source (BFloat16) must have the same
    scalar type"), so mixed-precision training does not run; half-precision training runs, but what the loop
    over ``view``-slices, the clamped fused q/k/v (``ClampBackward1`` keeps its input) and the router's p-norm
    save is not modelled.  Its parameters, generate and serving are estimated."""
    if s.task != "train" or not m.traits.sliced_expert_loop:
        return []
    return [Problem("task", f"{m.name}'s experts are slices of 2-D parameters run in an eager loop "
                    "(DbrxExperts); training it is not estimated: under mixed precision transformers' loop fails "
                    "(index_add_ of half-precision expert outputs into fp32 hidden states), and the loop's saved "
                    "tensors in half precision are not modelled",
                    "estimate task: inference (Hugging Face generate) or task: serve; the parameter count is "
                    "vramplan.spec.hf_config.model_from_config(config).num_parameters")]


_PARAMETERS_ONLY = "the parameter count is vramplan.spec.hf_config.model_from_config(config).num_parameters"


def every_token_expert_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """The analytic engine's refusal of training and generate for a model whose experts run every token
    (``Traits.experts_run_every_token``: Llama 4's ``Llama4TextMoe``): its MoE terms count top-k x tokens.  The traced
    engine runs transformers' own forward (the repeat over the experts included) and is not refused."""
    if not m.traits.experts_run_every_token or s.task not in ("train", "inference"):
        return []
    return [Problem("task", f"{m.name}'s MoE layers run every routed expert on every token (Llama4TextMoe.forward "
                    "repeats the hidden states num_experts times, each scaled by its router score, 0 for an expert not "
                    "picked): the saved and transient tensors, num_experts x tokens wide, are not in the analytic "
                    f"engine's terms, so task {s.task} is not estimated by it",
                    "use --engine trace (it runs transformers' own forward), or task: serve (vLLM runs the routed "
                    "experts on their top-k tokens, FusedMoE); " + _PARAMETERS_ONLY)]


def analytic_unmodelled_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """The analytic engine's refusal of training and generate for a model whose layers run a mechanism its terms
    leave out (``Traits.analytic_unmodelled``: Gemma 3n's AltUp streams, per-layer inputs and KV-shared layers), or of
    training alone where its generate is modelled (``Traits.analytic_generate``).  The traced engine runs
    transformers' own forward and is not refused."""
    refused = ("train",) if m.traits.analytic_generate else ("train", "inference")
    if m.traits.analytic_unmodelled and s.task == "inference" and s.parallel.tp > 1:
        # Gemma3nTextConfig.base_model_tp_plan (transformers 5.24 configuration_gemma3n.py:77-88) names the decoder
        # layers' attention and MLP only: how the per-layer embeddings, AltUp's projections and the tied head sit on
        # the ranks was not read (and the traced engine's tensor-parallel run of it stops at the tied lm_head)
        return [Problem("parallel.tp", f"is {s.parallel.tp}: {m.name}'s generate under tensor parallelism is not "
                        "modelled (its tp plan covers the decoder layers' attention and MLP; the per-layer embeddings, "
                        "AltUp's projections and the tied head outside it were not read)",
                        "set parallel.tp: 1 (generate on one GPU is estimated)")]
    if not m.traits.analytic_unmodelled or s.task not in refused:
        return []
    also = "; task inference (generate) is estimated by the analytic engine" if m.traits.analytic_generate else ""
    return [Problem("task", f"{m.name}: {m.traits.analytic_unmodelled}, so task {s.task} is not estimated by the "
                    "analytic engine", "use --engine trace, which runs transformers' own forward" + also + "; "
                    + _PARAMETERS_ONLY)]


# vLLM disables its hybrid KV cache manager for a model with chunked local attention unless
# VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE is set (vllm/config: VllmConfig.__post_init__, read in 0.11.0,
# 0.12.0, 0.15.1, 0.18.0, 0.21.0 and 0.33.0; 0.10.0 disables it only beside EAGLE), and
# ``unify_hybrid_kv_cache_specs`` (vllm/v1/core/kv_cache_utils.py) turns every ChunkedLocalAttentionSpec into a
# FullAttentionSpec: each layer holds full pages
CHUNKED_AS_FULL_FROM = (0, 11, 0)


def chunked_attention_as_full(s: Scenario) -> bool:
    """vLLM serving from 0.11.0: chunked local attention layers hold full pages (``CHUNKED_AS_FULL_FROM``)."""
    if not (s.task == "serve" and s.serve.engine == "vllm"):
        return False
    try:
        return parse_release(s.serve.vllm_version) >= CHUNKED_AS_FULL_FROM
    except ValueError:
        return False


def chunked_attention_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """The assumption a served model with chunked local attention carries where it is estimated."""
    if not (m.traits.attention_chunk_size and chunked_attention_as_full(s)):
        return []
    return [(f"chunked local attention ({m.traits.attention_chunk_size}-token chunks on the RoPE layers): vLLM "
            f"{s.serve.vllm_version} disables its hybrid KV cache manager for it unless "
            "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (not assumed), so every layer holds full pages of "
            "max_model_len (unify_hybrid_kv_cache_specs: ChunkedLocalAttentionSpec -> FullAttentionSpec)")]


def unmodelled_layer_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Tasks whose memory depends on a mechanism vramplan does not model, refused by every engine (Llama 4,
    transformers 5.24 ``modeling_llama4.py``; its experts that run every token are refused by the analytic engine
    alone, ``every_token_expert_problems``): chunked local attention's cache (``Traits.attention_chunk_size``: serving) and an image path of tiles and pixel
    shuffle (``Traits.image_path_unmodelled``: every task); a layer mechanism named in ``Traits.unmodelled_mixer``
    (every task; no family sets it at present).  Their parameters are counted."""
    t = m.traits
    if t.unmodelled_mixer:
        return [Problem("model", f"{m.name}: {t.unmodelled_mixer}; its parameters are counted "
                        f"({m.num_parameters:,}), but no task is estimated for it", _PARAMETERS_ONLY)]
    if t.image_path_unmodelled:
        return [Problem("model", f"{m.name}'s image path (the processor's tiles, the vision tower's pixel shuffle and "
                        "vision adapter, Llama4VisionModel) is not modelled; its vision tower and projector parameters "
                        f"are counted ({m.vision_parameters:,}), but no task is estimated for it",
                        f"{_PARAMETERS_ONLY}; its text_config alone (model_type llama4_text) is estimated where the "
                        "language model's mechanisms are modelled")]
    if t.analytic_unmodelled and s.task == "serve":
        return [Problem("task", f"{m.name}: {t.analytic_unmodelled}; no serving engine's layout of it was read (vLLM's, "
                        "SGLang's or llama.cpp's), so serving is not estimated",
                        "use task: inference with --engine trace (Hugging Face generate through transformers' own "
                        "forward); " + _PARAMETERS_ONLY)]
    if t.attention_chunk_size and s.task == "serve" and not chunked_attention_as_full(s):
        # vLLM 0.10.x keeps the hybrid KV cache manager on for it (ChunkedLocalAttentionSpec: min(chunk +
        # max_num_batched_tokens, max_model_len) tokens per request, vllm/v1/kv_cache_interface.py), not modelled;
        # SGLang's and llama.cpp's layouts of it were not read
        where = (f"vLLM {s.serve.vllm_version}, which keeps its hybrid KV cache manager on for it "
                 "(ChunkedLocalAttentionSpec, not modelled)" if s.serve.engine == "vllm"
                 else f"engine {s.serve.engine}, whose cache layout for it was not read")
        return [Problem("task", f"{m.name}'s RoPE layers attend within chunks of {t.attention_chunk_size} tokens "
                        f"(attention_chunk_size), served here by {where}",
                        "use serve.engine vllm with serve.vllm_version >= 0.11 (full pages on every layer), or set "
                        "attention_chunk_size to null in the config (every layer then holds full pages, an upper "
                        "bound); " + _PARAMETERS_ONLY)]
    return []


_NO_TASK = ("no serving is estimated for a cross-attention vision model yet; its parameters are "
            "vramplan.spec.hf_config.model_from_config(config).num_parameters and .vision_parameters, and "
            "task: inference (Hugging Face generate) is estimated")


def cross_attention_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for a model that reads its images through cross-attention layers
    (``VisionSpec.cross_attention_tokens_per_image``: Llama 3.2 Vision, transformers 5.24 ``modeling_mllama.py``), refused
    rather than answered as a Llama whose images are tokens of the sequence.  Estimated: the parameters
    (``spec/families/mllama.py``) and Hugging Face ``generate`` (``analytic/cross_attention.py``) under SDPA or eager
    attention, on one GPU, with the cache in the model's dtype.  Refused:

    * Training is estimated (``analytic/terms/cross_attention.py``) under LoRA (vision model frozen) or full
      fine-tuning (vision model and projector trained, or frozen with ``train.freeze_vision_tower``), SDPA, no or full
      checkpointing, on one pipeline stage without tensor or context parallelism, under Hugging Face's loops
      (``_cross_train_problems``).  Refused: QLoRA and DoRA, and the rest listed there.
    * Serving: vLLM serves the model from 0.6.2 to 0.10.2 only (``facts/vllm_releases.py`` ``MLLAMA_SERVED``), on
      its V0 encoder-decoder path, whose cross-attention KV blocks and encoder profile run are not modelled; other
      releases are refused as not serving it (``_cross_vllm_problem``); SGLang and llama.cpp are not modelled.
    * Inference with flash attention (``MllamaPreTrainedModel._supports_flash_attn = False``: it builds 4-D masks),
      tensor parallelism, a KV dtype other than the model's, quantized weights (transformers quantizes the vision
      model's linears, held unquantized here), Lit-GPT's generate, or a transformers release before 5.0 (the cache
      and mask code modelled is 5.24's).
    """
    v = m.vision
    # the marker is the keys/values per image, set for every such model, even one whose cross_attention_layers is
    # empty (its vision model still runs on the images, whose features then reach nothing)
    if v is None or not v.cross_attention_tokens_per_image:
        return []
    what = (f"{m.name} reads its images through {len(v.cross_attention_layers)} cross-attention layers "
            f"({v.cross_attention_tokens_per_image:,} vision keys and values per image); its parameters are "
            f"counted ({m.num_parameters:,}), but ")
    if s.task == "train":
        return _cross_train_problems(s, what)
    if s.task == "serve" and s.serve.engine == "vllm":
        return [_cross_vllm_problem(s.serve.vllm_version, what)]
    if s.task != "inference":
        return [Problem("task", what + f"{s.task} memory is not estimated for it: vLLM's cache for the "
                        "cross-attention layers (the image's keys and values, beside the self-attention layers' "
                        "blocks) and its encoder cache are not modelled", _NO_TASK)]
    return _cross_inference_problems(s, what)


def _cross_vllm_problem(version: str, what: str) -> Problem:
    """Serving a cross-attention model with vLLM, by release (``facts/vllm_releases.py`` ``MLLAMA_SERVED``): a
    release without the model is refused as such; a release with it, on its V0 encoder-decoder path (the
    cross-attention layers' KV blocks per request over the encoder's tiles x positions, the profile run's encoder
    input of the most images and tiles), is refused as not modelled."""
    first, last = MLLAMA_SERVED
    span = f"{release_text(first)} to {release_text(last)}"
    cited = "; ".join(MLLAMA_SOURCES)
    try:
        rel = parse_release(version)
    except ValueError:
        rel = None  # an unknown release string is refused where the release is read (serve/vllm.py)
    if rel is not None and rel < first:
        return Problem("serve.vllm_version", what + f"vLLM {version} has no mllama model: "
                       f"MllamaForConditionalGeneration came in {release_text(first)} ({cited})",
                       "no vLLM estimate is modelled for it; task: inference (Hugging Face generate) is estimated")
    if rel is not None and rel > last:
        return Problem("serve.vllm_version", what + f"vLLM {version} does not serve it: the model was removed with "
                       f"the V0 engine's encoder-decoder support after {release_text(last)} ({cited})",
                       f"vLLM serves it from {span} only, on V0 (not modelled); task: inference (Hugging Face "
                       "generate) is estimated")
    return Problem("serve.vllm_version", what + f"vLLM {version} serves it on the V0 engine's encoder-decoder path "
                   f"({span}), whose cross-attention KV blocks (per request, the encoder's max_image_tiles x "
                   "(patches + class token) positions per image) and the profile run's encoder input are not "
                   f"modelled ({cited})", _NO_TASK)


_CROSS_TRAIN_FRAMEWORKS = ("hf-trainer", "accelerate", "plain", "deepspeed")


def _cross_train_problems(s: Scenario, what: str) -> list[Problem]:
    """The training settings ``analytic/terms/cross_attention.py`` does not model (``cross_attention_problems``)."""
    t, par = s.train, s.parallel
    out: list[Problem] = []
    if t.peft is not None and t.peft.method != "lora":
        out.append(Problem("train.peft.method", what + f"{t.peft.method} is not modelled for it (QLoRA: transformers "
                           "quantizes the vision model's linears too, held unquantized here; DoRA: its magnitude "
                           "products on k_proj and v_proj run over the vision positions)", "set peft.method: lora"))
    if t.quantization != "none":
        out.append(Problem("train.quantization", what + f"{t.quantization} is not modelled for it: transformers "
                           "quantizes the vision model's linears too, which vramplan holds unquantized",
                           "set train.quantization: none"))
    if t.attention != "sdpa":
        out.append(Problem("train.attention", what + f"attention {t.attention!r} is not modelled for its training "
                           "(flash: MllamaPreTrainedModel sets _supports_flash_attn = False; eager: the "
                           "cross-attention scores over the vision positions are not terms)",
                           "set train.attention: sdpa"))
    if t.gradient_checkpointing not in ("none", "full"):
        out.append(Problem("train.gradient_checkpointing", what + f"{t.gradient_checkpointing} checkpointing is not "
                           "modelled for its cross-attention layers", "set gradient_checkpointing: none or full"))
    if par.tp > 1 or par.pp > 1 or par.cp > 1:
        out.append(Problem("parallel", what + "its training is modelled without tensor, pipeline or context "
                           "parallelism (the cross-attention layers' vision positions are not split)",
                           "set parallel.tp, pp and cp to 1 (data parallelism and ZeRO/FSDP sharding are modelled)"))
    if s.effective_framework not in _CROSS_TRAIN_FRAMEWORKS:
        out.append(Problem("framework", what + f"{s.effective_framework} has no Llama 3.2 Vision model modelled here "
                           "(transformers' MllamaForConditionalGeneration is)",
                           f"set framework to one of {', '.join(_CROSS_TRAIN_FRAMEWORKS)}"))
    for key, given, why in (("train.liger_kernels", t.liger_kernels, "Liger's mllama patch"),
                            ("train.packing", t.packing, "packed sequences with images"),
                            ("train.activation_offload", t.activation_offload != "none", "activation offloading"),
                            ("train.precision", t.precision == "fp8-mixed", "fp8 training (the vision linears)")):
        if given:
            out.append(Problem(key, what + f"{why} is not modelled for it", f"drop {key}"))
    return out


def _cross_inference_problems(s: Scenario, what: str) -> list[Problem]:
    """The generate settings ``analytic/cross_attention.py`` does not model (``cross_attention_problems``)."""
    inf = s.inference
    out: list[Problem] = []
    if inf.attention not in ("sdpa", "eager"):
        out.append(Problem("inference.attention", what + f"attention {inf.attention!r} is not available to it: "
                           "transformers 5.24 MllamaPreTrainedModel sets _supports_flash_attn = False (4-D masks)",
                           "set inference.attention: sdpa or eager"))
    if s.parallel.tp > 1:
        out.append(Problem("parallel.tp", what + "its generate is modelled on one GPU only",
                           "set parallel.tp: 1"))
    if inf.kv_cache_dtype not in ("auto", inf.dtype):
        out.append(Problem("inference.kv_cache_dtype", what + f"a {inf.kv_cache_dtype} cache is not modelled for "
                           "it (the cross-attention layers' cache is written in the model's dtype)",
                           "set inference.kv_cache_dtype: auto"))
    if inf.quantization != "none":
        out.append(Problem("inference.quantization", what + f"{inf.quantization} is not modelled for it: transformers "
                           "5.24 quantizes the vision model's linears too (quantizers/base.py get_keys_to_not_convert "
                           "keeps only the tied and output embeddings and the last module), which vramplan's "
                           "parameter roles hold unquantized", "set inference.quantization: none"))
    if s.effective_framework == "lightning":
        out.append(Problem("framework", what + "Lit-GPT has no cross-attention model", "drop framework: lightning"))
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        out.append(Problem("software.transformers", what + f"its generate is modelled on transformers 5.24's "
                           f"modeling_mllama.py, not {s.software.transformers}",
                           "drop software.transformers, or set it to 5.0 or later"))
    return out


_ENC_DEC_COUNTED = ("its parameters are vramplan.spec.hf_config.model_from_config(config).num_parameters "
                    "(.encoder_parameters for the encoder stack)")


# the earliest transformers release whose T5 training step (eager T5Attention) was read (analytic/terms/encoder_decoder.py)
T5_4X_READ_SINCE = (4, 30)


def encoder_decoder_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for an encoder-decoder model (``ModelSpec.encoder_decoder``: T5, mT5, UMT5,
    BART), refused rather than answered as a decoder-only model of the decoder stack.

    * Training (``analytic/terms/encoder_decoder.py``) is estimated for transformers 5.24's SFT step under SDPA,
      full or LoRA fine-tuning of unquantized weights, no or full checkpointing, DDP or DeepSpeed ZeRO-2, and for
      T5, mT5 and UMT5 also for transformers 4.x's step under its eager T5Attention without checkpointing; other
      settings are refused (``_encoder_decoder_train_problems``).
    * Inference (``analytic/encoder_decoder.py``) is estimated under SDPA on one GPU, unquantized, with the cache in
      the model's dtype, for transformers' own generate from 5.0; other settings are refused, and so is a T5 whose
      decoder has more layers than its encoder (5.24's generate builds the cache for the encoder's count).
    * Serving: vLLM served BART (``vllm/model_executor/models/bart.py``) only through the V0 engine's
      encoder-decoder model runner, removed with BART after 0.10.2 (vllm-project/vllm PR #24907, "After this PR,
      Whisper will be the only encoder-decoder model that are supported"); the V1 engine gained Whisper alone (PR
      #22018); T5 was never served (its relative position bias is a custom attention bias vLLM's attention backends
      do not take, RFC #7366).  vLLM's cross-attention block tables and encoder cache are not modelled.
    """
    if m.encoder_decoder is None:
        return []
    ed = m.encoder_decoder
    what = (f"{m.name} is an encoder-decoder model ({ed.encoder_layers} encoder layers, {m.num_layers} decoder "
            f"layers with cross-attention); {_ENC_DEC_COUNTED}, but ")
    if s.task == "serve":
        return [Problem("task", what + "serving memory is not estimated for it: vLLM served BART and Whisper only "
                        "in some releases (BART through the V0 engine's encoder-decoder runner, removed after 0.10.2 "
                        "by vllm-project/vllm PR #24907, which left Whisper the only encoder-decoder model; its "
                        "cross-attention block tables and encoder cache are not modelled) and T5 in none (its "
                        "relative position bias is an attention bias vLLM's kernels do not take)",
                        "use task inference (transformers generate), which is estimated")]
    if s.task == "train":
        return _encoder_decoder_train_problems(s, m, what)
    return _encoder_decoder_inference_problems(s, m, what)


def _encoder_decoder_train_problems(s: Scenario, m: ModelSpec, what: str) -> list[Problem]:
    """The training settings ``analytic/terms/encoder_decoder.py`` does not model (``encoder_decoder_problems``): the
    step is the Trainer's (hf-trainer, accelerate or plain PyTorch) SFT step of transformers 5.24's
    ``...ForConditionalGeneration`` under SDPA, with or without full checkpointing, full or LoRA fine-tuning of
    unquantized weights, DDP data parallelism or DeepSpeed ZeRO-2; for a T5 stack (relative position bias) also
    transformers 4.x's step, whose T5Attention is eager (no SDPA path up to 4.57.1; the default sdpa falls back to
    it), without checkpointing, with the separate lm_head 4.x keeps for a config saying tie_word_embeddings: false
    (spec/families/t5.py ``untied_head``)."""
    t, par = s.train, s.parallel
    ed = m.encoder_decoder
    assert ed is not None
    out: list[Problem] = []

    def refuse(key: str, why: str, fix: str) -> None:
        out.append(Problem(key, what + why, fix))

    version = s.software.transformers_version
    old = version is not None and version < (5, 0)
    t5_eager = ed.relative_bias_layers != "none" and old
    if t5_eager and t.attention not in ("sdpa", "eager"):
        # transformers 4.x: T5Attention.forward computes its scores itself (modeling_t5.py, 4.30.2 to 4.57.1), and
        # T5PreTrainedModel sets no _supports_sdpa: the default (sdpa) falls back to eager
        refuse("train.attention", f"transformers {s.software.transformers}'s T5Attention has eager attention only, "
               f"not {t.attention!r}", "set train.attention: eager")
    elif t.attention != "sdpa" and not t5_eager:
        refuse("train.attention", f"its training step is modelled under SDPA only, not {t.attention!r} (eager's "
               "scores are modelled for transformers 4.x's T5Attention only: transformers 5's eager_attention_forward "
               "keeps a softmax in the compute dtype, not checked; T5 has no flash attention: "
               "T5PreTrainedModel._supports_flash_attn = False)",
               "set train.attention: sdpa, or software.transformers to a 4.x release for a T5 model")
    if max(par.tp, par.pp, par.cp, par.ep) > 1:
        refuse("parallel", "its training step is modelled with data parallelism only (no tensor, pipeline, context "
               "or expert parallel plan for its encoder and decoder stacks)", "set parallel.tp, pp, cp and ep to 1")
    if par.fsdp != "none" or par.zero_stage == 3:
        # the sharding terms group parameters by decoder layer index (analytic/terms/sharding.py), which would put
        # encoder layer j in decoder layer j's unit; FSDP2's fully_shard per block also fails on T5's shared
        # embedding, tied across the stacks (transformers 5.24: "shared with a parameter already managed by
        # another FSDP group")
        refuse("parallel.fsdp" if par.fsdp != "none" else "parallel.zero_stage", "FSDP and DeepSpeed ZeRO-3 are not "
               "modelled for it (its encoder's layers are not units of their own)", "use DeepSpeed ZeRO-2 "
               "(parallel.zero_stage: 2) or DDP (parallel.fsdp: none, zero_stage: 0)")
    elif par.zero_stage == 1:
        # ZeRO-2 partitions the gradients as they are reduced, whatever the layer (within 0.7% of the trace for
        # whisper-tiny, whisper-base, t5-small and bart-base, tests/test_encdec_train.py); ZeRO-1 keeps every full
        # gradient to the step's end, and bart-base's trace then peaks at the head's backward with the tied
        # embedding's gradient beside the logits' gradients, 4% above the analytic step
        refuse("parallel.zero_stage", "DeepSpeed ZeRO-1 is not modelled for it (its full gradients' order across "
               "the two stacks and the tied embedding is not checked)", "use DeepSpeed ZeRO-2 (parallel.zero_stage: "
               "2) or DDP (zero_stage: 0)")
    elif s.effective_framework not in ("hf-trainer", "accelerate", "plain") and not (
            s.effective_framework == "deepspeed" and par.zero_stage == 2):
        refuse("framework", f"{s.effective_framework} is not modelled for it (transformers' own model under the "
               "Trainer, accelerate, DeepSpeed ZeRO-2 or plain PyTorch is)", "use framework: hf-trainer")
    if t.objective != "sft":
        refuse("train.objective", f"objective {t.objective} is not modelled for it (the seq2seq loss over the "
               "target is)", "set train.objective: sft")
    if t.loss != "standard" or t.liger_kernels:
        refuse("train.loss", "its loss is modelled as the model computes it (CrossEntropyLoss on lm_logits), not "
               "with a fused or chunked loss kernel or Liger's kernels", "set train.loss: standard and "
               "liger_kernels: false")
    if t.quantization != "none":
        refuse("train.quantization", f"{t.quantization} base weights are not modelled for it",
               "set train.quantization: none")
    if t5_eager and checkpointing(s) != "none":
        # transformers 4.x's T5Stack hands every checkpointed block the [b, heads, n, n] sum of the bias and the mask
        # (position_bias, encoder_decoder_position_bias) as arguments (modeling_t5.py 4.46.3 l.1106-1121), and
        # each encoder block recomputes its eager scores in the encoder's backward, which the analytic step holds
        # no moment of: the traced 4.46.3 step of t5-small (b 8, 64 x 1,024 tokens) is 47% above the full-
        # checkpointing estimate, umt5-small's (b 4, 128 x 512) 6% below it
        refuse("train.gradient_checkpointing", f"{checkpointing(s)} checkpointing is not modelled for it under "
               f"transformers {s.software.transformers}'s eager T5Attention (none is)",
               "set train.gradient_checkpointing: none, or drop software.transformers (5.24, SDPA)")
    elif checkpointing(s) not in ("none", "full"):
        refuse("train.gradient_checkpointing", f"{checkpointing(s)} checkpointing is not modelled for its encoder "
               "(none and full are)", "set train.gradient_checkpointing: full or none")
    if t.activation_offload != "none" or t.torchao_cpu_offload != "none" or t.optimizer_in_backward:
        refuse("train", "activation offloading, torchao's CPU offload and the optimizer in the backward are not "
               "modelled for it", "drop them")
    if old and not t5_eager:
        refuse("software.transformers", f"its training step is modelled on transformers 5.24 (and, for T5, mT5 and "
               f"UMT5, on 4.x's eager T5Attention), not {s.software.transformers}",
               "drop software.transformers, or set it to 5.0 or later")
    elif t5_eager and version is not None and version < T5_4X_READ_SINCE:
        # modeling_t5.py was read at 4.30.2, 4.36.2, 4.41.2, 4.46.3, 4.51.3 and 4.57.1; earlier releases were not
        refuse("software.transformers", f"its 4.x training step is modelled on the T5Attention of transformers 4.30 to "
               f"4.57 (the releases read), not {s.software.transformers}",
               "set software.transformers to 4.30 or later")
    audio = ed.audio
    if audio is not None and t.source_len not in (None, audio.encoder_frames):
        refuse("train.source_len", _audio_length(audio, t.source_len), f"drop train.source_len (the model's "
               f"{audio.encoder_frames:,}), and cut or pad the audio to 30 s as the feature extractor does")
    if m.position == "learned":
        # BartLearnedPositionalEmbedding: max_position_embeddings + 2 rows, ids offset by 2; Whisper's decoder:
        # max_target_positions rows (its encoder's length is the model's own, checked above)
        source = (("train.source_len", t.source_len or t.seq_len, "encoder"),) if audio is None else ()
        for key, n, stack in (*source, ("train.seq_len", t.seq_len, "decoder")):
            if n > m.max_position_embeddings:
                refuse(key, f"its {stack} has learned positions for {m.max_position_embeddings:,} tokens, not {n:,}",
                       f"set {key} to {m.max_position_embeddings:,} or less")
    return out


def _audio_length(audio: AudioSpec, n: int | None) -> str:
    """Why a speech encoder takes no other source length than its own (``encoder_decoder_problems``)."""
    return (f"its encoder runs over {audio.encoder_frames:,} positions, not {n:,}: WhisperEncoder.forward raises a "
            f"ValueError for input_features of other than {audio.input_frames:,} frames (30 s of audio: "
            "WhisperFeatureExtractor pads or cuts every clip to 480,000 samples at 16 kHz), transformers 5.24 "
            "models/whisper/modeling_whisper.py")


def _encoder_decoder_inference_problems(s: Scenario, m: ModelSpec, what: str) -> list[Problem]:
    """The generate settings ``analytic/encoder_decoder.py`` does not model (``encoder_decoder_problems``)."""
    inf, ed = s.inference, m.encoder_decoder
    assert ed is not None
    out: list[Problem] = []
    if inf.attention != "sdpa":
        out.append(Problem("inference.attention", what + f"its generate is modelled under SDPA only, not "
                           f"{inf.attention!r} (eager's scores and BART's flash path are not terms yet; T5 has no "
                           "flash attention: T5PreTrainedModel._supports_flash_attn = False)",
                           "set inference.attention: sdpa"))
    if s.parallel.tp > 1:
        out.append(Problem("parallel.tp", what + "its generate is modelled on one GPU only", "set parallel.tp: 1"))
    if inf.kv_cache_dtype not in ("auto", inf.dtype):
        out.append(Problem("inference.kv_cache_dtype", what + f"a {inf.kv_cache_dtype} cache is not modelled for it",
                           "set inference.kv_cache_dtype: auto"))
    if inf.quantization != "none":
        out.append(Problem("inference.quantization", what + f"{inf.quantization} is not modelled for it",
                           "set inference.quantization: none"))
    if s.effective_framework in ("lightning", "autoawq"):
        out.append(Problem("framework", what + f"{s.effective_framework} ships no encoder-decoder model (transformers' "
                           "generate is modelled)", "drop framework"))
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        out.append(Problem("software.transformers", what + f"its generate is modelled on transformers 5.24, not "
                           f"{s.software.transformers}", "drop software.transformers, or set it to 5.0 or later"))
    audio = ed.audio
    if audio is not None and "prompt_len" in inf.model_fields_set and inf.prompt_len != audio.encoder_frames:
        out.append(Problem("inference.prompt_len", what + _audio_length(audio, inf.prompt_len),
                           f"drop inference.prompt_len (the model's {audio.encoder_frames:,})"))
    if audio is not None and inf.new_tokens + 1 > m.max_position_embeddings:
        # WhisperGenerationMixin._set_max_new_tokens_and_length: max_new_tokens + the decoder_input_ids' length (at
        # least decoder_start_token_id) above max_target_positions raises a ValueError (generation_whisper.py, 5.24)
        out.append(Problem("inference.new_tokens", what + f"Whisper's generate raises a ValueError for {inf.new_tokens:,} "
                           f"new tokens after decoder_start_token_id: the decoder has {m.max_position_embeddings} "
                           "positions (max_target_positions)",
                           f"set inference.new_tokens to {m.max_position_embeddings - 1} or less"))
    if m.position == "learned":
        # BartLearnedPositionalEmbedding: max_position_embeddings + 2 rows, ids offset by 2; a longer source or target
        # indexes past the table; Whisper's decoder: max_target_positions rows (decoder_start_token_id and the
        # new tokens but the last), its encoder's length the model's own
        source = (("inference.prompt_len", inf.prompt_len, "encoder"),) if audio is None else ()
        for key, n, stack in (*source, ("inference.new_tokens", inf.new_tokens, "decoder")):
            if n > m.max_position_embeddings:
                out.append(Problem(key, what + f"its {stack} has learned positions for {m.max_position_embeddings:,} "
                                   f"tokens, not {n:,}", f"set {key} to {m.max_position_embeddings:,} or less"))
    if ed.relative_bias_layers != "none" and m.num_layers > ed.encoder_layers:
        # GenerationMixin._prepare_cache_for_generation builds DynamicCache(config=...) with the config's
        # num_layers (the encoder's: T5Config.attribute_map num_hidden_layers -> num_layers), so the decoder's
        # later layers find no cache layer (cache_utils.py EncoderDecoderCache.update: IndexError), read off 5.24
        out.append(Problem("model", what + f"transformers 5.24's generate fails for it: the cache is built for "
                           f"num_layers = {ed.encoder_layers} layers and the decoder has {m.num_layers} "
                           "(IndexError in the cache's update)", "use a config whose num_decoder_layers is at most "
                           "num_layers"))
    return out


def litgpt_problems(s: Scenario) -> list[Problem]:
    """What Lit-GPT's finetune scripts refuse: a bitsandbytes ``--quantize`` with a mixed precision ("Quantization and
    mixed precision is not supported.", ``finetune/lora.py`` ``setup`` at lit-gpt 8641822 and litgpt v0.3.1-v0.5.13)."""
    t = s.train
    if s.task != "train" or s.effective_framework != "lightning" or t.peft is None:
        return []
    if t.quantization in bnb_formats() and t.precision in ("bf16-mixed", "fp16-mixed"):
        return [Problem("train.precision", f"is {t.precision} with quantization {t.quantization}: Lit-GPT's finetune "
                        "scripts raise 'Quantization and mixed precision is not supported.' (finetune/lora.py setup)",
                        "set train.precision: bf16-true (or fp16-true)")]
    return []


def axolotl_problems(s: Scenario) -> list[Problem]:
    """Full fine-tuning under axolotl: its loader upcasts the embeddings, the LM head and the norms to fp32 and casts
    them back only under FSDP, for an attention implementation that needs it or with Cut Cross-Entropy
    (``src/axolotl/loaders/model.py`` ``_configure_embedding_dtypes``, facts/trainer_frameworks.py): a model of mixed
    dtypes the step does not model."""
    if s.task != "train" or s.framework != "axolotl" or s.train.peft is not None:
        return []
    return [Problem("framework", "is axolotl with full fine-tuning: axolotl's fp32 embeddings, LM head and norms "
                    "beside half-precision layers are not modelled (only its LoRA/QLoRA handling is)",
                    "set framework: hf-trainer to estimate the HF Trainer's own handling, or train.peft for LoRA")]


def hybrid_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for a hybrid attention + Mamba2 model (``ModelSpec.mamba``), refused rather
    than answered as if every layer were attention.

    * Training is estimated for full fine-tuning (SFT) with transformers' Trainer, Accelerate or DeepSpeed, without or with
      full activation checkpointing, on one GPU's shard of the batch (no tensor, context or pipeline parallelism):
      the mixers' saved tensors of transformers' torch path (analytic/terms/mamba2.py); adapters too on the Mamba2
      hybrids, with or without full checkpointing (a recomputed mixer's forward and backward temporaries:
      analytic/terms/mamba2.py ``mixer_recompute_per_token``, ``mixer_backward_per_token``); the rest is refused
      (``_hybrid_train_problems``).
    * Serving with SGLang or llama.cpp: they keep the mixers' state in their own pools (SGLang's
      ``MambaPool`` beside its token pool, llama.cpp's recurrent-state cells), not modelled.  vLLM is modelled
      (``serve/mamba_pages.py``: ``MambaSpec`` state pages, the attention block raised to hold one, the groups;
      ``serve/vllm.py`` ``_hybrid_rule`` refuses the releases and options it does not model).
    * Lit-GPT's generate loop: Lit-GPT ships no Bamba or Granite 4.0-H model; a quantized KV cache: transformers' ``QuantizedCache``
      refuses a model with other than full-attention layers (``cache_utils.py``, 5.24).
    Inference with transformers' ``generate`` is estimated (KV cache for the attention layers, the mixers'
    state per sequence: ``analytic/ssm_state.py``).
    """
    if m.mamba is None:
        return []
    if m.mamba.kind == "rwkv4":
        return _rwkv_problems(s, m)
    if m.mamba.kind == "rg_lru":
        return _rg_lru_problems(s, m)
    if m.mamba.kind == "lightning":
        return _lightning_problems(s, m)
    if m.mamba.kind in LINEAR_MIXER_KINDS:
        return _linear_mixer_problems(s, m)
    if m.mamba.parallel_attention:
        return _parallel_hybrid_problems(s, m)
    if m.mamba.shared_attention_layers:
        return _shared_block_problems(s, m)
    if len(m.mamba.layers) == m.num_layers:
        return _state_space_problems(s, m)
    kind = "Mamba2" if m.mamba.kind == "mamba2" else "Mamba"
    what = (f"{m.name} is a hybrid of {len(m.mamba.layers)} {kind} mixer layers and "
            f"{m.num_layers - len(m.mamba.layers) - len(m.mamba.ffn_only_layers)} attention layers")
    if m.mamba.kind == "mamba1":
        return _mamba1_hybrid_problems(s, m, what)
    if s.task == "train":
        return _hybrid_train_problems(s, m, what, peft=m.mamba.kind == "mamba2")
    if s.task == "serve":
        if s.serve.engine == "vllm":
            return []
        return [Problem("serve.engine", f"{what}; serving it with {s.serve.engine} is not estimated: the engine's "
                        "Mamba state pool is not modelled", "use serve.engine vllm, which is estimated")]
    if s.parallel.tp > 1:
        return [Problem("parallel.tp", f"{what}; tensor parallelism is not estimated for it (BambaConfig's "
                        "base_model_tp_plan shards only embed_tokens, GraniteMoeHybridConfig's only the experts)",
                        "set parallel.tp to 1")]
    if s.inference.kv_cache_dtype not in ("auto", s.inference.dtype):
        # transformers 5.24 cache_utils.py QuantizedCache.__init__: "`QuantizedCache` is only supported for models
        # with only full attention layers"
        return [Problem("inference.kv_cache_dtype", f"{what}; transformers' QuantizedCache refuses models with "
                        "other than full-attention layers", "use kv_cache_dtype: auto")]
    if s.effective_framework == "lightning":
        return [Problem("framework", f"{what}; Lit-GPT ships no such model",
                        "use the transformers framework for inference")]
    return []


# MambaSpec kinds that are neither Mamba kind (their state and generate: analytic/ssm_state.py; the short convolution's
# training: analytic/terms/mamba2.py)
LINEAR_MIXER_KINDS = {"gated_deltanet": "Gated DeltaNet linear-attention", "short_conv": "gated short-convolution"}


def _linear_mixer_what(m: ModelSpec) -> str:
    ms = m.mamba
    assert ms is not None
    return (f"{m.name} is a hybrid of {len(ms.layers)} {LINEAR_MIXER_KINDS[ms.kind]} layers and "
            f"{m.num_layers - len(ms.layers)} attention layers")


def _linear_mixer_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for a hybrid of Gated DeltaNet or gated short-convolution layers and attention
    (``MambaSpec.kind`` "gated_deltanet": ``qwen3_next``; "short_conv": ``lfm2``), for every engine; the analytic
    engine's own refusal is ``linear_mixer_analytic_problems``.

    * Serving with vLLM is modelled (``serve/mamba_pages.py``: the gated delta net's and the short convolution's state
      pages in the hybrid layout; ``serve/vllm.py`` ``_hybrid_rule`` refuses the releases and options it does not
      model); SGLang's state pool and llama.cpp's recurrent cells are not modelled.
    * transformers 4.x: its ``Qwen3NextDynamicCache`` and ``Lfm2HybridConvCache`` preallocate other shapes and dtypes
      than 5.24's ``LinearAttentionLayer`` (cache_utils.py), whose state the traced engine's decode step fills.
    * Inference: tensor parallelism (the configuration classes' ``base_model_tp_plan`` was not followed for these
      layers), a quantized cache (``QuantizedCache`` refuses models with other than full-attention layers,
      cache_utils.py 5.24), Lit-GPT (it ships no such model).
    """
    what = _linear_mixer_what(m)
    if s.task == "serve":
        # vLLM ships Qwen3NextForCausalLM and Lfm2ForCausalLM from 0.10.2: their state pages are laid out by
        # serve/mamba_pages.py, the releases checked by serve/vllm.py _hybrid_rule (facts/vllm_releases.py
        # LINEAR_MIXER_V1_FROM)
        if s.serve.engine == "vllm":
            if m.mamba is not None and len(m.mamba.layers) >= m.num_layers:
                # vLLM runs Qwen3NextForCausalLM and Lfm2ForCausalLM as hybrids (IsHybrid) whatever the layer mix:
                # its page sizing pads the state page to an attention block (0.11.0 vllm/config/__init__.py:641,
                # model_executor/models/config.py:344-394), which a model without attention layers has none of; no
                # released checkpoint is such a model
                return [Problem("model", f"{what}, with no attention layer: vLLM sizes its state pages from the "
                                "attention layers of these hybrid classes, which this config has none of (no released "
                                "checkpoint is such a model), so its pool is not estimated",
                                "give the model's published config.json, whose attention layers vLLM pages")]
            return []
        return [Problem("serve.engine", f"{what}; serving it with {s.serve.engine} is not estimated: its pool for "
                        "these layers' state (SGLang's MambaPool beside the token pool, llama.cpp's recurrent-state "
                        "cells) is not modelled", "use serve.engine vllm, which is estimated")]
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        return [Problem("software.transformers", f"{what}; it is modelled on transformers 5.24 (DynamicCache's "
                        f"LinearAttentionLayer), not {s.software.transformers} (its own hybrid cache class)",
                        "drop software.transformers, or set it to 5.0 or later")]
    if s.task == "train":
        return []
    return _generate_limits(s, what, "the layers' tensor-parallel plan is not modelled",
                            "transformers' QuantizedCache refuses models with other than full-attention layers")


def linear_mixer_analytic_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """The analytic engine's limits on training a hybrid of Gated DeltaNet or gated short-convolution layers: those of
    the Mamba2 hybrids (``_hybrid_train_problems``), and for the Gated DeltaNet autocast (``bf16-mixed``,
    ``fp16-mixed`` outside DeepSpeed), whose per-chunk half copies of the rule's matmul operands are not in its terms
    (``analytic/terms/gated_deltanet.py`` counts the other precisions').  Both kinds' state per sequence and
    generate's prefill and decode tensors are modelled (``analytic/ssm_state.py``), the short convolution's saved
    tensors too (``analytic/terms/mamba2.py``); the traced engine runs transformers' own forward and is not refused.
    MiniMax's lightning attention (``_lightning_problems`` holds its other limits): autocast is refused, as for the
    Gated DeltaNet (``analytic/terms/lightning.py`` counts the other precisions')."""
    if m.mamba is not None and m.mamba.kind == "rwkv4" and s.task == "train":
        return [Problem("task", f"{_rwkv_what(m)}; training it is not estimated by the analytic engine: autograd "
                        "saves the torch wkv loop's tensors of every token (rwkv_linear_attention_cpu runs one "
                        "iteration per token, each saving its batch x hidden fp32 products for the backward; the "
                        "CUDA kernel, when loaded, saves other tensors), which its terms do not count",
                        "use --engine trace (it runs transformers' own forward and backward on the meta device); "
                        + _PARAMETERS_ONLY)]
    if m.mamba is not None and m.mamba.kind == "lightning" and s.task == "train":
        t = s.train
        if t.precision in ("bf16-mixed", "fp16-mixed") and not s.deepspeed_engine:
            # under autocast the half query and key meet fp32 decay buffers: the products are fp32 and every matmul
            # saves half casts of them, per block; other records, not modelled (analytic/terms/lightning.py)
            return [Problem("train.precision", f"{_lightning_what(m)}; {t.precision} training is not estimated by the "
                            "analytic engine for it: under autocast the block loop's products of half activations and "
                            "fp32 decay factors are fp32, and its matmuls save half-precision copies of them, per "
                            "block, which are not modelled",
                            "set train.precision: bf16-true (or fp32), or use --engine trace")]
        return []
    if m.mamba is None or m.mamba.kind not in LINEAR_MIXER_KINDS or s.task != "train":
        return []
    what = _linear_mixer_what(m)
    # adapters on LFM2's gated short-convolution blocks and Qwen3-Next's Gated DeltaNet layers: the frozen blocks'
    # records (analytic/terms/mamba2.py frozen_mixer_dropped), checked against the traced engine
    # (tests/test_hybrid_peft.py, tests/test_families_qwen3_next.py)
    out = _hybrid_train_problems(s, m, what, peft=True)
    t = s.train
    if (m.mamba.kind == "gated_deltanet" and t.precision in ("bf16-mixed", "fp16-mixed")
            and not s.deepspeed_engine):
        # under autocast the rule's matmuls run as bf16 bmm on cast copies (saved instead of the fp32 operands), per
        # chunk: other records, not modelled (analytic/terms/gated_deltanet.py)
        out.append(Problem("train.precision", f"{what}; {t.precision} training is not estimated by the analytic engine "
                           "for it: under autocast the chunked delta rule's matmuls save half-precision copies of "
                           "their fp32 operands, per chunk, which are not modelled",
                           "set train.precision: bf16-true (or fp32), or use --engine trace"))
    return out


def _rwkv_what(m: ModelSpec) -> str:
    return f"{m.name} is an RWKV-4 model ({m.num_layers} time-mixing and channel-mixing blocks, no attention)"


def _rwkv_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for RWKV-4 (``MambaSpec.kind`` "rwkv4", ``rwkv``), for every engine; the
    analytic engine's refusal of training is in ``linear_mixer_analytic_problems``.

    * Serving: vLLM has no RWKV model class (the feature request vllm-project/vllm#3583 was closed without one, a
      maintainer moving it to the backlog in 2025-08; RWKV-7 support is proposed in the open #48686, which adds
      ``RWKV7ForCausalLM`` to the registry), and SGLang's and llama.cpp's state pools for it are not modelled.
    * Inference: tensor parallelism (``RwkvConfig`` has no ``base_model_tp_plan``), a quantized cache (the state is
      no KV cache: transformers' ``QuantizedCache`` does not reach it), Lit-GPT (it ships no RWKV model).
    * transformers 4.x is not modelled (its ``modeling_rwkv.py`` builds the same state, but was not read here).
    """
    what = _rwkv_what(m)
    if s.task == "serve":
        return [Problem("task", f"{what}; serving it with {s.serve.engine} is not estimated: vLLM has no RWKV model "
                        "class (vllm-project/vllm#3583; serving would need one, with state pages for its recurrent "
                        "state), and the other engines' state pools for it are not modelled",
                        "estimate inference (task: inference) with transformers' generate, which is estimated; "
                        + _PARAMETERS_ONLY)]
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        return [Problem("software.transformers", f"{what}; it is modelled on transformers 5.24's modeling_rwkv.py, "
                        f"not {s.software.transformers}", "drop software.transformers, or set it to 5.0 or later")]
    if s.task == "train":
        return []
    return _generate_limits(s, what, "RwkvConfig has no base_model_tp_plan",
                            "its state is no KV cache, which transformers' QuantizedCache would hold")


def _rg_lru_what(m: ModelSpec) -> str:
    ms = m.mamba
    assert ms is not None
    return (f"{m.name} is a RecurrentGemma (Griffin) model of {len(ms.layers)} RG-LRU recurrent blocks and "
            f"{m.num_layers - len(ms.layers)} local attention blocks")


def _rg_lru_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for RecurrentGemma (``MambaSpec.kind`` "rg_lru", ``recurrent_gemma``), for every
    engine: inference with transformers' ``generate`` is estimated (analytic/ssm_state.py: the blocks' state on the
    modules, the RG-LRU's prefill tensors; the local attention's windowed cache); the rest is refused.

    * Training: the RG-LRU's ``_rnn_scan`` is a Python loop over the tokens whose per-step tensors autograd saves,
      and ``SqrtBoundDerivative`` saves its own input: not modelled.
    * Serving: no engine's layout of its recurrent state (pages, pools) was read, so none is modelled.
    * Inference: tensor parallelism (``RecurrentGemmaConfig`` has no ``base_model_tp_plan``), a quantized cache (the
      recurrent state is on the modules, where transformers' ``QuantizedCache`` does not reach, and it refuses
      models with other than full-attention layers, cache_utils.py 5.24), Lit-GPT (it ships no such model), and
      transformers 4.x (its ``modeling_recurrent_gemma.py`` was not read).
    """
    what = _rg_lru_what(m)
    if s.task in ("train", "serve"):
        doing = "training" if s.task == "train" else f"serving it with {s.serve.engine}"
        why = ("the RG-LRU's recurrence runs as a Python loop over the tokens (_rnn_scan), whose per-step tensors "
               "autograd saves, which is not modelled" if s.task == "train" else
               "no serving engine's state pool for its recurrent blocks is modelled")
        return [Problem("task", f"{what}; {doing} is not estimated: {why}",
                        "estimate inference (task: inference) with transformers' generate, which is estimated; "
                        + _PARAMETERS_ONLY)]
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        return [Problem("software.transformers", f"{what}; it is modelled on transformers 5.24's "
                        f"modeling_recurrent_gemma.py, not {s.software.transformers}",
                        "drop software.transformers, or set it to 5.0 or later")]
    return _generate_limits(s, what, "RecurrentGemmaConfig has no base_model_tp_plan",
                            "its recurrent state is on the modules, and transformers' QuantizedCache refuses "
                            "models with other than full-attention layers")


def _lightning_what(m: ModelSpec) -> str:
    ms = m.mamba
    assert ms is not None
    return (f"{m.name} is a hybrid of {len(ms.layers)} lightning (linear) attention layers and "
            f"{m.num_layers - len(ms.layers)} softmax attention layers")


def _lightning_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for MiniMax (``MambaSpec.kind`` "lightning", ``minimax``), for every engine:
    inference with transformers' ``generate`` is estimated (analytic/ssm_state.py: the lightning attention's state in
    ``MiniMaxCache`` and its block-wise prefill; the softmax layers' KV cache); the rest is refused.

    * Training: a full fine-tune with transformers' block-wise loop is estimated (analytic/terms/lightning.py: its
      saved tensors per block; the traced engine runs it) within the Mamba2 hybrids' limits (``_hybrid_train_problems``:
      no adapters, sft, the Trainer, Accelerate or DeepSpeed, no or full checkpointing, no tp / cp / pp); the analytic
      engine refuses autocast (``linear_mixer_analytic_problems``).
    * Serving: no engine's layout of the lightning attention's state was read.
    * Inference: tensor parallelism (``MiniMaxConfig.base_model_tp_plan`` shards the softmax layers' projections and
      the experts, not ``qkv_proj``, ``output_gate`` or ``out_proj``; not modelled), a quantized cache
      (``MiniMaxCache`` is its own class, which transformers' ``QuantizedCache`` would replace and the model's forward
      refuses), Lit-GPT (it ships no such model), transformers 4.x (not read).
    """
    what = _lightning_what(m)
    if s.task == "serve":
        return [Problem("task", f"{what}; serving it with {s.serve.engine} is not estimated: no serving engine's "
                        "layout of the lightning attention's state is modelled",
                        "estimate inference (task: inference) with transformers' generate, which is estimated; "
                        + _PARAMETERS_ONLY)]
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        return [Problem("software.transformers", f"{what}; it is modelled on transformers 5.24's modeling_minimax.py, "
                        f"not {s.software.transformers}", "drop software.transformers, or set it to 5.0 or later")]
    if s.task == "train":
        return _hybrid_train_problems(s, m, what)
    return _generate_limits(s, what, "the lightning layers' projections are not in MiniMaxConfig's base_model_tp_plan",
                            "the model's forward takes no cache but its own MiniMaxCache")


def _mamba1_hybrid_problems(s: Scenario, m: ModelSpec, what: str) -> list[Problem]:
    """What vramplan does not estimate for a hybrid of Mamba-1 mixers and attention (``MambaSpec.kind`` "mamba1",
    ``jamba``): inference with transformers' ``generate`` is estimated (the attention layers' KV cache,
    ``analytic/kv_cache.py``, and the mixers' state and torch scan, ``analytic/ssm_state.py``'s Mamba-1 terms); the
    rest is refused.

    * Training: full fine-tuning and LoRA are estimated, the mixers as ``mamba`` and ``falcon_mamba``'s are
      (analytic/terms/mamba1.py, plus what the weighted dt, B and C norms save for their weights' gradients; frozen
      mixers: analytic/terms/mamba2.py ``frozen_mixer_dropped``); the limits of ``_hybrid_train_problems`` hold
      (DoRA, tensor/context/pipeline parallelism, other checkpointing policies and objectives are refused).
    * Serving with vLLM is modelled (``serve/mamba_pages.py``: the Mamba-1 state page, ``mamba1_state_shape``, in the
      hybrid layout; ``serve/vllm.py`` ``_hybrid_rule`` refuses the releases and options it does not model); SGLang's
      and llama.cpp's state pools are not modelled.
    * Inference: tensor parallelism (``JambaConfig.base_model_tp_plan`` shards only the experts), a quantized cache
      (``QuantizedCache`` refuses models with other than full-attention layers, cache_utils.py 5.24), Lit-GPT (it
      ships no such model), and transformers 4.x: its ``HybridMambaAttentionDynamicCache`` (modeling_jamba.py, e.g.
      at commit 008f5c8c) preallocates every mixer's convolution and SSM state in the model dtype, where 5.24's
      ``LinearAttentionLayer`` keeps the SSM state in fp32, and its mixer's ``slow_forward`` is other code.
    """
    if s.task == "train":
        return _hybrid_train_problems(s, m, what, peft=True)
    if s.task == "serve":
        return _mamba1_serve_problems(s, what)
    version = s.software.transformers_version
    if version is not None and version < (5, 0):
        return [Problem("software.transformers", f"{what}; its generate is modelled on transformers 5.24's "
                        f"modeling_jamba.py (DynamicCache's LinearAttentionLayer, an fp32 SSM state), not "
                        f"{s.software.transformers} (HybridMambaAttentionDynamicCache, its states in the model dtype)",
                        "drop software.transformers, or set it to 5.0 or later")]
    return _generate_limits(s, what, "its configuration's base_model_tp_plan shards only the experts",
                            "transformers' QuantizedCache refuses models with other than full-attention layers")


def _parallel_hybrid_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for a model whose every layer runs attention and a Mamba2 mixer side by side
    (``MambaSpec.parallel_attention``, ``falcon_h1``): inference with transformers' ``generate`` is estimated (every
    layer's KV cache, ``analytic/kv_cache.py``, and its mixer state, ``analytic/ssm_state.py``: transformers 5.24's
    ``LinearAttentionAndFullAttentionLayer`` holds both; the prefill's running layer, the mixer's tensors or the
    attention's beside the mixer's output); the rest is refused.

    * Training is estimated as a hybrid's is (``_hybrid_train_problems``), each layer saving an attention layer's
      tensors and its mixer's (analytic/terms/mamba2.py), where no autocast runs (``*-true`` precisions, fp32,
      DeepSpeed's half module): under autocast the mixer's ``in_proj`` output times its fp32 ``mup_vector`` buffer is
      an fp32 product, and FSDP's MixedPrecision casts buffers by its own rule; neither is modelled.
    * Serving: no engine's layout of a layer that holds both a KV cache and a mixer state is modelled
      (``serve/mamba_pages.py`` lays out hybrids whose mixer layers hold no attention).
    * Inference: tensor parallelism (``FalconH1Config.base_model_tp_plan`` shards only ``embed_tokens``), a quantized
      cache (``QuantizedCache`` refuses layer types other than "full_attention", cache_utils.py 5.24; Falcon-H1's are
      "hybrid"), Lit-GPT (it ships no such model).
    """
    what = (f"{m.name} runs attention and a Mamba2 mixer side by side in each of its {m.num_layers} layers "
            "(a KV cache and a mixer state in every layer)")
    if s.task == "train":
        t = s.train
        mixed = t.precision in ("bf16-mixed", "fp16-mixed") and not s.deepspeed_engine
        out = _hybrid_train_problems(s, m, what, peft=True)
        if mixed:
            out.append(Problem("train.precision", f"{what}; {t.precision} training is not estimated for it: under "
                               "autocast (or FSDP's MixedPrecision) each mixer multiplies its half in_proj output by "
                               "its fp32 mup_vector buffer, an fp32 product whose records are not modelled",
                               f"set train.precision: {t.precision.replace('mixed', 'true')} (half weights, no "
                               "autocast), which is estimated"))
        return out
    if s.task == "serve":
        return [Problem("serve.engine", f"{what}; serving it with {s.serve.engine} is not estimated: the engine's "
                        "layout of layers holding both a KV cache and a mixer state is not modelled",
                        "estimate inference (task: inference) with transformers' generate, which is estimated")]
    return _generate_limits(s, what, "its configuration's base_model_tp_plan shards only embed_tokens",
                            "transformers' QuantizedCache refuses models with other than full-attention layers "
                            "(these are 'hybrid')")


def _shared_block_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for a model of Mamba2 layers with shared transformer blocks run ahead of the
    mixer in some of them (``MambaSpec.shared_attention_layers``, ``zamba2``): training and inference with
    transformers' ``generate`` are estimated (the hybrid layers' KV cache and every layer's mixer state: transformers 5.24 gives a "hybrid" layer a
    ``LinearAttentionAndFullAttentionLayer``; the prefill's running layer, ``analytic/inference.py``
    ``shared_block_extra_bytes``); the rest is refused.

    * Training is estimated as the Mamba2 hybrids' is (``_hybrid_train_problems``: full fine-tuning, no or full
      checkpointing, one GPU's shard of the batch), each hybrid layer adding its shared block's saved tensors (the
      ``2 x hidden`` norm and attention input, the adapters' rank outputs, the MLP, the per-layer ``linear``'s input:
      analytic/terms/shared_block.py); adapters (``train.peft``), selective checkpointing, parallelism inside the
      model, sharded weights (FSDP, ZeRO-3: each hybrid layer's tied copy of the shared block) and transformers 4.x
      are refused.
    * Serving with vLLM is modelled (``serve/mamba_pages.py``: vLLM gives each hybrid layer's shared block its own
      ``Attention``, laid out beside every layer's Mamba2 state page); SGLang's and llama.cpp's state pools are not.
    * Inference: tensor parallelism (``Zamba2Config`` has no ``base_model_tp_plan``), a quantized cache
      (``QuantizedCache`` refuses layer types other than "full_attention", cache_utils.py 5.24), Lit-GPT (it ships no
      such model), and transformers 4.x, whose ``Zamba2HybridDynamicCache`` (modeling_zamba2.py before 5.0) preallocates
      every layer's convolution and SSM state in the model dtype, where 5.24's ``LinearAttentionLayer`` keeps the SSM
      state in fp32.
    """
    ms = m.mamba
    assert ms is not None
    what = (f"{m.name} runs a Mamba2 mixer in each of its {m.num_layers} layers and a shared transformer block "
            f"ahead of the mixer in {len(ms.shared_attention_layers)} of them")
    version = s.software.transformers_version
    if s.task == "train":
        if version is not None and version < (5, 0):
            return [Problem("software.transformers", f"{what}; its training is modelled on transformers 5.24's "
                            f"modeling_zamba2.py, not {s.software.transformers}",
                            "drop software.transformers, or set it to 5.0 or later")]
        sharded: list[Problem] = []
        if s.parallel.fsdp != "none" or s.parallel.zero_stage == 3:
            # every hybrid layer holds its own copy of the shared block, its weights tied to the first
            # num_mem_blocks' (modeling_zamba2.py 5.24 Zamba2Model.__init__ / _tied_weights_keys): a sharded run
            # gathers them at each hybrid layer, where the spec counts them once (not modelled, not checked)
            sharded = [Problem("parallel.fsdp" if s.parallel.fsdp != "none" else "parallel.zero_stage",
                               f"{what}; training it with its weights sharded (FSDP, DeepSpeed ZeRO-3) is not "
                               "estimated: each hybrid layer's tied copy of the shared block would be gathered where "
                               "it runs, which is not modelled", "use DDP or DeepSpeed ZeRO-1/2 "
                               "(parallel.fsdp: none, zero_stage at most 2)")]
        return _hybrid_train_problems(s, m, what) + _half_residual_problems(s, m, what) + sharded
    if s.task == "serve":
        # vLLM gives each hybrid layer's shared block its own Attention (zamba2.py Zamba2Attention.dpa_list): attention
        # layers beside the mixers, laid out by serve/mamba_pages.py
        if s.serve.engine == "vllm":
            return []
        return [Problem("serve.engine", f"{what}; serving it with {s.serve.engine} is not estimated: its pool for "
                        "the mixers' state (SGLang's MambaPool, llama.cpp's recurrent-state cells) beside the shared "
                        "blocks' KV cache is not modelled", "use serve.engine vllm, which is estimated")]
    if version is not None and version < (5, 0):
        return [Problem("software.transformers", f"{what}; its generate is modelled on transformers 5.24's "
                        f"modeling_zamba2.py (DynamicCache's hybrid layers, an fp32 SSM state), not "
                        f"{s.software.transformers} (Zamba2HybridDynamicCache, its states in the model dtype)",
                        "drop software.transformers, or set it to 5.0 or later")]
    return _generate_limits(s, what, "its transformers configuration has no base_model_tp_plan",
                            "transformers' QuantizedCache refuses models with other than full-attention layers "
                            "(these are 'hybrid' and 'linear_attention')")


def _mamba1_serve_problems(s: Scenario, what: str) -> list[Problem]:
    """Serving a model with Mamba-1 mixers with an engine other than vLLM (whose state pages are modelled:
    serve/mamba_pages.py), refused alike for the pure models and for Jamba."""
    if s.serve.engine == "vllm":
        return []
    return [Problem("serve.engine", f"{what}; serving it with {s.serve.engine} is not estimated: the engine's state "
                    "pool for Mamba mixers is not modelled", "use serve.engine vllm, which is estimated")]


def _state_space_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What vramplan does not estimate for a model whose every layer is a mixer (``mamba2``, ``mamba``,
    ``falcon_mamba``): inference with transformers' ``generate`` is estimated (the mixers' state per sequence and their
    torch scans, ``analytic/ssm_state.py``); the rest is refused.

    * Training of Mamba2 (``mamba2``) is estimated as a hybrid's mixer blocks are (``_hybrid_train_problems``: the
      Mamba2 mixer's saved tensors of transformers' torch path, ``analytic/terms/mamba2.py``; one norm per block, no
      MLP; LoRA and QLoRA on ``in_proj`` through the frozen mixers' records, ``frozen_mixer_dropped``), where the
      residual stream is fp32 anyway or ``residual_in_fp32`` is off (``_half_residual_problems``).
    * Training of Mamba-1 (``mamba``, ``falcon_mamba``): transformers' torch scan, ``mamba_selective_scan``'s
      recurrent loop (analytic/terms/mamba1.py), within the same limits.
    * Serving with vLLM is modelled (``serve/mamba_pages.py`` ``state_space_layout``: one group of every layer, the
      state page, one block per request); SGLang's and llama.cpp's state pools are not modelled.
    * Inference: tensor parallelism (no ``base_model_tp_plan`` for these classes), a quantized cache
      (``QuantizedCache`` refuses models with other than full-attention layers, cache_utils.py 5.24), Lit-GPT (it
      ships none of these models).
    """
    kind = "Mamba2" if m.mamba is not None and m.mamba.kind == "mamba2" else "Mamba"
    what = f"{m.name} is a state-space model ({m.num_layers} {kind} mixer layers, no attention)"
    if s.task == "train":
        # Mamba-1 (``mamba``, ``falcon_mamba`` with its weightless norms on dt, B and C): transformers' torch scan,
        # analytic/terms/mamba1.py; Mamba2 as the hybrids' mixers; adapters included on both (the frozen mixers'
        # records: mamba2.py frozen_mixer_dropped)
        return (_hybrid_train_problems(s, m, what, peft=True)
                + _half_residual_problems(s, m, what))
    if s.task == "serve":
        return _mamba1_serve_problems(s, what)
    version = s.software.transformers_version
    if kind == "Mamba" and version is not None and version < (5, 0):
        # transformers 4.x (cache_utils.py / modeling_mamba.py MambaCache): conv_states [batch, intermediate,
        # conv_kernel] and ssm_states [batch, intermediate, state] both zeros in the model dtype, preallocated for
        # the batch; 5.24's DynamicCache holds an fp32 SSM state and conv_kernel - 1 columns
        return [Problem("software.transformers", f"{what}; its generate is modelled on transformers 5.24 (an fp32 SSM "
                        f"state and conv_kernel - 1 convolution columns per mixer), not {s.software.transformers} "
                        "(MambaCache: both states in the model dtype, conv_kernel columns)",
                        "drop software.transformers, or set it to 5.0 or later")]
    return _generate_limits(s, what, "its transformers configuration has no base_model_tp_plan",
                            "it has no KV cache, and transformers' QuantizedCache refuses models with other than "
                            "full-attention layers")


def _generate_limits(s: Scenario, what: str, tp_why: str, cache_why: str) -> list[Problem]:
    """The first of what transformers' generate of a mixer model is not estimated with: tensor parallelism, a
    quantized cache, Lit-GPT (which ships no such model)."""
    if s.parallel.tp > 1:
        return [Problem("parallel.tp", f"{what}; tensor parallelism is not estimated for it ({tp_why})",
                        "set parallel.tp to 1")]
    if s.inference.kv_cache_dtype not in ("auto", s.inference.dtype):
        return [Problem("inference.kv_cache_dtype", f"{what}; {cache_why}", "use kv_cache_dtype: auto")]
    if s.effective_framework == "lightning":
        return [Problem("framework", f"{what}; Lit-GPT ships no such model",
                        "use the transformers framework for inference")]
    return []


def _half_residual_problems(s: Scenario, m: ModelSpec, what: str) -> list[Problem]:
    """Training under ``residual_in_fp32`` where the residual stream would otherwise be in the half dtype
    (``facts/precisions.py``: the ``*-true`` precisions, DeepSpeed's half module, FSDP's MixedPrecision): the blocks
    then turn it into fp32 from the first block on (``Mamba2Block.forward``), which the activation terms, one residual
    dtype for every layer, do not model.  Under fp32, or a mixed precision with autocast over fp32 weights, the
    residual stream is fp32 already and the cast changes nothing."""
    if not m.traits.residual_in_fp32:
        return []
    t = s.train
    autocast = (t.precision in ("bf16-mixed", "fp16-mixed") and not s.deepspeed_engine
                and s.parallel.fsdp == "none")
    if t.precision == "fp32" or autocast:
        return []
    return [Problem("train.precision", f"{what}; with residual_in_fp32 its residual stream is fp32 from the first "
                    f"block on, which is not estimated with {t.precision} under {s.effective_framework}"
                    + (" with FSDP" if s.parallel.fsdp != "none" else "") + " (a half-dtype residual stream)",
                    "use bf16-mixed with the Trainer or Accelerate without FSDP (autocast over fp32 weights, whose "
                    "residual stream is fp32 already), or a config with residual_in_fp32: false")]


def _hybrid_train_problems(s: Scenario, m: ModelSpec, what: str, peft: bool = False) -> list[Problem]:
    """What training of a hybrid Mamba2 model does not estimate (analytic/terms/mamba2.py models the mixers'
    saved tensors of transformers' torch path for a full fine-tune, per decoder layer of norm, mixer or attention,
    norm and MLP).  ``peft``: adapters are estimated (the Mamba2 hybrids of attention, mixer and MLP blocks: the
    frozen mixers' records as analytic/terms/mamba2.py ``frozen_mixer_dropped`` says)."""
    t, par = s.train, s.parallel
    out: list[Problem] = []
    if t.peft is not None and not peft:
        out.append(Problem("train.peft", f"{what}; training it with adapters is not estimated: which of a frozen "
                           "mixer's tensors are still saved below and above the adapters is not modelled",
                           "drop train.peft (full fine-tuning is estimated)"))
    elif t.peft is not None and t.peft.method == "dora":
        # DoRA's records are counted per layer as if every layer held the same adapted linears (analytic/terms/layers.py
        # _dora_saved), which a hybrid's mixer, attention and MLP blocks do not: 1.6-1.7x the traced engine's peak
        out.append(Problem("train.peft.method", f"{what}; DoRA on it is not estimated (its per-layer records assume "
                           "every layer holds the same adapted linears)", "use method: lora or qlora, which are estimated"))
    if t.objective != "sft":
        out.append(Problem("train.objective", f"{what}; only supervised fine-tuning is estimated for it (the "
                           f"{t.objective} trainer's extra forwards and generation are not modelled for mixers)",
                           "set train.objective: sft"))
    if s.effective_framework not in ("hf-trainer", "accelerate", "deepspeed"):
        out.append(Problem("framework", f"{what}; training it with {s.effective_framework} is not estimated "
                           "(transformers' mixer, run by the Trainer, Accelerate or DeepSpeed, is what is modelled)",
                           "set framework: hf-trainer"))
    if checkpointing(s) not in ("none", "full"):
        out.append(Problem("train.gradient_checkpointing", f"{what}; {checkpointing(s)} checkpointing is not "
                           "estimated for it (the mixer has no attention core to recompute alone)",
                           "set train.gradient_checkpointing to none or full"))
    for path, value, fix in (("parallel.tp", par.tp, "set parallel.tp to 1"),
                             ("parallel.cp", par.cp, "set parallel.cp to 1"),
                             ("parallel.pp", par.pp, "set parallel.pp to 1")):
        if value > 1:
            out.append(Problem(path, f"{what}; training it with {path} {value} is not estimated (the mixers' "
                               "saved tensors are modelled on whole sequences on one GPU)", fix))
    if t.liger_kernels:
        out.append(Problem("train.liger_kernels", f"{what}; Liger-Kernel has no patch for it (its norms and MLP "
                           "would stay transformers')", "set train.liger_kernels: false"))
    if t.activation_offload != "none":
        out.append(Problem("train.activation_offload", f"{what}; offloading its saved activations is not "
                           "estimated", "set train.activation_offload: none"))
    if t.precision in ("fp8-mixed", "fp8-torchao", "mxfp8-torchao"):
        out.append(Problem("train.precision", f"{what}; {t.precision} training is not estimated for it (fp8 "
                           "linears in the mixers are not modelled)", "use bf16-mixed or bf16-true"))
    return out


def section_conflicts(paths: dict[str, str], task: str) -> list[Problem]:
    """Options (``{dotted path: option}``) that set a section of another task than ``task``: refused, naming
    the option and the task (issue 19: ``--micro-batch-size`` on an inference scenario was ignored)."""
    out = []
    for path, option in paths.items():
        section = path.split(".", 1)[0]
        if section in TASK_SECTIONS and section != task:
            out.append(Problem(option, f"sets {path}, but the scenario's task is {task}: it would be ignored",
                               f"drop {option}, or set --task {section}"))
    return out


# the rl keys only PPO reads (spec/scenario.py Rl; analytic/ppo.py)
_PPO_ONLY_RL_KEYS = frozenset({"reward_model", "value_model", "num_mini_batches", "rollout_forward_batch_size"})
_TRL_ONLY_RL_KEYS = _PPO_ONLY_RL_KEYS | {"precompute_ref_log_probs"}
# the rl keys OpenRLHF reads under every estimator (--reward_pretrain; analytic/openrlhf.py); value_model
# (--critic_pretrain) under ppo only
_OPENRLHF_RL_KEYS = frozenset({"reward_model"})


def _use_cache_unread(s: Scenario) -> str | None:
    """Why ``train.use_cache`` changes nothing for ``s`` (None: it is read, analytic/terms/saved.py)."""
    t, fw = s.train, s.effective_framework
    if fw in OWN_MODEL_FRAMEWORKS or fw in ("verl", "openrlhf"):
        return f"framework {fw} runs its own forward, not the HF Trainer's"
    if t.objective != "sft":
        return f"it is read for train.objective sft; the {t.objective} trainer's forwards are modelled without it"
    tv = s.software.trl_version
    if tv is not None and fw == "hf-trainer" and tv >= SFT_USE_CACHE_OFF_SINCE:
        return "TRL's SFTTrainer from 0.22 passes use_cache=False to every forward (compute_loss)"
    if s.software.unsloth is not None and not s.lifecycle.evaluation:
        return ("Unsloth's patched model turns it off in training (LlamaModel_fast_forward) and no evaluation runs "
                "(lifecycle.evaluation)")
    if t.gradient_checkpointing not in ("none", None) and not s.lifecycle.evaluation:
        return ("gradient checkpointing turns it off in training (transformers' GradientCheckpointingLayer) and no "
                "evaluation runs (lifecycle.evaluation), whose forwards would read it")
    return None


def ignored_sections(s: Scenario) -> list[str]:
    """Assumptions for a document that sets keys of another task's section (they are not used)."""
    out = []
    for section in TASK_SECTIONS:
        if section == s.task:
            continue
        keys = _section_settings(s, section)
        if keys:
            shown = ", ".join(f"{section}.{k}" for k in keys)
            out.append(f"{shown} set but not used: the task is {s.task}")
    rl = _section_settings(s, "rl")
    if rl and not (s.task == "train" and s.train.objective in ("grpo", "rloo", "dpo", "kto", "orpo", "ppo")):
        shown = ", ".join(f"rl.{k}" for k in rl)
        out.append(f"{shown} set but not used: the rl section is read only with task train and "
                   "train.objective: grpo, rloo or ppo (dpo, kto and orpo read rl.reference_model)")
    elif s.train.objective != "ppo" and (ppo_only := [k for k in rl if k in _PPO_ONLY_RL_KEYS - (
            _OPENRLHF_RL_KEYS if s.effective_framework == "openrlhf" else frozenset())]):
        # TRL's PPOTrainer settings (analytic/ppo.py): the other trainers have no reward or value model on the GPU
        # (OpenRLHF builds its reward model under every estimator: analytic/openrlhf.py)
        shown = ", ".join(f"rl.{k}" for k in ppo_only)
        out.append(f"{shown} set but not used: read only with train.objective: ppo (TRL's PPOTrainer, OpenRLHF's "
                   "critic)")
    trains_rl = s.task == "train" and s.train.objective in ("grpo", "rloo", "dpo", "kto", "orpo", "ppo")
    if "verl" in rl and trains_rl and s.effective_framework != "verl":
        out.append("rl.verl set but not used: verl's hybrid-engine keys are read only with framework verl (docs/rl.md)")
    if "openrlhf" in rl and trains_rl and s.effective_framework != "openrlhf":
        out.append("rl.openrlhf set but not used: OpenRLHF's keys are read only with framework openrlhf (docs/rl.md)")
    if trains_rl and s.effective_framework == "openrlhf" and (
            trl_only := [k for k in rl if k in _TRL_ONLY_RL_KEYS - _OPENRLHF_RL_KEYS - {"value_model"}]):
        shown = ", ".join(f"rl.{k}" for k in trl_only)
        out.append(f"{shown} set but not used: TRL's trainer settings, not read under framework openrlhf")
    if trains_rl and s.effective_framework == "verl" and (trl_only := [k for k in rl if k in _TRL_ONLY_RL_KEYS]):
        # analytic/verl.py models verl's GRPO: no DPO precompute, no PPO reward or value model
        shown = ", ".join(f"rl.{k}" for k in trl_only)
        out.append(f"{shown} set but not used: TRL's trainer settings, not read under framework verl")
    out += _accelerate_unused(s)
    if s.software.unsloth is not None and s.task != "train":
        out.append(f"not modelled: software.unsloth with task {s.task}: Unsloth's inference path "
                   "(FastLanguageModel.for_inference) is read for training only; the estimate is transformers' / the "
                   "engine's own")
    if s.task == "train" and s.train.use_cache is not None and (why := _use_cache_unread(s)):
        out.append(f"train.use_cache set but not used: {why}")
    sft_read = s.train.objective == "sft" and s.effective_framework == "hf-trainer" and s.train.loss == "standard"
    if s.software.trl is not None and not (s.task == "train" and (s.train.objective != "sft" or sft_read)):
        # software.trl picks the post-training trainers' release (facts/trl.py) and SFTTrainer's loss under the HF
        # Trainer with the standard loss (analytic/trl_sft.py); anywhere else it changes nothing
        out.append("software.trl set but not used: it is read only with task train, for a post-training "
                   "train.objective (dpo, grpo, kto, orpo, ppo, rloo) or for SFTTrainer's loss (objective sft under "
                   "framework hf-trainer with train.loss standard)")
    return out


def _accelerate_unused(s: Scenario) -> list[str]:
    """``train.trainer_mixed_precision`` and ``software.accelerate`` are read only for a training job under FSDP with the
    HF Trainer or accelerate (spec/load.py ``fsdp_upcast_for``); set anywhere else they change nothing, said so."""
    under_fsdp = (s.task == "train" and s.effective_framework in ("hf-trainer", "accelerate")
                  and s.parallel.fsdp != "none")
    out: list[str] = []
    # PEFT reads it only under framework accelerate (FSDP2 of accelerate 1.6-1.12 casts the frozen base)
    reads_flag = under_fsdp and (s.train.peft is None or s.effective_framework == "accelerate")
    if s.train.trainer_mixed_precision is not None and not reads_flag:
        out.append("train.trainer_mixed_precision set but not used: it is read only under FSDP with framework hf-trainer "
                   "(a full fine-tune) or accelerate (accelerate's upcast of half-precision weights)")
    if s.software.accelerate is not None and not under_fsdp:
        out.append("software.accelerate set but not used: it is read only for a training job under FSDP with "
                   "framework hf-trainer or accelerate")
    return out


def _fp8_uses(s: Scenario) -> list[tuple[str, frozenset[str]]]:
    """(setting, architectures that run it) for each fp8 setting of the scenario's task."""
    uses: list[tuple[str, frozenset[str]]] = []
    if s.task == "train" and s.train.precision == "fp8-mixed":
        uses.append(("train.precision: fp8-mixed (Transformer Engine)", FP8_COMPUTE_ARCHITECTURES))
    if s.task == "train" and s.train.precision == "fp8-torchao":
        # torchtitan's Float8Converter: has_cuda_capability(8, 9) (or ROCm gfx942) else ValueError "float8 is only
        # supported on SM89 or later"; torchao's _scaled_mm kernels need the same fp8 tensor cores
        uses.append(("train.precision: fp8-torchao (torchao float8 training)", FP8_COMPUTE_ARCHITECTURES))
    if s.task == "inference" and s.inference.quantization == "fp8":
        uses.append(("inference.quantization: fp8", FP8_COMPUTE_ARCHITECTURES))
    if s.task == "serve" and s.serve.quantization == "fp8":
        uses.append(("serve.quantization: fp8", VLLM_FP8_WEIGHT_ARCHITECTURES))
    return uses


def capability_problems(s: Scenario, gpu: GpuSpec) -> list[Problem]:
    """What the GPU's generation cannot run: fp8 below Ada/Hopper (vLLM's weight-only fp8: below Ampere), and
    an explicit bf16 vLLM engine before Ampere (vLLM's ``_check_if_gpu_supports_dtype`` raises "Bfloat16 is
    only supported on GPUs with compute capability of at least 8.0").  A GPU of unknown generation (a
    custom capacity) is not checked."""
    arch = gpu.architecture
    if arch == "unknown":
        return []
    out = [Problem(setting.split(":")[0], f"{setting.split(': ')[1]} needs fp8 support, which {gpu.name} ({arch}, "
                   f"compute capability {gpu.compute_capability}) lacks",
                   "use a Hopper/Ada or newer GPU (hardware.gpu), or a 16-bit setting")
           for setting, archs in _fp8_uses(s) if arch not in archs]
    out += _mx_capability_problems(s, gpu)
    # a value, not the key's presence: the default auto is resolved to fp16 there (served_dtype), so only a bf16
    # given is refused, as vLLM refuses --dtype bfloat16 there (_check_if_gpu_supports_dtype, 0.8.5 and 0.9.0)
    if s.task == "serve" and s.serve.engine != "llamacpp" and arch in PRE_AMPERE and s.serve.dtype == "bf16":
        out.append(Problem("serve.dtype", f"vLLM refuses bf16 on {gpu.name} (compute capability "
                           f"{gpu.compute_capability} < 8.0)", "set serve.dtype: fp16 (the same bytes) or auto"))
    return out


def _mx_capability_problems(s: Scenario, gpu: GpuSpec) -> list[Problem]:
    """torchao MXFP8 training below compute capability 10.0: torchtitan's ``MXLinearConverter`` asserts
    ``has_cuda_capability(10, 0)`` ("MXFP8 is only supported on SM100 or architectures"); torchao 0.14.1 builds its
    ``mxfp8_cuda`` cast kernel only for SM100 and its cuBLAS MX gemm is Blackwell's (facts/mx_training.py).  The
    nearest working setting on an fp8 GPU is torchao float8 training."""
    if not (s.task == "train" and s.train.precision == "mxfp8-torchao"):
        return []
    cap = gpu.cuda_capability
    if cap is not None and cap >= MX_MIN_CAPABILITY:
        return []
    need = ".".join(map(str, MX_MIN_CAPABILITY))
    nearest = ("set train.precision: fp8-torchao (torchao float8 training, compute capability 8.9 and up)"
               if gpu.architecture in FP8_COMPUTE_ARCHITECTURES else "set train.precision: bf16-mixed")
    return [Problem("train.precision", f"mxfp8-torchao (torchao MXFP8 training) needs an NVIDIA GPU of compute "
                    f"capability {need} or above (torchtitan MXLinearConverter: has_cuda_capability(10, 0)), which "
                    f"{gpu.name} ({gpu.architecture}, compute capability {gpu.compute_capability}) is not",
                    f"{nearest}, or use a B200/B100 (hardware.gpu)")]


def capability_notes(s: Scenario, gpu: GpuSpec) -> list[str]:
    """Assumptions to state when a setting runs on this GPU but not as asked: bf16 before Ampere."""
    if gpu.architecture not in PRE_AMPERE:
        return []
    if s.task == "serve":
        # what vLLM runs there is fp16 (a bf16 given is refused, capability_problems); said by value, so that the
        # report's scenario, which holds the resolved fp16, reads the same
        return [_half_serving_note(s, gpu)] if s.serve.engine == "vllm" and served_dtype(s, gpu) == "fp16" else []
    where = {"train": s.train.precision.startswith("bf16"), "inference": s.inference.dtype == "bf16"}
    if not where[s.task]:
        return []
    return [(f"{gpu.name} ({gpu.architecture}) has no bf16 tensor cores (compute capability "
             f"{gpu.compute_capability} < 8.0): PyTorch runs bf16 emulated, with the same bytes but far slower")]


def _half_serving_note(s: Scenario, gpu: GpuSpec) -> str:
    """The assumption of a vLLM engine serving fp16 on a GPU without bf16, by release (``AUTO_DTYPE_FALLBACK_FROM``)."""
    head = (f"{gpu.name} ({gpu.architecture}) has no bf16 support (compute capability {gpu.compute_capability} < 8.0): "
            "vLLM serves fp16 there")
    if parse_release(s.serve.vllm_version) >= AUTO_DTYPE_FALLBACK_FROM:
        how = ("--dtype auto casts a bf16 checkpoint to fp16 with a warning (from vLLM 0.9.0, vllm/config.py "
               "_get_and_verify_dtype: current_platform.supported_dtypes[0])")
    else:
        how = (f"vLLM {s.serve.vllm_version} refuses a bf16 checkpoint under --dtype auto (before 0.9.0: "
               "_check_if_gpu_supports_dtype), so --dtype float16 or an fp16 or fp32 checkpoint is assumed")
    return f"{head}; {how}; the bytes are the same as bf16's"


def number_problems(option: str, value: float | None, low: float, high: float, *,
                    low_open: bool = False, hint: str = "") -> list[Problem]:
    """``value`` (None: not given) must be a finite number in [low, high] (``low_open``: above ``low``)."""
    if value is None:
        return []
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(option, f"{value} is not a finite number", hint or f"give a number in [{low:g}, {high:g}]")]
    below = value <= low if low_open else value < low
    if below or value > high:
        span = f"({_num(low)}, {_num(high)}]" if low_open else f"[{_num(low)}, {_num(high)}]"
        return [Problem(option, f"{_num(value)} is outside {span}", hint or f"give a number in {span}")]
    return []


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _changed(part: BaseModel, keys: tuple[str, ...]) -> list[str]:
    """The keys among ``keys`` whose value differs from the field's default (a value equal to the default is
    what the scenario would hold without it: a scenario dumped with every field is judged like the one written)."""
    return changed_fields(part, keys)


def _noted(prefix: str, keys: list[str], why: str) -> list[str]:
    return [f"{', '.join(f'{prefix}.{k}' for k in keys)} set but not used: {why}"] if keys else []


def unused_settings(s: Scenario) -> list[str]:
    """Assumptions for settings that this job does not read, each naming the key (docs/conventions.md, No silent
    inputs): what the scenario describes does not have the part they configure (another task's phases, a
    feature left off), so the estimate is the job's as described and the band is not widened.  One entry states
    what a setting does that the estimate reads only through the default fraction (SGLang without CUDA graphs)."""
    return [*_unused_parallel(s), *_unused_software(s), *_unused_task_keys(s), *_replicas(s)]


def _unused_parallel(s: Scenario) -> list[str]:
    par, out = s.parallel, []
    if s.task != "train":
        # sharding and offload of a training job's states; generate reads zero_stage (ZeRO-3 inference) and
        # offload, serving refuses offload (spec.load cross_check), neither splits activations over tp
        keys = ("fsdp", "cp", "sequence_parallel", "offload_device", "deepspeed") if s.task == "inference" else (
            "zero_stage", "fsdp", "cp", "sequence_parallel", "offload_device", "deepspeed")
        return _noted("parallel", _changed(par, keys), f"task {s.task} does not read a training job's sharding, "
                      "context or sequence parallelism, or offload device")
    if par.sequence_parallel and par.tp == 1:
        out += _noted("parallel", ["sequence_parallel"], "it splits the norm and residual tensors over the tp "
                      "ranks, and parallel.tp is 1")
    if par.offload == "none":
        out += _noted("parallel", _changed(par, ("offload_device",)), "parallel.offload is none")
    return out + _unused_deepspeed(s)


_DS_STAGE3_KEYS = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                   "stage3_param_persistence_threshold")


def _unused_deepspeed(s: Scenario) -> list[str]:
    """``parallel.deepspeed`` keys this job does not read (analytic/terms/deepspeed.py)."""
    par = s.parallel
    ds = par.deepspeed
    if ds is None:
        return []
    given = [k for k in type(ds).model_fields if getattr(ds, k) is not None]
    if par.zero_stage == 0 or par.fsdp != "none":
        return _noted("parallel.deepspeed", given, "DeepSpeed ZeRO does not run (parallel.zero_stage 0, or fsdp)")
    out = _noted("parallel.deepspeed", [k for k in given if k == "allgather_bucket_size"],
                 "DeepSpeed gathers the updated partitions with all_gather_into_tensor, without a bucket "
                 "(deepspeed 0.19.8 runtime/utils.py all_gather_dp_groups)")
    if par.zero_stage < 3:
        out += _noted("parallel.deepspeed", [k for k in given if k in _DS_STAGE3_KEYS], "ZeRO-3 settings, and "
                      f"parallel.zero_stage is {par.zero_stage}")
    elif ds.overlap_comm is not None:
        out += _noted("parallel.deepspeed", ["overlap_comm"], "at ZeRO-3 it picks the stream the reduction runs "
                      "on and allocates nothing (stage3.py reduce_and_partition_stream)")
    return out


def _unused_software(s: Scenario) -> list[str]:
    """Library releases no behaviour of this job reads (the behaviours each gates: spec/scenario.py Software)."""
    sw = s.software
    if s.task == "serve":
        return _noted("software", _changed(sw, ("bitsandbytes", "peft", "transformers", "torch", "expandable_segments",
                                                "torchtune", "torchtitan")),
                      "a serving engine's start-up follows its own release (serve.vllm_version, serve.sglang_version, "
                      "serve.gguf.llamacpp_build)")
    out = []
    if sw.torchtitan is not None and not torchtitan_fsdp2(s):
        out += _noted("software", ["torchtitan"], "only torchtitan's FSDP units depend on it (framework torchtitan, "
                      "parallel.fsdp full_shard or hybrid_shard over more than one GPU, one pipeline stage, no PEFT "
                      "or offload); --export's torchtitan.toml takes its job-config layout")
    tune = s.task == "train" and s.effective_framework == "torchtune"
    if sw.torchtune is not None and not tune:
        out += _noted("software", ["torchtune"], "it is read only with task train under framework torchtune")
    if tune:
        # torchtune stores QLoRA's base in torchao's NF4Tensor and builds its own LoRA layers (facts/torchtune.py)
        out += _noted("software", _changed(sw, ("bitsandbytes", "peft")), "torchtune quantizes with torchao's "
                      "NF4Tensor and builds its own LoRA layers (framework torchtune)")
        return out
    if sw.bitsandbytes is not None and not (s.task == "train" and s.train.quantization in bnb_formats(bits=4)):
        out += _noted("software", ["bitsandbytes"], "only a 4-bit training linear's saved input depends on it "
                      "(train.quantization nf4, nf4-dq or fp4)")
    if sw.peft is not None and not (s.task == "train" and s.train.peft is not None):
        out += _noted("software", ["peft"], "no adapters are trained (train.peft)")
    if sw.expandable_segments is not None and s.task != "train":
        out += _noted("software", ["expandable_segments"], "only a training step's allocator replay reads it")
    return out


def _unused_task_keys(s: Scenario) -> list[str]:
    """Keys of the task's own section that another of its keys turns off."""
    out = []
    if s.task == "train" and s.train.images_per_sample == 0:
        out += _noted("train", _changed(s.train, ("image_size",)), "no images (train.images_per_sample is 0)")
    if s.task == "inference":
        inf = s.inference
        if inf.images_per_sample == 0:
            out += _noted("inference", _changed(inf, ("image_size",)), "no images (inference.images_per_sample is 0)")
        if inf.quantization not in bnb_formats(bits=4):
            out += _noted("inference", _changed(inf, ("bnb_compute_dtype",)),
                          "no bitsandbytes 4-bit weights (inference.quantization)")
    if s.task != "train":
        out += _noted("lifecycle", _changed(s.lifecycle, tuple(type(s.lifecycle).model_fields)),
                      "the lifecycle phases (load, evaluation, checkpoint save) are modelled for task train")
        if trainer_framework(s.framework) is not None:
            out.append(f"framework {s.framework} set but not used: it is read for training only (its own handling "
                       f"of a k-bit base); the {s.task} is estimated as under hf-trainer")
    return out + _unused_serve(s)


def _unused_serve(s: Scenario) -> list[str]:
    sv, out = s.serve, list[str]()
    if s.task != "serve":
        return out
    if sv.engine == "vllm" and sv.max_loras == 0:
        out += _noted("serve", _changed(sv, ("max_lora_rank",)), "LoRA serving is off (serve.max_loras is 0)")
    if sv.speculative is not None and sv.speculative.method == "ngram" and sv.speculative.model is not None:
        # vLLM's SpeculativeConfig sets model "ngram" for the n-gram proposer (config/speculative.py __post_init__)
        out += _noted("serve.speculative", ["model"], "the n-gram proposer loads no model")
    if sv.engine == "sglang" and not sv.cuda_graphs:
        # serve/sglang.py SGLANG_BEHAVIOURS graphs_off_prefill / graphs_off_decode (0.5.14, 0.5.15 wheels)
        out.append("serve.cuda_graphs false under engine sglang (--disable-cuda-graph): no graph is captured; the pool "
                   "is sized from mem_fraction_static either way, and from 0.5.14 (prefill graphs) and 0.5.15 "
                   "(decode graphs) the default fraction's reserve leaves the graphs out")
    return out


def _replicas(s: Scenario) -> list[str]:
    """Generate and serving with more GPUs than one model's tp x pp: each group runs its own copy."""
    group = s.parallel.tp * s.parallel.pp * (s.serve.dp if s.task == "serve" else 1)
    if s.task == "train" or s.hardware.num_gpus <= group:
        return []
    named = "tp x pp x serve.dp" if s.task == "serve" and s.serve.dp > 1 else "tp x pp"
    return [(f"hardware.num_gpus {s.hardware.num_gpus} with {named} = {group}: each group of {group} GPU(s) runs its "
             "own copy of the model (data parallel); the figures are per GPU")]
