"""Inputs accepted but not modelled are said so (``not modelled: ``) or refused (spec/load.py)."""

from __future__ import annotations

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError

BASE = {"model": "meta-llama/Llama-2-7b-hf", "hardware": {"gpu": "H100", "num_gpus": 2}}


@pytest.mark.parametrize(("doc", "says"), [
    ({**BASE, "framework": "torchtitan", "task": "inference"}, "not modelled: framework torchtitan for task inference"),
    ({**BASE, "framework": "hf-trainer", "task": "serve"}, "not modelled: framework hf-trainer for task serve"),
    ({**BASE, "framework": "torchtitan", "train": {"gradient_checkpointing": "full"},
      "software": {"transformers": "4.40"}}, "not modelled: software.transformers 4.40 for the training loss"),
])
def test_an_input_that_is_not_modelled_is_said_so(doc: dict[str, object], says: str) -> None:
    assert any(a.startswith(says) for a in estimate(doc).assumptions)


def test_a_modelled_scenario_carries_no_such_assumption() -> None:
    assert not any(a.startswith("not modelled: ") for a in estimate(BASE).assumptions)


def test_expert_parallelism_on_a_dense_model_is_refused_not_ignored() -> None:
    with pytest.raises(ScenarioError, match="dense model"):
        resolve({**BASE, "parallel": {"ep": 2}})


def test_vllm_has_no_training_path() -> None:
    with pytest.raises(ScenarioError, match="framework vllm serves models"):
        resolve({**BASE, "framework": "vllm"})
