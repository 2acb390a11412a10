"""Which parameters live on one GPU: tensor, pipeline and expert parallel splits, and PEFT.

Splits follow Megatron-LM (arXiv 1909.08053 section 3): column-parallel linears
split their output features, row-parallel linears their input features, norms are
replicated, embeddings and the LM head are split along the vocabulary.  Pipeline
stage 0 holds the embedding and the first L/pp layers; the last stage holds the
LM head.  Expert parallelism divides each MoE layer's experts by ``ep``.

Everything here is a parameter *count*; bytes are applied by the term modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.spec.scenario import Peft
from vramplan.units import ceil_div

LINEAR_ROLES = ("linear", "expert", "lm_head")
# Frameworks whose tensor parallelism is transformers' own ``tp_plan`` on DTensor
# (``from_pretrained(tp_plan="auto")``, transformers/distributed/tensor_parallel.py).  Two of its terms
# differ from Megatron's (DeepSpeed, torchtitan keep the Megatron-style vocabulary-parallel loss):
# * the LM head is ``colwise_gather_output``: the logits are all-gathered, so every rank holds the
#   full-vocabulary logits and loss (``_tp_plan = {"lm_head": "colwise_gather_output"}``);
# * the input embedding is ``embedding_rowwise`` (vocabulary-parallel), but DTensor's embedding backward
#   has no strategy that yields a row-sharded weight gradient (torch/distributed/tensor/_ops/
#   _embedding_ops.py ``embedding_dense_backward_strategy``): the gradient comes out replicated, the full
#   ``vocab x hidden`` on every rank, and the optimizer's ops redistribute it to the row shard (a copy,
#   ``Shard._replicate_to_shard``).
HF_TP_FRAMEWORKS = ("hf-trainer", "accelerate", "plain", "lightning")


def gathers_logits(framework: str, tp: int) -> bool:
    """Whether every tensor-parallel rank holds the full-vocabulary logits (transformers' tp_plan)."""
    return tp > 1 and framework in HF_TP_FRAMEWORKS


def replicated_embedding_grad(model: ModelSpec, tp: int, framework: str) -> int:
    """Elements of the vocabulary-parallel input embedding whose gradient every rank holds whole (see
    HF_TP_FRAMEWORKS); 0 where the gradient is sharded.  (Tied embeddings are left as sharded.)"""
    if tp == 1 or framework not in HF_TP_FRAMEWORKS or model.tie_word_embeddings:
        return 0
    return sum(p.total for p in model.params if p.role == "embedding" and p.tp == "vocab")


@dataclass(frozen=True)
class RankParams:
    """Parameter counts held by one GPU of one pipeline stage (before ZeRO/FSDP sharding)."""

    stage: int
    layers: tuple[int, ...]
    total: int  # every base parameter on this rank
    linear: int  # base parameters in decoder linear weights (quantizable); excludes the LM head
    linear_out_features: int  # sum of out_features of those linears (int8 row scales)
    lm_head: int  # untied LM head parameters on this rank (never quantized)
    largest_linear: int  # elements of the largest single linear weight (dequant temporaries)
    decay: int  # parameters in the weight-decay group (all but biases and norms)
    per_layer: tuple[int, ...]  # base parameters of each layer on this rank
    outside_layers: int
    has_embedding: bool
    has_lm_head: bool
    lora: int  # adapter parameters (0 without PEFT)
    lora_per_layer: tuple[int, ...]
    dora_magnitudes: int


def _split(p: ParamGroup, tp: int, ep: int) -> int:
    """Elements of one instance of ``p`` held by one tensor-parallel rank."""
    if p.tp in ("column", "row", "vocab"):
        return ceil_div(p.numel, tp)
    if p.tp == "expert" and ep == 1:
        return ceil_div(p.numel, tp)  # without expert parallelism each expert is split like a dense MLP
    return p.numel


def _count_on_rank(p: ParamGroup, layers: set[int], ep: int) -> int:
    """Instances of ``p`` on this stage (and this expert-parallel rank)."""
    if not p.layer_span:
        return p.count
    per_layer = p.count // len(p.layer_span)
    held = sum(1 for i in p.layer_span if i in layers)
    if p.role == "expert" or p.tp == "expert":
        per_layer = ceil_div(per_layer, ep)
    return per_layer * held


def stage_layers(num_layers: int, pp: int, stage: int) -> tuple[int, ...]:
    """Layers of one pipeline stage: an even split, the first stages taking the remainder."""
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return tuple(range(start, start + base + (1 if stage < extra else 0)))


def targets(peft: Peft | None, model: ModelSpec) -> set[str]:
    """Module names an adapter attaches to (PEFT's ``target_modules``; 'all-linear' = every linear but the head)."""
    if peft is None:
        return set()
    if peft.target_modules == "all-linear":
        return {p.module for p in model.params if p.role in ("linear", "expert")}
    return set(peft.target_modules)


def rank_params(model: ModelSpec, tp: int, pp: int, ep: int, stage: int, peft: Peft | None) -> RankParams:
    layers = stage_layers(model.num_layers, pp, stage)
    lset = set(layers)
    first, last = stage == 0, stage == pp - 1
    tgt = targets(peft, model)
    total = linear = outs = largest = decay = outside = lora = dora = head = 0
    per_layer = {i: 0 for i in layers}
    lora_layer = {i: 0 for i in layers}
    for p in model.params:
        if not p.layer_span:
            if p.role in ("embedding", "position") and not first:
                continue
            if p.role == "lm_head" and not last:
                continue
            final_norm = p.name == "norm.weight" or p.module in ("ln_f", "final_layer_norm", "norm", "final_layernorm")
            if final_norm and not last:
                continue
        n_inst = _count_on_rank(p, lset, ep)
        if n_inst == 0:
            continue
        each = _split(p, tp, ep)
        size = each * n_inst
        total += size
        if p.decays:
            decay += size
        if p.role == "lm_head":
            head += size
        elif p.role in LINEAR_ROLES and p.in_features:
            linear += size
            outs += (ceil_div(p.out_features, tp) if p.tp in ("column", "vocab") else p.out_features) * n_inst
            largest = max(largest, each)
        if p.layer_span:
            per_inst_layers = [i for i in p.layer_span if i in lset]
            share = size // max(1, len(per_inst_layers))
            for i in per_inst_layers:
                per_layer[i] += share
        else:
            outside += size
        if p.module in tgt and p.in_features and p.role in ("linear", "expert") and peft is not None:
            fan_in = ceil_div(p.in_features, tp) if p.tp == "row" else p.in_features
            fan_out = ceil_div(p.out_features, tp) if p.tp == "column" else p.out_features
            # LoRA: A is r x in, B is out x r (arXiv 2106.09685 section 4.1); DoRA adds a magnitude per output row.
            adapter = peft.rank * (fan_in + fan_out) * n_inst
            lora += adapter
            if peft.method == "dora":
                dora += fan_out * n_inst
            for i in [j for j in p.layer_span if j in lset]:
                lora_layer[i] += adapter // max(1, len([j for j in p.layer_span if j in lset]))
    return RankParams(
        stage=stage, layers=layers, total=total, linear=linear, linear_out_features=outs, lm_head=head, largest_linear=largest,
        decay=decay, per_layer=tuple(per_layer[i] for i in layers), outside_layers=outside,
        has_embedding=first, has_lm_head=last, lora=lora + dora, lora_per_layer=tuple(lora_layer[i] for i in layers),
        dora_magnitudes=dora,
    )
