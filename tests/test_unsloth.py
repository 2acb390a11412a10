"""Unsloth's patched LoRA/QLoRA step (``software.unsloth``; analytic/unsloth.py, facts/unsloth.py), by hand.

Llama-3-8B: hidden 4,096, vocabulary 128,256 (untied head), 32 layers; a QLoRA micro-batch of 2 x 2,048 tokens in
fp16 on a T4 (compute capability 7.5), the layout of Unsloth's Colab notebooks."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.lifecycle import JobLifecycle, job_lifecycle
from vramplan.analytic.logits import cce_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.train import train_step
from vramplan.analytic.unsloth import UnslothHead, fast_ce_bytes, unsloth_cce_runs
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.unsloth import UNSLOTH_ROWS, unsloth_row
from vramplan.spec.load import parse_scenario

BASE: dict[str, Any] = {
    "model": "meta-llama/Meta-Llama-3-8B", "hardware": {"gpu": "T4"}, "software": {"unsloth": "2024.5"},
    "train": {"micro_batch_size": 2, "seq_len": 2048, "precision": "fp16-mixed", "gradient_checkpointing": "full",
              "activation_offload": "cpu", "peft": {"method": "qlora", "rank": 16}, "quantization": "nf4-dq",
              "optimizer": "adamw-8bit"}}


def _doc(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for section, values in changes.items():
        if isinstance(values, dict):
            doc[section] = {**doc.get(section, {}), **values}
        else:
            doc[section] = values
    return doc


def _terms(doc: dict[str, Any]) -> dict[str, int]:
    return {t.name: t.nbytes for t in train_step(resolve(doc)).terms}


def _job(doc: dict[str, Any]) -> JobLifecycle:
    tr = train_step(resolve(doc))
    assert tr.context is not None and tr.layout is not None
    return job_lifecycle(tr.context, tr.layout, tr.terms, tr.moments)


def _head(tokens: int = 4096, vocab: int = 128_256, hidden: int = 4096, compute: int = 2, config: int = 2,
          converted: bool = True) -> UnslothHead:
    return UnslothHead(tokens, vocab, hidden, compute, compute, config, converted)


def test_fast_cross_entropy_by_hand() -> None:
    # 4,096 positions x 128,256 x 2 B (fp16 logits, kept by Fast_CrossEntropyLoss) + the int64 shifted labels 8 x
    # 4,096 + the fp32 logsumexp 4 x 4,096: 1,050,673,152 + 32,768 + 16,384 = 1,050,722,304; forward: the fp32
    # losses 4 x 4,096, the per-chunk logsumexp of a vocabulary above 65,536 (2 chunks) 4 x 4,096 x 2 and
    # accelerate's fp32 copy of the returned logits 4 x 4,096 x 128,256 = 2,101,346,304: 2,101,395,456; backward:
    # the head's input gradient 4,096 x 4,096 x 2 (the logits' gradient is written into the logits)
    kt = fast_ce_bytes(_head())
    assert (kt.saved, kt.forward_extra, kt.backward_extra) == (1_050_722_304, 2_101_395_456, 33_554_432)
    # bf16-true (no autocast, nothing converted), a vocabulary within one chunk: 8 x 4 (losses) forward bytes only
    assert fast_ce_bytes(_head(8, 32_000, 16, converted=False)).forward_extra == 32
    # fp16 compute on a bf16 model: logits.to(config.torch_dtype) copies them; the larger of that copy (2 B) and the
    # fp32 conversion (4 B) per position and entry: 8 x 4 + 8 x 32,000 x 4 = 1,024,032
    assert fast_ce_bytes(_head(8, 32_000, 16, 2, 2, True)).forward_extra == 32 + 8 * 32_000 * 4
    assert fast_ce_bytes(_head(8, 32_000, 16, 2, 4, False)).forward_extra == 32 + 8 * 32_000 * 2


def test_the_step_takes_unsloths_loss_not_transformers() -> None:
    hf = _terms(_doc(software={"unsloth": None}, train={"activation_offload": "none"}))
    uns = _terms(_doc())
    assert "logits.loss" in hf and "logits.loss" not in uns
    # forward peak = saved + forward extra (test_fast_cross_entropy_by_hand): 1,050,722,304 + 2,101,395,456
    assert uns["logits.kernel_loss"] == 3_152_117_760
    assert uns["logits.kernel_loss_gradients"] == 1_050_722_304 + 33_554_432


def test_unsloths_own_kbit_preparation_keeps_the_rest_in_fp16() -> None:
    # PEFT's prepare_model_for_kbit_training casts every non-quantized parameter to fp32; Unsloth's casts only the
    # LoRA weights: embedding and head 2 x 128,256 x 4,096 = 1,050,673,152 elements and 65 norms x 4,096 = 266,240,
    # 1,050,939,392 elements x (4 - 2) B = 2,101,878,784 B fewer
    hf = _terms(_doc(software={"unsloth": None}, train={"activation_offload": "none"}))
    uns = _terms(_doc())
    assert hf["parameters"] - uns["parameters"] == 2_101_878_784


@pytest.mark.parametrize(("release", "family", "loss", "above"), [
    ("2024.4", "llama", "fast-ce", 0), ("2024.11.7", "llama", "fast-ce", 0), ("2024.11.8", "llama", "cce", 0),
    ("2024.12.4", "llama", "cce", 0), ("2024.12.5", "llama", "cce", 1024), ("2025.8.4", "qwen2", "cce", 1024),
    ("2025.8.5", "llama", "unmodelled", 0),
    # mistral.py kept the fast loss until the 2025.3.1 wheel
    ("2024.12.5", "mistral", "fast-ce", 0), ("2025.2.15", "mistral", "fast-ce", 0), ("2025.3.1", "mistral", "cce", 1024)])
def test_the_release_rows(release: str, family: str, loss: str, above: int) -> None:
    row = unsloth_row(tuple(int(x) for x in release.split(".")), family)
    assert (row.loss, row.cce_above_tokens) == (loss, above)


def test_the_rows_are_ordered_and_sourced() -> None:
    for rows in UNSLOTH_ROWS.values():
        assert [r.first for r in rows] == sorted({r.first for r in rows})
        assert all(r.source for r in rows)


def test_cut_cross_entropy_runs_where_its_conditions_hold() -> None:
    s = parse_scenario(_doc(software={"unsloth": "2024.12.5"}))
    assert unsloth_cce_runs(s, "llama", 1025, (7, 5)) and not unsloth_cce_runs(s, "llama", 1024, (7, 5))
    assert not unsloth_cce_runs(s, "mistral", 4096, (7, 5))
    # below compute capability 7.5 (a V100: 7.0) or with torch before 2.4 it is not enabled
    assert not unsloth_cce_runs(s, "llama", 4096, (7, 0))
    old = parse_scenario(_doc(software={"unsloth": "2024.12.5", "torch": "2.3.1"}))
    assert not unsloth_cce_runs(old, "llama", 4096, (7, 5))
    # 2024.11.8-2024.12.4 take it at any size
    assert unsloth_cce_runs(parse_scenario(_doc(software={"unsloth": "2024.11.8"})), "llama", 8, (7, 5))
    # the step's loss follows: Cut Cross-Entropy keeps the hidden states (4,096 x 4,096 x 2), the logsumexp and the
    # vocabulary's average logit, no logits and no fp32 copy (2024.12.5, 4,096 tokens on a T4)
    kt = cce_bytes(4096, 128_256, 4096, 2, 2, 2, head_trainable=False)
    assert _terms(_doc(software={"unsloth": "2024.12.5"}))["logits.kernel_loss"] == kt.forward_peak
    assert kt.forward_peak == 4096 * 4096 * 2 + 4 * 4096 + 4 * 128_256 + 4 * 4096
    # Mistral's forward took it only from 2025.3.1: on 2024.12.5 its loss keeps the logits
    mistral = {"model": "mistralai/Mistral-7B-v0.1", "software": {"unsloth": "2024.12.5"}}
    assert _terms(_doc(**mistral))["logits.kernel_loss"] == fast_ce_bytes(_head(vocab=32_000)).forward_peak


def test_an_unsloth_evaluation_makes_its_own_logits() -> None:
    # the HF Trainer's evaluation of 8 x 2,048 tokens (its per_device_eval_batch_size): the fast-ce forward's
    # logits 16,384 x 128,256 x 2 with their fp32 copy (x 4), the labels and row statistics
    lc = {"evaluation": True}
    ev = {p.name: p.moment for p in _job(_doc(lifecycle=lc)).phases}["evaluation"]
    head = fast_ce_bytes(_head(16_384)).forward_peak
    assert head >= 16_384 * 128_256 * 6
    assert ev.get(K.EVAL_FORWARD) >= head
    # where Cut Cross-Entropy runs the forward returns no logits: far less
    ev_cce = {p.name: p.moment for p in _job(_doc(software={"unsloth": "2024.12.5"}, lifecycle=lc)).phases}
    assert ev_cce["evaluation"].get(K.EVAL_FORWARD) < head // 4


def test_use_gradient_checkpointing_unsloth_offloads_the_layer_inputs() -> None:
    # the layer inputs on the host ("unsloth") against on the GPU (True): 32 layers x 4,096 tokens x 4,096 x 2 B of
    # inputs less at the loss (the last layer's input is the final norm's, kept by both)
    on_gpu = estimate(_doc(train={"activation_offload": "none"}))
    offloaded = estimate(_doc())
    assert offloaded.per_gpu.peak_allocated_bytes < on_gpu.per_gpu.peak_allocated_bytes
    assert offloaded.host.offloaded_bytes >= 31 * 4096 * 4096 * 2
    assert any("use_gradient_checkpointing='unsloth'" in a for a in offloaded.assumptions)


def test_no_mask_and_no_training_cache_under_unsloth() -> None:
    # transformers 4.38's 4-D mask and the training forward's cache: Unsloth's model drops the mask and turns
    # use_cache off in training (its attention is SDPA-like here: xformers without flash-attn)
    doc = _doc(software={"unsloth": "2024.5", "transformers": "4.38.2"},
               train={"gradient_checkpointing": "none", "activation_offload": "none", "attention": "sdpa"})
    names = _terms(doc)
    assert "saved.release_mask" not in names and "saved.train_cache" not in names
    plain = copy.deepcopy(doc)
    plain["software"] = {"transformers": "4.38.2"}
    assert "saved.release_mask" in _terms(plain) and "saved.train_cache" in _terms(plain)
    # without checkpointing the per-layer tensors are PEFT's modules': said not modelled (the band widens)
    assert any(a.startswith("not modelled: Unsloth's fused LoRA kernels") for a in estimate(doc).assumptions)


@pytest.mark.parametrize(("changes", "needle"), [
    ({"model": "microsoft/phi-2"}, "read for gemma, gemma2"),
    ({"model": "Qwen/Qwen3-8B"}, "dispatches it from 2025.4.2"),
    ({"software": {"unsloth": "2025.9"}}, "set software.unsloth: 2025.8.4"),
    ({"train": {"quantization": "int8"}}, "load_in_4bit"),
    ({"train": {"gradient_checkpointing": "selective", "activation_offload": "none"}}, "use_gradient_checkpointing"),
    ({"train": {"peft": None, "quantization": "none", "optimizer": "adamw"}}, "LoRA and QLoRA"),
    ({"hardware": {"gpu": "T4", "num_gpus": 2}}, "one GPU"),
    ({"framework": "accelerate"}, "HF Trainer"),
    ({"software": {"unsloth": "2024.3"}}, "first shipped in Unsloth 2024.4"),
    ({"software": {"unsloth": "2024.3.9"}}, "first shipped in Unsloth 2024.4"),
    ({"train": {"loss": "liger-fused-linear-ce"}}, "computes its own loss"),
])
def test_refused_where_not_modelled(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        estimate(_doc(**changes))
    assert needle in str(e.value)


def test_use_cache_under_unsloth_is_said_unused_in_training() -> None:
    rep = estimate(_doc(train={"use_cache": True, "gradient_checkpointing": "none", "activation_offload": "none"}))
    assert any(a.startswith("train.use_cache set but not used: Unsloth's patched model") for a in rep.assumptions)


def test_unsloth_runs_its_own_attention() -> None:
    # never eager for Llama (xformers or flash-attn); Gemma 2 without flash-attn builds the softcapped scores
    llama = estimate(_doc(train={"attention": "eager"}))
    assert llama.scenario["train"]["attention"] == "sdpa"
    assert any(a.startswith("train.attention: sdpa, not eager: Unsloth") for a in llama.assumptions)
    gemma2 = estimate(_doc(model="google/gemma-2-2b", software={"unsloth": "2024.8"}, train={"attention": "sdpa"}))
    assert gemma2.scenario["train"]["attention"] == "eager"
    assert estimate(_doc(train={"attention": "flash"})).scenario["train"]["attention"] == "flash"


def test_the_first_offloading_release_is_accepted() -> None:
    # "2024.4" is the release 2024.4.0, the first with use_gradient_checkpointing="unsloth"
    assert estimate(_doc(software={"unsloth": "2024.4"})).per_gpu.peak_allocated_bytes > 0


def test_inference_with_unsloth_is_said_not_modelled() -> None:
    rep = estimate({"model": "meta-llama/Meta-Llama-3-8B", "task": "inference", "hardware": {"gpu": "T4"},
                    "software": {"unsloth": "2024.5"}, "inference": {"batch_size": 1, "prompt_len": 128,
                                                                      "new_tokens": 16}})
    assert any(a.startswith("not modelled: software.unsloth with task inference") for a in rep.assumptions)


def test_the_traced_engine_refuses_unsloth() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as trace_estimate

    with pytest.raises(ScenarioError) as e:
        trace_estimate(_doc(train={"activation_offload": "none"}))
    assert "software.unsloth" in str(e.value)
