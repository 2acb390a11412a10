"""bitsandbytes < 0.43.2 kept each 4-bit linear's input for the backward (software.bitsandbytes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.spec.scenario import Scenario

TINY: dict[str, Any] = {
    "model": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
              "max_position_embeddings": 512},
    "hardware": {"gpu": "A100-80GB"}, "framework": "lightning",
    "train": {"micro_batch_size": 2, "seq_len": 128, "precision": "bf16-true", "optimizer": "adamw",
              "peft": {"method": "qlora", "rank": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.05},
              "quantization": "nf4"},
}


@pytest.mark.parametrize(("version", "saves"), [
    (None, False), ("0.41.1", True), ("0.43.1", True), ("0.43.2", False), ("0.45", False), ("1", False)])
def test_version_threshold(version: str | None, saves: bool) -> None:
    assert Scenario(model="gpt2", software={"bitsandbytes": version}).software.bnb_4bit_saves_input is saves


def test_old_bitsandbytes_adds_the_linear_inputs_by_hand() -> None:
    new = estimate(TINY)
    old = estimate({**TINY, "software": {"bitsandbytes": "0.41.1"}})
    # per layer and token, the bf16 inputs of the 4-bit linears not kept otherwise (LoRA dropout keeps
    # its own copy): q/k/v input 256 + o_proj input 256 + gate/up input 256 + down_proj input 688
    # = 1,456 elements x 2 B = 2,912 B; x 2 x 128 tokens x 2 layers = 1,490,944 B; and Lit-GPT's head, a
    # 4-bit linear too (framework lightning), keeps its input: 256 x 2 B x 256 tokens = 131,072 B
    assert old.per_gpu.peak_allocated_bytes - new.per_gpu.peak_allocated_bytes == 1_490_944 + 131_072
    assert any("keeps its input" in a for a in old.assumptions)
    assert any(">= 0.43.2" in a for a in new.assumptions)


def test_old_bitsandbytes_no_effect_without_4bit_or_adapters() -> None:
    lora = {**TINY, "train": {**TINY["train"], "peft": {"method": "lora"}, "quantization": "none"}}
    assert (estimate({**lora, "software": {"bitsandbytes": "0.41.1"}}).per_gpu.peak_allocated_bytes
            == estimate(lora).per_gpu.peak_allocated_bytes)


def test_trace_agrees_with_old_bitsandbytes() -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as trace_estimate

    sc = {**TINY, "software": {"bitsandbytes": "0.41.1"}}
    t_old = trace_estimate(sc).per_gpu.peak_allocated_bytes
    t_new = trace_estimate(TINY).per_gpu.peak_allocated_bytes
    a_old = estimate(sc).per_gpu.peak_allocated_bytes
    assert t_old > t_new  # the traced MatMul4Bit keeps its input too
    assert abs(a_old - t_old) / t_old < 0.03


def test_bad_version_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("model: gpt2\nsoftware: {bitsandbytes: latest}\n")
    res = CliRunner().invoke(app, ["estimate", str(f)])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "software.bitsandbytes" in text and "not a version number" in text and "Traceback" not in text


def test_old_bitsandbytes_keeps_fp32_inputs_uncast_under_autocast() -> None:
    # hf-trainer QLoRA in fp16-mixed: prepare_model_for_kbit_training leaves fp32 hidden states, and
    # Linear4bit.set_compute_type makes fp32 the compute dtype, so MatMul4Bit (< 0.43.2) keeps the fp32
    # inputs themselves, shared by the linears that read them
    from dataclasses import replace

    from vramplan.analytic import activations as act
    from vramplan.catalog.resolve import resolve

    sc = {**TINY, "framework": "hf-trainer",
          "train": {**TINY["train"], "precision": "fp16-mixed", "peft": {"method": "qlora", "rank": 8,
                                                                        "target_modules": ["q_proj", "v_proj"]}}}
    m = resolve(sc).model
    ctx = act.ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                         gqa_repeat=False, seq_len=128, frozen_base=True, lora_targets=frozenset({"q_proj", "v_proj"}),
                         lora_rank=8, elementwise_bytes=4)
    new = act.layer_saved_per_token(m, m.layers[0], ctx)
    old = act.layer_saved_per_token(m, m.layers[0], replace(ctx, kbit_saves_input=True))
    # per token: q/k/v read the fp32 normed input (4 x 256 = 1,024 B, one tensor; the adapters keep their
    # fp16 autocast copies, not it), o_proj the attention output's contiguous copy (2 x 256 = 512 B), gate/up
    # the fp32 normed input (1,024 B), down_proj the fp32 product (4 x 688 = 2,752 B): 5,312 B
    assert old - new == 1_024 + 512 + 1_024 + 2_752


def test_old_bitsandbytes_inputs_are_not_released_during_the_layer_backward() -> None:
    # MatMul4Bit (< 0.43.2) keeps A in ctx.tensors, which the autograd engine does not release after the
    # node runs: the MLP's backward has not freed down_proj's input when its elementwise gradients peak
    from dataclasses import replace

    from vramplan.analytic import activations as act
    from vramplan.catalog.resolve import resolve

    m = resolve({**TINY, "framework": "hf-trainer"}).model
    ctx = act.ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                         gqa_repeat=False, seq_len=128, frozen_base=True, lora_targets=frozenset({"q_proj", "v_proj"}),
                         lora_rank=8, elementwise_bytes=4, kbit_saves_input=True)
    # down_proj carries no adapter: nothing of its input is released (2,752 B/token are kept)
    assert act.freed_before_mlp_backward_per_token(m, m.layers[0], ctx) == 0
    # by the attention's backward the MLP's saved tensors are released except the kept inputs of gate/up
    # (the fp32 normed input, 4 x 256 = 1,024 B) and down (4 x 688 = 2,752 B)
    newer = replace(ctx, kbit_saves_input=False)
    freed_old = act.freed_before_attention_backward_per_token(m, m.layers[0], ctx)
    freed_new = act.freed_before_attention_backward_per_token(m, m.layers[0], newer)
    assert freed_old == freed_new
    saved_old = act.mlp_saved(m, m.layers[0], ctx)
    saved_new = act.mlp_saved(m, m.layers[0], newer)
    assert saved_old - saved_new == 1_024 + 2_752
