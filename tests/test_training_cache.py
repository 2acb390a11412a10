"""The cache a training forward builds with use_cache on and no gradient checkpointing (terms/saved.py
``training_cache_bytes``; transformers 5.24 LlamaModel.forward, DynamicLayer.update copies from 4.56)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.engine import estimate

KEY = "cache of the training forward (use_cache)"
# Llama-2-7B: 32 layers, 32 K/V heads x 128 = 4,096 wide; K and V for 2 x 2,048 tokens in bf16:
# 32 x 2 x (2 x 2,048) x 4,096 x 2 = 2,147,483,648 B
LLAMA2_CACHE = 32 * 2 * (2 * 2048) * 4096 * 2


def _doc(model: str = "meta-llama/Llama-2-7b-hf", transformers: str | None = None, **train: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 1},
                           "train": {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16-true",
                                     "gradient_checkpointing": "none", "attention": "sdpa",
                                     "peft": {"method": "lora", "rank": 16}, **train}}
    if transformers is not None:
        doc["software"] = {"transformers": transformers}
    return doc


def _cache(doc: dict[str, Any]) -> int:
    from vramplan.analytic.terms.context import StepContext
    from vramplan.analytic.terms.saved import training_cache_bytes
    from vramplan.catalog.resolve import resolve

    r = resolve(doc)
    from vramplan.analytic.attention import resolve_attention
    from vramplan.analytic.terms.context import step_policy

    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)
    return training_cache_bytes(StepContext(r, 0, attention, repeat))


def test_current_release_copies_every_layer() -> None:
    assert _cache(_doc()) == LLAMA2_CACHE
    assert _cache(_doc(transformers="4.56.0")) == LLAMA2_CACHE
    rep = estimate(_doc())
    assert any("builds a DynamicCache in the forward" in a for a in rep.assumptions)


@pytest.mark.parametrize("train", [{"use_cache": False}, {"gradient_checkpointing": "full"}])
def test_off_or_checkpointed_holds_none(train: dict[str, Any]) -> None:
    assert _cache(_doc(**train)) == 0


def test_older_release_holds_references() -> None:
    # 4.55: the cache appends the attention's own key and value tensors, which the kernel keeps anyway
    assert _cache(_doc(transformers="4.55.4")) == 0
    # ... except grouped K/V that SDPA before 4.54 is handed repeated: the unrepeated ones are the cache's alone.
    # Llama-3-8B: 8 K/V heads x 128 = 1,024 wide: 32 x 2 x 4,096 x 1,024 x 2 = 536,870,912
    assert _cache(_doc("meta-llama/Meta-Llama-3-8B", transformers="4.53.3")) == 32 * 2 * 4096 * 1024 * 2
    assert _cache(_doc("meta-llama/Meta-Llama-3-8B", transformers="4.55.4")) == 0  # enable_gqa: nothing repeated


def test_the_forward_end_holds_it_and_the_backward_does_not() -> None:
    # the step's moments with and without it: the forward's end (the loss computed inside the model's forward) holds
    # the whole cache, the backward's start (the HF Trainer's compute_loss has returned the loss alone) none of it
    from vramplan.analytic.train import train_step
    from vramplan.catalog.resolve import resolve

    on, off = (train_step(resolve(_doc(use_cache=u))).moments for u in (True, False))
    assert on[0].phase == "forward" and on[0].total - off[0].total == LLAMA2_CACHE
    assert on[1].total == off[1].total  # the loss moment: the output, and the cache with it, are gone


def test_traced_engine_builds_it_too() -> None:
    # the installed transformers builds the same DynamicCache when the trace runs the forward with use_cache on: each
    # layer's K and V copied by torch.cat, 32 layers x 2 tensors of 256 x 4,096 x 2 B = 2,097,152 B (RoPE's
    # rotate_half makes 64 more cats of that size, on and off alike)
    pytest.importorskip("torch")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.step import trace_train

    def cats(use_cache: bool) -> int:
        st = trace_train(resolve(_doc(seq_len=256, micro_batch_size=1, use_cache=use_cache)))
        return sum(1 for ev in st.events if ev.nbytes == 2_097_152 and ev.op == "aten.cat.default")

    assert cats(True) - cats(False) == 32 * 2
