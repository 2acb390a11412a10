"""Building the real model and its training setup from a resolved scenario.

The model is built from its ``config.json`` with random weights (``from_config``: nothing is
downloaded), in the dtype the scenario's precision stores parameters in, on the measured
device.  The settings are applied the way the frameworks the analytic engine models apply
them (Hugging Face Trainer / Accelerate / plain PyTorch):

* ``fp32``: fp32 parameters, no autocast.  ``bf16-mixed``/``fp16-mixed``: fp32 parameters
  under ``torch.autocast`` (fp16 adds a ``GradScaler``).  ``bf16-true``/``fp16-true``: half
  parameters.  With PEFT the frozen base is stored in the half dtype and the adapters in the
  analytic engine's dtype (``analytic.precision.adapter_bytes``: fp32 with peft's
  ``autocast_adapter_dtype``, the base dtype for ``software.peft`` < 0.12);
* optimizer: the class and arguments of the optimizer's row in ``facts/optimizers.py``:
  ``torch.optim.AdamW`` with ``foreach=True`` (CUDA's default implementation,
  forced on the CPU too so that a CPU measurement has the GPU's optimizer-step temporaries)
  or ``fused=True``; SGD (with momentum 0.9 for ``sgd-momentum``); transformers' Adafactor;
  bitsandbytes' 8-bit / paged / Lion optimizers where bitsandbytes and CUDA are present.
  Parameters are grouped as the Trainer groups them (no weight decay for biases and norms),
  with the Trainer's default weight decay of 0;
* gradient checkpointing: ``full`` = transformers' per-layer checkpointing, non-reentrant;
  ``selective`` (Megatron's: recompute only the s x s attention tensors) = none with SDPA or
  flash attention, which never save them;
* attention: ``attn_implementation`` = eager | sdpa | flash_attention_2 (flash falls back to
  SDPA where the flash-attn package or CUDA is missing, and says so);
* LoRA / DoRA: ``peft.get_peft_model`` with the scenario's rank, alpha, targets and dropout.

What cannot be run here is refused with one message per reason (``unsupported``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.precision import litgpt_fp32_base
from vramplan.analytic.terms.saved import attention_only_decoder
from vramplan.errors import MissingExtraError, Problem, ScenarioError
from vramplan.facts.optimizers import optimizer_facts
from vramplan.spec.load import Resolved

if TYPE_CHECKING:
    import torch

__all__ = ["Built", "build", "require_torch", "unsupported"]

_LEARNED_POSITIONS = ("learned",)


def require_torch() -> None:
    """Raise a MissingExtraError naming the extra when torch/transformers are absent."""
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            raise MissingExtraError(f"`vramplan measure` needs {mod}: pip install 'vramplan[trace]'")


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def unsupported(r: Resolved, device_type: str) -> list[Problem]:
    """Every reason the scenario cannot be measured on ``device_type`` ("cpu" or "cuda")."""
    s, m = r.scenario, r.model
    out: list[Problem] = []
    if s.task == "serve":
        out.append(Problem("task", "measure runs a training step or a generate() pass; serving memory is vLLM's "
                           "(profiled weights + activations, then the KV cache fills the rest)",
                           "use task: inference to measure a generate() pass, or `vramplan estimate` for serve"))
        return out
    if s.task == "train" and s.train.objective != "sft":
        out.append(Problem("train.objective", f"measure runs a supervised (sft) step; objective {s.train.objective} "
                           "needs TRL's trainer and its rollout engine", "measure inside your own GRPO run with the "
                           "callbacks (docs/measure.md), or set train.objective: sft"))
    if m.vision is not None:
        # spec.families.transformers_config builds the language model alone: its step would lack the tower's
        # weights, gradients and activations that the estimate counts
        out.append(Problem("model", f"{m.name} is a vision-language model; measure builds its language model "
                           "alone, without the vision tower and images the estimate counts",
                           "measure the language model (its text_config as the model), or estimate"))
    if m.encoder_decoder is not None:
        # measure builds AutoModelForCausalLM and calls its generate or a training step on decoder inputs alone
        out.append(Problem("model", f"{m.name} is an encoder-decoder model; measure builds causal LMs only",
                           "use `vramplan estimate` (analytic/encoder_decoder.py)"))
    par = s.parallel
    if s.hardware.num_gpus > 1 or par.tp > 1 or par.pp > 1 or par.cp > 1 or par.ep > 1:
        out.append(Problem("hardware.num_gpus", "measure runs one process on one device",
                           "set hardware.num_gpus: 1 and tp/pp/cp/ep to 1 (measure one GPU's share with the "
                           "callbacks inside your own launcher)"))
    if par.zero_stage or par.fsdp != "none" or par.offload != "none":
        out.append(Problem("parallel", "ZeRO/FSDP/offload need a distributed launch; measure runs one process",
                           "set parallel.zero_stage: 0, fsdp: none, offload: none"))
    fw = s.framework
    if fw in ("deepspeed", "torchtitan", "vllm", "megatron", "torchtune", "verl", "openrlhf"):
        out.append(Problem("framework", f"measure runs a plain PyTorch / Hugging Face step, not {fw}",
                           "set framework: hf-trainer (or plain, accelerate, lightning)"))
    if s.task == "train":
        t = s.train
        if t.precision == "fp8-mixed":
            out.append(Problem("train.precision", "fp8-mixed needs Transformer Engine on Hopper or newer",
                               "measure bf16-mixed instead"))
        if t.precision == "fp8-torchao":
            out.append(Problem("train.precision", "fp8-torchao needs torchao's float8 kernels on an sm89+ GPU",
                               "measure bf16-mixed instead"))
        if t.precision == "mxfp8-torchao":
            out.append(Problem("train.precision", "mxfp8-torchao needs torchao's MX kernels on a compute-capability-10 "
                               "GPU", "measure bf16-mixed instead"))
        if t.quantization != "none" or (t.peft is not None and t.peft.method == "qlora"):
            out.append(Problem("train.quantization", f"quantized base weights ({t.quantization}) need bitsandbytes "
                               "on CUDA; measure builds dense random weights",
                               "set train.quantization: none and peft.method: lora"))
        facts = optimizer_facts(t.optimizer)
        construct = facts.construct
        if construct is not None and construct.needs_cuda and (device_type != "cuda" or not _has(construct.package)):
            out.append(Problem("train.optimizer", f"{t.optimizer} needs {construct.package} on CUDA"
                               + ("" if device_type == "cuda" else " (this run is on the CPU)"),
                               f"run on a CUDA machine with `pip install {construct.package}`, or set "
                               "train.optimizer: adamw"))
        elif construct is not None and facts.subset is not None:
            out.append(Problem("train.optimizer", f"{t.optimizer} gives a subset of the parameters another "
                               "layout (its own parameter groups); measure builds one optimizer class over "
                               "the Trainer's two groups", "use `vramplan trace` for it, or set train.optimizer: adamw"))
        elif construct is not None and not _has(construct.package):
            out.append(Problem("train.optimizer", f"{t.optimizer} needs {construct.package}",
                               f"`pip install {construct.package}`, or set train.optimizer: adamw"))
        if t.torch_compile:
            out.append(Problem("train.torch_compile", "measure runs the eager step; a compiled model's memory "
                               "(inductor's fusions, the partitioner's saved set) is not what it would measure",
                               "set train.torch_compile: false, or measure inside your compiled run with the "
                               "callbacks (docs/measure.md)"))
        if t.loss in ("cut-cross-entropy", "chunked"):
            out.append(Problem("train.loss", f"measure runs transformers' own loss or Liger's fused linear "
                               f"cross-entropy; {t.loss} needs its own training loop (ml-cross-entropy's patch, "
                               "torchtune's recipe)", "measure inside that loop with the callbacks "
                               "(docs/measure.md), or set train.loss: standard"))
        # Liger's kernels are triton programs: CUDA (or ROCm) only
        liger = t.loss == "liger-fused-linear-ce" or t.liger_kernels
        if liger and (device_type != "cuda" or not _has("liger_kernel")):
            which = "train.loss" if t.loss == "liger-fused-linear-ce" else "train.liger_kernels"
            out.append(Problem(which, "Liger-Kernel's triton kernels need the liger-kernel package on a GPU"
                               + ("" if device_type == "cuda" else " (this run is on the CPU)"),
                               "run on a CUDA machine with `pip install liger-kernel`, or set train.loss: "
                               "standard and train.liger_kernels: false"))
        if t.packing:
            out.append(Problem("train.packing", "measure feeds padded rows of seq_len tokens; packed rows need "
                               "flash-attention's variable-length kernel and a collator's position_ids",
                               "measure inside your packed run with the callbacks (docs/measure.md), or set "
                               "train.packing: false"))
        if s.software.unsloth is not None:
            out.append(Problem("software.unsloth", "measure runs transformers' model; Unsloth patches it with triton "
                               "kernels that need a GPU and the unsloth package", "measure inside the Unsloth run with "
                               "the callbacks (docs/measure.md), or unset software.unsloth"))
        if t.activation_offload != "none":
            out.append(Problem("train.activation_offload", "measure runs the step without torchtune's / TRL's "
                               "activation offloading context", "measure inside that run with the callbacks "
                               "(docs/measure.md), or set train.activation_offload: none"))
        policy = checkpoint_policy(s)
        if policy == "op-sac" or t.checkpoint_every_n_layers > 1 or t.deepspeed_checkpointing != "none":
            out.append(Problem("train.gradient_checkpointing", "torchtitan's op-level and every-n-th-layer "
                               "checkpointing and DeepSpeed's partitioned / CPU checkpointing are not measured here "
                               "(measure runs transformers' model with torch's checkpoint)",
                               "use gradient_checkpointing: full with checkpoint_every_n_layers: 1, or none"))
        if policy == "attention-core" and t.attention == "eager":
            out.append(Problem("train.gradient_checkpointing", "selective recomputation of eager attention's "
                               "s x s tensors is not a transformers option",
                               "use attention: sdpa (selective then equals none) or gradient_checkpointing: full"))
        if m.position in _LEARNED_POSITIONS and t.seq_len > m.max_position_embeddings:
            out.append(Problem("train.seq_len", f"{t.seq_len} tokens exceed the model's "
                               f"{m.max_position_embeddings} learned positions",
                               f"use --seq-len {m.max_position_embeddings} or less"))
    else:
        inf = s.inference
        if inf.quantization != "none":
            out.append(Problem("inference.quantization", f"{inf.quantization} weights need their CUDA kernels "
                               "(bitsandbytes/GPTQ/AWQ); measure builds dense random weights",
                               "set inference.quantization: none"))
        if inf.kv_cache_dtype not in ("auto", inf.dtype):
            out.append(Problem("inference.kv_cache_dtype", f"a {inf.kv_cache_dtype} KV cache needs a quantized "
                               "cache implementation; generate() keeps the cache in the weights' dtype",
                               "set inference.kv_cache_dtype: auto"))
        total = inf.prompt_len + inf.new_tokens
        if m.position in _LEARNED_POSITIONS and total > m.max_position_embeddings:
            out.append(Problem("inference.prompt_len", f"prompt + new tokens = {total} exceed the model's "
                               f"{m.max_position_embeddings} learned positions",
                               "lower --prompt-len / --new-tokens"))
    return out


@dataclass
class Built:
    model: Any  # torch.nn.Module (a transformers PreTrainedModel, possibly wrapped by peft)
    optimizer: Any  # torch.optim.Optimizer | None
    scaler: Any  # torch.amp.GradScaler | None
    autocast_dtype: Any  # torch.dtype | None
    device: Any  # torch.device
    vocab_size: int
    encoder_only: bool
    optimizer_name: str
    notes: list[str] = field(default_factory=list)


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _hf_config(cfg: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    from vramplan.spec.families import transformers_config

    # the language model of a multimodal config, named as the transformers classes that build its family
    cfg = transformers_config(cfg)
    for key in ("quantization_config", "architectures", "auto_map", "torch_dtype", "dtype", "transformers_version"):
        cfg.pop(key, None)
    return AutoConfig.for_model(**cfg)


def attention_impl(want: str, device_type: str) -> tuple[str, str | None]:
    """The ``attn_implementation`` to build with, and a note when it differs from the scenario's."""
    if want == "eager":
        return "eager", None
    if want == "flash":
        if device_type == "cuda" and _has("flash_attn"):
            return "flash_attention_2", None
        return "sdpa", ("attention: flash-attention 2 is not available here (needs the flash-attn package on "
                        "CUDA); measured with SDPA, which saves the same tensors (output + logsumexp)")
    return "sdpa", None


def precision_dtypes(precision: str, peft: bool) -> tuple[str, str, str | None]:
    """(base parameter dtype, adapter dtype, autocast dtype) for a training precision."""
    if precision == "fp32":
        return "fp32", "fp32", None
    if precision in ("bf16-true", "fp16-true"):
        half = precision[:4]
        return half, half, None
    half = precision[:4]  # bf16-mixed / fp16-mixed
    return (half if peft else "fp32"), "fp32", half


def decay_groups(model: Any) -> tuple[list[Any], list[Any]]:
    """Trainable parameters with and without weight decay, as transformers' Trainer splits them.

    ``Trainer.get_decay_parameter_names``: no decay for parameters inside ``nn.LayerNorm`` or
    whose name matches bias / layernorm / rmsnorm / norm.
    """
    import re

    import torch

    patterns = [re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")]
    norm_params: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            norm_params.update(id(p) for p in mod.parameters(recurse=False))
    decay: list[Any] = []
    no_decay: list[Any] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in norm_params or any(pat.search(name.lower()) for pat in patterns):
            no_decay.append(p)
        else:
            decay.append(p)
    return decay, no_decay


def make_optimizer(name: str, model: Any, device_type: str) -> tuple[Any, str | None]:
    """The torch optimizer for a scenario's ``train.optimizer`` (None for "none"), and a note.

    The class and its keyword arguments are the optimizer's row in ``facts/optimizers.py``
    (``construct``); bitsandbytes rows were checked by ``unsupported`` (present, on CUDA).
    """
    import importlib

    construct = optimizer_facts(name).construct
    decay, no_decay = decay_groups(model)
    groups = [{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    lr = 1e-5
    if construct is None or not groups:
        return None, None
    module, _, cls_name = construct.path.rpartition(".")
    cls: Any = getattr(importlib.import_module(module), cls_name)
    note = construct.note_off_cuda if device_type != "cuda" else None
    optimizer = cls(groups, lr=lr, **dict(construct.kwargs))
    if callable(getattr(optimizer, "train", None)):
        # schedule-free optimizers step only in train mode (schedulefree's step raises "Optimizer was not in
        # train mode"); transformers' Trainer calls optimizer.train() before training for the same reason
        # (trainer.py: `if hasattr(self.optimizer, "train") and callable(self.optimizer.train)`)
        optimizer.train()
    return optimizer, note


def _apply_peft(model: Any, r: Resolved, adapter_fp32: bool) -> Any:
    from peft import LoraConfig, get_peft_model

    peft = r.scenario.train.peft
    assert peft is not None
    targets: Any = peft.target_modules
    task_type = None if r.model.encoder_only else "CAUSAL_LM"
    kwargs: dict[str, Any] = {"r": peft.rank, "lora_alpha": peft.alpha, "target_modules": targets,
                              "lora_dropout": peft.dropout, "use_dora": peft.method == "dora", "task_type": task_type}
    cfg = LoraConfig(**kwargs)
    try:
        return get_peft_model(model, cfg, autocast_adapter_dtype=adapter_fp32)
    except ValueError as exc:
        import torch

        names = sorted({n.split(".")[-1] for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)})
        raise ScenarioError([Problem("train.peft.target_modules", str(exc).splitlines()[0],
                                     f"this model's linear modules: {', '.join(names) or 'none'}; or all-linear")]) from None


def _apply_liger(model: Any, fused_loss: bool, kernels: bool) -> str:
    """Patch ``model`` with Liger-Kernel as ``apply_liger_kernel_to_llama(model=...)`` and its siblings do, before PEFT
    wraps it (TRL's ``use_liger_kernel`` calls ``_apply_liger_kernel_to_instance`` on the base model the same way).

    liger-kernel v0.8.2 ``transformers/monkey_patch.py``: with ``fused_linear_cross_entropy`` the instance's
    forward becomes ``lce_forward``, which in training skips the logits and runs the fused head + loss; with
    ``rms_norm`` / ``swiglu`` / ``rope`` the instance's norms and MLPs are patched and the module's
    ``apply_rotary_pos_emb`` replaced."""
    from liger_kernel.transformers.monkey_patch import (  # type: ignore[import-not-found,unused-ignore]
        _apply_liger_kernel_to_instance,
    )

    # Liger dispatches on the config's model type and does nothing (a log line) for one it has no patch for; the
    # fused loss replaces the instance's forward, so its absence shows that nothing was applied.  The kernels alone
    # are refused for unpatched families by the scenario checks (spec/checks.py) before measure runs.
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=fused_loss, cross_entropy=False,
                                    rms_norm=kernels, swiglu=kernels, rope=kernels)
    if fused_loss and "forward" not in vars(model):
        raise ScenarioError([Problem("train.loss", f"liger-kernel has no patch for {type(model).__name__}",
                                     "set train.loss: standard and train.liger_kernels: false")])
    parts = (["fused linear cross-entropy"] if fused_loss else []) + (["RMSNorm, SwiGLU, RoPE"] if kernels else [])
    return "Liger-Kernel applied to the model instance: " + ", ".join(parts)


def build(r: Resolved, raw: dict[str, Any], device: torch.device, seed: int = 0) -> Built:
    """Build the scenario's model (random weights) and optimizer on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    s, m = r.scenario, r.model
    notes: list[str] = []
    train = s.task == "train"
    peft = s.train.peft if train else None
    if train:
        base, _adapter, autocast = precision_dtypes(s.train.precision, peft is not None)
        if litgpt_fp32_base(s):
            base = "fp32"  # Lit-GPT under a mixed precision keeps its frozen base fp32 (analytic/precision.py)
        want_attention = s.train.attention
    else:
        base, autocast = s.inference.dtype, None
        want_attention = s.inference.attention
    impl, note = attention_impl(want_attention, device.type)
    if m.mamba is not None and len(m.mamba.layers) == m.num_layers:
        # no attention layer to choose a kernel for, and transformers' Mamba classes (MambaForCausalLM,
        # FalconMambaForCausalLM, Mamba2ForCausalLM) refuse attn_implementation="sdpa" (no _supports_sdpa)
        impl, note = "eager", None
    if note:
        notes.append(note)
    torch.manual_seed(seed)
    auto = AutoModelForMaskedLM if m.encoder_only else AutoModelForCausalLM
    try:
        config = _hf_config(raw)
        if train:
            # the training forward's cache as the scenario says (analytic/terms/saved.py training_cache_bytes): the
            # config's own use_cache unless train.use_cache names one, off for a model whose forward cannot keep it
            config.use_cache = (s.train.use_cache if s.train.use_cache is not None else config.use_cache) \
                and attention_only_decoder(m)
        with torch.device(device):
            model = auto.from_config(  # type: ignore[no-untyped-call]
                config, attn_implementation=impl, dtype=_torch_dtype(base))
    except (ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ScenarioError([Problem("model", f"transformers cannot build this config.json: {first}",
                                     "check the config against the model's Hugging Face repository")]) from None
    moe_impl = getattr(model.config, "_experts_implementation", None)
    if m.moe is not None and moe_impl:
        notes.append(f"MoE experts run with transformers' {moe_impl!r} implementation")
    if train and checkpoint_policy(s) == "attention-core":
        notes.append("gradient checkpointing: selective recomputation drops only the s x s attention tensors "
                     "(arXiv 2205.05198 sec. 5), which SDPA and flash attention never save: measured without "
                     "checkpointing, the same memory")
    elif train and checkpoint_policy(s) == "full":
        # transformers 5 renames gradient_checkpointing_enable to activation_checkpointing_enable
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        notes.append("gradient checkpointing: the recomputed layer's tensors are created in the backward pass "
                     "and shown as temporaries (backward); the estimate counts them as activations, so compare "
                     "the sum of the two")
    if train and (s.train.loss == "liger-fused-linear-ce" or s.train.liger_kernels):
        notes.append(_apply_liger(model, s.train.loss == "liger-fused-linear-ce", s.train.liger_kernels))
    if peft is not None:
        # the analytic engine's adapter dtype (analytic/precision.py: adapter_bytes), so that a measurement
        # compares like with like: fp32 with peft >= 0.12, the base dtype with older peft or LitGPT's -true
        from vramplan.analytic.precision import adapter_bytes, policy

        model = _apply_peft(model, r, adapter_fp32=adapter_bytes(s, policy(s)) == 4 and base != "fp32")
    model.train(train)
    optimizer = None
    scaler = None
    opt_name = s.train.optimizer if train else "none"
    if train:
        optimizer, note = make_optimizer(opt_name, model, device.type)
        if note:
            notes.append(note)
        if autocast == "fp16":
            scaler = torch.amp.GradScaler(device.type)
        if autocast and device.type == "cpu":
            notes.append("CPU autocast's op lists differ from CUDA's: pow and layer_norm run in the half dtype on "
                         "the CPU but in fp32 on CUDA, so GELU-tanh and LayerNorm activations are smaller here")
        dropout = max(m.hidden_dropout, m.attention_dropout)
        if device.type == "cpu" and dropout > 0:
            notes.append(f"dropout p={dropout:g}: the CPU saves each dropout mask in the input's dtype "
                         "(CUDA's fused kernel saves a 1-byte mask), so CPU activations are larger")
    vocab = int(getattr(model.config, "vocab_size", 0) or m.vocab_size)
    # Gemma 3n's per-layer embeddings cover only the first vocab_size_per_layer_input ids (262,144 of 262,400;
    # Gemma3nTextScaledWordEmbedding in modeling_gemma3n.py): random ids above it index out of bounds on CUDA
    vocab = min(vocab, int(getattr(model.config, "vocab_size_per_layer_input", 0) or vocab))
    return Built(model=model, optimizer=optimizer, scaler=scaler,
                 autocast_dtype=_torch_dtype(autocast) if autocast else None, device=device, vocab_size=vocab,
                 encoder_only=m.encoder_only, optimizer_name=opt_name, notes=notes)
