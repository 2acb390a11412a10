"""The job's lifecycle on one GPU: the phases around the steady training step, each with its peak.

``max_memory_allocated``, ``max_memory_reserved`` and nvidia-smi report maxima over the whole process, so
a published peak can come from a phase other than the steady step (docs/lifecycle.md):

1. ``load`` (``load.py``): from_pretrained, per loading path (direct, fp32 then cast, quantize on load,
   sharded); its events are replayed through the caching-allocator model, so the blocks it frees stay
   cached in its reserved bytes; the host RAM it needs too;
2. ``peft preparation`` (``load.py``): ``prepare_model_for_kbit_training``'s fp32 casts, continuing the
   load's allocator;
3. ``first step`` (``steps.py``): optimizer states created at its ``optimizer.step()``;
4. the steady ``training step`` (analytic/train.py), which the caller adds;
5. ``evaluation`` (``evaluation.py``): no-grad forwards, kept logits, generation (Lit-GPT);
6. ``checkpoint save`` (``save.py``): gathers by state-dict type.

Each phase is its live terms plus its transients, as a ``Moment`` with the same declared keys as the
step's.  A phase's reserved bytes are the load's replay, or its tensors packed into empty segments (the
caching allocator reuses cached blocks of earlier phases first, so the job's reserved bytes are at least
the largest phase's; never released: nothing calls ``torch.cuda.empty_cache``).  The evaluation's, under the
allocator replay, are its forward replayed after the two steps (engine.py ``_evaluation_after_step``,
analytic/allocator.py ``reserved_after_step``): an evaluation batch larger than the micro-batch opens segments
beside the ones the steps cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramplan.analytic.allocator import reserved_for
from vramplan.analytic.events import StepLayout
from vramplan.analytic.lifecycle.evaluation import (
    eval_batch_size,
    eval_builds_cache,
    eval_cache_fused_views,
    eval_generates,
    eval_runs,
    evaluation_phase,
)
from vramplan.analytic.lifecycle.load import (
    host_load_bytes,
    load_mode,
    load_peaks,
    load_plan,
    prepares_kbit,
    upcasts_half_base,
)
from vramplan.analytic.lifecycle.save import save_phase, state_dict_type
from vramplan.analytic.lifecycle.steps import between_steps, device_states_bytes, first_step
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.resident import hf_buffer_bytes
from vramplan.analytic.terms.saved import use_cache_off_by
from vramplan.spec.defaults import expandable_segments
from vramplan.spec.fields import changed_fields
from vramplan.spec.scenario import Lifecycle

__all__ = ["LIFECYCLE_ORDER", "OPENRLHF_ORDER", "VERL_ORDER", "JobLifecycle", "PhasePeak", "job_lifecycle", "packed_reserved"]

# the report's lifecycle phases, in the order a job runs them (the steady step's name is "training step")
LIFECYCLE_ORDER = ("load", "peft preparation", "first step", "rollout", "scoring", "training step", "evaluation",
                   "checkpoint save", "weight sync", "reference scoring")
# verl's phases (analytic/verl.py) in the order an iteration runs them; the names appended above, so the order of
# the phases every other job reports stays as it was
VERL_ORDER = ("weight sync", "rollout", "scoring", "reference scoring", "training step")
# OpenRLHF's (analytic/openrlhf.py): the experience first, then the update, then the weights to the engines
# (ppo_trainer.py ppo_train: the critic's fit before the actor's; experience_maker.py make_experience: reward, actor,
# critic, reference)
OPENRLHF_ORDER = ("rollout", "reward scoring", "scoring", "critic scoring", "reference scoring",
                  "critic training step", "training step", "weight sync")


@dataclass(frozen=True)
class PhasePeak:
    """One phase: its content at its highest point, its reserved bytes, and whether it runs before the
    process has its communicators and cuBLAS handles (load, preparation)."""

    name: str
    moment: Moment
    reserved_bytes: int
    before_step: bool = False


@dataclass
class JobLifecycle:
    phases: list[PhasePeak]
    host_load_bytes: int
    assumptions: list[str] = field(default_factory=list)


def packed_reserved(mo: Moment, expandable: bool = False) -> int:
    """A moment's tensors packed into empty allocator segments (``reserved_for``; expandable segments: mapped
    pages), at least their total."""
    sizes = [(nbytes, 1) for part in mo.parts.values() for nbytes in part.values()]
    return max(reserved_for(sizes, expandable_segments=expandable), mo.total)


def _load_phases(c: StepContext) -> list[PhasePeak]:
    load, prep = load_peaks(load_plan(c))
    # the buffers an older transformers release registers when it builds the model exist before any weight is
    # loaded (analytic/hf_buffers.py), in blocks of their own
    rope, mask = hf_buffer_bytes(c)
    out = [PhasePeak("load", _with_buffers(load.moment("load"), rope, mask), load.reserved_bytes + rope + mask, True)]
    if prep is not None:
        out.append(PhasePeak("peft preparation", _with_buffers(prep.moment("peft preparation"), rope, mask),
                             prep.reserved_bytes + rope + mask, True))
    return out


def _with_buffers(mo: Moment, rope: int, mask: int) -> Moment:
    mo.add(K.HF_ROPE_BUFFERS, rope)
    mo.add(K.HF_CAUSAL_MASK, mask)
    return mo


def job_lifecycle(c: StepContext, lay: StepLayout, terms: list[Term], moments: list[Moment]) -> JobLifecycle:
    """Every phase of the job but the steady step, for the rank ``c`` (the step's peak stage)."""
    phases = _load_phases(c)
    # in the backward each parameter's optimizer creates its states at its own first step(), inside the first
    # backward: a moment of it holds some of the states, at most the steady moment, which bounds it
    fs = first_step(moments, 0 if c.in_backward else device_states_bytes(terms))
    expandable = expandable_segments(c.s)
    phases.append(PhasePeak("first step", fs, packed_reserved(fs, expandable)))
    resident = between_steps(terms, "evaluation")
    if eval_runs(c):
        ev = evaluation_phase(c, lay, resident)
        phases.append(PhasePeak("evaluation", ev, packed_reserved(ev, expandable)))
    if c.s.lifecycle.checkpoint_save:
        sv = save_phase(c, resident)
        phases.append(PhasePeak("checkpoint save", sv, packed_reserved(sv, expandable)))
    return JobLifecycle(phases, host_load_bytes(c), _assumptions(c))


def _assumptions(c: StepContext) -> list[str]:
    lc = c.s.lifecycle
    mode = load_mode(c)
    load = {
        "direct": "each tensor in the dtype the step holds it (from_pretrained with torch_dtype, or transformers "
                  ">= 5's dtype='auto' default; Lit-GPT's load_checkpoint)",
        "fp32-cast": "fp32 onto the GPU (transformers < 5 without torch_dtype), then cast one parameter at a time "
                     "(Module._apply): the fp32 blocks stay cached",
        "quantize": "each linear as a half-precision copy on the GPU, quantized there by bitsandbytes "
                    "(Params4bit._quantize / Int8Params.cuda); the copies' blocks stay cached",
        "litgpt": "Lit-GPT under Lightning's BitsandbytesPrecision: every linear, the LM head included (its own "
                  "nn.Linear, made first), built on the GPU in the precision's dtype and quantized in its "
                  "constructor beside a float16 copy, then quantized again from the checkpoint one linear at a time, "
                  "a float16 copy beside the whole quantized model (lit-gpt 8641822 finetune/lora.py main, "
                  "lit_gpt/utils.py load_checkpoint; lightning 71aed75 _Linear4bit._quantize_weight, "
                  "_quantize_on_load_hook); set lifecycle.quantize_at_init false for a model built off the GPU",
        "torchtune": "torchtune builds the model on the GPU in its dtype, each NF4 linear quantized by to_nf4 in its "
                     "constructor, then load_state_dict quantizes each checkpoint tensor again from its GPU copy, one "
                     "linear at a time beside the whole quantized model (recipes/lora_finetune_single_device.py "
                     "_setup_model; torchao NF4Tensor copy_); the whole checkpoint is read into host RAM "
                     "(FullModelHFCheckpointer.load_checkpoint)",
        "quantize-partition": "a bitsandbytes model under DeepSpeed ZeRO-3 is not built under zero.Init "
                              "(transformers get_init_context: is_deepspeed_zero3_enabled() and not is_quantized): "
                              "each rank quantizes the whole model on its GPU (Params4bit._quantize, device_map "
                              "{'': current_device}), and deepspeed.initialize partitions it afterwards "
                              "(zero.Init(module=...)); the freed blocks stay cached",
        "whole-partition": "a model not built under zero.Init (lifecycle.zero_init false): deepspeed.initialize "
                           "casts it to the half dtype, moves it to the GPU whole (DeepSpeedEngine."
                           "_configure_distributed_model: module.to(device)) and partitions it there "
                           "(zero.Init(module=...)); ZeRO-3's defragment empties the cache afterwards, so the step "
                           "starts from an empty one",
        "sharded": "unit by unit, full on the GPU only while it is sharded (FSDP flatten + shard; DeepSpeed "
                   "zero.Init with GatheredParameters per module)",
        "offloaded": "parameters offloaded: each unit passes through the GPU while it is partitioned to the host",
    }[mode]
    out = [(f"lifecycle, load: {load}; host RAM per process at the load's peak counted "
           f"(device_map {lc.device_map or 'framework default'})")]
    if upcasts_half_base(c):
        out.append("lifecycle, peft preparation: axolotl upcasts the embeddings, LM head and norms to fp32 after "
                   "loading, then casts them back to the model's dtype for the adapter, each new copy beside the old "
                   "(loaders/model.py _configure_embedding_dtypes)")
    elif prepares_kbit(c):
        back = ("; then axolotl converts the norms and embeddings back to the model's dtype, each half copy beside "
                "its fp32 one" if c.casts_back else
                "; then DeepSpeed's engine casts them back to its half dtype at initialize, each half copy beside its "
                "fp32 one" if not c.kbit else "")
        out.append("lifecycle, peft preparation: prepare_model_for_kbit_training casts each non-quantized "
                   f"parameter to fp32 beside its half original (peft utils/other.py){back}")
    if c.in_backward:
        out.append("lifecycle, first step: each parameter's optimizer creates its states at its first step() in "
                   "the first backward, so the first step is bounded by the steady step (counted as it)")
    else:
        out.append("lifecycle, first step: optimizer states are created at its optimizer.step() (torch "
                   "AdamW._init_group), so it peaks no higher than the steady step")
    out += _evaluation_assumptions(c)
    if lc.checkpoint_save:
        out.append(f"lifecycle, checkpoint save: state dict {state_dict_type(c)} for a sharded model (FSDP "
                   "_full_post_state_dict_hook clones without offload_to_cpu; accelerate's and Lightning's "
                   "FullStateDictConfig(offload_to_cpu=True, rank0_only=True); DeepSpeed save_checkpoint); an unsharded "
                   "one is written from its parameters' storage (docs/lifecycle.md)")
        if state_dict_type(c) == "full" and c.framework != "deepspeed" and lc.save_optimizer:
            out.append("lifecycle, checkpoint save: the optimizer is saved after the model with the same type, "
                       "its full state dict gathered on the GPU (FullOptimStateDictConfig defaults to "
                       "offload_to_cpu=False; FSDP _allgather_orig_param_states); the save peaks at the larger gather")
    out.append("lifecycle: the job's reserved bytes are the largest phase's (the load replayed through the "
               "allocator, other phases packed); blocks cached by earlier phases are assumed reused"
               + ("; the evaluation's forward is replayed after the two steps' stream (reserved-bytes model replay): "
                  "its tensors take blocks the steps cached where large enough and open segments beside them "
                  "otherwise, as nothing calls torch.cuda.empty_cache between" if eval_runs(c) else ""))
    return out + _unused_eval(c) + _unused_save(c) + _unused_load(c, mode)


def _evaluation_assumptions(c: StepContext) -> list[str]:
    """What the evaluation phase assumes (none: said so, with the key that turns it on)."""
    lc, out = c.s.lifecycle, []
    if not eval_runs(c):
        return [("lifecycle, evaluation: none (the HF Trainer's default eval_strategy='no'; accelerate, DeepSpeed, "
                 "torchtitan and plain loops evaluate only where the script does; set lifecycle.evaluation)")]
    gen = f", then {eval_generates(c)} tokens generated with a full-length KV cache (Lit-GPT generate_example)" \
        if eval_generates(c) else ""
    kept = ("every batch's logits kept on the GPU" + (f", moved to the CPU every {lc.eval_accumulation_steps}"
                                                      if lc.eval_accumulation_steps else "")
            if lc.eval_keeps_logits else "no logits kept (no compute_metrics)")
    length = f" of {lc.eval_seq_len:,} tokens" if lc.eval_seq_len is not None else ""
    off = use_cache_off_by(c.s) if c.m.encoder_decoder is None and not c.m.encoder_only else None
    fp32 = (" in fp32, as bitsandbytes' linears return the prepared model's fp32 hidden states"
            if c.act.elementwise_bytes == 4 else "")
    cache = (f", each forward's KV cache held to its end{fp32} (use_cache on: train.use_cache, else the config's; "
             "set train.use_cache: false where the script turns it off)" if eval_builds_cache(c) else
             f", no KV cache in its forwards ({_CACHE_OFF[off]})" if off else "")
    out.append(f"lifecycle, evaluation: no-grad forwards of {eval_batch_size(c)} sequences{length}{cache}, {kept}"
               f"{gen} (HF Trainer.evaluation_loop / Lit-GPT validate)")
    if eval_cache_fused_views(c):
        out.append(f"not modelled: the evaluation cache of {c.m.family}'s fused q/k/v projection before "
                   "transformers 4.56 holds views that keep each layer's whole projection output alive (1.5x the "
                   "keys and values counted with GPT-2's split, 2x with GPT-NeoX's rotated key beside it)")
    return out


# why an evaluation forward builds no cache whatever the model's config (terms/saved.py use_cache_off_by)
_CACHE_OFF = {
    "trl": "TRL's SFTTrainer from 0.22 passes use_cache=False to every forward",
    "trainer": "the HF Trainer from transformers 5.0 writes TrainingArguments.use_cache, False by default, into the "
               "config; set train.use_cache: true if the arguments set it",
    "trl-load": "TRL 0.15-0.16 load a model named by id with use_cache=False under gradient checkpointing; set "
                "train.use_cache: true if the script passed a model object",
}

_EVAL_KEYS = ("eval_batch_size", "eval_keeps_logits", "eval_batches", "eval_accumulation_steps", "eval_seq_len",
             "eval_generate_tokens")


def _given(part: Lifecycle, keys: tuple[str, ...]) -> list[str]:
    """The keys among ``keys`` whose value differs from the field's default, as dotted names.  A value equal
    to the default is what the scenario would have without it, so a scenario dumped with every field (the
    planner's and solvers' documents, a report's ``scenario``) is judged like the one the user wrote."""
    return [f"lifecycle.{k}" for k in changed_fields(part, keys)]


def _unused_eval(c: StepContext) -> list[str]:
    """Evaluation settings that no evaluation reads (docs/conventions.md, No silent inputs).  With
    ``lifecycle.evaluation`` left to the framework's default (off but under Lightning) they describe an
    evaluation the estimate leaves out, so they widen the band (``not modelled``); with evaluation set false
    they are merely unused."""
    lc = c.s.lifecycle
    if not eval_runs(c):
        given = _given(lc, _EVAL_KEYS)
        if not given:
            return []
        shown = ", ".join(given)
        if lc.evaluation is None:
            return [(f"not modelled: {shown} given, but {c.framework}'s loop runs no evaluation by default, so no "
                     "evaluation phase is counted (set lifecycle.evaluation: true to count it)")]
        return [f"{shown} set but not used: lifecycle.evaluation is false"]
    out = []
    if lc.eval_keeps_logits and c.framework == "lightning":
        out.append("lifecycle.eval_keeps_logits set but not used: Lit-GPT's validate keeps only each batch's loss")
    elif lc.eval_keeps_logits and c.framework != "hf-trainer":
        out.append(f"not modelled: lifecycle.eval_keeps_logits under {c.framework} (logits a custom evaluation loop "
                   "keeps; only the HF Trainer's evaluation_loop is modelled keeping them)")
    if lc.eval_keeps_logits and c.framework == "hf-trainer":
        return out
    # without kept logits each batch's tensors are freed before the next (evaluation.py _kept_logits)
    given = _given(lc, ("eval_batches", "eval_accumulation_steps"))
    return out + ([(f"{', '.join(given)} set but not used: no logits are kept between evaluation batches "
                    "(the HF Trainer with lifecycle.eval_keeps_logits)")] if given else [])


def _unused_save(c: StepContext) -> list[str]:
    """Save settings the save does not read: no save, an unsharded model (written from its parameters'
    storage, save.py ``save_phase``), or a save that gathers no optimizer state."""
    lc = c.s.lifecycle
    given = _given(lc, ("state_dict_type", "save_optimizer"))
    if not given:
        return []
    if not lc.checkpoint_save:
        why = "lifecycle.checkpoint_save is false"
    elif c.shards[2] <= 1 or c.offload_params:
        why = ("the parameters are unsharded (or offloaded to the host), so the save gathers no copy on the GPU "
               "(save.py save_phase; docs/lifecycle.md)")
    elif "lifecycle.save_optimizer" in given and (state_dict_type(c) != "full" or c.framework == "deepspeed"):
        given, why = ["lifecycle.save_optimizer"], "only a full state dict outside DeepSpeed gathers the optimizer's state"
    else:
        return []
    return [f"{', '.join(given)} set but not used: {why}"]


def _unused_load(c: StepContext, mode: str) -> list[str]:
    """Load settings the loading path does not read."""
    lc, out = c.s.lifecycle, []
    if lc.load_dtype == "fp32" and mode != "fp32-cast":
        why = {"quantize": "with bitsandbytes, from_pretrained given no torch_dtype loads float16 "
                           "(transformers Bnb4BitHfQuantizer / Bnb8BitHfQuantizer.update_torch_dtype, 4.38-4.57)",
               "direct": "the step holds its weights in fp32, so an fp32 load is the direct one",
               "whole-partition": "deepspeed.initialize casts the host model to the half dtype before it moves it to "
                                  "the GPU (DeepSpeedEngine._configure_distributed_model), so no fp32 copy reaches "
                                  "the GPU"}.get(mode)
        out.append(f"lifecycle.load_dtype fp32 set but not used: {why}" if why else
                   f"not modelled: lifecycle.load_dtype fp32 on the {mode} loading path (its tensors are counted in "
                   "the dtype the step holds them)")
    par = c.s.parallel
    if lc.zero_init is not None and not (par.zero_stage == 3 and c.s.deepspeed_engine and c.quant == "none"):
        out.append("lifecycle.zero_init set but not used: only DeepSpeed ZeRO-3 partitions a model at load, and "
                   "transformers never builds a bitsandbytes one under zero.Init")
    if lc.quantize_at_init and mode not in ("litgpt", "torchtune"):
        # load.py quantizes_at_init: a bitsandbytes 4-bit base, unsharded, parameters on the GPU
        out.append("lifecycle.quantize_at_init set but not used: only a bitsandbytes 4-bit base held whole on the "
                   "GPU is quantized as it is built")
    return out
