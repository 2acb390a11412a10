"""``spec.fields.changed_fields``: a field is set when its value differs from its default, never by presence."""

from __future__ import annotations

from vramplan.spec.defaults import with_trainer_defaults
from vramplan.spec.fields import changed_fields
from vramplan.spec.scenario import Gguf, Rl, Scenario, Serve


def test_a_default_written_out_is_not_a_setting() -> None:
    # gpu_memory_utilization written at its default 0.9 is present (model_fields_set) but unchanged
    sv = Serve(gpu_memory_utilization=0.9, block_size=32)
    assert "gpu_memory_utilization" in sv.model_fields_set
    assert changed_fields(sv) == ["block_size"]
    assert changed_fields(sv, ("gpu_memory_utilization",)) == []


def test_keys_keep_their_order_and_factories_are_called() -> None:
    # gguf's default comes from a default_factory (Gguf()): equal to it is unchanged, another quant is a change
    sv = Serve(gguf=Gguf(), block_size=32, max_loras=2)
    assert changed_fields(sv, ("max_loras", "gguf", "block_size")) == ["max_loras", "block_size"]
    assert changed_fields(Serve(gguf=Gguf(quant="Q8_0")), ("gguf",)) == ["gguf"]


def test_resolved_defaults_replace_the_schema_defaults() -> None:
    # under rloo the resolved rl block holds RLOOConfig's beta 0.05, 2 generations and 512 completion tokens: against
    # the schema's nulls all three differ; against the rl block the scenario resolves to without one, none does
    s = with_trainer_defaults(Scenario.model_validate({"model": "x", "train": {"objective": "rloo"}}))
    plain = with_trainer_defaults(s.model_copy(update={"rl": Rl()})).rl
    assert changed_fields(s.rl) == ["beta", "rollout"]
    assert changed_fields(s.rl, defaults=plain) == []
    assert changed_fields(Serve(dtype="bf16"), ("dtype",), defaults={"dtype": "bf16"}) == []
