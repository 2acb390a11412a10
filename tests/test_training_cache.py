"""The cache a training forward builds with use_cache on and no gradient checkpointing (terms/saved.py
``training_cache_bytes``; transformers 5.24 LlamaModel.forward, DynamicLayer.update).

The attention runs on what ``cache.update`` returns, so the kernel keeps the cache's own tensors and the cache adds
nothing, except where the kernel is handed K/V repeated to every query head (eager attention; SDPA before 4.54):
then the cache holds the grouped K/V beside the repeated copies the kernel keeps."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.terms.context import StepContext, step_policy
from vramplan.analytic.terms.saved import training_cache_bytes
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate

# Llama-3-8B: 32 layers, 8 K/V heads x 128 = 1,024 wide; K and V of 2 x 2,048 tokens in bf16:
# 32 x 2 x (2 x 2,048) x 1,024 x 2 = 536,870,912 B
LLAMA3_GROUPED = 32 * 2 * (2 * 2048) * 1024 * 2


def _doc(model: str = "meta-llama/Meta-Llama-3-8B", transformers: str | None = None, **train: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 1},
                           "train": {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16-true",
                                     "gradient_checkpointing": "none", "attention": "eager",
                                     "peft": {"method": "lora", "rank": 16}, **train}}
    if transformers is not None:
        doc["software"] = {"transformers": transformers}
    return doc


def _cache(doc: dict[str, Any]) -> int:
    r = resolve(doc)
    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)
    return training_cache_bytes(StepContext(r, 0, attention, repeat))


def test_grouped_kv_repeated_for_the_kernel() -> None:
    # eager attention repeats the 8 K/V heads to 32: the kernel keeps the repeated copies, the cache the grouped ones
    # (use_cache true: what a 4.x HF Trainer or a plain loop leaves the config's at; the 5.x Trainer's below)
    assert _cache(_doc(use_cache=True)) == LLAMA3_GROUPED
    assert _cache(_doc(transformers="4.56.0")) == _cache(_doc(transformers="4.40.0")) == LLAMA3_GROUPED
    # SDPA: repeated before 4.54 (repeat_kv), handed over grouped from 4.54 (enable_gqa): nothing beside it then
    assert _cache(_doc(transformers="4.53.3", attention="sdpa")) == LLAMA3_GROUPED
    assert _cache(_doc(transformers="4.54.0", attention="sdpa")) == 0
    assert any("builds a DynamicCache in the forward" in a for a in estimate(_doc(use_cache=True)).assumptions)


def test_the_hf_trainer_from_5_0_turns_the_config_off() -> None:
    # transformers 5.0 Trainer.__init__: model.config.use_cache = self.args.use_cache, TrainingArguments.use_cache
    # defaulting to False; 4.x leaves the config's (true for Llama-3-8B)
    assert _cache(_doc()) == _cache(_doc(transformers="5.0.0")) == 0
    assert _cache(_doc(transformers="4.57.3")) == LLAMA3_GROUPED
    # a loop of one's own keeps the config's on the current release
    assert _cache({**_doc(), "framework": "plain"}) == LLAMA3_GROUPED


def test_the_kernel_keeping_the_caches_own_tensors_adds_nothing() -> None:
    # Llama-2-7B: as many K/V heads as query heads, nothing repeated: the kernel keeps what the cache holds
    assert _cache(_doc("meta-llama/Llama-2-7b-hf")) == 0
    assert _cache(_doc("meta-llama/Llama-2-7b-hf", transformers="4.40.0", attention="sdpa")) == 0
    # the flash-attention package takes grouped K/V itself
    assert _cache(_doc(attention="flash")) == 0


@pytest.mark.parametrize("train", [{"use_cache": False}, {"gradient_checkpointing": "full"}])
def test_off_or_checkpointed_holds_none(train: dict[str, Any]) -> None:
    assert _cache(_doc(**train)) == 0


def test_the_forward_end_holds_it_and_the_backward_does_not() -> None:
    # the step's moments with and without it: the forward's end (the loss computed inside the model's forward) holds
    # the grouped K/V too, the backward's start (the HF Trainer's compute_loss has returned the loss alone) none of it
    on, off = (train_step(resolve(_doc(use_cache=u))).moments for u in (True, False))
    assert on[0].phase == "forward" and on[0].total - off[0].total == LLAMA3_GROUPED
    assert on[1].total == off[1].total


def test_traced_engine_agrees() -> None:
    # the installed transformers run on the meta device: the most the forward holds at once differs by the grouped
    # K/V with eager attention (Qwen2.5-0.5B: 24 layers, 2 K/V heads x 64 = 128 wide, 256 tokens in bf16:
    # 24 x 2 x 256 x 128 x 2 = 3,145,728 B) and by nothing under SDPA (grouped K/V handed over with enable_gqa)
    pytest.importorskip("torch")
    from vramplan.trace.step import trace_train

    def forward_high(use_cache: bool, attention: str) -> int:
        st = trace_train(resolve(_doc("Qwen/Qwen2.5-0.5B", seq_len=256, micro_batch_size=1, use_cache=use_cache,
                                      attention=attention)))
        starts = {name: seq for seq, name in st.marks}
        live = high = 0
        for ev in st.events:
            live += ev.nbytes
            if starts["forward"] <= ev.seq < starts["backward"]:
                high = max(high, live)
        return high

    assert forward_high(True, "eager") - forward_high(False, "eager") == 24 * 2 * 256 * 128 * 2
    assert forward_high(True, "sdpa") == forward_high(False, "sdpa")


def test_trl_sft_from_0_22_passes_use_cache_false() -> None:
    # trl v0.22.0 SFTTrainer.compute_loss: inputs["use_cache"] = False (trl #3891); before it the config's
    def trl(v: str) -> dict[str, Any]:
        return {**_doc(), "software": {"trl": v, "transformers": "4.57.3"}}
    assert _cache(trl("0.21.0")) == LLAMA3_GROUPED
    assert _cache(trl("0.22.0")) == _cache(trl("1.9.0")) == 0
    # train.use_cache given under such a release is said to be unused, with the reason
    doc = trl("0.22.0")
    doc["train"] = {**doc["train"], "use_cache": True}
    assert any("train.use_cache set but not used: TRL's SFTTrainer from 0.22" in a for a in estimate(doc).assumptions)
