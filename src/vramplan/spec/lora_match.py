"""Which modules a LoRA ``target_modules`` list reaches, by PEFT's rules, on the model's parameter names.

peft 0.21.2 ``check_target_module_exists`` adapts a module when its path equals a target or ends with
``"." + target``; the experts of a transformers 5 MoE model are parameters of one ``...Experts`` module, so their
names are no module paths (facts/peft_targets.py), except where peft converts them (``moe_pattern``) or bitsandbytes
holds them as per-expert linears (``quantized_expert_loop``).  The analytic engine counts adapters by a module's last
name (analytic/layout.py ``lora_targets``), so a dotted target that reaches only some of the modules of its last name
is counted on all of them: ``partial_lora_targets`` names those, for the report to state.
"""

from __future__ import annotations

import re

from vramplan.facts.peft_targets import completed_targets
from vramplan.facts.quantization import bnb_formats
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.spec.scenario import Peft

__all__ = ["experts_are_parameters", "gate_before", "module_paths", "partial_lora_targets", "quantized_expert_loop",
           "reached_leaves", "target_matches", "unmatched_lora_targets"]

_BNB = frozenset(bnb_formats())


def quantized_expert_loop(m: ModelSpec, quant: str) -> bool:
    """Whether bitsandbytes holds the routed experts as per-expert quantized linears.

    transformers 4.x held each expert as an MLP of ``nn.Linear`` and ``replace_with_bnb_linear``
    converted every one of them (integrations/bitsandbytes.py ``_replace_with_bnb_linear``); the
    traced engine converts transformers 5's fused experts back to that layout (trace/quant.py).
    gpt-oss keeps its experts as fused, transposed, biased parameters in both versions, which
    bitsandbytes never converts.
    """
    return m.moe is not None and quant in _BNB and m.traits.experts_are_linears


def stock_bnb_quantizes_experts(m: ModelSpec, quant: str, fused_experts: bool) -> bool:
    """Whether stock bitsandbytes quantizes ``m``'s routed experts: only as transformers 4.x's per-expert
    ``nn.Linear`` MLPs (``quantized_expert_loop`` on a release without fused experts); transformers >= 5's fused
    parameters, and experts that are parameters in every release, stay in the load dtype (bitsandbytes issue #1849;
    ``train.quantize_moe_experts``)."""
    return quantized_expert_loop(m, quant) and not fused_experts


def experts_are_parameters(m: ModelSpec, fused_experts: bool, quant: str = "none") -> bool:
    """Whether the routed experts are transformers 5's fused parameters (no module a target can name):
    ``fused_experts`` (transformers >= 5) on a MoE model, unless bitsandbytes converts them to per-expert linears
    (``quantized_expert_loop``)."""
    return fused_experts and m.moe is not None and not quantized_expert_loop(m, quant)


def gate_before(params: tuple[ParamGroup, ...], up: ParamGroup) -> bool:
    """Whether the group before an expert ``up_proj`` is the same experts' ``gate_proj``: transformers 5 fuses the
    two into one ``gate_up_proj`` [E, 2I, h]."""
    i = params.index(up)
    return i > 0 and params[i - 1].role == "expert" and params[i - 1].module == "gate_proj"


def module_paths(m: ModelSpec, expert_params: bool = False) -> frozenset[str]:
    """The model's module paths with the layer index folded (``layers.self_attn.q_proj``); with ``expert_params``
    the routed experts' tensors are parameters, not modules, and give no path."""
    paths = frozenset(p.name.rsplit(".", 1)[0] for p in m.params if "." in p.name)
    if not expert_params:
        return paths
    # the experts' weights and biases (gpt-oss's down_proj.bias) alike
    return paths - {p.name.rsplit(".", 1)[0] for p in m.params if p.role == "expert"}


def _key(target: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", "", target.removeprefix("model.").removeprefix("base_model.model."))


def target_matches(target: str, paths: frozenset[str]) -> bool:
    """PEFT's rule for a list of names (peft ``check_target_module_exists``): a module is adapted when its
    path equals the target or ends with ``"." + target``.  A target naming one layer
    (``model.layers.0.self_attn.q_proj``) is compared with its index and ``model.`` prefix folded."""
    key = _key(target)
    return any(p == key or p.endswith("." + key) or key.endswith("." + p) for p in paths)


def _converted(target: str, m: ModelSpec, expert_params: bool) -> bool:
    """Whether peft turns ``target`` into a ``target_parameters`` entry of the fused experts (``moe_pattern``:
    the target equals a 4.x name of its mapping or ends with ``"." + name``; scenarios may spell Mixtral's
    w1/w3/w2 as gate_proj/up_proj/down_proj, the trait ``expert_module_aliases``)."""
    pattern = m.peft_moe_pattern if expert_params else None
    if pattern is None:
        return False
    aliases = dict(m.traits.expert_module_aliases)
    leaf = target.rsplit(".", 1)[-1]
    return leaf in pattern.names or aliases.get(leaf, leaf) in {"gate_proj", "up_proj", "down_proj"}


def unmatched_lora_targets(peft: Peft | None, m: ModelSpec, expert_params: bool = False) -> list[str]:
    """The ``target_modules`` entries that name no module of ``m`` and that peft does not convert (Mixtral's
    w1/w2/w3 aliases included)."""
    targets = completed_targets(peft.target_modules, m.peft_default_targets) if peft is not None else "all-linear"
    if targets == "all-linear":
        return []
    aliases, paths = dict(m.traits.expert_module_aliases), module_paths(m, expert_params)
    return [t for t in targets if not (target_matches(aliases.get(t, t), paths) or _converted(t, m, expert_params))]


def partial_lora_targets(peft: Peft | None, m: ModelSpec, expert_params: bool = False) -> list[tuple[str, str]]:
    """(target, last name) for each dotted or layer-indexed target that reaches only some of the modules named like
    its last name: the analytic engine adapts all of them (an over-estimate, stated)."""
    targets = completed_targets(peft.target_modules, m.peft_default_targets) if peft is not None else "all-linear"
    if targets == "all-linear":
        return []
    paths = module_paths(m, expert_params)
    out: list[tuple[str, str]] = []
    for t in targets:
        leaf = t.rsplit(".", 1)[-1]
        if "." not in t or _converted(t, m, expert_params):
            continue
        reached = {p for p in paths if target_matches(t, frozenset({p}))}
        named = {p for p in paths if p.rsplit(".", 1)[-1] == leaf}
        if reached and (reached != named or _key(t) != t.removeprefix("model.").removeprefix("base_model.model.")):
            out.append((t, leaf))
    return out


def reached_leaves(targets: list[str], m: ModelSpec, expert_params: bool) -> set[str]:
    """The last names of the modules the targets reach (a target that reaches nothing adds none), Mixtral's expert
    aliases spelled as the model's names."""
    aliases, paths = dict(m.traits.expert_module_aliases), module_paths(m, expert_params)
    out: set[str] = set()
    for t in targets:
        leaf = aliases.get(t.rsplit(".", 1)[-1], t.rsplit(".", 1)[-1])
        if "." not in t or target_matches(t, paths) or _converted(t, m, expert_params):
            out.add(leaf)
    return out
