"""LoRA targets on MoE models against peft itself: every family and target list, on the meta device.

peft 0.21.2 on transformers 5.24 converts the 4.x expert names into ``target_parameters`` only for the model types
transformers maps to a conversion pattern (facts/peft_targets.py ``moe_pattern``); elsewhere an expert name adapts
nothing, the router is refused unless it is an ``nn.Linear``, and a router whose forward returns a tuple makes the
first forward fail.  Each case builds the shrunk catalog model with peft's own ``get_peft_model`` (the traced engine's
``build_model``) and compares the adapter count with the analytic engine's ``rank_params``, or, where peft raises or
the run cannot start, checks that resolving the scenario refuses it too.
"""

from __future__ import annotations

import pytest

from vramplan.analytic.layout import rank_params
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError

QWEN2_MOE = "Qwen/Qwen1.5-MoE-A2.7B-Chat"
OSS = "openai/gpt-oss-20b"
PHIMOE = "microsoft/Phi-3.5-MoE-instruct"
OLMOE = "allenai/OLMoE-1B-7B-0924"
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
NEXT = "Qwen/Qwen3-Next-80B-A3B-Thinking"
GRANITE = "ibm-granite/granite-3.1-3b-a800m-instruct"

COUNTED = [
    (QWEN2_MOE, ["q_proj", "down_proj"]),  # not converted: the shared expert's down_proj only
    (QWEN2_MOE, ["q_proj", "gate_proj", "up_proj", "down_proj"]),
    (QWEN2_MOE, "all-linear"),
    (OSS, ["q_proj", "down_proj"]),  # gpt-oss: down_proj is a parameter, no module
    (OSS, "all-linear"),
    (PHIMOE, ["q_proj", "v_proj", "down_proj"]),
    (OLMOE, ["q_proj", "gate_proj", "up_proj", "down_proj"]),  # converted: ParamWrapper on the fused experts
    (OLMOE, "all-linear"),
    (MIXTRAL, ["q_proj", "w2"]),
    (MIXTRAL, ["q_proj", "w1", "w3", "gate"]),
    (NEXT, ["in_proj_qkvz", "gate_proj", "up_proj", "down_proj"]),  # converted since it maps to qwen2_moe
    (NEXT, "all-linear"),
    (GRANITE, ["q_proj", "v_proj"]),
    ("Qwen/Qwen2.5-0.5B", ["self_attn.q_proj", "mlp.down_proj"]),  # dotted: peft's suffix rule
]

REFUSED = [
    (QWEN2_MOE, ["q_proj", "gate"], "not an nn.Linear"),
    (OSS, ["q_proj", "router"], "not an nn.Linear"),
    (OSS, ["down_proj"], "not found"),
    (OLMOE, ["q_proj", "experts"], "cannot adapt"),
    (GRANITE, ["q_proj", "router"], "not an nn.Linear"),
    (OLMOE, ["q_proj", "up_proj"], "Cannot convert"),
    (NEXT, ["in_proj_qkvz", "shared_expert.up_proj"], "Cannot convert"),
]
# peft accepts these, and the first forward fails: PhimoeTopKRouter returns a tuple to lora.Linear's forward
FAILS_IN_FORWARD = [(PHIMOE, ["q_proj", "router"]), (PHIMOE, "all-linear")]


def _config(mid: str) -> dict[str, object]:
    from vramplan.trace.shrink import catalog_config, shrink

    return shrink(catalog_config(mid), vocab=2048)


def _resolved(mid: str, targets: object):  # type: ignore[no-untyped-def]
    return resolve({"model": _config(mid), "hardware": {"gpu": "a100"},
                    "train": {"peft": {"method": "lora", "rank": 8, "target_modules": targets}}})


@pytest.mark.parametrize(("mid", "targets"), COUNTED, ids=[f"{m.split('/')[1]}-{t}" for m, t in COUNTED])
def test_adapter_count_matches_peft(mid: str, targets: object) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.trace.build import build_model

    r = _resolved(mid, targets)
    built = build_model(r, "meta", "train")
    got = sum(p.numel() for n, p in built.model.named_parameters() if "lora_" in n)
    assert got > 0
    assert rank_params(r.model, 1, 1, 1, 0, r.scenario.train.peft).lora == got


def _peft_on_meta(mid: str, targets: object):  # type: ignore[no-untyped-def]
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(_config(mid))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(str(cfg.pop("model_type")), **cfg))
    return get_peft_model(model, LoraConfig(r=8, target_modules=targets))


@pytest.mark.parametrize(("mid", "targets", "said"), REFUSED, ids=[f"{m.split('/')[1]}-{t}" for m, t, _ in REFUSED])
def test_refused_where_peft_raises(mid: str, targets: list[str], said: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    with pytest.raises(ScenarioError) as err:
        _resolved(mid, targets)
    assert said in str(err.value)
    with pytest.raises(ValueError):  # peft itself: NoMatchingPeftModuleError is a ValueError too
        _peft_on_meta(mid, targets)


@pytest.mark.parametrize(("mid", "targets"), FAILS_IN_FORWARD, ids=[str(t) for _, t in FAILS_IN_FORWARD])
def test_refused_where_the_forward_fails(mid: str, targets: object) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    with pytest.raises(ScenarioError) as err:
        _resolved(mid, targets)
    assert "returns a tuple" in str(err.value)
    cfg = dict(_config(mid))
    cfg.update(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(str(cfg.pop("model_type")), **cfg))
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets))
    with pytest.raises(AttributeError, match="'tuple' object has no attribute 'dtype'"):
        peft_model(input_ids=torch.zeros(1, 4, dtype=torch.long))


def _assumptions(model: str, targets: list[str]) -> list[str]:
    from vramplan import estimate

    doc = {"model": model, "hardware": {"gpu": "h100"}, "train": {"micro_batch_size": 1, "seq_len": 256, "peft": {
        "method": "lora", "rank": 8, "target_modules": targets}}}
    return list(estimate(doc).assumptions)


def test_layer_indexed_target_is_stated_as_an_over_estimate() -> None:
    # peft adapts layer 0's q_proj only; the analytic engine counts every q_proj and says so
    notes = _assumptions("Qwen/Qwen2.5-0.5B", ["model.layers.0.self_attn.q_proj", "v_proj"])
    assert any("'model.layers.0.self_attn.q_proj' reaches some of" in n and "over-estimate" in n for n in notes)


def test_dotted_target_reaching_nothing_is_skipped_and_named() -> None:
    # Qwen1.5-MoE's shared expert is mlp.shared_expert.down_proj: "mlp.down_proj" reaches no module (peft skips it)
    from vramplan.analytic.layout import lora_targets
    from vramplan.spec.scenario import Peft

    notes = _assumptions(QWEN2_MOE, ["q_proj", "mlp.down_proj"])
    assert any("'mlp.down_proj' names no module" in n for n in notes)
    m = resolve({"model": QWEN2_MOE, "hardware": {"gpu": "h100"}}).model
    lt = lora_targets(Peft(method="lora", rank=8, target_modules=["q_proj", "mlp.down_proj"]), m)
    assert lt.linear == frozenset({"q_proj"}) and not lt.experts_wrapped


def test_unconverted_expert_name_is_named_in_the_assumptions() -> None:
    # gpt-oss: down_proj is a parameter of GptOssExperts; peft skips the name, the report says so
    notes = _assumptions(OSS, ["q_proj", "down_proj"])
    assert any("'down_proj' names no module" in n and "routed experts are parameters" in n for n in notes)
