"""axolotl and LLaMA-Factory: the HF Trainer with their own handling of a k-bit base (facts/trainer_frameworks.py).

Llama-3-8B: hidden 4,096, vocabulary 128,256 (untied head), 32 layers, 65 RMSNorm weights of 4,096; a QLoRA
micro-batch of 2 x 2,048 tokens in bf16 on an A100."""

from __future__ import annotations

import copy
from typing import Any, get_args

import pytest

from vramplan import estimate
from vramplan.analytic.lifecycle import job_lifecycle
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.trainer_frameworks import TRAINER_FRAMEWORKS, trainer_framework
from vramplan.spec.scenario import Framework, Scenario

BASE: dict[str, Any] = {
    "model": "meta-llama/Meta-Llama-3-8B", "hardware": {"gpu": "A100-80GB"}, "framework": "hf-trainer",
    "train": {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16-mixed", "gradient_checkpointing": "full",
              "attention": "flash", "peft": {"method": "qlora", "rank": 16}, "quantization": "nf4-dq",
              "optimizer": "adamw-8bit"}}

# embedding and head 2 x 128,256 x 4,096 = 1,050,673,152 elements and 65 norms x 4,096 = 266,240:
# 1,050,939,392 elements that peft's k-bit preparation holds in fp32 (4 B) instead of bf16 (2 B)
NON_QUANTIZED = 1_050_939_392


def _doc(framework: str, **train: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["framework"] = framework
    doc["train"].update(train)
    return doc


def _terms(doc: dict[str, Any]) -> dict[str, int]:
    return {t.name: t.nbytes for t in train_step(resolve(doc)).terms}


def _phases(doc: dict[str, Any]) -> dict[str, int]:
    tr = train_step(resolve(doc))
    assert tr.context is not None and tr.layout is not None
    job = job_lifecycle(tr.context, tr.layout, tr.terms, tr.moments)
    return {p.name: p.moment.total for p in job.phases}


@pytest.mark.parametrize("row", TRAINER_FRAMEWORKS, ids=lambda r: r.name)
def test_each_row_is_a_framework_that_runs_as_another(row: Any) -> None:
    assert row.name in get_args(Framework)
    assert row.runs_as in get_args(Framework) and trainer_framework(row.runs_as) is None
    assert Scenario(model="gpt2", framework=row.name).effective_framework == row.runs_as
    assert row.source and row.since.count(".") == 2
    # casting back needs a preparation to undo
    assert row.kbit_prepares or not row.casts_back


def test_the_step_holds_the_non_quantized_parameters_in_bf16() -> None:
    hf = _terms(_doc("hf-trainer"))
    for fw in ("axolotl", "llamafactory"):
        got = _terms(_doc(fw))
        # 1,050,939,392 elements x (4 - 2) B fewer
        assert hf["parameters"] - got["parameters"] == NON_QUANTIZED * 2, fw


def test_no_autocast_copy_of_a_half_head() -> None:
    # the HF Trainer's fp32 head (after the preparation) gets a bf16 autocast copy, 128,256 x 4,096 x 2 B
    # = 1,050,673,152 B; axolotl's and LLaMA-Factory's head is bf16 already: no such record
    assert _terms(_doc("hf-trainer"))["casts.head_kbit"] == 1_050_673_152
    for fw in ("axolotl", "llamafactory"):
        assert "casts.head_kbit" not in _terms(_doc(fw)), fw


def test_preparation_phase_by_framework() -> None:
    hf, ax, lf = (_phases(_doc(fw)) for fw in ("hf-trainer", "axolotl", "llamafactory"))
    # LLaMA-Factory runs no k-bit preparation
    assert "peft preparation" in hf and "peft preparation" not in lf
    # peft's casts peak at the largest (state so far + the next fp32 copy): with E non-quantized elements and the
    # embedding e0 first, the head eh last, at the head, 4E + 2 eh (the embedding's own cast gives 2E + 4 e0, less);
    # axolotl's casts back start from 4E and peak at the first, 4E + 2 e0.  The embedding and the untied head are
    # equal here (128,256 x 4,096), so the two phases peak at the same bytes
    assert ax["peft preparation"] == hf["peft preparation"]
    # the load itself is the same everywhere
    assert hf["load"] == ax["load"] == lf["load"]


def test_axolotls_cast_back_peaks_at_the_first_tensor() -> None:
    # Llama-3.2-1B ties its head to the embedding: e = 128,256 x 2,048 = 262,668,288 elements, and 16 x 2 + 1 norms
    # of 2,048, n = 67,584; E = e + n non-quantized elements, held bf16 (2 B) after the load.  peft's casts, in module
    # order, peak where the state so far plus the next fp32 copy is largest: at the embedding, 2E + 4e (bf16 state
    # plus its fp32 copy).  axolotl's casts back start from 4E (all fp32) and peak at the first, the embedding's half
    # copy: 4E + 2e.  The difference is 2E - 2e = 2n = 135,168 B (without the cast back, 0: the preparation's peak)
    doc = {**_doc("hf-trainer"), "model": "meta-llama/Llama-3.2-1B"}
    hf = _phases(doc)["peft preparation"]
    ax = _phases({**doc, "framework": "axolotl"})["peft preparation"]
    assert ax - hf == 2 * 67_584


def test_axolotl_upcasts_a_half_base_for_lora() -> None:
    # LoRA on a bf16 base: axolotl upcasts the embedding, head and 65 norms (1,050,939,392 elements) to fp32 after
    # loading, then casts them back; the cast back peaks at the first tensor, every one fp32 beside the embedding's
    # half copy: 2 B x 1,050,939,392 + 2 B x 525,336,576 = 3,152,551,936 B above the loaded model
    lora = {"peft": {"method": "lora", "rank": 16}, "quantization": "none"}
    ax = _phases(_doc("axolotl", **lora))
    assert ax["peft preparation"] - ax["load"] == NON_QUANTIZED * 2 + 525_336_576 * 2
    assert "peft preparation" not in _phases(_doc("hf-trainer", **lora))
    said = estimate(_doc("axolotl", **lora)).assumptions
    assert any(a.startswith("lifecycle, peft preparation: axolotl upcasts") for a in said)


def test_the_assumptions_name_the_framework() -> None:
    ax = estimate(_doc("axolotl"))
    assert any(a.startswith("axolotl: prepare_model_for_kbit_training") for a in ax.assumptions)
    lf = estimate(_doc("llamafactory"))
    assert any(a.startswith("llamafactory runs no prepare_model_for_kbit_training") for a in lf.assumptions)


def test_lora_on_a_half_base_steps_as_the_hf_trainers() -> None:
    # no k-bit base: the frameworks' steps are the HF Trainer's (axolotl's load-time upcast is a phase of its own)
    doc = {"peft": {"method": "lora", "rank": 16}, "quantization": "none"}
    hf = estimate(_doc("hf-trainer", **doc)).per_gpu.lifecycle["training step"]
    assert estimate(_doc("axolotl", **doc)).per_gpu.lifecycle["training step"] == hf
    assert estimate(_doc("llamafactory", **doc)).per_gpu.lifecycle["training step"] == hf


def test_axolotl_evaluates_at_its_micro_batch() -> None:
    # axolotl sets eval_batch_size to micro_batch_size when unset; the HF Trainer (and LLaMA-Factory) evaluate 8
    from vramplan.analytic.lifecycle.evaluation import eval_batch_size

    def batch(fw: str) -> int:
        tr = train_step(resolve(_doc(fw)))
        assert tr.context is not None
        return eval_batch_size(tr.context)
    assert (batch("axolotl"), batch("llamafactory"), batch("hf-trainer")) == (2, 8, 8)


def test_axolotl_on_a_model_its_names_do_not_cover_keeps_the_fp32_casts() -> None:
    # GPT-J's embedding is wte and its norms ln_1 / ln_f: axolotl's cast back (names holding "norm", embed_tokens,
    # lm_head) leaves them fp32, so the step is counted as peft leaves it, and said so
    doc = {**_doc("hf-trainer"), "model": "EleutherAI/gpt-j-6b"}
    doc["train"] = {**doc["train"], "peft": {"method": "qlora", "rank": 16, "target_modules": ["q_proj", "v_proj"]}}
    hf, ax = _terms(doc), _terms({**doc, "framework": "axolotl"})
    assert ax["parameters"] == hf["parameters"]
    said = estimate({**doc, "framework": "axolotl"}).assumptions
    assert any("do not cover every non-quantized parameter of" in a for a in said)


def _named_rows() -> list[Any]:
    """The first catalog row of each model type whose adapter sets Traits.norm_embed_names."""
    from vramplan.catalog.models import list_models
    from vramplan.spec.hf_config import model_from_config

    seen: dict[str, Any] = {}
    for r in list_models():
        if "vision_config" in r.config or r.config.get("model_type") in seen:
            continue
        if model_from_config(r.config, name=r.id).traits.norm_embed_names:
            seen[r.config["model_type"]] = r
    return list(seen.values())


NAMED = _named_rows()


def test_the_named_families_are_the_dense_llama_style_ones() -> None:
    assert sorted(r.config["model_type"] for r in NAMED) == ["gemma", "gemma2", "granite", "llama", "mistral", "olmo2",
                                                              "phi3", "qwen2", "qwen3", "smollm3"]


@pytest.mark.parametrize("row", NAMED, ids=lambda r: r.config["model_type"])
def test_axolotls_names_cover_every_non_quantized_parameter(row: Any) -> None:
    # transformers' own module on the meta device: every parameter bitsandbytes leaves unquantized (all but the
    # weights of the decoder layers' nn.Linear modules; the head is skipped) is in a module whose name holds "norm",
    # embed_tokens or lm_head (axolotl's get_linear_embedding_layers default), or is a linear's bias (cast by
    # Linear4bit.forward to its input's dtype)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vramplan.spec.families import typed_for_transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.for_model(**typed_for_transformers(row.config))
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(cfg)
    linears = {name for name, mod in module.named_modules() if isinstance(mod, torch.nn.Linear) and ".layers." in name}
    left = []
    for name, _ in module.named_parameters():
        owner = name.rpartition(".")[0]
        if owner in linears:
            continue  # a quantized linear's weight, or its bias
        if "norm" in owner or any(e in owner for e in ("embed_tokens", "lm_head")):
            continue
        left.append(name)
    assert not left, f"{row.id}: {left[:5]}"


def test_axolotl_full_fine_tuning_is_refused() -> None:
    with pytest.raises(ScenarioError, match="axolotl with full fine-tuning"):
        estimate(_doc("axolotl", peft=None, quantization="none"))
    # LLaMA-Factory's full fine-tuning is the HF Trainer's
    lf = estimate(_doc("llamafactory", peft=None, quantization="none", optimizer="adamw"))
    hf = estimate(_doc("hf-trainer", peft=None, quantization="none", optimizer="adamw"))
    assert lf.per_gpu.peak_allocated_bytes == hf.per_gpu.peak_allocated_bytes


TINY: dict[str, Any] = {
    "model": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
              "max_position_embeddings": 512},
    "hardware": {"gpu": "A100-80GB"},
    "train": {"micro_batch_size": 2, "seq_len": 128, "precision": "bf16-mixed", "optimizer": "adamw",
              "attention": "sdpa", "peft": {"method": "qlora", "rank": 8, "target_modules": ["q_proj", "v_proj"]},
              "quantization": "nf4"},
}


@pytest.mark.parametrize("framework", ["axolotl", "llamafactory"])
def test_trace_agrees(framework: str) -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as trace_estimate

    doc = {**TINY, "framework": framework}
    hf = {**TINY, "framework": "hf-trainer"}
    traced, traced_hf = trace_estimate(doc).per_gpu, trace_estimate(hf).per_gpu
    analytic, analytic_hf = estimate(doc).per_gpu, estimate(hf).per_gpu
    # the traced model holds the embedding, head and 5 norms in bf16: (2 x 1,000 x 256 + 5 x 256) x 2 B fewer
    assert traced_hf.breakdown["weights"] - traced.breakdown["weights"] == (2 * 1000 * 256 + 5 * 256) * 2
    # and the analytic engine by the same bytes (both engines' weights differ by the 4-bit linears' quantization
    # state alone, as under the HF Trainer)
    assert (analytic.breakdown["weights"] - traced.breakdown["weights"]
            == analytic_hf.breakdown["weights"] - traced_hf.breakdown["weights"])
    # the step's peak: 26,790,912 analytic vs 26,797,568 traced on this shape
    assert abs(analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1) < 0.001


def test_deepspeeds_half_module_undoes_the_fp32_casts() -> None:
    # under a ZeRO stage the HF Trainer hands the prepared model to DeepSpeed's engine, which casts every floating
    # parameter to bf16 (DeepSpeedEngine._configure_distributed_model): the step holds the non-quantized parameters
    # as LLaMA-Factory's does, 1,050,939,392 x 2 B fewer than without the engine's cast
    def zero(fw: str) -> dict[str, Any]:
        doc = _doc(fw)
        doc["hardware"]["num_gpus"] = 2
        doc["parallel"] = {"zero_stage": 2}
        return doc
    hf, lf = _terms(zero("hf-trainer")), _terms(zero("llamafactory"))
    assert hf["parameters"] == lf["parameters"]
    ddp = _doc("hf-trainer")
    ddp["hardware"]["num_gpus"] = 2
    # and the adapters: fp32 without the engine (peft >= 0.12), bf16 under it. peft's default targets for Llama,
    # q_proj and v_proj at rank 16: (16 x 4,096 + 4,096 x 16) + (16 x 4,096 + 1,024 x 16) = 212,992 per layer,
    # x 32 = 6,815,744 parameters x (4 - 2) B = 13,631,488 B
    assert _terms(ddp)["parameters"] - hf["parameters"] == NON_QUANTIZED * 2 + 13_631_488
    said = estimate(zero("hf-trainer")).assumptions
    assert any("DeepSpeed's engine casts every floating parameter" in a for a in said)


def test_trace_agrees_under_deepspeed() -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as trace_estimate

    doc = {**TINY, "framework": "hf-trainer", "hardware": {"gpu": "A100-80GB", "num_gpus": 2},
           "parallel": {"zero_stage": 2}}
    lf = {**doc, "framework": "llamafactory"}
    # the traced engine casts as DeepSpeed's engine does: the weights LLaMA-Factory's step holds
    assert trace_estimate(doc).per_gpu.breakdown["weights"] == trace_estimate(lf).per_gpu.breakdown["weights"]
    # and the analytic engine within 0.6% of its peak (26,856,448 vs 26,711,552 B on this shape)
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, trace_estimate(doc).per_gpu.peak_allocated_bytes
    assert abs(a / t - 1) < 0.006
