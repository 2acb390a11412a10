"""What framework megatron (Megatron-LM training its own GPT model with Megatron-Core) can mean, and the refusals of
what it cannot (facts/megatron.py names the release read).

Modelled: task train, objective sft (pretraining or supervised fine-tuning: the same step), full training (no
adapters), ``--bf16`` (``precision: bf16-mixed``) or fp32, ``--optimizer adam`` (``adamw-fused``: Transformer Engine's
FusedAdam) or ``sgd`` (``sgd-momentum``), tensor, sequence, pipeline (1f1b), context and expert parallelism, the
distributed optimizer (``parallel.megatron.use_distributed_optimizer``), Megatron's interleaved schedule
(``megatron_schedule_problems``) and these recompute settings:

* ``gradient_checkpointing: selective`` (or ``attention-core``): ``--recompute-granularity selective`` with the default
  ``--recompute-modules core_attn``, Korthikanti et al.'s selective recompute (arXiv 2205.05198 sec. 5);
* ``gradient_checkpointing: full``: ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``
  (each layer keeps its input and is recomputed alone in its backward);
* ``none``: no ``--recompute-*`` argument.

Refused: ``--recompute-method uniform`` with more than one layer per unit and ``--recompute-method block`` (a unit of
n layers recomputed at once, or only the first n layers of a stage: ``checkpoint_every_n_layers`` is torchtitan's every
n-th layer, another layout), adapters and quantized bases, other precisions and optimizers, the losses and kernels of
other libraries, ZeRO / FSDP / offload (Megatron's own sharding is the distributed optimizer), and tasks other than
train.
"""

from __future__ import annotations

from vramplan.errors import Problem
from vramplan.facts.megatron import MEGATRON_OPTIMIZERS, MEGATRON_PRECISIONS, READ_AT
from vramplan.spec.defaults import checkpointing
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = ["megatron_problems", "megatron_schedule_problems", "megatron_unmodelled"]

_TRAIN_ONLY = "use task: train (Megatron-LM's pretrain_gpt.py), or another framework (framework: vllm / hf-trainer)"


def megatron_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """The refusals of a framework megatron scenario (module docstring), and of ``parallel.megatron`` elsewhere."""
    if s.effective_framework != "megatron":
        if s.parallel.megatron is not None:
            return [Problem("parallel.megatron", f"Megatron-Core's settings are read only under framework megatron "
                            f"(here {s.effective_framework})", "set framework: megatron, or remove parallel.megatron")]
        return []
    if s.task != "train":
        return [Problem("framework", f"framework megatron is modelled for task train only (Megatron-LM's training "
                        f"step, read at {READ_AT}); task {s.task} is not", _TRAIN_ONLY)]
    return [*_model_refusals(m), *_train_refusals(s), *_parallel_refusals(s), *_checkpointing_refusals(s)]


def _model_refusals(m: ModelSpec) -> list[Problem]:
    """Megatron-Core's GPTModel is a decoder-only text transformer: an encoder, an encoder-decoder or a vision
    tower is another of its models (BERT, T5, LLaVA), not modelled here."""
    kind = ("an encoder-only" if m.encoder_only else "an encoder-decoder" if m.encoder_decoder is not None else
            "a vision-language" if m.vision is not None else "")
    if not kind:
        return []
    return [Problem("model", f"{m.name} is {kind} model; framework megatron is modelled for Megatron-Core's GPT "
                    "(decoder-only text) model", "use a decoder-only text model, or framework: hf-trainer")]


def megatron_unmodelled(s: Scenario, m: ModelSpec) -> list[str]:
    """What a framework megatron estimate counts with the engine's own rules, said (``not modelled: ``)."""
    if s.effective_framework != "megatron" or s.task != "train":
        return []
    out = [("not modelled: the load and checkpoint-save phases of Megatron-LM's own checkpointing "
           "(megatron/training/checkpointing.py); the lifecycle phases are estimated by the Hugging Face path's rules")]
    if any(ls.moe for ls in m.layers):
        out.append("not modelled: Megatron-Core's MoE token dispatcher and grouped expert GEMMs "
                   "(megatron/core/transformer/moe); the routed experts are counted as the engine's MoE layers")
    if m.mamba is not None:
        out.append("not modelled: Megatron-Core's MambaModel; the Mamba mixers are counted as transformers' layers")
    return out


def _train_refusals(s: Scenario) -> list[Problem]:
    t, out = s.train, []
    if t.peft is not None:
        out.append(Problem("train.peft", "framework megatron trains every parameter here: Megatron-LM's "
                           "pretrain_gpt.py has no adapters (NeMo's PEFT is another framework)",
                           "remove train.peft, or use framework: hf-trainer"))
    if t.objective != "sft":
        out.append(Problem("train.objective", f"objective {t.objective} is not a Megatron-LM training step here "
                           "(pretraining or SFT: objective sft)", "use objective: sft, or framework: hf-trainer (TRL)"))
    if t.precision not in MEGATRON_PRECISIONS:
        out.append(Problem("train.precision", f"framework megatron is modelled with --bf16 (bf16-mixed: bf16 "
                           f"parameters, fp32 grad buffer and main parameters) or fp32; {t.precision} is not one of "
                           "them (--fp16's fp32 copies of the main gradients, Transformer Engine's fp8 and the other "
                           "libraries' precisions are not modelled)", "use precision: bf16-mixed or fp32"))
    if t.optimizer not in MEGATRON_OPTIMIZERS:
        names = ", ".join(f"{k} (--optimizer {v})" for k, v in MEGATRON_OPTIMIZERS.items())
        out.append(Problem("train.optimizer", f"Megatron-LM's --optimizer runs Transformer Engine's FusedAdam or "
                           f"FusedSGD (megatron/core/optimizer/__init__.py); {t.optimizer} is not one of them: "
                           f"{names}", "use optimizer: adamw-fused (Megatron's adam), or framework: hf-trainer"))
    others = [(name, on) for name, on in (
        ("train.loss", t.loss != "standard"), ("train.liger_kernels", t.liger_kernels),
        ("train.packing", t.packing), ("train.activation_offload", t.activation_offload != "none"),
        ("train.torch_compile", t.torch_compile), ("train.optimizer_in_backward", t.optimizer_in_backward),
        ("train.torchao_cpu_offload", t.torchao_cpu_offload != "none"), ("train.attention", t.attention == "eager"),
        ("train.deepspeed_checkpointing", t.deepspeed_checkpointing != "none")) if on]
    for name, _ in others:
        out.append(Problem(name, f"{name} is another library's option; framework megatron runs Megatron-Core's own "
                           "GPT model, loss (vocabulary-parallel cross-entropy) and fused attention",
                           f"leave {name} at its default, or use another framework (framework: hf-trainer)"))
    return out


def _parallel_refusals(s: Scenario) -> list[Problem]:
    par, out = s.parallel, []
    for name, on in (("parallel.zero_stage", par.zero_stage != 0), ("parallel.fsdp", par.fsdp != "none"),
                     ("parallel.offload", par.offload != "none"), ("parallel.deepspeed", par.deepspeed is not None)):
        if on:
            out.append(Problem(name, f"framework megatron shards with its distributed optimizer, not DeepSpeed's ZeRO "
                               f"or PyTorch FSDP ({name} is not read)", f"remove {name}; set "
                               "parallel.megatron.use_distributed_optimizer: true for Megatron's ZeRO-1 layout"))
    return out


def _checkpointing_refusals(s: Scenario) -> list[Problem]:
    t, g = s.train, checkpointing(s)
    out = []
    if g == "op-sac":
        out.append(Problem("train.gradient_checkpointing", "op-sac is torchtitan's op-level selective checkpointing; "
                           "Megatron-LM's selective recompute is core_attn (gradient_checkpointing: selective)",
                           "use gradient_checkpointing: selective, full or none"))
    if t.checkpoint_every_n_layers > 1:
        out.append(Problem("train.checkpoint_every_n_layers", f"Megatron-LM's --recompute-method uniform with "
                           f"--recompute-num-layers {t.checkpoint_every_n_layers} recomputes units of that many layers "
                           "at once, and block only the first n layers of a stage; neither is modelled (this field is "
                           "torchtitan's every n-th layer)", "use checkpoint_every_n_layers: 1 (--recompute-method "
                           "uniform --recompute-num-layers 1)"))
    return out


def megatron_schedule_problems(s: Scenario) -> list[Problem]:
    """A pipeline schedule other than 1f1b under framework megatron (pp > 1): Megatron's interleaved 1F1B
    (``--num-virtual-stages-per-pipeline-rank``, arguments.py line 2586) is modelled, the others refused.

    Megatron-Core's interleaved schedule (core_v0.15.0 megatron/core/pipeline_parallel/schedules.py
    ``get_pp_rank_microbatches``, lines 728-729) runs ``2 (pp - 1 - rank) + (v - 1) g`` warmup forwards, g the
    micro-batch group ``microbatch_group_size_per_vp_stage``, pp by default (model_parallel_config.py lines 395-396),
    and needs the micro-batches M >= g with M mod g = 0 (schedules.py lines 975-990).  Where M is a multiple of pp,
    torch's ``ScheduleInterleaved1F1B`` warmup (facts/pipeline_schedules.py: ``(v - 1) x per_round + 2 (pp - 1 -
    rank)``, per_round = M // (M // pp) = pp) is the same count, so the engine's interleaved row holds."""
    par, m = s.parallel, s.train.grad_accum_steps
    if par.pp_schedule != "interleaved-1f1b":
        return [Problem("parallel.pp_schedule", f"framework megatron runs 1F1B, or its interleaved 1F1B with virtual "
                        f"stages; {par.pp_schedule} is not a Megatron-LM schedule here",
                        "use pp_schedule: 1f1b or interleaved-1f1b")]
    if m < par.pp or m % par.pp:
        return [Problem("train.grad_accum_steps", f"Megatron-LM's interleaved schedule needs the micro-batches per "
                        f"step ({m}) to be a multiple of pp = {par.pp} (schedules.py: "
                        "microbatch_group_size_per_vp_stage defaults to pp)", f"use grad_accum_steps a multiple of {par.pp}")]
    return []
