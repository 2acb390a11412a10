"""Lit-GPT's CausalSelfAttention copies K/V to every query head before SDPA in a training step (analytic/attention.py
``litgpt_kv_repeated``: lit-gpt 8641822 lit_gpt/model.py lines 208-215 ``expand`` + ``reshape``; litgpt v0.5.9
litgpt/model.py lines 441-444 ``repeat_interleave``), then SDPA runs a fused kernel on equal head counts."""

from __future__ import annotations

from typing import Any

from vramplan.analytic import activations as act
from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.terms.context import step_policy
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve

TOKENS = 1079  # the resource tables' Falcon sequence length (validation/published.yaml)


def _doc(model: str, framework: str, **train: Any) -> dict[str, Any]:
    return {"model": model, "task": "train", "framework": framework, "hardware": {"gpu": "A100-40GB"},
            "train": {"micro_batch_size": 1, "seq_len": TOKENS, "precision": "bf16-true",
                      "peft": {"method": "lora", "rank": 8, "target_modules": ["query_key_value"]}, **train}}


def _records(doc: dict[str, Any]) -> dict[str, int]:
    res = train_step(resolve(doc))
    assert res.context is not None
    return {t.name: t.nbytes for t in layer_activations(res.context).tensors[1]}


def test_falcon_40b_kv_copied_to_every_head_under_lightning() -> None:
    lit = _records(_doc("tiiuae/falcon-40b", "lightning"))
    # Falcon-40B: 128 query heads and 8 K/V groups of 64 -> q width 8,192, K/V width 512.  Lit-GPT copies K and V to
    # every query head and flash saves the copies: 2 B x 8,192 x 1,079 = 17,678,336 B each per layer
    assert lit["attention.k"] == lit["attention.v"] == 2 * 8192 * TOKENS == 17_678_336
    assert lit["attention.q"] == 2 * 8192 * TOKENS
    # the flash kernel (no s x s tensor): the logsumexp, fp32 per head and token, 4 x 128 x 1,079 = 552,448 B
    assert lit["attention.logsumexp"] == 552_448 and "attention.softmax" not in lit


def test_one_kv_head_is_copied_too_and_runs_flash() -> None:
    # from lit-gpt 50b1974b (every tagged release) a training step copies one K/V head as well: equal head counts,
    # flash (bf16, head_dim 64, sm80), not transformers' math kernel for Falcon's MQA
    r = resolve(_doc("tiiuae/falcon-7b", "lightning"))
    assert resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu) == ("flash", True)
    lit = _records(_doc("tiiuae/falcon-7b", "lightning"))
    # Falcon-7B: 71 heads of 64 -> 4,544; 2 x 4,544 x 1,079 = 9,805,952 B
    assert lit["attention.k"] == lit["attention.v"] == 9_805_952
    # transformers' FalconAttention keeps its rule (one K/V head to SDPA: the math kernel)
    hf = resolve(_doc("tiiuae/falcon-7b", "hf-trainer"))
    assert resolve_attention(hf.scenario, hf.model, step_policy(hf.scenario), hf.gpu)[0] == "math"


def test_backward_holds_dk_dv_as_wide_as_the_copies() -> None:
    r = resolve(_doc("tiiuae/falcon-40b", "lightning"))
    res = train_step(r)
    assert res.context is not None
    ctx = res.context.act
    assert ctx.gqa_repeat and ctx.attention == "flash"
    m = r.model
    # attention backward per token: dO-side residual gradients 2 r h (r 2, h 8,192), dQ and dO 2 c q, dK and dV as wide
    # as the copies 2 c q, the fp32 dQ accumulator 4 q: 2*2*8192 + 2*(2*8192 + 2*8192) + 4*8192 = 131,072
    assert act.backward_transients_per_token(m, m.layers[1], ctx)[1] == 131_072
