"""peft's LoRA with full checkpointing: the recomputed layer's forward holds more than its saved tensors, at its down
projection (analytic/activations.py ``recompute_forward_bytes``), and with a fused or chunked loss that moment is the
step's peak; where it is not derived the report says so and the band is widened (analytic/train.py
``RECOMPUTE_MOMENT_NOTE``).  Checked by hand and against the traced engine, which runs peft's and transformers' own
modules on the meta device (benchmarks/recompute_moment.py: Llama-2-7B's layers, 1.0016 LoRA and 1.0014 QLoRA of the
traced peak, were 0.929 and 0.888; QLoRA on q_proj and v_proj 0.9995, was 0.946)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic import activations as act
from vramplan.analytic.terms import StepContext
from vramplan.analytic.train import RECOMPUTE_MOMENT_NOTE
from vramplan.catalog.resolve import resolve

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _llama(h: int = 4096, inter: int = 11008, heads: int = 32, kv: int = 32, vocab: int = 1024) -> dict[str, Any]:
    return {"model_type": "llama", "vocab_size": vocab, "hidden_size": h, "intermediate_size": inter,
            "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 2,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def _doc(model: Any = "meta-llama/Llama-3.1-8B", method: str = "lora", targets: Any = "all-linear",
         loss: str = "liger-fused-linear-ce", ckpt: str = "full", framework: str = "hf-trainer",
         precision: str = "bf16-mixed", dropout: float = 0.0, batch: int = 1, seq: int = 4096) -> dict[str, Any]:
    train: dict[str, Any] = {"micro_batch_size": batch, "seq_len": seq, "precision": precision, "loss": loss,
                             "gradient_checkpointing": ckpt,
                             "peft": {"method": method, "rank": 16, "target_modules": targets, "dropout": dropout}}
    if method == "qlora":
        train["quantization"] = "nf4"
    return {"model": model, "task": "train", "framework": framework, "hardware": {"gpu": "A100-80GB"}, "train": train}


def _moment(doc: dict[str, Any]) -> tuple[int, int] | None:
    r = resolve(doc)
    c = StepContext(r, 0, "flash", False)
    return act.recompute_forward_bytes(r.model, r.model.layers[1], c.act, c.tokens)


def test_lora_moment_by_hand() -> None:
    # Llama-2-7B's layer, bf16 under autocast, fp32 adapters: the layer's gradient and lora_B's scaled one
    # (2 + 2) x 4,096; the layer input and the residual, copied by the norms, 2 x 2 x 4,096; the norm's output
    # 2 x 4,096; the product 2 x 11,008; down's base output 2 x 4,096; peft's fp32 copy of the product 4 x 11,008:
    # 16,384 + 16,384 + 8,192 + 22,016 + 8,192 + 44,032 = 115,200 B a token, nothing per layer
    assert _moment(_doc(_llama(), loss="standard", seq=2048)) == (115_200, 0)
    # with LoRA dropout, dropout's fp32 output beside the copy while lora_A runs: + 44,032
    assert _moment(_doc(_llama(), loss="standard", seq=2048, dropout=0.05)) == (159_232, 0)


def test_qlora_moment_by_hand() -> None:
    # fp32 hidden states (prepare_model_for_kbit_training), bf16 weights, inside down's MatMul4Bit: the gradients
    # 4 x 4,096 + 2 x 4,096, no norm copies, the norm's fp32 output 4 x 4,096, the fp32 product 4 x 11,008, autocast's
    # input cast 2 x 11,008 and the output 2 x 4,096, less the adapter's records not made yet (2 x 11,008 + 2 x 16):
    # 24,576 + 16,384 + 44,032 + 22,016 + 8,192 - 22,048 = 93,152 B a token; the weight dequantized to bf16, copied
    # to fp32 and cast back by autocast: (4 + 2) x 4,096 x 11,008 = 270,532,608 B
    assert _moment(_doc(_llama(), method="qlora", loss="standard", seq=2048)) == (93_152, 270_532_608)
    # at 65,536 tokens the adapter's moment is larger: 24,576 + 16,384 + 44,032 + the base output in fp32 and its
    # clone 2 x 4 x 4,096 = 117,760 B a token (x 65,536 = 7.72 GB against 93,152 x 65,536 + 270,532,608 = 6.38 GB)
    assert _moment(_doc(_llama(), method="qlora", loss="standard", seq=65536)) == (117_760, 0)


def test_qlora_outside_the_mlp_by_hand() -> None:
    # QLoRA on q_proj and v_proj (peft's default targets for Llama): down's MatMul4Bit backward needs no saved tensor,
    # the product's backward recomputes the layer and torch's early stop ends it at the product, so the peak is up's
    # matmul: the layer's gradient 4 x 4,096, the norm's fp32 output 4 x 4,096, the input cast 2 x 4,096 and the
    # output 2 x 11,008 = 62,976 B a token, and the same 270,532,608 B of weight (traced engine: 0.946 -> 0.9995)
    assert _moment(_doc(_llama(), method="qlora", targets=["q_proj", "v_proj"], loss="standard",
                        seq=2048)) == (62_976, 270_532_608)
    # plain LoRA outside the MLP holds no more than the MLP's backward (traced engine 1.0004): nothing added
    assert _moment(_doc(_llama(), targets=["q_proj", "v_proj"], loss="standard", seq=2048)) == (0, 0)


@pytest.mark.parametrize("doc", [
    _doc(_llama(), targets=["q_proj", "v_proj", "up_proj"]),    # an MLP adapter but none on down_proj
    _doc(_llama(), framework="torchtune", loss="chunked", precision="bf16-true"),  # torchtune's own LoRA layers
    _doc(_llama(), precision="bf16-true"),                      # no autocast: other casts
])
def test_not_derived_elsewhere(doc: dict[str, Any]) -> None:
    assert _moment(doc) is None


def test_the_moment_sets_the_checkpointed_mlp_point() -> None:
    # with the 1,024-token vocabulary the layer's moment is the peak: the step's peak grows by the moment's excess over
    # the MLP backward's own (115,200 - (82,432 - 22,048)) x 2,048 = 112,263,168 B with the down adapter
    # (1,435,803,648 -> 1,548,066,816)
    with_down = estimate(_doc(_llama(), loss="standard", seq=2048)).per_gpu.peak_allocated_bytes
    from vramplan.analytic.terms import layers

    r = resolve(_doc(_llama(), loss="standard", seq=2048))
    c = StepContext(r, 0, "flash", False)
    la = layers.layer_activations(c)
    assert la.mlp_transient[1] == (115_200 + 22_048) * 2048
    assert with_down == 1_548_066_816  # benchmarks/recompute_moment.py: the traced engine's 1,545,619,456 (1.0016)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_fused_loss_note_where_the_moment_is_not_derived(method: str) -> None:
    qv = estimate(_doc(method=method, targets=["q_proj", "v_proj", "up_proj"]))
    assert RECOMPUTE_MOMENT_NOTE in qv.assumptions
    # the note is a "not modelled" input: the band takes the calibration's widest class
    derived = estimate(_doc(method=method))
    assert RECOMPUTE_MOMENT_NOTE not in derived.assumptions
    widened = qv.per_gpu.peak_allocated_bytes_high / qv.per_gpu.peak_allocated_bytes
    usual = derived.per_gpu.peak_allocated_bytes_high / derived.per_gpu.peak_allocated_bytes
    assert widened > usual


@pytest.mark.parametrize("doc", [
    _doc(targets=["q_proj", "v_proj", "up_proj"], ckpt="none"),      # no recompute
    _doc(targets=["q_proj", "v_proj", "up_proj"], loss="standard"),  # the logits' moment dominates (the 32k rows)
    _doc(targets=["q_proj", "v_proj"]),                              # derived: within the MLP backward's moment
    _doc(loss="chunked", framework="torchtune", precision="bf16-true"),  # torchtune's LoRA, not peft's
])
def test_no_note_elsewhere(doc: dict[str, Any]) -> None:
    assert RECOMPUTE_MOMENT_NOTE not in estimate(doc).assumptions


def test_qlora_o_proj_adapter_saves_the_kernels_output() -> None:
    # peft's bitsandbytes LoRA does not cast its input under autocast, and o_proj's input is the flash kernel's saved
    # output: its adapter adds lora_A's output only (rank 16 x 2 B = 32 B a token), where plain LoRA's fp32 copy is
    # cast back to bf16 and saved (4,096 x 2 B = 8,192 B more)
    def o_proj(method: str, attention: str) -> dict[str, int]:
        r = resolve(_doc(_llama(), method=method, loss="standard", seq=2048))
        c = StepContext(r, 0, attention, False)
        return {t.name: t.nbytes for t in act.attention_tensors(r.model, r.model.layers[1], c.act)
                if t.name.startswith("attention.o_proj")}

    assert o_proj("qlora", "flash") == {"attention.o_proj.lora_a_output": 32}
    assert o_proj("lora", "flash") == {"attention.o_proj.lora_input": 8192, "attention.o_proj.lora_a_output": 32}
