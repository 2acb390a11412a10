"""The refusals DPO, KTO and ORPO share (a preference trainer's setups that the estimate does not model)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.errors import ScenarioError

A100 = "A100-80GB"


def shared_refusals(train: dict[str, Any], loss: str = "liger-fused-linear-ce") -> list[tuple[dict[str, Any], str]]:
    """(scenario change, the ``where`` of the problem it must raise) for every preference trainer."""
    return [
        ({"parallel": {"zero_stage": 3}, "hardware": {"gpu": A100, "num_gpus": 8}}, "parallel"),
        ({"parallel": {"tp": 2}, "hardware": {"gpu": A100, "num_gpus": 2}}, "parallel"),
        ({"train": {**train, "loss": loss}}, "train.loss"),
        ({"train": {**train, "packing": True}}, "train.packing"),
        ({"lifecycle": {"evaluation": True}}, "lifecycle.evaluation"),
        ({"framework": "torchtune"}, "framework"),
    ]


def assert_refused(base: dict[str, Any], change: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate({**base, **change})
    assert any(p.where == where for p in exc.value.problems), exc.value
