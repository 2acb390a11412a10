"""The attention a job runs when the scenario leaves it at its default and names an older transformers release
(spec/load.py ``release_attention_for``; ``Traits.sdpa_since`` read off the release wheels)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate


def _doc(model: str = "meta-llama/Llama-2-7b-hf", task: str = "train", attention: str | None = None,
         **software: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": task, "hardware": {"gpu": "A100-80GB", "num_gpus": 1}}
    section = ({"micro_batch_size": 1, "seq_len": 1024, "gradient_checkpointing": "none", "precision": "bf16-mixed"}
               if task == "train"
               else {"batch_size": 1, "prompt_len": 1024, "new_tokens": 8})
    if attention is not None:
        section["attention"] = attention
    doc[task] = section
    if software:
        doc["software"] = software
    return doc


def _attention(doc: dict[str, Any]) -> str:
    s = resolve(doc).scenario
    return s.train.attention if s.task == "train" else s.inference.attention


@pytest.mark.parametrize(("model", "software", "expected"), [
    ("meta-llama/Llama-2-7b-hf", {"transformers": "4.35.2"}, "eager"),    # before 4.36's _check_and_enable_sdpa
    ("meta-llama/Llama-2-7b-hf", {"transformers": "4.36.2"}, "sdpa"),
    ("meta-llama/Llama-2-7b-hf", {"transformers": "4.36.2", "torch": "2.1.0"}, "eager"),  # torch < 2.1.1
    ("meta-llama/Llama-2-7b-hf", {"transformers": "4.36.2", "torch": "2.1.1"}, "sdpa"),
    ("mistralai/Mistral-7B-v0.1", {"transformers": "4.36.2"}, "eager"),   # Mistral's SDPA class from 4.37
    ("mistralai/Mistral-7B-v0.1", {"transformers": "4.37.2"}, "sdpa"),
    ("openai-community/gpt2", {"transformers": "4.41.2"}, "eager"),       # GPT-2's from 4.42
    ("openai-community/gpt2", {"transformers": "4.42.4"}, "sdpa"),
    ("tiiuae/falcon-7b", {"transformers": "4.33.3"}, "sdpa"),             # Falcon called SDPA itself before 4.36
    ("llava-hf/llava-1.5-7b-hf", {"transformers": "4.36.2"}, "eager"),    # LLaVA's composite class: none in 4.36
    ("llava-hf/llava-1.5-7b-hf", {"transformers": "4.37.2"}, "sdpa"),     # ... from 4.37 its language model's
    ("meta-llama/Llama-2-7b-hf", {}, "sdpa"),                             # no release named: the current one
])
def test_default_attention_by_release(model: str, software: dict[str, str], expected: str) -> None:
    assert _attention(_doc(model, **software)) == expected


def test_an_explicit_attention_is_kept() -> None:
    # optimum's BetterTransformer ran SDPA on releases before 4.36: the scenario says so
    assert _attention(_doc(attention="sdpa", transformers="4.31.0")) == "sdpa"
    assert _attention(_doc(attention="flash", transformers="4.34.1")) == "flash"


def test_inference_follows_the_same_rule() -> None:
    assert _attention(_doc(task="inference", transformers="4.35.2")) == "eager"


def test_the_report_says_so_and_resolves_to_itself() -> None:
    rep = estimate(_doc(transformers="4.35.2"))
    note = next(a for a in rep.assumptions if a.startswith("train.attention: eager"))
    assert "before transformers 4.36" in note
    # the report's scenario holds the attention that ran: resolving it again changes nothing
    assert _attention(rep.scenario) == "eager"


def test_eager_default_costs_the_scores() -> None:
    # Llama-2-7B LoRA, one sequence of 1024, no checkpointing (the activations make the peak): eager keeps each
    # layer's softmax output (and more) for the backward, the flash kernel none, so the older release's default needs more
    old_doc, new_doc = _doc(transformers="4.35.2"), _doc(transformers="4.36.2")
    for d in (old_doc, new_doc):
        d["train"]["peft"] = {"method": "lora", "rank": 16}
    old = estimate(old_doc).per_gpu.peak_allocated_bytes
    new = estimate(new_doc).per_gpu.peak_allocated_bytes
    # at least the 32 layers' saved softmax output: 32 heads x 1024^2 x 2 B each = 2 GiB
    assert old - new >= 32 * 32 * 1024 * 1024 * 2
