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


# Model types whose routed experts transformers 5 fuses into ``gate_up_proj`` [E, 2I, h] and ``down_proj``
# [E, h, I] parameters and whose LoRA targets peft converts from the 4.x names: transformers
# ``conversion_mapping._MODEL_TO_CONVERSION_PATTERN`` maps them to the "mixtral" or "qwen2_moe" pattern, and
# peft ``utils/transformers_weight_conversion.py`` (``_MOE_TARGET_MODULE_MAPPING``, ``_convert_peft_config_moe``)
# turns the expert and router names into ``target_parameters``.
FUSED_EXPERT_LORA_TYPES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"})
_MLP_NAMES = frozenset({"gate_proj", "up_proj", "down_proj"})
# Mixtral's expert linears in transformers 4.x (``MixtralBlockSparseTop2MLP``: w2(act(w1(x)) * w3(x))), the
# names peft's conversion maps for Mixtral (``_MOE_TARGET_MODULE_MAPPING["mixtral"]``): a scenario may spell
# them either way
MIXTRAL_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass(frozen=True)
class LoraTargets:
    """Where the adapters go.  ``linear``: modules whose ``nn.Linear`` gets a ``lora.Linear``.  The ranks are
    those of peft's ``ParamWrapper`` on transformers 5's fused MoE parameters (0: not adapted).

    peft's conversion (``_convert_peft_config_moe``) moves every name of its mapping (``gate_proj``,
    ``up_proj``, ``down_proj``, ``gate``; Mixtral's ``w1``/``w3``/``w2``, which scenarios spell as the
    former) from ``target_modules`` to ``target_parameters``.  So on a model with dense or shared-expert
    MLPs (DeepSeek, Qwen2-MoE) those MLPs' linears lose their adapters, and the fused ``gate_up_proj``
    gets one adapter of rank ``r`` x (number of the gate/up names targeted), with alpha scaled alike
    (``rank_pattern``/``alpha_pattern``), where 4.x had two of rank ``r``.
    """

    linear: frozenset[str] = frozenset()
    gate_up_rank: int = 0
    down_rank: int = 0
    router_rank: int = 0

    @property
    def experts_wrapped(self) -> bool:
        return bool(self.gate_up_rank or self.down_rank)


BNB_FORMATS = ("nf4", "nf4-dq", "fp4", "int8")


def quantized_expert_loop(m: ModelSpec, quant: str) -> bool:
    """Whether bitsandbytes holds the routed experts as per-expert quantized linears.

    transformers 4.x held each expert as an MLP of ``nn.Linear`` and ``replace_with_bnb_linear``
    converted every one of them (integrations/bitsandbytes.py ``_replace_with_bnb_linear``); the
    traced engine converts transformers 5's fused experts back to that layout (trace/quant.py).
    gpt-oss keeps its experts as fused, transposed, biased parameters in both versions, which
    bitsandbytes never converts.
    """
    return m.moe is not None and quant in BNB_FORMATS and m.model_type != "gpt_oss"


def lora_targets(peft: Peft | None, model: ModelSpec, fused_experts: bool = True,
                 quant: str = "none") -> LoraTargets:
    """Resolve PEFT's ``target_modules`` on ``model``.

    ``all-linear`` is every ``nn.Linear`` but the LM head (peft ``_maybe_include_all_linear_layers``): the
    experts and the router of 4.x MoE models were linears, gpt-oss's fused experts and router are not.
    ``fused_experts``: transformers >= 5 (``software.transformers``).  With a bitsandbytes ``quant`` the
    experts are per-expert 4-bit linears (``quantized_expert_loop``), adapted per expert as in 4.x; the
    router is transformers 5's module either way.
    """
    if peft is None:
        return LoraTargets()
    if peft.target_modules == "all-linear":
        names = {p.module for p in model.params if p.role == "linear"}
        if model.model_type != "gpt_oss":
            names |= {p.module for p in model.params if p.role in ("expert", "router")}
    else:
        names = set(peft.target_modules)
        if model.model_type == "mixtral":
            names = {MIXTRAL_EXPERT_NAMES.get(n, n) for n in names}
    if not (fused_experts and model.moe is not None and model.model_type in FUSED_EXPERT_LORA_TYPES):
        return LoraTargets(linear=frozenset(names))
    router = "gate" in names and any(p.role == "router" for p in model.params)
    if quantized_expert_loop(model, quant):
        return LoraTargets(linear=frozenset(names - {"gate"}), router_rank=peft.rank if router else 0)
    gate_up = len({"gate_proj", "up_proj"} & names)
    return LoraTargets(linear=frozenset(names - _MLP_NAMES - {"gate"}), gate_up_rank=peft.rank * gate_up,
                       down_rank=peft.rank if "down_proj" in names else 0, router_rank=peft.rank if router else 0)


def rank_params(model: ModelSpec, tp: int, pp: int, ep: int, stage: int, peft: Peft | None,
                lt: LoraTargets | None = None) -> RankParams:
    """``lt``: the resolved adapter targets (default: ``lora_targets(peft, model)``)."""
    layers = stage_layers(model.num_layers, pp, stage)
    lset = set(layers)
    first, last = stage == 0, stage == pp - 1
    if lt is None:
        lt = lora_targets(peft, model)
    tgt = lt.linear
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
        if peft is None or not p.in_features:
            continue
        fan_in = ceil_div(p.in_features, tp) if p.tp == "row" else p.in_features
        fan_out = ceil_div(p.out_features, tp) if p.tp == "column" else p.out_features
        rank = 0
        if p.role == "expert" and lt.experts_wrapped:
            # peft ParamWrapper (tuners/lora/layer.py update_layer): lora_A [rank x E, in], lora_B [out, rank x E],
            # i.e. rank x (in + out) per expert; the fused gate_up_proj's out is 2I, counted at the gate group
            if p.module == "gate_proj":
                rank, fan_out = lt.gate_up_rank, 2 * fan_out
            elif p.module == "down_proj":
                rank = lt.down_rank
        elif p.role == "router" and lt.router_rank:
            rank = lt.router_rank  # ParamWrapper on the router weight [E, h]: one 2-D adapter
        elif p.module in tgt and p.role in ("linear", "expert", "router"):
            rank = peft.rank
        if rank:
            # LoRA: A is r x in, B is out x r (arXiv 2106.09685 section 4.1); DoRA adds a magnitude per output row.
            adapter = rank * (fan_in + fan_out) * n_inst
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
