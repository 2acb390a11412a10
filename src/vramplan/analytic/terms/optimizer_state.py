"""The optimizer's terms: its states, the fp32 master weights, the step's temporaries, and where they
live when ZeRO-Offload moves them to the host.

``optimizer_cost`` (analytic/optimizer.py) is called in one place, :func:`optimizer_cost_of`, so that
the optimizer's facts can change form without touching the terms.
"""

from __future__ import annotations

from vramplan.analytic.gradients import master_weight_bytes
from vramplan.analytic.layout import RankParams
from vramplan.analytic.moment import K
from vramplan.analytic.optimizer import OptimizerCost, optimizer_cost
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.resident import offload_where
from vramplan.analytic.timeline import END, STEP
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.units import ceil_div

__all__ = ["master", "optimizer_cost_of", "optimizer_states", "step_temporary"]


def optimizer_cost_of(c: StepContext) -> OptimizerCost:
    """The optimizer's states, managed states and step temporaries for this rank's partition."""
    t, rp, pol, peft = c.s.train, c.rp, c.pol, c.peft
    shard_os = c.shards[0]
    decay = rp.lora if peft is not None else rp.decay
    small = sum(p.total for p in c.m.params if p.numel < 4096) if peft is None else 0
    adafactor = t.optimizer == "adafactor" and peft is None
    factored = _adafactor_state(c.m) if adafactor else c.trainable
    return optimizer_cost(
        t.optimizer if not (c.framework == "deepspeed" and t.optimizer == "adamw") else "adamw-fused",
        c.trainable_shard, ceil_div(decay, shard_os), 4 if pol.master_bytes else pol.param_bytes,
        small_tensor_params=ceil_div(small, shard_os), adafactor_factored=ceil_div(factored, shard_os),
        largest_param=rp.largest_linear if peft is None else c.m.hidden_size * (peft.rank if peft else 0),
        adafactor_tensors=_adafactor_tensors(c.m, rp, c.tp, shard_os) if adafactor else (),
    )


def _master_bytes(c: StepContext) -> int:
    pol = c.pol
    return master_weight_bytes(c.trainable, c.shards[0], pol.master_bytes) if pol.master_bytes else 0


def optimizer_states(c: StepContext) -> list[Term]:
    """The states on the GPU (CUDA managed memory for paged optimizers), or on the host when offloaded.

    ZeRO-Offload (arXiv 2101.06840): fp32 masters, moments and fp32 gradients live on the host;
    gradients are copied to the host partition as they are reduced.
    """
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
    """``optimizer.step()``'s temporaries (none on the GPU when the optimizer runs on the host)."""
    if c.offload_opt:
        return []
    out = [Term(K.OPTIMIZER_STEP, optimizer_cost_of(c).step_temporary_bytes, STEP, END, "optimizer.step")]
    if c.pol.master_bytes:
        # DeepSpeed builds an fp32 copy of the gradient partition for the optimizer step
        out.append(Term(K.OPTIMIZER_STEP, c.trainable_shard * 4, STEP, END, "optimizer.step.fp32_gradients"))
    return out


def _adafactor_tensors(m: ModelSpec, rp: RankParams, tp: int, shards: int) -> list[tuple[int, int, int]]:
    """(elements, rows, columns) of this rank's parameters in the order Adafactor steps through them.

    The Trainer's groups (``get_decay_parameter_names``): the decay group (embeddings, linear
    weights, the LM head, in module order, layer by layer) then the no-decay group (norm weights
    and biases).  A weight [out, in] is factored into out rows and in columns; transformers 5
    stores a layer's routed experts as one [E, 2I, h] gate-up and one [E, h, I] down tensor.
    Vector parameters are not factored (0, 0).  Two layers are listed: the step's peak depends
    only on each tensor and the one before it.
    """
    layers = list(rp.layers)[:2]

    def shape(p: ParamGroup, n: int) -> tuple[int, int, int]:
        n = ceil_div(n, shards)
        if p.in_features and p.out_features and shards == 1:
            return n, n // p.in_features, n // p.out_features
        if p.role == "embedding" and shards == 1:
            return n, n // m.hidden_size, m.hidden_size
        return n, 0, 0

    def tp_numel(p: ParamGroup) -> int:
        return ceil_div(p.numel, tp) if p.tp in ("column", "row", "vocab") else p.numel

    decay: list[tuple[int, int, int]] = []
    no_decay: list[tuple[int, int, int]] = []
    pre = [p for p in m.params if not p.layer_span and p.role in ("embedding", "position")]
    post = [p for p in m.params if not p.layer_span and p not in pre]
    layered = [p for p in m.params if p.layer_span]
    if rp.has_embedding:
        decay += [shape(p, tp_numel(p)) for p in pre]
    for i in layers:
        gate_up = 0
        for p in layered:
            if i not in p.layer_span:
                continue
            if p.role in ("norm", "bias"):
                no_decay.append(shape(p, tp_numel(p)))
            elif p.role == "expert":
                n = tp_numel(p) * (p.count // len(p.layer_span))  # the layer's experts in one tensor
                if p.module in ("gate_proj", "up_proj") and m.mlp_gated:
                    gate_up += n
                    if gate_up == 2 * n:
                        decay.append((ceil_div(gate_up, shards), 0, 0) if shards > 1 else
                                     (gate_up, gate_up // p.in_features, gate_up // (2 * p.out_features)))
                else:
                    decay.append(shape(p, n))
            else:
                decay.append(shape(p, tp_numel(p)))
    for p in post:
        if p.role == "lm_head" and not rp.has_lm_head:
            continue
        (no_decay if p.role in ("norm", "bias") else decay).append(shape(p, tp_numel(p)))
    return decay + no_decay


def _adafactor_state(m: ModelSpec) -> int:
    """Adafactor state elements: rows + columns for each matrix, the full size for vectors."""
    total = 0
    for p in m.params:
        if p.in_features and p.out_features:
            total += (p.in_features + p.out_features) * p.count
        elif p.role in ("embedding", "position"):
            rows = p.numel // m.hidden_size
            total += (rows + m.hidden_size) * p.count
        else:
            total += p.total
    return total
