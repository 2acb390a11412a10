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

from vramplan.analytic.layout import RankParams, split_on_rank
from vramplan.errors import Problem, ScenarioError
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
    "BNB_BLOCK", "BNB_MIN_8BIT_SIZE", "STEP_TEMPORARIES", "OptimizerCost", "StepContext", "SubsetCensus",
    "adafactor_state_elements", "adafactor_step_bytes", "adafactor_step_tensors", "came_step_bytes",
    "low_rank_step_bytes", "muon_step_bytes", "optimizer_assumptions", "optimizer_cost", "optimizer_cost_for",
    "state_bytes_per_param", "state_tensors_per_param", "subset_census",
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
    # the hidden matrices on this rank: (out, in, instances), unsharded (a subset layout's step works on
    # whole matrices), and the other trainable tensors' sizes in step order (low-rank rows)
    matrices: Sequence[tuple[int, int, int]] = ()
    rest_tensors: Sequence[int] = ()
    rank: int = 0
    svd: bool = False


def _foreach_sqrt(f: OptimizerFacts, c: StepContext) -> int:
    # _foreach_sqrt(exp_avg_sqs) over the weight-decay group: one second-moment-sized tensor per parameter
    return f.states[-1].bytes_per_element(c.param_bytes) * c.decay_group


def _sign_update(f: OptimizerFacts, c: StepContext) -> int:
    # update = exp_avg.clone().mul_(b1).add(grad, alpha=1 - b1).sign_(): the clone and the add's result
    return 2 * f.states[0].bytes_per_element(c.param_bytes) * c.largest_param


def _adafactor(_f: OptimizerFacts, c: StepContext) -> int:
    return adafactor_step_bytes(c.adafactor_tensors or ((c.largest_param, 0, 0),), c.param_bytes)


def _muon(_f: OptimizerFacts, c: StepContext) -> int:
    return muon_step_bytes(c.matrices, c.param_bytes)


def _low_rank(_f: OptimizerFacts, c: StepContext) -> int:
    return low_rank_step_bytes(c.rest_tensors, c.matrices, c.param_bytes, c.rank, svd=c.svd)


def _adam_mini(_f: OptimizerFacts, c: StepContext) -> int:
    # Adam_mini.step, per parameter: grad = p.grad.to(float32) (a copy for half gradients) and one fp32
    # tensor of the parameter's size (h = v.sqrt() for the embeddings and head, m * stepsize elsewhere)
    copies = 1 if c.param_bytes < 4 else 0
    return 4 * (copies + 1) * c.largest_param


def _came(_f: OptimizerFacts, c: StepContext) -> int:
    return came_step_bytes(c.adafactor_tensors or ((c.largest_param, 0, 0),), c.param_bytes)


STEP_TEMPORARIES: dict[StepTemporary, Callable[[OptimizerFacts, StepContext], int]] = {
    "none": lambda _f, _c: 0,
    "foreach_sqrt_decay_group": _foreach_sqrt,
    "per_tensor_sign_update": _sign_update,
    "adafactor_stepwise": _adafactor,
    "newton_schulz_matrix": _muon,
    "low_rank_projection": _low_rank,
    "adam_mini_stepwise": _adam_mini,
    "came_stepwise": _came,
}
"""Step-temporary strategies by the name a row of ``facts/optimizers.py`` gives (``StepTemporary``)."""


def state_bytes_per_param(optimizer: str, param_bytes: int) -> float:
    """Average state bytes per trainable parameter (large tensors; 0 for factored states)."""
    return optimizer_facts(optimizer).state_bytes_per_param(param_bytes)


def state_tensors_per_param(optimizer: str) -> int:
    """State tensors the optimizer allocates per parameter (block scales aside), for the allocator
    event stream (``analytic/events.py``): AdamW 2, Lion 1, SGD 0."""
    return len(optimizer_facts(optimizer).states)


@dataclass(frozen=True)
class SubsetCensus:
    """This rank's parameters as a row's subset layout sees them (before ZeRO/FSDP sharding):
    ``params`` elements in the subset's tensors, ``state_elements`` the elements its states are sized on
    (``params``, or r x max(out, in) per matrix for a low-rank subset), ``projection`` the r x min(out, in)
    projection elements of a low-rank subset."""

    params: int = 0
    state_elements: int = 0
    projection: int = 0


def _state_bytes(f: OptimizerFacts, trainable: int, param_bytes: int, small: int, factored: int,
                 matrix_factors: int) -> int:
    """Bytes of the row's ``states`` for ``trainable`` parameters (the subset's excluded)."""
    if f.factored:
        # Factored states come in row/column pairs: a pair holds rows + columns of each matrix and the full
        # size of each vector (``factored`` elements), or the matrices' rows + columns only (``matrices_only``)
        fac = [st for st in f.states if st.factored]
        out = sum(st.bytes(trainable, param_bytes) for st in f.states if not st.factored)
        for st in fac[::2]:
            out += (matrix_factors if st.matrices_only else factored) * st.bytes_per_element(param_bytes)
        return out
    if f.small_tensors is not None:
        # tensors below the threshold keep every state unquantized in the rule's dtype, without scales
        big = trainable - small
        rule = f.small_tensors.dtype
        small_bytes = param_bytes if rule is None else DTYPE_BITS[rule] // 8
        return sum(st.bytes(big, param_bytes) for st in f.states) + small * len(f.states) * small_bytes
    return sum(st.bytes(trainable, param_bytes) for st in f.states)


def optimizer_cost(
    optimizer: str,
    trainable: int,
    decay_group: int,
    param_bytes: int,
    small_tensor_params: int = 0,
    adafactor_factored: int = 0,
    largest_param: int = 0,
    adafactor_tensors: Sequence[tuple[int, int, int]] = (),
    *,
    subset: SubsetCensus = SubsetCensus(),
    matrix_factors: int = 0,
    step: StepContext | None = None,
) -> OptimizerCost:
    """States and step temporaries for ``trainable`` parameters held on this GPU.

    ``small_tensor_params``: parameters in tensors below the row's small-tensor threshold
    (bitsandbytes: 4096 values), which keep every state in the rule's dtype.
    ``adafactor_factored``: the factored rows' state elements (rows + columns for the matrices,
    the full size of vectors; computed by the caller from the tensor shapes); ``matrix_factors``: rows +
    columns of the matrices only (CAME's confidence pair).
    ``adafactor_tensors``: (elements, rows, columns) of each parameter in step order
    (``adafactor_step_bytes``).  ``subset``: the row's subset layout's census on this GPU (its
    ``params`` are part of ``trainable``); ``step``: the step-temporary context when the caller has more
    than the counts above (the subset rows' matrix shapes).

    >>> optimizer_cost("adamw-8bit", 2**20, 2**20, 4).state_bytes   # 2 x (2**20 + 4 x 4096 absmax)
    2129920
    """
    f = optimizer_facts(optimizer)
    if trainable == 0:
        return OptimizerCost(0, 0, 0)
    states = _state_bytes(f, trainable - subset.params, param_bytes, small_tensor_params, adafactor_factored,
                          matrix_factors)
    if f.subset is not None:
        states += sum(st.bytes(subset.state_elements, param_bytes) for st in f.subset.states)
        states += subset.projection * param_bytes
    ctx = step or StepContext(decay_group, param_bytes, largest_param, adafactor_tensors)
    temp = STEP_TEMPORARIES[f.step_temporary](f, ctx)
    if f.managed_memory:
        return OptimizerCost(0, states, temp)
    return OptimizerCost(states, 0, temp)


def _embedding_head(m: ModelSpec, rp: RankParams, tp: int) -> list[int]:
    """Elements of each input-embedding and untied LM-head tensor on this rank."""
    emb = [split_on_rank(p, tp, 1) for p in m.params if p.role == "embedding" for _ in range(p.count)]
    head = [split_on_rank(p, tp, 1) for p in m.params if p.role == "lm_head" for _ in range(p.count)]
    return (emb if rp.has_embedding else []) + (head if rp.has_lm_head else [])


def subset_census(f: OptimizerFacts, m: ModelSpec, rp: RankParams, tp: int) -> SubsetCensus:
    """The row's subset layout on this rank (``facts.optimizers.SubsetLayout``).

    Hidden matrices: the decoder's linear weights (``RankParams.linear_shapes``, as this rank holds
    them); a low-rank subset (GaLore, APOLLO) sizes its states on r x max(out, in) and keeps an
    r x min(out, in) projection per matrix.  Embeddings and head: the input embeddings and untied head.
    """
    sub = f.subset
    if sub is None:
        return SubsetCensus()
    if sub.params == "embedding_head":
        n = sum(_embedding_head(m, rp, tp))
        return SubsetCensus(n, n, 0)
    if not sub.rank:
        return SubsetCensus(rp.linear, rp.linear, 0)
    r = sub.rank
    big = sum(min(r, min(fi, fo)) * max(fi, fo) * k for _role, fi, fo, _each, k in rp.linear_shapes)
    proj = sum(min(r, min(fi, fo)) * min(fi, fo) * k for _role, fi, fo, _each, k in rp.linear_shapes)
    return SubsetCensus(rp.linear, big, proj)


def _rest_tensors(m: ModelSpec, rp: RankParams, tp: int) -> list[int]:
    """The trainable tensors outside the hidden matrices in the Trainer's order for GaLore and APOLLO
    (transformers puts the non-target parameters in the first group): the embeddings, one norm vector,
    the LM head (the order fixes which tensor's temporaries precede a matrix's)."""
    eh = _embedding_head(m, rp, tp)
    norm = [m.hidden_size]
    return eh[:1] + norm + eh[1:] if rp.has_embedding else norm + eh


def _step_context(f: OptimizerFacts, m: ModelSpec, rp: RankParams, peft: Peft | None, tp: int, shards: int,
                  decay: int, param_bytes: int) -> StepContext:
    tensors: Sequence[tuple[int, int, int]] = ()
    if f.step_temporary in ("adafactor_stepwise", "came_stepwise") and peft is None:
        tensors = adafactor_step_tensors(m, rp, tp, shards)
    largest = rp.largest_linear if peft is None else m.hidden_size * peft.rank
    if f.step_temporary == "adam_mini_stepwise" and peft is None:
        largest = max([largest, *_embedding_head(m, rp, tp)])
    matrices: Sequence[tuple[int, int, int]] = ()
    rest: Sequence[int] = ()
    if f.subset is not None and f.subset.params == "hidden_matrices":
        matrices = [(fo, fi, k) for _role, fi, fo, _each, k in rp.linear_shapes]
        rest = _rest_tensors(m, rp, tp)
    rank = f.subset.rank if f.subset is not None else 0
    svd = f.subset is not None and f.subset.projection == "svd"
    return StepContext(ceil_div(decay, shards), param_bytes, largest, tensors, matrices, rest, rank, svd)


def optimizer_cost_for(m: ModelSpec, rp: RankParams, *, peft: Peft | None, optimizer: str, framework: str,
                       shards: int, tp: int, trainable: int, decay: int, param_bytes: int) -> OptimizerCost:
    """The optimizer's cost on one GPU of one pipeline stage, every per-optimizer decision read from its row.

    ``trainable``/``decay``: this rank's trainable and weight-decay parameters before ZeRO/FSDP
    sharding over ``shards`` optimizer shards; ``param_bytes``: bytes per element of the parameter
    the optimizer updates (4 with fp32 masters).  The framework may run another row
    (``facts.optimizers.runs_as``: DeepSpeed's FusedAdam for ``adamw``).  Small tensors (the row's
    small-tensor rule), factored states, a subset layout (``subset_census``) and the per-tensor shapes
    of a step-wise strategy are taken from the model for full fine-tuning; adapters (PEFT) are counted
    as their parameter total, the largest being one ``hidden x rank`` matrix.  Under ZeRO/FSDP every
    state is sharded evenly; a subset row's step temporaries are those of whole matrices.
    """
    f = optimizer_facts(runs_as(optimizer, framework))
    if f.subset is not None and f.subset.params == "hidden_matrices" and peft is not None:
        raise ScenarioError([Problem("train.optimizer", f"{optimizer} updates the model's hidden matrices; with "
                                     "train.peft the trainable parameters are adapters (not modelled)",
                                     "use full fine-tuning, or another optimizer with train.peft")])
    small = 0
    if f.small_tensors is not None and peft is None:
        small = sum(p.total for p in m.params if p.numel < f.small_tensors.below_elements)
    factored = adafactor_state_elements(m) if f.factored and peft is None else trainable
    matrix_factors = factored - sum(p.total for p in m.params if not _is_factored(m, p)) if peft is None else 0
    census = subset_census(f, m, rp, tp) if peft is None else SubsetCensus()
    census = SubsetCensus(ceil_div(census.params, shards), ceil_div(census.state_elements, shards),
                          ceil_div(census.projection, shards))
    ctx = _step_context(f, m, rp, peft, tp, shards, decay, param_bytes)
    return optimizer_cost(f.name, ceil_div(trainable, shards), ceil_div(decay, shards), param_bytes,
                          small_tensor_params=ceil_div(small, shards), adafactor_factored=ceil_div(factored, shards),
                          largest_param=ctx.largest_param, adafactor_tensors=ctx.adafactor_tensors,
                          subset=census, matrix_factors=ceil_div(max(0, matrix_factors), shards), step=ctx)


def _is_factored(m: ModelSpec, p: ParamGroup) -> bool:
    """Adafactor and CAME factor a matrix (a linear weight or an embedding), not a vector."""
    return bool(p.in_features and p.out_features) or p.role in ("embedding", "position")


_STEP_ASSUMPTIONS: dict[StepTemporary, str] = {
    "foreach_sqrt_decay_group": "torch.optim.AdamW uses the foreach implementation (CUDA default): one state-sized "
                                "temporary for the weight-decay group during step()",
    "newton_schulz_matrix": "Muon: torch.optim.Muon over the decoder's 2-D hidden matrices, fused torch.optim.AdamW "
                            "over the embeddings, LM head, norms and biases; the Newton-Schulz step of one whole "
                            "matrix at a time (ZeRO/FSDP shards only the states)",
    "low_rank_projection": "low-rank optimizer (GaLore/APOLLO) on the attention and MLP matrices, AdamW elsewhere; "
                           "one parameter updated at a time; the SVD solver's workspace is not counted",
    "adam_mini_stepwise": "Adam-mini: its per-block second moments (one fp32 value per head or tensor) are not "
                          "counted; one parameter updated at a time",
    "came_stepwise": "CAME: one parameter updated at a time in fp32",
}
_TORCHAO_ASSUMPTION = ("torchao low-bit AdamW: each parameter's update is one torch.compile graph; its fp32 "
                       "intermediates and the per-state quantization maps are not counted")
_MANAGED_ASSUMPTION = ("paged optimizer states live in CUDA managed memory: outside max_memory_allocated, "
                       "counted in device_used while resident")


def optimizer_assumptions(optimizer: str, framework: str) -> list[str]:
    """The report's assumption lines for the optimizer that ``framework`` runs."""
    f = optimizer_facts(runs_as(optimizer, framework))
    out = [_STEP_ASSUMPTIONS[f.step_temporary]] if f.step_temporary in _STEP_ASSUMPTIONS else []
    if f.managed_memory:
        out.append(_MANAGED_ASSUMPTION)
    if f.small_tensors is not None and f.small_tensors.dtype is None:
        out.append(_TORCHAO_ASSUMPTION)
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


def muon_step_bytes(matrices: Sequence[tuple[int, int, int]], param_bytes: int) -> int:
    """Peak temporaries of ``torch.optim.Muon.step`` (torch 2.13 ``_single_tensor_muon``), one hidden
    matrix at a time; ``matrices``: (out, in, instances).

    Per matrix of k = min(out, in) and K = max(out, in) values a side: ``update = grad.lerp(buf,
    momentum)`` (Nesterov, the default) is a new tensor in the gradient's dtype (kK x param_bytes) alive
    to the end; ``_zeropower_via_newtonschulz`` casts it to bf16 (``grad.bfloat16()``) and iterates
    ``gram = X @ X.T`` (k x k), ``gram_update = addmm(gram, gram, gram)`` (k x k) and ``X = addmm(X,
    gram_update, X)`` (k x K): from the second of the five iterations, the old and the new X, the gram
    and its update are alive together, 2 x (2 kK + 2 k^2) bytes in bf16.  So a matrix peaks at
    ``param_bytes x kK + 4 kK + 4 k^2``; the step's peak is the largest over the matrices.  The
    fused AdamW of the other parameters updates in place.

    Llama-3.2-1B with fp32 parameters: the MLP's 8,192 x 2,048 matrices, k = 2,048, K = 8,192:
    4 x 16,777,216 + 4 x 16,777,216 + 4 x 4,194,304 = 150,994,944 B.

    >>> muon_step_bytes([(8192, 2048, 16), (2048, 2048, 16)], 4)
    150994944
    """
    best = 0
    for out, inp, _count in matrices:
        k, big = min(out, inp), max(out, inp)
        best = max(best, param_bytes * k * big + 4 * k * big + 4 * k * k)
    return best


def low_rank_step_bytes(rest: Sequence[int], matrices: Sequence[tuple[int, int, int]], param_bytes: int,
                        rank: int, *, svd: bool) -> int:
    """Peak temporaries of GaLore's ``AdamW.step`` (galore_torch/adamw.py) and APOLLO's
    (apollo_torch/apollo.py), one parameter at a time in the Trainer's order: ``rest`` (the tensors
    outside the target matrices, first group) then the ``matrices`` (out, in, instances), two layers.

    A tensor of n values outside the targets: ``denom = exp_avg_sq.sqrt()`` and ``norm_grad = exp_avg /
    denom`` (2 n x param_bytes).  A target matrix (k = min(out, in), K = max(out, in), r = min(rank, k)):
    the projected gradient, ``denom`` and the low-rank ``norm_grad`` (3 r K x param_bytes), then the
    full-size update and its scaled copy (GaLore: ``project_back`` and ``* scale``; APOLLO: ``p.grad *
    factor`` and the norm-growth limiter's division): 2 out x in x param_bytes.  GaLore's projection
    step (``get_orthogonal_matrix``, the first step and every ``update_proj_gap``-th) instead holds the
    fp32 copy of a half gradient (4 out x in), ``U`` (4 out x k), ``S`` (4 k) and ``Vh`` (4 k x in) of
    ``torch.linalg.svd(full_matrices=False)`` (the solver's workspace is not counted).  The previous
    tensor's full-size ``norm_grad`` stays bound to its local name until it is reassigned, so it is
    added to each tensor's peak.

    A 64 x 32 matrix, rank 8, fp32: 3 x 8 x 64 x 4 + 2 x 2,048 x 4 = 22,528 B, after the previous
    matrix's 2,048 x 4 = 8,192 B norm_grad: 30,720 B.

    >>> low_rank_step_bytes([1000], [(64, 32, 2)], 4, 8, svd=False)
    30720
    """
    seq: list[tuple[int, int, int]] = [(n, 0, 0) for n in rest]
    seq += [(out, inp, 1) for out, inp, _count in matrices] * 2
    best = prev = 0
    for a, b, target in seq:
        if not target:
            n = a
            best = max(best, prev + 2 * n * param_bytes)
            prev = n * param_bytes
            continue
        n, k, big = a * b, min(a, b), max(a, b)
        r = min(rank, k)
        update = 3 * r * big * param_bytes + 2 * n * param_bytes
        proj = ((4 * n if param_bytes < 4 else 0) + 4 * k * (a + b + 1)) if svd else 0
        best = max(best, prev + max(update, proj))
        prev = n * param_bytes
    return best


def came_step_bytes(tensors: Sequence[tuple[int, int, int]], param_bytes: int) -> int:
    """Peak temporaries of ``came_pytorch.CAME.step``, one parameter at a time (``tensors`` as for
    ``adafactor_step_bytes``), all in fp32.

    Per parameter of n values: ``grad.float()`` (4n for half gradients); ``update = (grad**2) + eps``
    (the square and the sum, 8n) while the previous parameter's ``update`` and ``res`` are still bound
    to their names (4 n_prev each); then ``res = (update - exp_avg)**2 + eps`` (the difference, the
    square and the sum: at most 8n at once beside ``update``, 4n) with the previous ``res`` alive
    (4 n_prev); the factored approximations (``r_factor * c_factor``, 4n) replace ``update`` and
    ``res`` one at a time.  So parameter i peaks at 4 (copies n_i + max(2 n_i + 2 n_prev, 3 n_i +
    n_prev)), copies = 1 for half gradients.

    >>> came_step_bytes([(100, 10, 10), (1000, 10, 100)], 4)   # 4 x max(2,000 + 200, 3,000 + 100)
    12400
    """
    copies = 1 if param_bytes < 4 else 0
    best = prev = 0
    for n, _rows, _cols in tensors:
        best = max(best, 4 * (copies * n + max(2 * n + 2 * prev, 3 * n + prev)))
        prev = n
    return best
