"""``train.peft.target_modules: null``: PEFT's own default LoRA targets per model type (facts/peft_targets.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts import peft_targets
from vramplan.facts.peft_targets import completed_targets, default_lora_targets


def _doc(model: str, **peft: Any) -> dict[str, Any]:
    return {"model": model, "task": "train", "hardware": {"gpu": "A100-80GB"},
            "train": {"micro_batch_size": 1, "seq_len": 256, "precision": "bf16-true",
                      "peft": {"method": "lora", "rank": 8, **peft}}}


@pytest.mark.parametrize("model_type", sorted(peft_targets._LORA_TARGETS))
def test_each_row_is_peft_s_own_mapping(model_type: str) -> None:
    # the independent check: the installed peft's table (peft/utils/constants.py) holds the same row
    constants = pytest.importorskip("peft.utils.constants")
    assert list(default_lora_targets(model_type) or ()) == \
        constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type]


def test_null_takes_the_model_type_row_and_says_so() -> None:
    r = resolve(_doc("tiiuae/falcon-7b"))
    assert r.scenario.train.peft is not None
    assert r.scenario.train.peft.target_modules == ["query_key_value"]
    assert any("PEFT's default for model type 'falcon'" in a for a in r.assumptions)
    # Phi-2: PEFT's default adapts the MLP too (q_proj, v_proj, fc1, fc2)
    phi = resolve(_doc("microsoft/phi-2"))
    assert phi.scenario.train.peft is not None and phi.scenario.train.peft.target_modules == [
        "q_proj", "v_proj", "fc1", "fc2"]


def test_llama_default_is_unchanged_and_silent() -> None:
    # Llama's row is q_proj, v_proj, what the scenario's default has always meant: no assumption added
    r = resolve(_doc("meta-llama/Llama-3.2-1B"))
    assert r.scenario.train.peft is not None and r.scenario.train.peft.target_modules == ["q_proj", "v_proj"]
    assert not any("LoRA targets" in a for a in r.assumptions)


def test_phi2_default_counts_more_adapters_than_q_and_v_alone() -> None:
    # phi-2: hidden 2560, intermediate 10240, 32 layers, rank 8.  q_proj, v_proj: 2 x 8 x (2560 + 2560) per layer;
    # fc1 8 x (2560 + 10240), fc2 8 x (10240 + 2560): 81,920 + 102,400 + 102,400 = 286,720 per layer,
    # 9,175,040 in all, against 81,920 x 32 = 2,621,440 for q_proj and v_proj alone
    default = estimate(_doc("microsoft/phi-2"))
    qv = estimate(_doc("microsoft/phi-2", target_modules=["q_proj", "v_proj"]))
    # adapters in fp32 (peft >= 0.12 autocast_adapter_dtype): 4 B each; AdamW states 8 B each
    diff = (9_175_040 - 2_621_440) * 4
    assert default.per_gpu.breakdown["optimizer_states"] - qv.per_gpu.breakdown["optimizer_states"] == 2 * diff


def test_a_type_without_a_row_assumes_q_and_v_where_they_exist() -> None:
    r = resolve(_doc("allenai/OLMo-2-1124-7B"))
    assert r.scenario.train.peft is not None and r.scenario.train.peft.target_modules == ["q_proj", "v_proj"]
    assert any("LoRA targets assumed q_proj, v_proj" in a and "'olmo2'" in a for a in r.assumptions)


def test_a_type_without_a_row_or_q_and_v_is_refused_once() -> None:
    # Phi-3 fuses qkv_proj and has no PEFT row: PEFT raises "Please specify `target_modules`"
    with pytest.raises(ScenarioError) as err:
        resolve(_doc("microsoft/Phi-3-mini-4k-instruct"))
    problems = [p for p in err.value.problems if p.where == "train.peft.target_modules"]
    assert len(problems) == 1
    assert "no default LoRA targets for model type 'phi3'" in problems[0].message
    assert "qkv_proj" in problems[0].message


def test_completed_targets_keeps_what_is_given() -> None:
    assert completed_targets(["c_attn"], ("q_proj", "v_proj")) == ["c_attn"]
    assert completed_targets("all-linear", ("query_key_value",)) == "all-linear"
    assert completed_targets(None, default_lora_targets("gpt2")) == ["c_attn"]
    assert completed_targets(None, default_lora_targets("no_such_type")) == ["q_proj", "v_proj"]


def test_the_table_holds_every_peft_row_but_gemma4s_expression() -> None:
    # peft 0.21.2 peft/utils/constants.py: 41 rows, one of them (gemma4) a regular expression string
    constants = pytest.importorskip("peft.utils.constants")
    rows = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    assert set(rows) - set(peft_targets._LORA_TARGETS) == {k for k, v in rows.items() if isinstance(v, str)}


def test_bert_null_takes_peft_s_query_value_row() -> None:
    # peft 0.21.2 maps "bert" to ["query", "value"]: PEFT completes the targets, nothing to refuse.
    # BERT-large: hidden 1024, 24 layers, rank 8: query and value each 8 x (1024 + 1024) = 16,384 adapter
    # parameters, 32,768 per layer, 786,432 in all; AdamW's two fp32 moments: 786,432 x 8 = 6,291,456 B
    r = resolve(_doc("google-bert/bert-large-uncased"))
    assert r.scenario.train.peft is not None and r.scenario.train.peft.target_modules == ["query", "value"]
    assert any("PEFT's default for model type 'bert', query, value" in a for a in r.assumptions)
    named = estimate(_doc("google-bert/bert-large-uncased", target_modules=["query", "value"]))
    default = estimate(_doc("google-bert/bert-large-uncased"))
    assert default.per_gpu.breakdown["optimizer_states"] == 6_291_456
    assert default.per_gpu.breakdown == named.per_gpu.breakdown
