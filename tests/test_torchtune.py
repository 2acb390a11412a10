"""torchtune's conventions (``framework: torchtune``): torchao NF4 weights and their dequantization, adapters in the
model's dtype, no peft preparation, the loss of each release, its load path and its refusals (facts/torchtune.py,
docs/conventions.md "torchtune").  ``litgpt`` is Lit-GPT's conventions, those ``lightning`` has always meant.

The tiny Llama: hidden 256, MLP 768, 2 layers, 4 heads of 64, 2 K/V heads, vocabulary 1000, untied head.  Every
linear is a multiple of 64 x 256 = 16,384 elements, as torchao's to_nf4 asserts: q/o 65,536, k/v 32,768,
gate/up/down 196,608; 786,432 per layer, 1,572,864 in 14 matrices.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.lifecycle.load import load_mode
from vramplan.analytic.logits import loss_bytes, torchtune_loss_release
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.resident import parameter_bytes
from vramplan.analytic.timeline import attention, mlp
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.torchtune import torchao_nf4_bytes, torchao_nf4_dequant_peak_bytes

TINY: dict[str, Any] = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
QLORA: dict[str, Any] = {"seq_len": 128, "micro_batch_size": 1, "precision": "bf16-true",
                         "peft": {"method": "qlora", "target_modules": ["q_proj", "v_proj"]}, "quantization": "nf4-dq"}


def _doc(framework: str, train: dict[str, Any] | None = None, software: dict[str, Any] | None = None,
         model: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"model": model or TINY, "hardware": {"gpu": "A100-80GB"}, "framework": framework,
            "train": {**QLORA, **(train or {})}, "software": software or {}}


def _step(framework: str, train: dict[str, Any] | None = None, software: dict[str, Any] | None = None) -> TrainResult:
    return train_step(resolve(_doc(framework, train, software)))


def _ctx(tr: TrainResult) -> StepContext:
    assert tr.context is not None
    return tr.context


def _term(tr: TrainResult, name: str) -> int:
    return sum(t.nbytes for t in tr.terms if t.name == name)


def test_torchao_nf4_bytes_match_the_cpu_measurement() -> None:
    # torchao 0.7.0 on CPU (benchmarks/torchtune_nf4_cpu_check.py): a 1,024 x 512 bf16 weight stores
    # quantized_data 262,144 (uint8, two codes a byte) + quantized_scalers 8,192 (int8, one per 64)
    # + quantization_factor 32 x 2 = 64 (bf16, one per 256 scalers) + scaler_mean 2 + nf4 table 16 x 2 = 32
    assert torchao_nf4_bytes(1024 * 512) == 262_144 + 8_192 + 64 + 2 + 32 == 270_434
    # get_original_weight's live bytes at its peak, measured through a TorchDispatchMode: 7,364,672 for 1,024 x 512
    # and 58,917,376 for 4,096 x 1,024 = 14 n + 3 n / 64 + n / 8,192
    assert torchao_nf4_dequant_peak_bytes(1024 * 512) == 14 * 524_288 + 3 * 8_192 + 64 == 7_364_672
    assert torchao_nf4_dequant_peak_bytes(4096 * 1024) == 58_917_376


def test_torchtune_weights_are_torchao_nf4_and_adapters_its_dtype() -> None:
    # NF4: 1,572,864 / 2 + 1,572,864 / 64 + 2 x 96 + 34 x 14 = 786,432 + 24,576 + 192 + 476 = 811,676;
    # the rest in bf16, no peft preparation: (embedding 256,000 + head 256,000 + 5 norms x 256) x 2 = 1,026,560
    # -> 1,838,236.  Adapters on q and v (r 8): 2 x (8 x 512 + 8 x 384) = 14,336 in bf16 = 28,672 B.
    base, adapters = parameter_bytes(_ctx(_step("torchtune")))
    assert (base, adapters) == (1_838_236, 28_672)
    # plain PyTorch with peft >= 0.12: fp32 adapters (57,344 B), and prepare_model_for_kbit_training's fp32 copies
    # of the 513,280 non-quantized weights: 2 B more each
    plain_base, plain_adapters = parameter_bytes(_ctx(_step("plain")))
    assert plain_adapters == 57_344
    assert plain_base - base > 513_280 * 2 - 1_000


def test_torchtune_dequantizes_each_layers_largest_weight_in_its_backward() -> None:
    # the MLP's 196,608 weights: 14 x 196,608 + 3 x 196,608 / 64 + 196,608 / 8,192 = 2,752,512 + 9,216 + 24
    tr = _step("torchtune")
    rows = [t for t in tr.terms if t.name == "transient.nf4_dequant"]
    assert {t.nbytes for t in rows} == {2_761_752}
    assert {(t.born, t.dies) for t in rows} == {(mlp(j), attention(j)) for j in (0, 1)}
    assert not [t for t in _step("plain").terms if t.name == "transient.nf4_dequant"]


def test_torchtune_loss_by_release() -> None:
    # 1 x 128 tokens, V 1000, bf16 logits: v = 128,000, v' = 127 x 1000 = 127,000 (the shifted copy)
    assert torchtune_loss_release((0, 2, 1)) == "torchtune_shifted"
    assert torchtune_loss_release((0, 3)) == torchtune_loss_release(None) == "padded"
    old = _step("torchtune", software={"torchtune": "0.2.1"})
    # v0.2: the fp32 output beside its shifted copy 4 x 128,000 + 4 x 127,000 = 1,020,000 (the forward's record);
    # the copy stays bound with the log-probs (8 x 127,000 = 1,016,000); at the loss's backward their two
    # gradients join: 16 x 127,000 = 2,032,000 (> 8 x 127,000 + 4 x 128,000 = 1,528,000 at slice_backward)
    assert _term(old, "logits.loss") == 1_020_000
    assert _term(old, "logits.loss_gradients") == 2_032_000
    lt = loss_bytes(128, 1000, 2, release="torchtune_shifted", shifted_tokens=127)
    assert lt.saved_after_forward == 1_016_000 and sum(lt.forward_tensors) == lt.forward_peak
    # v0.6.1 (the default): labels shifted, logits deleted before the backward: (2 + 4 + 4) v and 12 v
    new = _step("torchtune")
    assert (_term(new, "logits.loss"), _term(new, "logits.loss_gradients")) == (1_280_000, 1_536_000)
    assert any("torchtune 0.2.1" in a for a in old.assumptions)


def test_torchtune_loads_as_built_and_reads_its_checkpoint_on_the_host() -> None:
    c = _ctx(_step("torchtune"))
    assert load_mode(c) == "torchtune"
    assert load_mode(_ctx(_step("plain"))) == "quantize"


@pytest.mark.parametrize(("train", "key"), [
    ({"precision": "fp16-true"}, "train.precision"),
    ({"precision": "bf16-mixed"}, "train.precision"),
    ({"quantization": "nf4"}, "train.quantization"),
    ({"gradient_checkpointing": "selective"}, "train.gradient_checkpointing"),
])
def test_torchtune_refuses_what_its_recipes_cannot_run(train: dict[str, Any], key: str) -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(_doc("torchtune", train))
    assert key in str(e.value)


def test_torchtune_refuses_weights_to_nf4_cannot_block() -> None:
    # intermediate 688: 256 x 688 = 176,128 elements, not a multiple of 16,384 (to_nf4 asserts it)
    with pytest.raises(ScenarioError) as e:
        resolve(_doc("torchtune", model={**TINY, "intermediate_size": 688}))
    assert "16,384" in str(e.value)


def test_software_torchtune_elsewhere_is_named_unused() -> None:
    plain = estimate(resolve(_doc("plain", software={"torchtune": "0.2.1"})))
    assert any(a.startswith("software.torchtune set but not used") for a in plain.assumptions)
    report = estimate(resolve(_doc("torchtune", software={"bitsandbytes": "0.41.1"})))
    assert any(a.startswith("software.bitsandbytes set but not used") for a in report.assumptions)
    tune = _step("torchtune", software={"bitsandbytes": "0.41.1"})
    # torchao's LinearNF4 keeps no input, whatever bitsandbytes release is named (bitsandbytes 0.41.1's MatMul4Bit did)
    assert not _ctx(tune).act.kbit_saves_input
    assert _ctx(_step("plain", software={"bitsandbytes": "0.41.1"})).act.kbit_saves_input


def test_litgpt_is_lightnings_conventions() -> None:
    lit, lightning = _step("litgpt", {"quantization": "nf4"}), _step("lightning", {"quantization": "nf4"})
    assert [(t.name, t.nbytes) for t in lit.terms] == [(t.name, t.nbytes) for t in lightning.terms]
    assert _ctx(lit).litgpt_head == 256_000


def test_litgpt_reports_as_lightning() -> None:
    # the whole report, bar the scenario's own framework field, is lightning's
    lit = estimate(resolve(_doc("litgpt", {"quantization": "nf4"}))).model_dump(mode="json")
    lightning = estimate(resolve(_doc("lightning", {"quantization": "nf4"}))).model_dump(mode="json")
    assert lit["scenario"].pop("framework") == "litgpt"
    lightning["scenario"].pop("framework")
    assert lit == lightning


def test_torchtune_host_holds_the_whole_checkpoint() -> None:
    # every bf16 base weight: (1,572,864 linears + 513,280 others) x 2 = 4,172,288 B
    from vramplan.analytic.lifecycle.load import host_load_bytes

    assert host_load_bytes(_ctx(_step("torchtune"))) == (1_572_864 + 513_280) * 2 == 4_172_288


def test_trace_refuses_torchtune() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.build import trace_policy

    with pytest.raises(ScenarioError) as e:
        trace_policy(resolve(_doc("torchtune")))
    assert "framework" in str(e.value)


def test_torchtune_save_dequantizes_one_weight_at_a_time() -> None:
    # reparametrize_as_dtype_state_dict_post_hook: each NF4 weight dequantized on the GPU, then moved to the CPU;
    # the save adds the largest one's get_original_weight peak (2,761,752 B) to what stays resident between steps
    from vramplan.analytic.lifecycle import job_lifecycle

    tr = _step("torchtune")
    assert tr.context is not None and tr.layout is not None
    job = job_lifecycle(tr.context, tr.layout, tr.terms, tr.moments)
    save = next(p.moment for p in job.phases if p.name == "checkpoint save")
    assert save.parts["weights"]["gathered for checkpoint save"] == 2_761_752
