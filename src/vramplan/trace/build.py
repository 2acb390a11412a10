"""Build the scenario's model from its config alone: meta device, scenario dtype, PEFT, QLoRA, checkpointing.

The model is ``AutoModelForCausalLM.from_config`` of the catalog entry, local ``config.json`` or
inline mapping (no weights are read; ``quantization_config`` of a pre-quantized checkpoint is
dropped: the scenario's dtype and quantization decide how weights are stored, and ``resolve`` has set
that quantization from the checkpoint's, spec/load.py ``checkpoint_quantization_for``).  Tied weights
are re-tied by transformers' ``post_init``.  Adapters come from peft's ``get_peft_model``.
4-bit base weights are stored as bitsandbytes stores them, by ``QuantLinear`` (trace/quant.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.terms.context import kbit_held_fp32
from vramplan.analytic.trl_sft import sft_row, trl_sft
from vramplan.errors import Problem, ScenarioError
from vramplan.facts.peft_targets import completed_targets
from vramplan.facts.quantization import bnb_formats, quant_format
from vramplan.spec.load import Resolved
from vramplan.trace import cuda
from vramplan.trace.quant import EXPERTS_NOTE, QuantExperts, QuantLinear, quantize_linears

__all__ = ["Built", "Policy", "build_model", "raw_config", "trace_policy"]

_DROP_KEYS = ("quantization_config", "auto_map", "_name_or_path", "transformers_version", "architectures",
              "torch_dtype", "dtype", "use_cache")
_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def raw_config(model: str | dict[str, Any], offline: bool = False) -> dict[str, Any]:
    """The config.json mapping of a catalog id/alias, a local path, an inline mapping or a Hub id (read from
    the Hugging Face cache, where resolving the scenario put it: ``catalog.models.model_config``)."""
    from vramplan.catalog.models import model_config

    return model_config(model, offline=offline)


@dataclass(frozen=True)
class Policy:
    """Dtypes of one traced training step (mirrors analytic/precision.py)."""

    param_dtype: torch.dtype  # trainable parameters as stored
    frozen_dtype: torch.dtype  # frozen base weights under PEFT (as loaded)
    autocast_dtype: torch.dtype | None  # torch.autocast('cuda', dtype) around the forward
    master_fp32: bool  # fp32 master copies held by the optimizer (DeepSpeed)
    half: torch.dtype


def trace_policy(r: Resolved, fsdp2: bool = False) -> Policy:
    """The dtypes of the step; ``fsdp2``: the model is wrapped by ``fully_shard`` (trace/fsdp.py)."""
    s = r.scenario
    prec = s.train.precision
    if s.effective_framework == "megatron":
        # Megatron-LM runs Megatron-Core's GPT model (megatron/core/models/gpt) and its own DDP grad buffer and
        # distributed optimizer, not transformers' modeling code under torch's DDP, which is what the trace runs
        raise ScenarioError([Problem("framework", "Megatron-Core's own model and grad buffer are not traced (the trace "
                                     "runs transformers' modeling code)", "use --engine analytic for framework megatron")])
    if s.effective_framework == "torchtune":
        # torchtune runs its own model classes (torchtune.modules.TransformerDecoder, torchao NF4Tensor weights),
        # not transformers' modeling code, which is what the trace runs
        raise ScenarioError([Problem("framework", "torchtune's own model is not traced (the trace runs "
                                     "transformers' modeling code)", "use --engine analytic for framework torchtune")])
    if trl_sft(s) and sft_row(s).first >= (0, 15, 0):
        # SFTTrainer's compute_loss from 0.15 (analytic/trl_sft.py): metric copies of the logits, or a chunked or fused
        # head without them; the trace runs the HF Trainer's loss, which is TRL's only before 0.15
        raise ScenarioError([Problem("software.trl", f"TRL {s.software.trl} SFTTrainer's loss is not traced (the trace "
                                     "runs the HF Trainer's loss, TRL's only before 0.15)",
                                     "use --engine analytic, or leave software.trl unset for the HF Trainer's step")])
    half = torch.float16 if prec.startswith("fp16") else (torch.float32 if prec == "fp32" else torch.bfloat16)
    if prec == "fp32":
        return Policy(torch.float32, torch.float32, None, False, torch.float32)
    if prec in ("bf16-true", "fp16-true"):
        return Policy(half, half, None, False, half)
    if prec == "fp8-mixed":
        raise ScenarioError([Problem("train.precision", "fp8-mixed (Transformer Engine) is not traced",
                                     "use --engine analytic for fp8-mixed, or trace bf16-mixed")])
    if prec == "fp8-torchao":
        # torchao's Float8Linear is not installed beside vramplan, and its _scaled_mm has no meta/CPU kernel
        raise ScenarioError([Problem("train.precision", "fp8-torchao (torchao float8 training) is not traced",
                                     "use --engine analytic for fp8-torchao, or trace bf16-mixed")])
    if prec == "mxfp8-torchao":
        # torchao's MXLinear is not installed beside vramplan; its cuBLAS MX gemm and cast kernels are SM100 kernels
        raise ScenarioError([Problem("train.precision", "mxfp8-torchao (torchao MXFP8 training) is not traced",
                                     "use --engine analytic for mxfp8-torchao, or trace bf16-mixed")])
    if fsdp2 and not s.deepspeed_engine:
        # fp32 sharded parameters, half all-gathered copies (MixedPrecisionPolicy.param_dtype); accelerate
        # also wraps the forward in autocast (Accelerator.native_amp is set for FSDP too)
        autocast = half if s.effective_framework in ("hf-trainer", "accelerate") else None
        return Policy(torch.float32, half, autocast, False, half)
    if s.deepspeed_engine:
        # DeepSpeed's half module with fp32 masters and no autocast, under the HF Trainer, accelerate and Lightning
        # too (Scenario.deepspeed_engine)
        return Policy(half, half, None, True, half)
    if s.parallel.fsdp != "none" or s.effective_framework == "torchtitan":
        # FSDP MixedPrecision(param_dtype=half): the module computes with half (all-gathered) parameters,
        # the optimizer updates the fp32 sharded ones: traced as half parameters plus fp32 copies
        # that parallel.py turns into FSDP's sharded fp32 parameters
        return Policy(half, half, None, True, half)
    return Policy(torch.float32, half, half, False, half)


@dataclass
class Built:
    model: torch.nn.Module
    config: Any
    quant_tensors: list[torch.Tensor] = field(default_factory=list)
    attention: str = "sdpa"
    notes: list[str] = field(default_factory=list)


_FLASH_NAME = "vramplan_fa2"
_SELECTIVE_NAME = "vramplan_selective_eager"


def _hf_config(r: Resolved, attention: str) -> Any:
    from transformers import AutoConfig

    from vramplan.spec.families import transformers_config

    # the transformers classes that build the family (its adapter names them), without the null keys
    # their configuration class rejects; r.model was built from this config, so its family is known
    cfg = transformers_config(raw_config(r.scenario.model, r.scenario.offline))
    for k in _DROP_KEYS:
        cfg.pop(k, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(**cfg)
    config.use_cache = False
    return config


def _register_flash() -> None:
    """An attention function with flash-attention 2's memory (``flash_attn_func`` via transformers)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if _FLASH_NAME in AttentionInterface._global_mapping:
        return

    def flash_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        head_dim, v_head = q.shape[-1], v.shape[-1]
        if v_head != head_dim:
            v = torch.nn.functional.pad(v, [0, head_dim - v_head])
        target = None
        if q.dtype == torch.float32:
            target = cuda.autocast_state() or next(
                m for m in module.modules() if isinstance(m, torch.nn.Linear)).weight.dtype
        if target is not None and target != torch.float32:
            q, k, v = q.to(target), k.to(target), v.to(target)
        out = cuda.flash_attn_func(q, k, v, dropout)
        if v_head != head_dim:
            out = out[..., :v_head]
        return out, None

    AttentionInterface.register(_FLASH_NAME, flash_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_FLASH_NAME, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])


def _register_selective() -> None:
    """Eager attention whose core (scores, softmax, dropout, weighted sum) is checkpointed."""
    import sys

    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if _SELECTIVE_NAME in AttentionInterface._global_mapping:
        return
    ckpt = _checkpoint_func()

    def selective(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> Any:
        eager: Any = getattr(sys.modules[type(module).__module__], "eager_attention_forward")  # noqa: B009
        if not (module.training and torch.is_grad_enabled()):
            return eager(module, query, key, value, attention_mask, **kwargs)
        return ckpt(functools.partial(eager, module, **kwargs), query, key, value, attention_mask)

    AttentionInterface.register(_SELECTIVE_NAME, selective)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_SELECTIVE_NAME, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def attn_implementation(attention: str, checkpointing: str = "none") -> str:
    if attention == "flash":
        _register_flash()
        return _FLASH_NAME
    if attention == "eager" and checkpointing in ("selective", "attention-core"):
        _register_selective()
        return _SELECTIVE_NAME
    return attention


def _auto_class(r: Resolved) -> Any:
    """The transformers auto class that builds ``r``'s model: an encoder-decoder model (T5, BART) as its
    ...ForConditionalGeneration (auto/modeling_auto.py MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, the class
    Seq2SeqTrainer fine-tunes), a speech encoder (Whisper) by MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES (the class the
    speech recognition fine-tuning examples train with Seq2SeqTrainer), another model as its causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq

    ed = r.model.encoder_decoder
    if ed is None:
        return AutoModelForCausalLM
    return AutoModelForSpeechSeq2Seq if ed.audio is not None else AutoModelForSeq2SeqLM


def _supports_sdpa(config: Any, auto: Any) -> bool:
    """Whether the class ``auto`` (``_auto_class``) builds for ``config`` runs SDPA attention
    (``PreTrainedModel._supports_sdpa``; transformers 4.x's default is False: its T5 has no SDPA path, and asking
    for it by name raises a ValueError, ``_check_and_enable_sdpa(hard_check_only=True)``)."""
    mapping: Any = getattr(auto, "_model_mapping", None)
    try:
        cls = mapping[type(config)] if mapping is not None else None
    except KeyError:
        return True
    return bool(getattr(cls, "_supports_sdpa", True))


def _silence() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    for name in ("transformers.modeling_utils", "transformers.configuration_utils", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)


def build_model(r: Resolved, device: str = "meta", task: str = "train", fsdp2: bool = False) -> Built:
    """The scenario's model on ``device`` (``meta`` for tracing; ``cpu`` for a real reference run)."""
    from transformers.utils import logging as hf_logging

    _silence()
    verbosity: Any = hf_logging.set_verbosity_error
    verbosity()
    s = r.scenario
    attention = s.train.attention if task == "train" else s.inference.attention
    config = _hf_config(r, attention)
    notes: list[str] = []
    auto = _auto_class(r)
    if attention == "sdpa" and not _supports_sdpa(config, auto):
        # transformers' default (``get_correct_attn_implementation``: "Sdpa is the default, so we try it and
        # fallback to eager otherwise when not possible"); gpt-oss's attention sinks have no SDPA path
        attention = "eager"
        notes.append(f"{r.model.family} has no SDPA attention: transformers' default falls back to eager")
    impl = attn_implementation(attention, checkpoint_policy(s) if task == "train" else "none")
    quant = "none"
    if task == "train":
        pol = trace_policy(r, fsdp2)
        peft_cfg = s.train.peft
        quant = s.train.quantization if peft_cfg is not None else "none"
        dtype = pol.frozen_dtype if peft_cfg is not None else pol.param_dtype
    else:
        dtype = _HALF[s.inference.dtype]
        quant = s.inference.quantization
        peft_cfg = None
    if quant != "none" and quant_format(quant).library == "hqq":
        # transformers 5.24 HqqHfQuantizer has no get_quantize_ops / load operations: from_pretrained raises
        # NotImplementedError (quantizers/base.py HfQuantizer.get_quantize_ops), so there is no loaded model to trace
        raise ScenarioError([Problem("inference.quantization", f"{quant} weights are not traced: transformers 5.24 "
                                     "cannot load HQQ checkpoints (HfQuantizer.get_quantize_ops: NotImplementedError)",
                                     "use --engine analytic, which holds them as hqq's HQQLinear does")])
    if quant != "none" and quant not in bnb_formats():
        # the traced engine emulates bitsandbytes' Linear4bit / Linear8bitLt only (trace/quant.py); GPTQ, AWQ,
        # fp8, block-wise fp8 and MXFP4 kernels are not emulated, so they are refused before building the model
        raise ScenarioError([Problem("inference.quantization", f"{quant} weights are not traced",
                                     "use --engine analytic for GPTQ/AWQ/fp8/fp8-block/MXFP4/compressed-tensors checkpoints")])
    if r.model.traits.sliced_expert_loop and device == "meta":
        # DbrxExperts.forward picks each expert's tokens with torch.where / nonzero on the routing, which has no
        # data-independent meta implementation (torch: "The register_meta function for torch.nonzero() raises
        # unimplemented by default")
        raise ScenarioError([Problem("model", f"{r.model.name}'s experts loop over the tokens each one is routed "
                                     "(DbrxExperts: torch.where on the routing), which the meta device cannot run: "
                                     "it is not traced", "use --engine analytic")])
    if r.model.traits.attn_logit_softcap and attention == "sdpa":
        raise ScenarioError([Problem(
            "train.attention" if task == "train" else "inference.attention",
            "transformers' sdpa attention rejects Gemma 2's attention logit soft-capping",
            "use attention: eager or flash for gemma2")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device):
            try:
                factory: Any = auto.from_config
                model = factory(config, dtype=dtype, attn_implementation=impl)
            except ValueError as exc:
                raise ScenarioError([Problem("model", f"transformers cannot build this model: {exc}",
                                             "check the config.json and the attention")]) from None
    model.config.use_cache = task != "train"
    quant_tensors: list[torch.Tensor] = []
    if quant != "none" and task == "train" and s.train.quantize_moe_experts and not r.model.traits.experts_are_linears:
        # trace/quant.py converts transformers' standard fused experts only; these would stay 16-bit here, against
        # the key (and the analytic engine's 4-bit experts)
        raise ScenarioError([Problem("train.quantize_moe_experts", f"the traced engine quantizes transformers' "
                                     f"standard fused experts only; {r.model.name}'s experts (never nn.Linear) would "
                                     "stay 16-bit here", "use --engine analytic")])
    if quant != "none":
        # inference: the configured bnb_4bit_compute_dtype (default: the model dtype); QuantLinear replaces it
        # with an fp32/bf16 input's dtype as bitsandbytes' set_compute_type does
        compute = pol.half if task == "train" else _HALF[s.inference.bnb_compute_dtype or s.inference.dtype]
        old_bnb = task == "train" and r.scenario.software.bnb_4bit_saves_input
        quant_tensors = quantize_linears(model, quant, compute_dtype=compute, device=device, saves_input=old_bnb)
        notes.append(f"base linear weights stored as bitsandbytes {quant} (packed payload + absmax blocks)")
        if old_bnb:
            notes.append(f"bitsandbytes {r.scenario.software.bitsandbytes}: 4-bit linears keep their input "
                         "for the backward (< 0.43.2)")
        if any(isinstance(m, QuantExperts) for m in model.modules()):
            notes.append(EXPERTS_NOTE)
    if task == "train":
        sw = r.scenario.software
        per_expert = any(isinstance(m, QuantExperts) for m in model.modules())
        if not sw.fused_moe_experts and r.scenario.train.peft is not None and r.model.moe is not None \
                and not per_expert:
            raise ScenarioError([Problem(
                "software.transformers", f"transformers {sw.transformers}'s per-expert MoE layout cannot be traced: "
                f"the installed transformers {_transformers_version()} fuses the experts",
                "use --engine analytic, which models both layouts, or drop software.transformers")])
        model = _prepare_train(r, model, quant, notes)
    else:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        sw = r.scenario.software
        if sw.transformers is not None:
            # generate's cache and logits handling changed across releases (analytic/inference.py
            # generate_behaviour); the trace runs the installed release's code
            notes.append(f"generate traced with the installed transformers {_transformers_version()}, not the "
                         f"{sw.transformers} the scenario names (--engine analytic models that release)")
    return Built(model, config, quant_tensors, attention, notes)


def _prepare_train(r: Resolved, model: torch.nn.Module, quant: str, notes: list[str]) -> torch.nn.Module:
    s = r.scenario
    t = s.train
    model.train()
    if t.peft is not None:
        for p in model.parameters():
            p.requires_grad_(False)
        if quant != "none" and kbit_held_fp32(s, r.model):
            # peft.prepare_model_for_kbit_training: every fp16/bf16 parameter becomes fp32 (LLaMA-Factory runs none;
            # axolotl casts the norms and embeddings back, DeepSpeed's engine casts the module to its half dtype:
            # the step holds them in the model's dtype either way)
            for p in model.parameters():
                if p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.to(torch.float32)
            notes.append("prepare_model_for_kbit_training casts non-quantized parameters to fp32")
    policy = checkpoint_policy(s)
    if policy == "op-sac" or t.deepspeed_checkpointing != "none":
        raise ScenarioError([Problem("train.gradient_checkpointing", "torchtitan's op-level selective checkpointing "
                                     "and DeepSpeed's partitioned / CPU checkpointing are not traced (the trace runs "
                                     "transformers' model with torch's checkpoint)",
                                     "use --engine analytic, or gradient_checkpointing: full")])
    if policy == "full":
        _enable_checkpointing(model)
        _keep_every_nth(model, t.checkpoint_every_n_layers)
    if t.peft is not None:
        if t.peft.method == "dora" and quant != "none":
            raise ScenarioError([Problem("train.peft.method", "DoRA over quantized base weights is not traced",
                                         "use lora/qlora, or --engine analytic")])
        model = _apply_peft(r, model, quant)
    return model


def _checkpoint_func() -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    def ckpt(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        state = cuda.autocast_state()

        def run(*a: Any, **kw: Any) -> Any:
            marks = [(enter(), leave) for enter, leave in cuda.CHECKPOINT_SCOPES]
            try:
                with cuda.restore_autocast(state):
                    return function(*a, **kw)
            finally:
                for depth, leave in marks:
                    leave(depth)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    return ckpt


def _enable_checkpointing(model: Any) -> None:
    """transformers' activation checkpointing (non-reentrant), restoring the autocast state on recompute."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    func = _checkpoint_func()
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False):
            m._gradient_checkpointing_func = func


def _keep_every_nth(model: Any, n: int) -> None:
    """Checkpoint only the n-th, 2n-th, ... decoder layer (torchtitan ``_apply_layer_sac``, counting from 1):
    transformers' ``GradientCheckpointingLayer`` runs checkpointed while its ``gradient_checkpointing`` is set."""
    if n <= 1:
        return
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing") and hasattr(m, "_gradient_checkpointing_func")
              and not hasattr(m, "layers")]
    for j, layer in enumerate(layers):
        if (j + 1) % n:
            layer.gradient_checkpointing = False


def _apply_peft(r: Resolved, model: torch.nn.Module, quant: str) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    t = r.scenario.train
    assert t.peft is not None
    p = t.peft
    target: list[str] | str = completed_targets(p.target_modules, r.model.peft_default_targets)
    per_expert = any(isinstance(m, QuantExperts) for m in model.modules())
    aliases = dict(r.model.traits.expert_module_aliases)
    if isinstance(target, list) and aliases:
        # other spellings of the expert linears (Mixtral: peft converts 4.x's w1/w3/w2 of
        # ``MixtralBlockSparseTop2MLP`` to the fused parameters); the per-expert 4-bit linears (QuantExperts)
        # are named gate_proj/up_proj/down_proj
        v4 = aliases if per_expert else {b: a for a, b in aliases.items()}
        target = [v4.get(n, n) for n in target]
    lora: Any = LoraConfig
    # a speech encoder (Whisper) as PEFT's Whisper examples wrap it, without a task type (the plain PeftModel, whose
    # forward passes input_features through; PeftModelForCausalLM's passes an input_ids=None that
    # WhisperForConditionalGeneration.forward hands its decoder a second time)
    ed = r.model.encoder_decoder
    task = None if ed is not None and ed.audio is not None else "CAUSAL_LM"
    cfg = lora(r=p.rank, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=target,
               use_dora=p.method == "dora", bias="none", task_type=task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # adapters in the analytic engine's dtype (analytic/precision.py: adapter_bytes): peft's
            # autocast_adapter_dtype upcasts them to fp32; without it they keep the base weight's dtype
            from vramplan.analytic.precision import adapter_bytes, policy

            fp32 = adapter_bytes(r.scenario, policy(r.scenario)) == 4
            with _v4_expert_targets(per_expert):
                peft_model = get_peft_model(model, cfg, autocast_adapter_dtype=fp32)
        except ValueError as exc:
            raise ScenarioError([Problem("train.peft.target_modules", str(exc).splitlines()[0],
                                         "name modules the model has (e.g. q_proj, v_proj) or all-linear")]) from None
    if quant != "none":
        _use_bnb_lora_forward(peft_model)
    return cast(torch.nn.Module, peft_model)


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


@contextlib.contextmanager
def _v4_expert_targets(active: bool) -> Iterator[None]:
    """Keep 4.x's per-expert LoRA targets while the experts are per-expert 4-bit linears.

    On transformers 5, peft rewrites the expert names of a MoE config (``gate_proj``/``up_proj``/
    ``down_proj`` on Qwen2-MoE-style models) into ``target_parameters`` of the fused experts
    (utils/transformers_weight_conversion.py ``_MOE_TARGET_MODULE_MAPPING``).  The QLoRA layout here is
    4.x's (``QuantExperts``: one linear per expert), which has no fused parameter, so the rewrite would
    leave the experts, and the dense and shared-expert MLPs that share those names, without adapters.
    Only the router's entry is kept: the router is transformers 5's module, whose weight is a parameter.
    """
    if not active:
        yield
        return
    from peft.utils import transformers_weight_conversion as conv

    saved = dict(conv._MOE_TARGET_MODULE_MAPPING)
    try:
        for key, mapping in saved.items():
            conv._MOE_TARGET_MODULE_MAPPING[key] = {k: v for k, v in mapping.items() if k == "gate"}
        yield
    finally:
        conv._MOE_TARGET_MODULE_MAPPING.clear()
        conv._MOE_TARGET_MODULE_MAPPING.update(saved)


def _use_bnb_lora_forward(model: torch.nn.Module) -> None:
    """peft's LoRA over a bitsandbytes 4-bit layer clones the base output (``lora/bnb.py``)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    for m in model.modules():
        if isinstance(m, LoraLinear) and isinstance(m.get_base_layer(), QuantLinear):
            m.forward = functools.partial(_bnb_lora_forward, m)  # type: ignore[method-assign]


def _bnb_lora_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    result = self.base_layer(x, *args, **kwargs)
    result = result.clone()
    for active in self.active_adapters:
        if active not in self.lora_A:
            continue
        lora_a, lora_b = self.lora_A[active], self.lora_B[active]
        dropout, scaling = self.lora_dropout[active], self.scaling[active]
        requires_conversion = cuda.autocast_state() is None
        if requires_conversion:
            expected = result.dtype
            x = self._cast_input_dtype(x, lora_a.weight.dtype)
        if active not in self.lora_variant:
            output = lora_b(lora_a(dropout(x))) * scaling
            if requires_conversion:
                output = output.to(expected)
            result = result + output
        else:
            result = self.lora_variant[active].forward(self, active_adapter=active, x=x, result=result)
            if requires_conversion:
                result = result.to(expected)
    return cast(torch.Tensor, result)
