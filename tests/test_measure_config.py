"""measure/config.py: the raw config.json behind a model, and shrinking a scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError, UnknownNameError
from vramplan.measure.config import layer_count, raw_config, read_scenario_document, shrink

TINY_LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 172,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 256, "layer_types": ["full_attention"] * 4}


def test_raw_config_catalog_alias_is_the_catalog_json() -> None:
    cfg = raw_config("gpt2")
    assert cfg["model_type"] == "gpt2" and cfg["n_layer"] == 12 and cfg["n_embd"] == 768


def test_raw_config_path_and_inline(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY_LLAMA))
    assert raw_config(str(f)) == TINY_LLAMA
    assert raw_config(str(tmp_path)) == TINY_LLAMA  # the folder holding config.json
    inline = raw_config(TINY_LLAMA)
    assert inline == TINY_LLAMA and inline is not TINY_LLAMA  # a copy


def test_raw_config_unknown_name_suggests() -> None:
    with pytest.raises(UnknownNameError) as info:
        raw_config("gtp2")
    assert "gpt2" in str(info.value)


def test_shrink_catalog_model_layers_keeps_everything_else() -> None:
    doc = {"model": "gpt2", "hardware": {"gpu": "T4"}, "train": {"seq_len": 1024}}
    small = shrink(doc, layers=2, seq_len=64, micro_batch_size=2)
    assert isinstance(small["model"], dict)
    assert small["model"]["n_layer"] == 2 and small["model"]["n_embd"] == 768
    assert small["model"]["_name_or_path"] == "openai-community/gpt2 [2 layers]"
    assert small["train"] == {"seq_len": 64, "micro_batch_size": 2}
    assert doc["model"] == "gpt2" and doc["train"] == {"seq_len": 1024}  # the input is not edited
    r = resolve(small)
    # GPT-2 small: 124,439,808 parameters; each of 12 layers holds 7,087,872 -> 2 layers keep
    # 124,439,808 - 10 * 7,087,872 = 53,561,088
    assert r.model.num_layers == 2 and r.model.num_parameters == 53_561_088


def test_shrink_cuts_per_layer_lists() -> None:
    small = shrink({"model": TINY_LLAMA, "hardware": {"gpu": "T4"}}, layers=2)
    assert small["model"]["num_hidden_layers"] == 2
    assert small["model"]["layer_types"] == ["full_attention"] * 2
    assert layer_count(small["model"]) == 2


def test_shrink_multimodal_text_config() -> None:
    cfg = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 6,
                                                   "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}}
    small = shrink({"model": cfg}, layers=3)
    assert small["model"]["text_config"]["num_hidden_layers"] == 3
    assert len(small["model"]["text_config"]["layer_types"]) == 3


def test_shrink_inference_fields() -> None:
    small = shrink({"model": "gpt2", "task": "inference"}, batch_size=2, prompt_len=16, new_tokens=0)
    assert small["inference"] == {"batch_size": 2, "prompt_len": 16, "new_tokens": 0}


def test_shrink_bad_values_all_reported() -> None:
    with pytest.raises(ScenarioError) as info:
        shrink({"model": "gpt2"}, layers=0, seq_len=-1, new_tokens=-2)
    where = [p.where for p in info.value.problems]
    assert where == ["--layers", "--seq-len", "--new-tokens"]


def test_shrink_config_without_layer_count() -> None:
    with pytest.raises(ScenarioError, match="no layer count"):
        shrink({"model": {"model_type": "llama", "hidden_size": 8}}, layers=1)


def test_read_scenario_document_copies(tmp_path: Path) -> None:
    src = {"model": "gpt2", "train": {"seq_len": 8}}
    doc = read_scenario_document(src)
    doc["train"]["seq_len"] = 9
    assert src["train"]["seq_len"] == 8
    with pytest.raises(ScenarioError, match="no such file"):
        read_scenario_document(tmp_path / "missing.yaml")
