"""What every term of one pipeline stage's step reads: the scenario, the precision policy, the
sharding, this rank's parameters and the activation context, computed once per stage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

from vramplan.analytic import activations as act
from vramplan.analytic.inference import litgpt_head_params
from vramplan.analytic.layout import (
    BNB_4BIT_FORMATS,
    BNB_FORMATS,
    LoraTargets,
    RankParams,
    chunk_layers,
    chunk_stages,
    head_stage,
    lora_targets,
    rank_params,
)
from vramplan.analytic.precision import PrecisionPolicy, adapter_bytes, litgpt_fp32_base, policy
from vramplan.analytic.zero_bubble import held_until_weight_pass
from vramplan.facts.pipeline_schedules import in_flight_chunks, peak_saved_bytes, pipeline_schedule
from vramplan.facts.trainer_frameworks import trainer_framework
from vramplan.spec.defaults import fsdp_group, megatron_distributed_optimizer
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.load import Resolved
from vramplan.spec.lora_match import quantized_expert_loop
from vramplan.spec.model import LayerSpec, ModelSpec
from vramplan.spec.scenario import Peft, Scenario
from vramplan.units import ceil_div

__all__ = ["StepContext", "casts_back_for", "communicators", "kbit_held_fp32", "kbit_prepares_for", "layout_style", "shards",
           "stages", "step_policy"]

# the frameworks that load a k-bit base through peft.prepare_model_for_kbit_training
KBIT_PREPARED = ("hf-trainer", "accelerate", "plain")


def shards(s: Scenario, dp: int) -> tuple[int, int, int]:
    """(optimizer/master shards, gradient shards, parameter shards) for ZeRO / FSDP."""
    par = s.parallel
    fsdp = par.fsdp
    group = fsdp_group(s, dp)
    if fsdp in ("full_shard", "hybrid_shard"):
        return group, group, group
    if fsdp == "shard_grad_op":
        return group, group, 1
    if s.effective_framework == "megatron":
        # --use-distributed-optimizer shards the fp32 main parameters and Adam's moments only (the ZeRO-1 layout,
        # distrib_optimizer.py); the bf16 parameters and the fp32 grad buffer stay whole (facts/megatron.py)
        return (dp if megatron_distributed_optimizer(s) else 1, 1, 1)
    z = par.zero_stage
    return (dp if z >= 1 else 1, dp if z >= 2 else 1, dp if z >= 3 else 1)


def communicators(s: Scenario) -> int:
    """NCCL communicators a rank holds: one per parallel dimension of more than one rank (data -- with the
    context-parallel ranks, which reduce gradients with it (``Scenario.shard_degree``) --, context, tensor, pipeline);
    each one keeps its buffers (analytic/overhead.py ``nccl_bytes``)."""
    par = s.parallel
    return (1 if s.shard_degree > 1 else 0) + (1 if par.cp > 1 else 0) + (1 if par.tp > 1 else 0) + \
        (1 if par.pp > 1 else 0)


def stages(pp: int, style: str = "loop") -> list[int]:
    """The pipeline ranks worth estimating: the first (most micro-batches in flight) and the last (the head); under
    a V schedule every rank (rank 0 holds the embedding and the head; the in-flight walk differs by rank)."""
    if pp == 1:
        return [0]
    return list(range(pp)) if style == "v" else [0, pp - 1]


def layout_style(s: Scenario) -> str:
    """The chunk layout of ``s``'s pipeline schedule (facts/pipeline_schedules.py ``style``): "loop" or "v"."""
    return pipeline_schedule(s.parallel.pp_schedule).style if s.parallel.pp > 1 else "loop"


def kbit_prepares_for(s: Scenario) -> bool:
    """peft.prepare_model_for_kbit_training runs on the scenario's bitsandbytes base: under the HF Trainer, accelerate
    or a plain loop, not with Unsloth (its own casts only the LoRA weights: facts/unsloth.py) nor LLaMA-Factory (none:
    facts/trainer_frameworks.py)."""
    t, row = s.train, trainer_framework(s.framework)
    return t.peft is not None and t.quantization in BNB_FORMATS and s.effective_framework in KBIT_PREPARED \
        and s.software.unsloth is None and (row is None or row.kbit_prepares)


def casts_back_for(s: Scenario, m: ModelSpec) -> bool:
    """The framework converts the norms and embeddings back to the model's dtype after its fp32 upcast, and that
    reaches every non-quantized parameter of ``m`` (axolotl over a model whose adapter sets
    ``Traits.norm_embed_names``: facts/trainer_frameworks.py)."""
    row = trainer_framework(s.framework)
    return row is not None and row.casts_back and m.traits.norm_embed_names


def kbit_held_fp32(s: Scenario, m: ModelSpec) -> bool:
    """The step holds the k-bit base's non-quantized parameters in fp32, as peft's k-bit preparation leaves them
    (``kbit_prepares_for``).  Not where axolotl casts the norms and embeddings back (``casts_back_for``), nor where
    DeepSpeed's engine runs the step in a half dtype: it casts every floating parameter to it
    (``DeepSpeedEngine._configure_distributed_model``, deepspeed 0.19.8 ``_cast_module_mixed_precision``;
    ``module.half()`` / ``bfloat16()`` before), the 4-bit weights' uint8 storage aside.  The analytic step
    (``StepContext.kbit``) and the traced model (trace/build.py) read this one decision."""
    return kbit_prepares_for(s) and not casts_back_for(s, m) \
        and not (s.deepspeed_engine and step_policy(s).frozen_param_bytes < 4)


def step_policy(s: Scenario) -> PrecisionPolicy:
    """The precision policy of the trainable parameters."""
    pol = policy(s)
    if s.train.peft is not None and not s.deepspeed_engine:
        # the adapters (the trainable parameters) are fp32 with peft >= 0.12 (get_peft_model's
        # autocast_adapter_dtype=True), or the base weight's dtype with older peft (precision.adapter_bytes);
        # their gradients and optimizer states follow
        adapter = adapter_bytes(s, pol)
        pol = replace(pol, param_bytes=adapter, grad_bytes=adapter)
    if litgpt_fp32_base(s):
        # Lit-GPT under bf16-mixed/fp16-mixed: Fabric's MixedPrecision leaves the model it built in fp32
        # (analytic/precision.py litgpt_fp32_base)
        pol = replace(pol, frozen_param_bytes=4)
    return pol


def _residual_bytes(pol: PrecisionPolicy, frozen_base: bool, kbit_prepared: bool) -> int:
    """The residual stream's dtype: the embeddings' output, kept by the residual adds (autocast leaves
    additions alone).  Under PEFT the frozen base, embeddings included, is loaded in the half dtype,
    unless ``prepare_model_for_kbit_training`` cast the non-quantized parameters to fp32."""
    if not frozen_base:
        return pol.residual_bytes
    return 4 if kbit_prepared else pol.frozen_param_bytes


_T = TypeVar("_T")

# rank_params by model and layout: the planner's lower bound and its estimates ask for the same few
# layouts of one model many times, and the tally walks every parameter group (a 70B model's 80 layers).
# Models and adapter settings are keyed by identity (a ``Peft`` holds a list: it has no hash; a
# ModelSpec's hash walks all its parameter groups); each entry holds them, so an identity cannot be
# reused while its entry lives.  A few models at a time: every ``resolve`` makes a new ModelSpec, and a
# long run over many scenarios must not keep them all alive.
_RANK_PARAMS: dict[int, tuple[ModelSpec, dict[tuple[object, ...], tuple[Peft | None, RankParams]]]] = {}
_MODELS_KEPT = 4
_LAYOUTS_KEPT = 256


def _rank_params(m: ModelSpec, tp: int, pp: int, ep: int, stage: int, peft: Peft | None,
                 lt: LoraTargets, frozen: tuple[str, ...] = (), virtual: int = 1, style: str = "loop") -> RankParams:
    """``layout.rank_params``, computed once per model and layout (an immutable record)."""
    mine = _RANK_PARAMS.get(id(m))
    if mine is None or mine[0] is not m:
        if len(_RANK_PARAMS) >= _MODELS_KEPT:
            _RANK_PARAMS.clear()
        mine = _RANK_PARAMS[id(m)] = (m, {})
    layouts = mine[1]
    key = (tp, pp, ep, stage, id(peft), lt, frozen, virtual, style)
    hit = layouts.get(key)
    if hit is not None and hit[0] is peft:
        return hit[1]
    if len(layouts) >= _LAYOUTS_KEPT:
        layouts.clear()
    rp = rank_params(m, tp, pp, ep, stage, peft, lt, frozen, virtual, style=style)
    layouts[key] = (peft, rp)
    return rp


@dataclass(frozen=True, eq=False)
class StepContext:
    """One pipeline stage's rank: the inputs of its terms (derived values are computed on first use)."""

    r: Resolved
    stage: int
    attention: str  # the kernel that runs (analytic/attention.py resolve_attention)
    gqa_repeat: bool
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)
    # GPipe's backward phase walked from its second micro-batch on: the first micro-batch's activations are freed
    # and every gradient exists (train.py takes the higher of this walk and the first backward's)
    gpipe_later: bool = False

    def memo(self, name: str, make: Callable[[], _T]) -> _T:
        """``make()`` computed once per stage: a value several terms read (the layers' saved tensors)."""
        if name not in self._memo:
            self._memo[name] = make()
        out: _T = self._memo[name]
        return out

    @property
    def s(self) -> Scenario:
        return self.r.scenario

    @property
    def m(self) -> ModelSpec:
        return self.r.model

    @property
    def gpu(self) -> GpuSpec:
        return self.r.gpu

    @property
    def peft(self) -> Peft | None:
        return self.s.train.peft

    @property
    def framework(self) -> str:
        return self.s.effective_framework

    @cached_property
    def pol(self) -> PrecisionPolicy:
        return step_policy(self.s)

    @cached_property
    def adapter(self) -> int:
        """Bytes per adapter element (unused without PEFT)."""
        return adapter_bytes(self.s, policy(self.s))

    @property
    def tp(self) -> int:
        return self.s.parallel.tp

    @property
    def pp(self) -> int:
        return self.s.parallel.pp

    @property
    def ep(self) -> int:
        return self.s.parallel.ep

    @cached_property
    def shards(self) -> tuple[int, int, int]:
        """(optimizer/master, gradient, parameter) shards."""
        return shards(self.s, self.s.shard_degree)

    @property
    def quant(self) -> str:
        return self.s.train.quantization if self.peft is not None else "none"

    @cached_property
    def kbit_prepares(self) -> bool:
        """peft.prepare_model_for_kbit_training runs on the k-bit base (``kbit_prepares_for``)."""
        return kbit_prepares_for(self.s)

    @cached_property
    def kbit(self) -> bool:
        """The step holds the k-bit base's non-quantized parameters in fp32 (``kbit_held_fp32``)."""
        return kbit_held_fp32(self.s, self.m)

    @cached_property
    def casts_back(self) -> bool:
        """The framework converts them back to the model's dtype after its fp32 upcast (``casts_back_for``)."""
        return casts_back_for(self.s, self.m)

    @property
    def offload_params(self) -> bool:
        return self.s.parallel.offload == "optimizer+params"

    @property
    def offload_opt(self) -> bool:
        return self.s.parallel.offload != "none"

    @property
    def last(self) -> bool:
        """This stage holds the LM head (and the loss): the last rank, or rank 0 under a V schedule."""
        return self.stage == head_stage(self.pp, self.style)

    @cached_property
    def style(self) -> str:
        """The chunk layout of the pipeline schedule (``layout_style``)."""
        return layout_style(self.s)

    @cached_property
    def litgpt_head(self) -> int:
        """Elements of Lit-GPT's 4-bit LM head on this rank; 0 outside Lit-GPT with a bitsandbytes 4-bit base.

        Lit-GPT's ``GPT.__init__`` makes ``lm_head`` as its own ``nn.Linear`` (even where the checkpoint ties it
        to the embedding, as Falcon's does), and Lightning's ``BitsandbytesPrecision`` replaces every
        ``torch.nn.Linear`` made under ``fabric.init_module`` (``ignore_modules`` empty: Lit-GPT passes none),
        so the head is quantized like the decoder's linears (lit-gpt 8641822 ``lit_gpt/lora.py``, lightning
        71aed75 ``plugins/precision/bitsandbytes.py``; analytic/inference.py, Lit-GPT section)."""
        if not (self.framework == "lightning" and self.quant in BNB_4BIT_FORMATS and self.last):
            return 0
        return litgpt_head_params(self.m, self.rp.lm_head, self.tp)

    @cached_property
    def tokens(self) -> int:
        t = self.s.train
        return ceil_div(t.micro_batch_size * t.seq_len, self.s.parallel.cp)

    @cached_property
    def lt(self) -> LoraTargets:
        return lora_targets(self.peft, self.m, self.s.software.fused_moe_experts, self.quant)

    @cached_property
    def rp(self) -> RankParams:
        return _rank_params(self.m, self.tp, self.pp, self.ep, self.stage, self.peft, self.lt, self.frozen_prefixes,
                            self.virtual, self.style)

    @cached_property
    def frozen_prefixes(self) -> tuple[str, ...]:
        """Name prefixes of the parameters full fine-tuning leaves frozen: a vision-language model's tower and
        projector with ``train.freeze_vision_tower`` (requires_grad False: no gradient, no optimizer state); the
        parameters an encoder-decoder model freezes itself (``EncoderDecoderSpec.frozen_params``)."""
        v = self.m.vision
        if v is not None and self.peft is None and self.s.train.freeze_vision_tower:
            return v.param_prefixes
        # the parameters the model itself freezes (Whisper's sinusoidal encoder positions)
        ed = self.m.encoder_decoder
        return ed.frozen_params if ed is not None and self.peft is None else ()

    @property
    def trainable(self) -> int:
        return self.rp.lora if self.peft is not None else self.rp.total - self.rp.frozen

    @property
    def trainable_shard(self) -> int:
        """Trainable parameters in this rank's optimizer partition."""
        return ceil_div(self.trainable, self.shards[0])

    @cached_property
    def layer_specs(self) -> list[LayerSpec]:
        return [self.m.layers[i] for i in self.rp.layers]

    @property
    def virtual(self) -> int:
        """Model chunks this rank holds (``parallel.pp_virtual_stages``; 1 without an interleaved schedule)."""
        return self.s.parallel.pp_virtual_stages if self.pp > 1 else 1

    @cached_property
    def in_flight_chunks(self) -> int:
        """Chunk-micro-batches whose saved activations the rank holds at its peak (the count; the bytes are
        ``in_flight_bytes``'s), by the schedule's rule
        (facts/pipeline_schedules.py ``in_flight_chunks``): 1F1B keeps up to pp micro-batches in flight on the
        first stage (arXiv 2104.04473 sec. 2.2), GPipe all of the step's, interleaved 1F1B torch's warmup + 1."""
        if self.pp == 1:
            return 1
        row = pipeline_schedule(self.s.parallel.pp_schedule)
        return in_flight_chunks(row, self.pp, self.stage, self.virtual, self.s.train.grad_accum_steps)

    @cached_property
    def in_flight(self) -> int:
        """Micro-batches whose activations the stage holds, rounded up to whole micro-batches of the rank's
        layers (``in_flight_chunks / virtual``; 1F1B: min(pp - stage, m))."""
        return ceil_div(self.in_flight_chunks, self.virtual)

    def in_flight_bytes(self, kept: Sequence[int]) -> int:
        """Bytes of the other micro-batches in flight while the timeline walks one micro-batch's saved tensors
        (``kept``: per layer of this rank, in ``rp.layers`` order): the schedule's peak over the rank's chunks
        (facts/pipeline_schedules.py ``peak_saved_bytes``, each chunk at its own layers' bytes) less the walked
        micro-batch.  1F1B and GPipe: ``(in_flight - 1) x sum(kept)``."""
        total = sum(kept)
        if self.pp == 1:
            return 0
        row = pipeline_schedule(self.s.parallel.pp_schedule)
        position = {layer: j for j, layer in enumerate(self.rp.layers)}
        chunks = chunk_layers(self.m.num_layers, self.pp, self.stage, self.virtual, self.style)
        chunk_bytes = [sum(kept[position[i]] for i in chunk) for chunk in chunks]
        peak = peak_saved_bytes(row, self.pp, self.stage, self.virtual, self.s.train.grad_accum_steps, chunk_bytes,
                                self.held_until_weight_pass(chunks) if row.in_flight == "split" else ())
        # GPipe's later backwards: the first micro-batch's saved tensors are gone
        return peak - total - (total if self.gpipe_later else 0)

    def held_until_weight_pass(self, chunks: Sequence[Sequence[int]]) -> list[int]:
        """Per local chunk (the pipeline stage ``chunk_stages`` names: loop ``stage + k pp``, V ``stage`` and
        ``2 pp - 1 - stage``), the bytes one micro-batch keeps from its input-gradient pass to its weight-gradient
        pass under a zero-bubble schedule (analytic/zero_bubble.py)."""
        pol, last = self.pol, self.pp * self.virtual - 1
        residual = _residual_bytes(pol, self.peft is not None, self.kbit)
        ids = chunk_stages(self.pp, self.stage, self.virtual, self.style)
        return [held_until_weight_pass(self.m, layers, self.tokens, pol.compute_bytes, residual, pol.autocast,
                                       first=ids[k] == 0, last=ids[k] == last)
                for k, layers in enumerate(chunks)]

    @property
    def in_backward(self) -> bool:
        """The optimizer step runs in the backward, one parameter at a time (``train.optimizer_in_backward``)."""
        return self.s.train.optimizer_in_backward

    @property
    def torchao_offload(self) -> bool:
        """torchao's CPUOffloadOptimizer holds the optimizer (``train.torchao_cpu_offload``)."""
        return self.s.train.torchao_cpu_offload != "none"

    @property
    def grads_one_at_a_time(self) -> bool:
        """Each GPU gradient is freed in the backward as soon as it is used: the optimizer step runs in the
        backward, or torchao's CPUOffloadOptimizer copies it to the host (offload_gradients)."""
        return self.in_backward or self.s.train.torchao_cpu_offload == "optimizer+gradients"

    @cached_property
    def grads_during_fwd(self) -> bool:
        """Gradients exist during the forward: from the second micro-batch of an accumulation window on
        (the Trainer sets them to None only after the optimizer step).  Not under GPipe: with pp > 1 the
        accumulation window is the schedule's micro-batches, and ``ScheduleGPipe._step_microbatches`` (torch 2.13)
        runs every forward of the step before the first backward, so the forwards see no gradients; from the
        second backward on (``gpipe_later``) every gradient is there."""
        if self.pp > 1 and pipeline_schedule(self.s.parallel.pp_schedule).in_flight == "all":
            return self.gpipe_later
        return self.s.train.grad_accum_steps > 1 or self.in_flight > 1

    @property
    def peft_layer(self) -> str:
        """The peft LoRA layer class over each adapted base linear (``act.ActContext.peft_layer``): "Linear" over a
        plain base, "Linear4bit" / "Linear8bitLt" over bitsandbytes; "" where peft's layers do not run the adapters
        (torchtune, Lit-GPT, Unsloth) or the base has another format."""
        if self.peft is None or self.s.software.unsloth is not None or self.framework in ("torchtune", "lightning"):
            return ""
        if self.quant == "none":
            return "Linear"
        if self.quant in BNB_FORMATS:
            return "Linear4bit" if self.quant in BNB_4BIT_FORMATS else "Linear8bitLt"
        return ""

    @cached_property
    def act(self) -> act.ActContext:
        s, m, pol, peft, lt, quant = self.s, self.m, self.pol, self.peft, self.lt, self.quant
        par = s.parallel
        return act.ActContext(
            compute_bytes=pol.compute_bytes, residual_bytes=_residual_bytes(pol, peft is not None, self.kbit),
            linear_input_bytes=pol.linear_input_bytes, autocast=pol.autocast, attention=self.attention,
            gqa_repeat=self.gqa_repeat, seq_len=s.train.seq_len, tp=par.tp, ep=par.ep,
            sequence_parallel=par.sequence_parallel, frozen_base=peft is not None,
            # the activation terms read a dense MLP's adapters by role (Traits.mlp_module_roles: LFM2's w1/w3/w2)
            lora_targets=lt.linear | {role for name, role in m.traits.mlp_module_roles if name in lt.linear},
            lora_rank=peft.rank if peft else 0, lora_dropout=bool(peft and peft.dropout > 0),
            dora=bool(peft and peft.method == "dora"),
            elementwise_bytes=4 if (self.kbit and pol.autocast) else 0,
            expert_bytes=pol.param_bytes if peft is None else pol.frozen_param_bytes,
            expert_loop=quantized_expert_loop(m, quant if peft is not None else "none"),
            gate_up_wrapped=bool(lt.gate_up_rank), down_wrapped=bool(lt.down_rank), router_wrapped=bool(lt.router_rank),
            sdpa=s.train.attention == "sdpa", adapter_bytes=self.adapter,
            # torchtune's 4-bit base is torchao's NF4Tensor: LinearNF4 saves the weight only (facts/torchtune.py)
            kbit_saves_input=(peft is not None and quant in BNB_4BIT_FORMATS
                              and s.software.bnb_4bit_saves_input and self.framework != "torchtune"),
            liger=s.train.liger_kernels,
            peft_layer=self.peft_layer, kbit_state_bytes=pol.frozen_param_bytes,
            # prepare_model_for_kbit_training casts the non-quantized parameters, the norms among them, to fp32
            norm_weight_bytes=4 if self.kbit else pol.param_bytes if peft is None else pol.frozen_param_bytes,
        )
