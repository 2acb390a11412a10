"""transformers' Falcon with the new decoder architecture (Falcon-40B) under SDPA, transformers 5.24 modeling_falcon.py:
``_split_heads`` broadcasts each K/V group to its query heads and ``flatten(2, 3)`` copies them (lines 258-263), and
``FalconModel.forward`` always materializes the causal mask (``allow_is_causal_skip=False``, lines 753-761), so SDPA
runs the memory-efficient kernel, which keeps the mask converted to the query dtype (``Traits.sdpa_mask_always``).
Lit-GPT's own attention (framework lightning) is not affected (tests/test_litgpt_kv_repeat.py)."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import live_at_backward
from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.terms.context import step_policy
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.trace.shrink import catalog_config, shrink

TOKENS = 1079


def _doc(framework: str) -> dict[str, Any]:
    return {"model": "tiiuae/falcon-40b", "task": "train", "framework": framework, "hardware": {"gpu": "A100-80GB"},
            "train": {"micro_batch_size": 1, "seq_len": TOKENS, "precision": "bf16-true", "attention": "sdpa",
                      "peft": {"method": "lora", "rank": 8, "target_modules": ["query_key_value"]}}}


def _records(doc: dict[str, Any]) -> dict[str, int]:
    res = train_step(resolve(doc))
    assert res.context is not None
    return {t.name: t.nbytes * t.copies for t in layer_activations(res.context).tensors[1]}


def test_falcon_40b_transformers_by_hand() -> None:
    r = resolve(_doc("hf-trainer"))
    assert r.model.traits.sdpa_mask_always
    assert resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu) == ("efficient", False)
    rec = _records(_doc("hf-trainer"))
    # 128 heads of 64 (q 8,192), 8 K/V groups (512): the flatten copies K and V to every head, 2 B x 8,192 each per
    # token, counted as the K/V heads (2 x 512 x 1,079 = 1,104,896 B) plus two copies of the rest
    # (2 x 2 x (8,192 - 512) x 1,079 = 33,146,880 B)
    assert rec["attention.k"] == rec["attention.v"] == 1_104_896
    assert rec["attention.kv_repeated"] == 33_146_880
    # the mask in the query dtype, [1, 1, 1,079, 1,079]: 2 x 1,079 x 1,079 = 2,328,482 B per layer
    assert rec["attention.window_mask"] == 2_328_482


def test_lightning_falcon_40b_keeps_its_own_rule() -> None:
    rec = _records(_doc("lightning"))
    # Lit-GPT: no mask in training and K/V copied once (2 x 8,192 x 1,079 = 17,678,336 B each)
    assert "attention.window_mask" not in rec and "attention.kv_repeated" not in rec
    assert rec["attention.k"] == rec["attention.v"] == 17_678_336


def test_layer_saved_bytes_agree_with_the_trace() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.step import trace_train

    # shrunk Falcon-40B (h 256, 4 heads of 64) with 2 K/V groups
    cfg = {**shrink(catalog_config("tiiuae/falcon-40b"), vocab=2048), "num_kv_heads": 2}
    r = resolve({"model": cfg, "hardware": {"gpu": "a100"},
                 "train": {"micro_batch_size": 1, "seq_len": 64, "precision": "bf16-true"}})
    inside = sum(e.nbytes for e in live_at_backward(trace_train(r)) if ".h.1." in f".{e.module}.")
    res = train_step(r)
    assert res.context is not None
    analytic = layer_activations(res.context).full[1]
    # the rest: the second LayerNorm's (ln_mlp) mean and rstd, 2 x 4 B x 64 tokens = 512 B, not modelled (both norms
    # normalize the same input; the engine counts one).  Before: the K/V copies (2 x 2 x (256 - 128) x 64 = 32,768 B)
    # and the bf16 mask (2 x 64 x 64 = 8,192 B) were missing too
    assert inside - analytic == 512
