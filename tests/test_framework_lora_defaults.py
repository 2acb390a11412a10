"""``train.peft.target_modules: null`` under frameworks with LoRA of their own (spec/load.py ``lora_targets_for``).

PEFT's table (facts/peft_targets.py) completes null only where PEFT builds the adapters.  Lit-GPT's finetune/lora.py
defaults to the query and the value (lora_query, lora_value: lit-gpt 8641822, litgpt v0.3.1 to v0.5.13); torchtune's
LoRA builders require lora_attn_modules (v0.6.1), so null is refused there.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.peft_targets import LITGPT_LORA_DEFAULT, TORCHTUNE_LORA_RECIPE


def _doc(model: str, framework: str, **peft: Any) -> dict[str, Any]:
    return {"model": model, "framework": framework, "hardware": {"gpu": "a100-40gb"},
            "train": {"precision": "bf16-true", "micro_batch_size": 1, "seq_len": 512,
                      "peft": {"method": "lora", "rank": 8, **peft}}}


def test_the_rows_read_off_the_sources() -> None:
    # Lit-GPT: lora_query=True, lora_value=True (the rest False); torchtune's configs: q_proj, v_proj, output_proj and
    # the MLP (w1, w3, w2 in transformers' names)
    assert LITGPT_LORA_DEFAULT == ("q_proj", "v_proj")
    assert TORCHTUNE_LORA_RECIPE == ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_lightning_null_is_litgpts_query_and_value() -> None:
    r = resolve(_doc("meta-llama/Llama-2-7b-hf", "lightning"))
    assert r.scenario.train.peft is not None and r.scenario.train.peft.target_modules == ["q_proj", "v_proj"]
    assert any("Lit-GPT's default, q_proj, v_proj" in a for a in r.assumptions)


def test_lightning_null_on_phi2_is_not_pefts_row() -> None:
    # PEFT's phi row adapts fc1 and fc2 too (q_proj, v_proj, fc1, fc2); Lit-GPT's default is the attention's q and v
    hf = resolve(_doc("microsoft/phi-2", "hf-trainer"))
    lit = resolve(_doc("microsoft/phi-2", "lightning"))
    assert hf.scenario.train.peft is not None and lit.scenario.train.peft is not None
    assert hf.scenario.train.peft.target_modules == ["q_proj", "v_proj", "fc1", "fc2"]
    assert lit.scenario.train.peft.target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize(("model", "fused"), [("tiiuae/falcon-7b", "query_key_value"),
                                              ("openai-community/gpt2", "c_attn")])
def test_lightning_null_on_a_fused_qkv_is_refused(model: str, fused: str) -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(_doc(model, "lightning"))
    text = str(e.value)
    assert "train.peft.target_modules" in text and "lora_query and lora_value" in text
    assert f"[{fused}]" in text


def test_lightning_named_targets_are_kept() -> None:
    r = resolve(_doc("tiiuae/falcon-7b", "lightning", target_modules=["query_key_value"]))
    assert r.scenario.train.peft is not None and r.scenario.train.peft.target_modules == ["query_key_value"]


def test_torchtune_null_is_refused_with_the_recipes_choice() -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(_doc("meta-llama/Llama-3.1-8B", "torchtune"))
    text = str(e.value)
    assert "train.peft.target_modules" in text and "lora_attn_modules with no default" in text
    assert "[q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]" in text


def test_hf_trainer_null_still_takes_peft_row() -> None:
    r = resolve(_doc("tiiuae/falcon-7b", "hf-trainer"))
    assert r.scenario.train.peft is not None and r.scenario.train.peft.target_modules == ["query_key_value"]
