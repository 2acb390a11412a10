"""A catalog row that writes a multimodal checkpoint's language model alone (the Gemma 3 ``-pt`` rows: model type
``gemma3_text`` under ``Gemma3ForConditionalGeneration``) says that the vision tower it does not describe is not
counted (catalog/models.py ``_text_part_of_multimodal``), and its band widens; rows with the vision config, and
text models, say nothing of it."""

from __future__ import annotations

import pytest

from vramplan.catalog import load_model
from vramplan.engine import estimate

SAYS = "checkpoint is a Gemma3ForConditionalGeneration (a vision-language model)"


@pytest.mark.parametrize("name", ["google/gemma-3-4b-pt", "google/gemma-3-12b-pt", "google/gemma-3-27b-pt"])
def test_text_part_rows_say_the_tower_is_not_counted(name: str) -> None:
    m = load_model(name)
    assert m.vision_parameters == 0
    assert any(SAYS in n and n.startswith("not modelled: ") for n in m.source_notes)


@pytest.mark.parametrize("name", ["google/gemma-3-4b-it", "meta-llama/Llama-3.1-8B", "openai/whisper-small"])
def test_complete_rows_say_nothing(name: str) -> None:
    assert not any(SAYS in n for n in load_model(name).source_notes)


def test_the_report_states_it_and_widens_the_band() -> None:
    doc = {"model": "google/gemma-3-4b-pt", "task": "inference", "hardware": {"gpu": "A100-80GB"}}
    r = estimate(doc)
    assert any(SAYS in a for a in r.assumptions)
    assert any(a.startswith("band widened") for a in r.assumptions)
