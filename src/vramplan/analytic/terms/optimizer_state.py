"""The optimizer's terms: its states, the fp32 master weights, the step's temporaries, and where they
live when ZeRO-Offload moves them to the host.

The optimizer's cost (analytic/optimizer.py ``optimizer_cost_for``, reading the optimizer's row in
facts/optimizers.py) is computed in one place, :func:`optimizer_cost_of`.
"""

from __future__ import annotations

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.gradients import master_weight_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.optimizer import OptimizerCost, optimizer_cost_for
from vramplan.analytic.terms import cpu_offload
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.resident import offload_where
from vramplan.analytic.timeline import END, STEP

__all__ = ["SUB_GROUP_SIZE", "master", "optimizer_cost_of", "optimizer_states", "step_temporary", "zero3_sub_groups",
           "zero_stage_stepping", "zero_step"]

# stage3.py steps one sub-group of the partition at a time: DeepSpeedZeroConfig.sub_group_size's default (1e9
# elements, runtime/zero/config.py; the Hugging Face example configs write the same), which no scenario key changes.
# ``_create_fp16_sub_groups`` closes a sub-group at the parameter that takes it to sub_group_size or more, so a
# sub-group holds less than sub_group_size + one parameter's partition.
SUB_GROUP_SIZE = 1_000_000_000


def optimizer_cost_of(c: StepContext) -> OptimizerCost:
    """The optimizer's states, managed states and step temporaries for this rank's partition; every
    per-optimizer decision (the framework's substitute, small tensors, factored states, the step-wise
    strategy's tensors) is read from its row (facts/optimizers.py) by ``optimizer_cost_for``."""
    peft, pol = c.peft, c.pol
    return optimizer_cost_for(
        c.m, c.rp, peft=peft, optimizer=c.s.train.optimizer, framework=c.framework, shards=c.shards[0], tp=c.tp,
        trainable=c.trainable, decay=c.rp.lora if peft is not None else c.rp.decay - c.rp.frozen_decay,
        param_bytes=4 if pol.master_bytes else pol.param_bytes)


def _master_bytes(c: StepContext) -> int:
    pol = c.pol
    return master_weight_bytes(c.trainable, c.shards[0], pol.master_bytes) if pol.master_bytes else 0


def optimizer_states(c: StepContext) -> list[Term]:
    """The states on the GPU (CUDA managed memory for paged optimizers), or on the host when offloaded.

    ZeRO-Offload (arXiv 2101.06840): fp32 masters, moments and fp32 gradients live on the host;
    gradients are copied to the host partition as they are reduced.
    """
    if c.torchao_offload:
        return cpu_offload.optimizer_states(c)
    oc = optimizer_cost_of(c)
    name = c.s.train.optimizer
    if c.offload_opt:
        where = offload_where(c)
        return [resident(K.OPTIMIZER_STATES, 0, "optimizer.states", optimizer=name),
                resident(K.OPTIMIZER_STATES, oc.state_bytes, "optimizer.states.offloaded", where=where, optimizer=name),
                resident(K.OPTIMIZER_STATES, oc.managed_bytes, "optimizer.managed.offloaded", where=where,
                         optimizer=name),
                resident(K.MASTER, _master_bytes(c), "master.offloaded", where=where),
                resident(K.GRADIENTS, c.trainable_shard * 4, "gradients.fp32.offloaded", where=where)]
    return [resident(K.OPTIMIZER_STATES, oc.state_bytes, "optimizer.states", optimizer=name),
            resident(K.OPTIMIZER_STATES, oc.managed_bytes, "optimizer.managed", where="managed", optimizer=name)]


def master(c: StepContext) -> list[Term]:
    """fp32 master weights of half-precision trainable parameters (DeepSpeed, Megatron)."""
    return [resident(K.MASTER, 0 if c.offload_opt else _master_bytes(c), "master")]


def step_temporary(c: StepContext) -> list[Term]:
    """``optimizer.step()``'s temporaries (none on the GPU when the optimizer runs on the host, torchao's
    CPUOffloadOptimizer's fused AdamW included; each
    parameter's own when the step runs in the backward, terms/in_backward.py)."""
    if c.offload_opt or c.in_backward or c.torchao_offload:
        return []
    nbytes = optimizer_cost_of(c).step_temporary_bytes
    groups = zero3_sub_groups(c)
    if groups:
        # ZeRO-3 hands the optimizer one sub-group's flat fp32 partition per step() (stage3.py _optimizer_step:
        # ``param_groups[...]['params'] = [fp32_param]``, deepspeed 0.19.8 line 1260): the largest sub-group's
        # temporaries, not the whole partition's
        nbytes = nbytes * max(groups) // sum(groups)
    out = [Term(K.OPTIMIZER_STEP, nbytes, STEP, END, "optimizer.step")]
    if c.pol.master_bytes and c.pol.grad_bytes < 4 and not zero_step(c):
        # DeepSpeed builds an fp32 copy of the gradient partition for the optimizer step; Megatron-Core's gradients
        # are fp32 already and its main gradients views of them (distrib_optimizer.py line 2396: .float() of fp32)
        out.append(Term(K.OPTIMIZER_STEP, c.trainable_shard * 4, STEP, END, "optimizer.step.fp32_gradients"))
    return out


def zero3_sub_groups(c: StepContext) -> tuple[int, ...]:
    """The elements of each optimizer sub-group of this rank's trainable partition when ZeRO-3 steps it with its
    partitions on the GPU (() otherwise): ``SUB_GROUP_SIZE`` elements each and the rest (``_create_fp16_sub_groups``
    closes a sub-group at the parameter that reaches it: the cut inside a parameter is not modelled)."""
    if zero_stage_stepping(c) != 3 or c.offload_params:
        return ()
    full, rest = divmod(c.trainable_shard, SUB_GROUP_SIZE)
    return (SUB_GROUP_SIZE,) * full + ((rest,) if rest else ())


def zero_stage_stepping(c: StepContext) -> int:
    """The DeepSpeed ZeRO stage whose optimizer runs this rank's step (1-3), 0 when none does: ZeRO with trainable
    parameters, the step neither in the backward nor torchao's offload optimizer's (ZeRO-3 on one rank too: stage3.py
    steps its sub-groups whatever the world size)."""
    s = c.s
    if not deepspeed_zero(s) or c.trainable == 0 or c.in_backward or c.torchao_offload:
        return 0
    stage = s.parallel.zero_stage
    return stage


def zero_step(c: StepContext) -> bool:
    """DeepSpeed's ZeRO optimizer runs this rank's step on the GPU (the optimizer not offloaded): its gradient
    copies, the fp32 one included, are terms/deepspeed.py ``step_norm_and_flatten``'s."""
    return zero_stage_stepping(c) > 0 and not c.offload_opt
