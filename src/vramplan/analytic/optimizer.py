"""Optimizer states and the optimizer step's temporaries, per trainable parameter.

What each optimizer keeps (state tensors, dtypes, block scales, the small-tensor rule, managed
memory) is its row in ``facts/optimizers.py`` (the table of states and sources is there).  This
module turns a row into bytes: ``optimizer_cost`` sizes the states from the row's ``states`` and
the step temporaries with the strategy the row names (``STEP_TEMPORARIES``, the only per-optimizer
code), and ``optimizer_cost_for`` takes what the training step has (model, rank, PEFT, framework,
shards) and makes every per-optimizer decision from the row.

Step temporaries: torch's AdamW on CUDA defaults to the ``foreach`` implementation
(``_default_to_fused_or_foreach``), whose ``_multi_tensor_adamw`` allocates
``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``: one state-dtype tensor per
parameter of the group, alive together.  The Trainer's largest group is the
weight-decay group.  ``fused=True`` updates in place (no temporary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vramplan.analytic.layout import RankParams
from vramplan.facts.optimizers import (
    BNB_BLOCK,
    BNB_MIN_8BIT_SIZE,
    OptimizerFacts,
    StepTemporary,
    optimizer_facts,
    runs_as,
)
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.spec.scenario import Peft
from vramplan.units import DTYPE_BITS, ceil_div

__all__ = [
    "BNB_BLOCK", "BNB_MIN_8BIT_SIZE", "STEP_TEMPORARIES", "OptimizerCost", "StepContext", "adafactor_state_elements",
    "adafactor_step_bytes", "adafactor_step_tensors", "optimizer_assumptions", "optimizer_cost", "optimizer_cost_for",
    "state_bytes_per_param", "state_tensors_per_param",
]


@dataclass(frozen=True)
class OptimizerCost:
    state_bytes: int  # inside torch's caching allocator
    managed_bytes: int  # CUDA managed memory (paged optimizers)
    step_temporary_bytes: int


@dataclass(frozen=True)
class StepContext:
    """What a step-temporary strategy may read (counts are parameters held on this GPU)."""

    decay_group: int
    param_bytes: int  # bytes per element of the parameter the optimizer updates
    largest_param: int
    adafactor_tensors: Sequence[tuple[int, int, int]]


def _foreach_sqrt(f: OptimizerFacts, c: StepContext) -> int:
    # _foreach_sqrt(exp_avg_sqs) over the weight-decay group: one second-moment-sized tensor per parameter
    return f.states[-1].bytes_per_element(c.param_bytes) * c.decay_group


def _sign_update(f: OptimizerFacts, c: StepContext) -> int:
    # update = exp_avg.clone().mul_(b1).add(grad, alpha=1 - b1).sign_(): the clone and the add's result
    return 2 * f.states[0].bytes_per_element(c.param_bytes) * c.largest_param


def _adafactor(_f: OptimizerFacts, c: StepContext) -> int:
    return adafactor_step_bytes(c.adafactor_tensors or ((c.largest_param, 0, 0),), c.param_bytes)


STEP_TEMPORARIES: dict[StepTemporary, Callable[[OptimizerFacts, StepContext], int]] = {
    "none": lambda _f, _c: 0,
    "foreach_sqrt_decay_group": _foreach_sqrt,
    "per_tensor_sign_update": _sign_update,
    "adafactor_stepwise": _adafactor,
}
"""Step-temporary strategies by the name a row of ``facts/optimizers.py`` gives (``StepTemporary``)."""


def state_bytes_per_param(optimizer: str, param_bytes: int) -> float:
    """Average state bytes per trainable parameter (large tensors; 0 for factored states)."""
    return optimizer_facts(optimizer).state_bytes_per_param(param_bytes)


def state_tensors_per_param(optimizer: str) -> int:
    """State tensors the optimizer allocates per parameter (block scales aside), for the allocator
    event stream (``analytic/events.py``): AdamW 2, Lion 1, SGD 0."""
    return len(optimizer_facts(optimizer).states)


def optimizer_cost(
    optimizer: str,
    trainable: int,
    decay_group: int,
    param_bytes: int,
    small_tensor_params: int = 0,
    adafactor_factored: int = 0,
    largest_param: int = 0,
    adafactor_tensors: Sequence[tuple[int, int, int]] = (),
) -> OptimizerCost:
    """States and step temporaries for ``trainable`` parameters held on this GPU.

    ``small_tensor_params``: parameters in tensors below the row's small-tensor threshold
    (bitsandbytes: 4096 values), which keep every state in the rule's dtype.
    ``adafactor_factored``: the factored rows' state elements (rows + columns for the matrices,
    the full size of vectors; computed by the caller from the tensor shapes).
    ``adafactor_tensors``: (elements, rows, columns) of each parameter in step order
    (``adafactor_step_bytes``).

    >>> optimizer_cost("adamw-8bit", 2**20, 2**20, 4).state_bytes   # 2 x (2**20 + 4 x 4096 absmax)
    2129920
    """
    f = optimizer_facts(optimizer)
    if trainable == 0:
        return OptimizerCost(0, 0, 0)
    if f.factored:
        # the row and column vectors (and vectors' full states) together: adafactor_factored values
        states = adafactor_factored * f.states[0].bytes_per_element(param_bytes)
    elif f.small_tensors is not None:
        # tensors below the threshold keep every state unquantized in the rule's dtype, without scales
        big = trainable - small_tensor_params
        states = sum(st.bytes(big, param_bytes) for st in f.states)
        states += small_tensor_params * len(f.states) * DTYPE_BITS[f.small_tensors.dtype] // 8
    else:
        states = sum(st.bytes(trainable, param_bytes) for st in f.states)
    ctx = StepContext(decay_group, param_bytes, largest_param, adafactor_tensors)
    temp = STEP_TEMPORARIES[f.step_temporary](f, ctx)
    if f.managed_memory:
        return OptimizerCost(0, states, temp)
    return OptimizerCost(states, 0, temp)


def optimizer_cost_for(m: ModelSpec, rp: RankParams, *, peft: Peft | None, optimizer: str, framework: str,
                       shards: int, tp: int, trainable: int, decay: int, param_bytes: int) -> OptimizerCost:
    """The optimizer's cost on one GPU of one pipeline stage, every per-optimizer decision read from its row.

    ``trainable``/``decay``: this rank's trainable and weight-decay parameters before ZeRO/FSDP
    sharding over ``shards`` optimizer shards; ``param_bytes``: bytes per element of the parameter
    the optimizer updates (4 with fp32 masters).  The framework may run another row
    (``facts.optimizers.runs_as``: DeepSpeed's FusedAdam for ``adamw``).  Small tensors (the row's
    small-tensor rule), factored states and the per-tensor shapes of a step-wise strategy are taken
    from the model for full fine-tuning; adapters (PEFT) are counted as their parameter total, the
    largest being one ``hidden x rank`` matrix.
    """
    f = optimizer_facts(runs_as(optimizer, framework))
    small = 0
    if f.small_tensors is not None and peft is None:
        small = sum(p.total for p in m.params if p.numel < f.small_tensors.below_elements)
    factored = adafactor_state_elements(m) if f.factored and peft is None else trainable
    tensors: Sequence[tuple[int, int, int]] = ()
    if f.step_temporary == "adafactor_stepwise" and peft is None:
        tensors = adafactor_step_tensors(m, rp, tp, shards)
    largest = rp.largest_linear if peft is None else m.hidden_size * peft.rank
    return optimizer_cost(f.name, ceil_div(trainable, shards), ceil_div(decay, shards), param_bytes,
                          small_tensor_params=ceil_div(small, shards), adafactor_factored=ceil_div(factored, shards),
                          largest_param=largest, adafactor_tensors=tensors)


_STEP_ASSUMPTIONS: dict[StepTemporary, str] = {
    "foreach_sqrt_decay_group": "torch.optim.AdamW uses the foreach implementation (CUDA default): one state-sized "
                                "temporary for the weight-decay group during step()",
}
_MANAGED_ASSUMPTION = ("paged optimizer states live in CUDA managed memory: outside max_memory_allocated, "
                       "counted in device_used while resident")


def optimizer_assumptions(optimizer: str, framework: str) -> list[str]:
    """The report's assumption lines for the optimizer that ``framework`` runs."""
    f = optimizer_facts(runs_as(optimizer, framework))
    out = [_STEP_ASSUMPTIONS[f.step_temporary]] if f.step_temporary in _STEP_ASSUMPTIONS else []
    if f.managed_memory:
        out.append(_MANAGED_ASSUMPTION)
    return out


def adafactor_step_tensors(m: ModelSpec, rp: RankParams, tp: int, shards: int) -> list[tuple[int, int, int]]:
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


def adafactor_state_elements(m: ModelSpec) -> int:
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


def adafactor_step_bytes(tensors: Sequence[tuple[int, int, int]], param_bytes: int) -> int:
    """Peak temporaries of ``transformers.optimization.Adafactor.step``, one parameter at a time.

    ``tensors``: (n elements, rows, columns) per parameter in step order (the Trainer's decay
    group, then the no-decay group); rows = columns = 0 for a vector (unfactored).  Per
    parameter, in ``step()`` (transformers 4.x/5.x, unchanged since the fairseq port):

    * ``grad = grad.float()`` and ``p_data_fp32 = p.float()`` for bf16/fp16 parameters: two fp32
      copies (4n each) alive for the whole iteration (none for fp32 parameters);
    * ``update = (grad**2) + eps``: the square and the sum (4n + 4n) while the previous
      parameter's ``update`` (4 n_prev) is still bound to the local name until this assignment;
    * factored: ``_approx_sq_grad`` builds ``r_factor`` (rows) and ``c_factor`` (columns) and
      their outer product (4n) while ``update`` (4n) is alive; unfactored: ``exp_avg_sq.rsqrt()``
      (4n) beside ``update``;
    * ``p_data_fp32.add_(-update)``: the negation (4n) beside ``update``.

    So parameter i peaks at 4 (copies n_i + 2 n_i + max(n_prev, rows_i + cols_i)) bytes, with
    copies = 2 for half parameters, 0 for fp32; the step's peak is the largest over parameters.

    Worked example, Llama-3.1-8B in bf16-true: the LM head (128,256 x 4,096 = 525,336,576
    elements) follows the last down projection (58,720,256): 4 x (2 + 2) x 525,336,576
    + 4 x 58,720,256 = 8,640,266,240 B (8.6 GB) above the states.
    """
    copies = 2 if param_bytes < 4 else 0
    best = prev = 0
    for n, rows, cols in tensors:
        best = max(best, 4 * ((copies + 2) * n + max(prev, rows + cols)))
        prev = n
    return best
