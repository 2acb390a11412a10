"""LoRA target_modules checked against the model's real module names, as PEFT matches them."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from vramplan import estimate
from vramplan.catalog import load_model
from vramplan.cli.main import app
from vramplan.errors import ScenarioError
from vramplan.spec.load import unmatched_lora_targets
from vramplan.spec.scenario import Peft


def _doc(model: str, targets: Any) -> dict[str, Any]:
    return {"model": model, "task": "train", "hardware": {"gpu": "A100-80GB"},
            "train": {"micro_batch_size": 1, "seq_len": 256, "peft": {"method": "lora", "rank": 8,
                                                                       "target_modules": targets}}}


def test_a_target_matches_by_name_suffix_and_layer_paths_fold() -> None:
    llama = load_model("meta-llama/Llama-2-7b-hf")
    ok = ["q_proj", "self_attn.v_proj", "mlp.down_proj", "model.layers.3.self_attn.k_proj", "lm_head"]
    assert unmatched_lora_targets(Peft(target_modules=ok), llama) == []
    assert unmatched_lora_targets(Peft(target_modules=["q_proj", "v_prj"]), llama) == ["v_prj"]
    assert unmatched_lora_targets(Peft(target_modules="all-linear"), llama) == []
    # Mixtral's 4.x expert names are aliases of the experts' projections
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert unmatched_lora_targets(Peft(target_modules=["w1", "w2", "w3", "gate"]), mixtral) == []


def test_no_target_matching_is_refused_with_the_real_names() -> None:
    # GPT-NeoX (Pythia) fuses q, k and v into query_key_value: PEFT raises "Target modules ['q_proj',
    # 'v_proj'] not found in the base model", so the job would not start
    with pytest.raises(ScenarioError) as err:
        estimate(_doc("EleutherAI/pythia-410m", ["q_proj", "v_proj"]))
    text = " ".join(str(err.value).split())
    assert "train.peft.target_modules" in text and "query_key_value" in text and "all-linear" in text


def test_a_typo_beside_a_real_target_is_stated_and_adds_no_adapter() -> None:
    # PEFT adapts q_proj and skips "v_prj" silently: the estimate counts q_proj's adapters alone and says so
    typo = estimate(_doc("meta-llama/Llama-2-7b-hf", ["q_proj", "v_prj"]))
    only_q = estimate(_doc("meta-llama/Llama-2-7b-hf", ["q_proj"]))
    assert typo.per_gpu.peak_allocated_bytes == only_q.per_gpu.peak_allocated_bytes
    assert any("'v_prj' names no module" in a for a in typo.assumptions)
    assert not any("names no module" in a for a in only_q.assumptions)


def test_cli_exit_2_on_no_matching_target() -> None:
    res = CliRunner().invoke(app, ["estimate", "--model", "EleutherAI/pythia-410m", "--gpu", "A100-80GB",
                                   "--peft", "lora", "--target-modules", "q_proj,v_proj"])
    assert res.exit_code == 2, res.output
    assert "query_key_value" in " ".join(res.output.split())
