"""Lit-GPT (``framework: lightning``) LoRA under a mixed precision: Lightning Fabric's ``MixedPrecision`` leaves the
model it builds in fp32, so the frozen base is held at 4 B per weight and autocast's uncached half copy of each
frozen linear is saved by its matmul (analytic/precision.py ``litgpt_fp32_base``, terms/casts.py
``frozen_casts_apply``).  Sources: lit-gpt 8641822 and litgpt v0.3.1-v0.5.13 ``finetune/lora.py``; lightning 71aed75
and 2.4.0 ``fabric/plugins/precision/amp.py``, ``precision.py``, ``half.py``.

The tiny Llama of tests/test_litgpt_step.py: hidden 256, MLP 688, 2 layers, vocabulary 1000, untied head.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.lifecycle.evaluation import _generation_bytes
from vramplan.analytic.terms.resident import parameter_bytes
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError

TINY: dict[str, Any] = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
LORA: dict[str, Any] = {"seq_len": 300, "micro_batch_size": 1, "peft": {"method": "lora", "rank": 8}}


def _doc(framework: str, precision: str, model: dict[str, Any] | str = TINY, **train: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "A100-80GB"}, "framework": framework,
            "train": {**LORA, "precision": precision, **train}}


def _step(framework: str, precision: str, **train: Any) -> TrainResult:
    return train_step(resolve(_doc(framework, precision, **train)))


def _terms(tr: TrainResult, name: str) -> list[int]:
    return [t.nbytes for t in tr.terms if t.name == name]


def test_litgpt_mixed_holds_the_frozen_base_in_fp32() -> None:
    # base parameters: linears 2 x (2 x 65,536 + 2 x 32,768 + 3 x 176,128) = 1,449,984, embedding 256,000, 5 norms
    # 1,280, head 256,000: 1,963,264, at 4 B under bf16-mixed instead of 2 under bf16-true: 3,926,528 B more (the
    # adapters are fp32 in both)
    mixed, true = _step("lightning", "bf16-mixed"), _step("lightning", "bf16-true")
    assert mixed.context is not None and true.context is not None
    assert mixed.context.pol.frozen_param_bytes == 4 and true.context.pol.frozen_param_bytes == 2
    assert parameter_bytes(mixed.context)[0] - parameter_bytes(true.context)[0] == 3_926_528
    assert any("Fabric's MixedPrecision leaves the model it builds in fp32" in a for a in mixed.assumptions)


def test_litgpt_mixed_saves_each_frozen_linears_half_copy() -> None:
    # each layer's linears, 724,992 weights, cast to bf16 (2 B) and saved by their matmuls: 1,449,984 B per layer;
    # the head cast per 128-token chunk: ceil(300 / 128) = 3 copies of 256,000 x 2 B = 1,536,000 B
    tr = _step("lightning", "bf16-mixed")
    assert _terms(tr, "casts.layer") == [1_449_984, 1_449_984]
    assert _terms(tr, "casts.head_chunks_frozen") == [1_536_000]
    # 129 tokens: two chunks
    assert _terms(_step("lightning", "bf16-mixed", seq_len=129), "casts.head_chunks_frozen") == [1_024_000]


@pytest.mark.parametrize(("framework", "precision"), [("lightning", "bf16-true"), ("hf-trainer", "bf16-mixed")])
def test_no_frozen_copies_elsewhere(framework: str, precision: str) -> None:
    # bf16-true holds the base in bf16 (HalfPrecision.convert_module); transformers' PEFT loads it in bf16 too
    tr = _step(framework, precision)
    assert tr.context is not None and tr.context.pol.frozen_param_bytes == 2
    assert not _terms(tr, "casts.layer") and not _terms(tr, "casts.head_chunks_frozen")


def test_litgpt_mixed_makes_the_sample_kv_cache_in_fp32() -> None:
    # Lit-GPT's cache for generate_example: 2 layers x K and V x 4 heads x 300 positions x 64 = 307,200 elements.
    # bf16-true: 614,400 B + the 300^2 bool mask 90,000 + one position's logits 1,000 x 2 = 706,400 B.
    # bf16-mixed: made in fp32 (1,228,800 B), then each layer's K and V converted at its first use: the first
    # layer's bf16 K, 307,200 x 2 / 2 layers / 2 = 153,600 B, beside it: 1,228,800 + 153,600 + 92,000 = 1,474,400 B
    mixed, true = _step("lightning", "bf16-mixed"), _step("lightning", "bf16-true")
    assert mixed.context is not None and mixed.layout is not None
    assert true.context is not None and true.layout is not None
    assert _generation_bytes(true.context, true.layout) == 706_400
    assert _generation_bytes(mixed.context, mixed.layout) == 1_474_400


def test_litgpt_refuses_quantization_with_mixed_precision() -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(_doc("lightning", "bf16-mixed", peft={"method": "qlora"}, quantization="nf4"))
    assert e.value.problems[0].where == "train.precision"
    assert "Quantization and mixed precision is not supported" in str(e.value)


def test_llama2_7b_default_precision_runs_out_of_memory_on_40gb() -> None:
    # Lit-GPT's tutorial (finetune_lora.md, commit 982abcb): Llama 2 7B LoRA, micro-batch 1, "Default (bf16-mixed) |
    # OutOfMemoryError", "--precision bf16-true | 21.30 GB" on the 40 GB A100 (validation/published.yaml).
    # Layer copies: 32 x (4 x 4096^2 + 3 x 4096 x 11008) x 2 B = 32 x 404,750,336 = 12,952,010,752 B; head copies:
    # ceil(1304 / 128) = 11 x 131,072,000 x 2 B = 2,883,584,000 B; base weights 6,738,415,616 x 4 B.
    doc = {"model": "meta-llama/Llama-2-7b-hf", "hardware": {"gpu": "A100-40GB"}, "framework": "lightning",
           "train": {"seq_len": 1304, "micro_batch_size": 1, "precision": "bf16-mixed", "attention": "sdpa",
                     "peft": {"method": "lora", "rank": 8, "target_modules": ["q_proj", "v_proj"]}}}
    tr = train_step(resolve(doc))
    assert sum(_terms(tr, "casts.layer")) == 12_952_010_752
    assert _terms(tr, "casts.head_chunks_frozen") == [2_883_584_000]
    report = estimate(doc)
    assert report.per_gpu.breakdown["weights"] >= 6_738_415_616 * 4
    assert report.verdict == "DOES NOT FIT"
    doc["train"]["precision"] = "bf16-true"
    assert estimate(doc).verdict == "FITS"


def test_checkpointed_layers_hold_only_their_recomputed_copies() -> None:
    # a checkpointed forward saves nothing (torch.utils.checkpoint), and the frozen linears' copies are not
    # cached, so each is freed after its matmul: no forward-to-loss row; the recomputation casts the layer again
    # and its matmuls save the copies until the layer's backward: 724,992 x 2 B = 1,449,984 B per layer
    tr = _step("lightning", "bf16-mixed", gradient_checkpointing="full")
    assert _terms(tr, "casts.layer") == []
    assert _terms(tr, "casts.recomputed") == [1_449_984, 1_449_984]
    # the head is outside the checkpointed blocks: its chunk copies stay (3 x 256,000 x 2 B)
    assert _terms(tr, "casts.head_chunks_frozen") == [1_536_000]
