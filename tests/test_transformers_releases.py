"""The first transformers release of each model family (facts/transformers.py) and the refusal of a
``software.transformers`` older than the scenario's family."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.transformers import first_release, release_tuple
from vramplan.spec.families import FAMILIES

TABLE = json.loads(resources.files("vramplan.facts").joinpath("data/transformers_model_types.json").read_text())


# Hand-checked against the wheels: transformers 4.50.0's configuration_auto.py has no ("qwen3", "Qwen3Config")
# and 4.51.0's has; Gemma 2 arrived in 4.42.0, gpt-oss in 4.55.0, Phi-3 in 4.41.0 (4.40.0 has "phi" only).
@pytest.mark.parametrize(("model_type", "first"), [
    ("qwen3", "4.51.0"), ("qwen3_moe", "4.51.0"), ("gemma2", "4.42.0"), ("gpt_oss", "4.55.0"), ("phi3", "4.41.0"),
    ("llama", "4.28.0"), ("mixtral", "4.36.0"), ("gemma3_text", "4.50.0"),
])
def test_first_release_read_off_the_wheels(model_type: str, first: str) -> None:
    assert first_release(model_type) == first


def test_types_of_the_oldest_wheel_have_no_known_first_release() -> None:
    # gpt2 is in 4.26.0, the oldest wheel read: its own first release is older and unknown
    assert TABLE["first_release"]["gpt2"] == TABLE["oldest_release_read"] == "4.26.0"
    assert first_release("gpt2") is None
    assert first_release("no_such_family") is None


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_is_in_the_table(model_type: str) -> None:
    """Every family vramplan models is one transformers ships, so the table dates each of them."""
    assert model_type in TABLE["first_release"]


def test_release_tuple_pads_to_three_numbers() -> None:
    assert release_tuple("4.45") == (4, 45, 0) < release_tuple("4.51.0") == (4, 51, 0)
    assert release_tuple("5") == (5, 0, 0) > release_tuple("4.57.6")


def _scenario(version: str) -> dict[str, object]:
    return {"model": "Qwen/Qwen3-8B", "task": "train", "hardware": {"gpu": "A100-80GB", "num_gpus": 1},
            "software": {"transformers": version}}


def test_a_release_older_than_the_family_is_refused() -> None:
    with pytest.raises(ScenarioError) as e:
        estimate(_scenario("4.50.3"))
    text = str(e.value)
    assert "software.transformers" in text and "4.51.0" in text and "4.51 or later" in text


@pytest.mark.parametrize("version", ["4.51", "4.51.0", "4.57.1", "5.0"])
def test_the_first_release_and_later_are_accepted(version: str) -> None:
    assert estimate(_scenario(version)).per_gpu.device_used_bytes > 0
