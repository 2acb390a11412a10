"""Lit-GPT (``framework: lightning``) with a bitsandbytes 4-bit base: its own quantized LM head, dequantized
per chunk in the step (terms/loss.py ``litgpt_head_dequant``), and the evaluation's generation with
Lit-GPT's KV cache (analytic/lifecycle/evaluation.py).  Sources: lit-gpt 8641822 (``finetune/lora.py``,
``lit_gpt/lora.py``, ``lit_gpt/utils.py``), lightning 71aed75 (``plugins/precision/bitsandbytes.py``),
bitsandbytes 0.41.1 (``autograd/_functions.py`` ``MatMul4Bit``).

The tiny Llama of tests/test_lifecycle.py: hidden 256, MLP 688, 2 layers, vocabulary 1000, untied head.
"""

from __future__ import annotations

from typing import Any

from vramplan.analytic.lifecycle.evaluation import _generation_bytes
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.resident import parameter_bytes
from vramplan.analytic.timeline import FORWARD, LOSS, mlp
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve

TINY: dict[str, Any] = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
QLORA: dict[str, Any] = {"seq_len": 128, "micro_batch_size": 1, "precision": "bf16-true",
                         "peft": {"method": "qlora"}, "quantization": "nf4"}


def _step(framework: str, model: dict[str, Any] | str = TINY, train: dict[str, Any] | None = None) -> TrainResult:
    return train_step(resolve({"model": model, "hardware": {"gpu": "A100-80GB"}, "framework": framework,
                               "train": {**QLORA, **(train or {})}}))


def _ctx(tr: TrainResult) -> StepContext:
    assert tr.context is not None
    return tr.context


def _term(tr: TrainResult, name: str) -> int:
    return sum(t.nbytes for t in tr.terms if t.name == name)


def test_litgpt_holds_its_head_quantized() -> None:
    # linears 2 x (2 x 65,536 + 2 x 32,768 + 3 x 176,128) = 1,449,984 in nf4: 724,992 + 1,449,984 / 64 x 4
    # = 815,616; the rest in bf16: embedding 256,000 + 5 norms 1,280 + head 256,000 -> 1,026,560;
    # 1,842,176 as transformers holds it (the head in bf16).  Lit-GPT quantizes its head too:
    # 256,000 / 2 + 256,000 / 64 x 4 = 144,000 in place of 512,000: 1,842,176 - 368,000 = 1,474,176.
    c = _ctx(_step("lightning"))
    assert c.litgpt_head == 256_000
    assert parameter_bytes(c)[0] == 1_474_176


def test_litgpt_head_dequantized_beyond_the_loss() -> None:
    # 64 tokens: dequantized head 256,000 x (2 B fp16 + 2 B bf16) = 1,024,000; logits 2 x 1000 x 64 = 128,000.
    # backward, at the head's first chunk: 2 x 128,000 + 1,024,000 = 1,280,000 against the standard loss's
    #   backward record 6 x 128,000 = 768,000: 512,000 more;
    # forward, at the last chunk: 128,000 + 1,024,000 = 1,152,000 against the loss's forward record
    #   (2 + 4 + 4) x 1000 x 64 = 640,000: 512,000 more.
    tr = _step("lightning", train={"seq_len": 64})
    assert _term(tr, "logits.loss_gradients") == 768_000
    assert _term(tr, "logits.head_dequant_over_loss_gradients") == 512_000
    assert _term(tr, "logits.loss") == 640_000
    assert _term(tr, "logits.head_dequant_over_loss") == 512_000
    # lifetimes: the forward's end until the backward's start; the backward's start until the last layer's MLP
    life = {t.name: (t.born, t.dies) for t in tr.terms if t.name.startswith("logits.head_dequant")}
    assert life == {"logits.head_dequant_over_loss": (FORWARD, LOSS),
                    "logits.head_dequant_over_loss_gradients": (LOSS, mlp(1))}
    # 128 tokens: 2 x 256,000 + 1,024,000 = 1,536,000 = the loss's 6 x 256,000: nothing more
    assert _term(_step("lightning"), "logits.head_dequant_over_loss_gradients") == 0
    # fp16-true: the dequantized head is already in the compute dtype (no .to copy): 512,000;
    # 2 x 128,000 + 512,000 = 768,000, the loss's own
    fp16 = _step("lightning", train={"seq_len": 64, "precision": "fp16-true"})
    assert _term(fp16, "logits.head_dequant_over_loss_gradients") == 0


def test_no_litgpt_head_outside_lightning_or_4bit() -> None:
    assert _ctx(_step("accelerate")).litgpt_head == 0
    assert _ctx(_step("lightning", train={"peft": {"method": "lora"}, "quantization": "none"})).litgpt_head == 0
    assert _term(_step("accelerate"), "logits.head_dequant_over_loss_gradients") == 0


def test_falcon_40b_head_worked_example() -> None:
    # Falcon-40B ties its head in transformers; Lit-GPT holds one: 65,024 x 8,192 = 532,676,608 elements.
    # 1 x 1,079 tokens (the resource tables' longest Alpaca sample): dequant 4 x 532,676,608 = 2,130,706,432;
    # logits 2 x 65,024 x 1,079 = 140,321,792; 2 x 140,321,792 + 2,130,706,432 - 6 x 140,321,792
    # = 1,569,419,264 (terms/loss.py worked example)
    tr = _step("lightning", "tiiuae/falcon-40b", {"seq_len": 1079, "quantization": "nf4-dq",
                                                 "peft": {"method": "qlora", "target_modules": ["query_key_value"]}})
    c = _ctx(tr)
    assert c.litgpt_head == 532_676_608
    assert _term(tr, "logits.head_dequant_over_loss_gradients") == 1_569_419_264
    # the evaluation's generation (lit-gpt validate: set_kv_cache(batch_size=1) over max_seq_length 1,079):
    # K and V of 128 heads (expanded from 8 groups) x 64 x 1,079 x 2 B x 60 layers = 2,121,400,320; the mask
    # 1,079^2 = 1,164,241 B; one position's logits 130,048; the prompt's dequantized head 2,130,706,432:
    # 4,253,401,041 B
    assert tr.layout is not None
    assert _generation_bytes(c, tr.layout) == 4_253_401_041
