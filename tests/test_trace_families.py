"""One traced training step per supported family (shrunken catalog configs), plus inference.

Each trace must build the model from its config on the meta device, run forward, backward and
the optimizer step, and hold exactly the parameters the model spec counts (tied weights once):
weights = parameters x 4 bytes (fp32 parameters under bf16-mixed), optimizer states = 2 x that.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vramplan.catalog.resolve import resolve
from vramplan.trace.engine import estimate, trace
from vramplan.trace.shrink import catalog_config, shrink

FAMILIES = {
    "llama": "meta-llama/Llama-3.1-8B", "mistral": "mistralai/Mistral-7B-v0.1", "qwen2": "Qwen/Qwen2.5-7B",
    "qwen3": "Qwen/Qwen3-8B", "qwen3_moe": "Qwen/Qwen3-30B-A3B", "mixtral": "mistralai/Mixtral-8x7B-v0.1",
    "gemma2": "google/gemma-2-2b", "gemma3": "google/gemma-3-1b-pt", "phi3": "microsoft/Phi-3-mini-4k-instruct",
    "gpt2": "openai-community/gpt2", "gpt_neox": "EleutherAI/pythia-1b", "falcon": "tiiuae/falcon-7b",
    "opt": "facebook/opt-125m", "deepseek_v3": "deepseek-ai/DeepSeek-V3", "phi": "microsoft/phi-2",
    "starcoder2": "bigcode/starcoder2-7b", "stablelm": "stabilityai/stablelm-2-zephyr-1_6b",
    "cohere": "CohereForAI/aya-23-8B", "olmo": "allenai/OLMo-1B-hf", "gpt_oss": "openai/gpt-oss-20b",
    "olmoe": "allenai/OLMoE-1B-7B-0924", "granitemoe": "ibm-granite/granite-3.1-3b-a800m-instruct",
    "phimoe": "microsoft/Phi-3.5-MoE-instruct", "glm4_moe": "zai-org/GLM-4.5-Air",
    "smollm3": "HuggingFaceTB/SmolLM3-3B-Base", "cohere2": "CohereForAI/c4ai-command-r7b-12-2024",
    "exaone4": "LGAI-EXAONE/EXAONE-4.0-32B", "seed_oss": "ByteDance-Seed/Seed-OSS-36B-Instruct",
    "ernie4_5_moe": "baidu/ERNIE-4.5-21B-A3B-PT",
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_traces_a_training_step(family: str) -> None:
    cfg = shrink(catalog_config(FAMILIES[family]), hidden=128, vocab=512)
    attention = "eager" if family == "gemma2" else "sdpa"
    doc = {"model": cfg, "hardware": {"gpu": "h100"},
           "train": {"micro_batch_size": 1, "seq_len": 64, "attention": attention}}
    r, st = trace(resolve(doc))
    params = r.model.num_parameters
    weights = sum(e.nbytes for e in st.events if e.nbytes > 0 and e.category == "weights")
    # DeepSeek's and GLM's router correction bias is a checkpoint tensor but a buffer in transformers (fp32);
    # ERNIE's is a parameter without grad (Ernie4_5_MoeStatics), already among the weights
    weights += sum(e.nbytes for e in st.events if e.nbytes > 0 and e.op.endswith("e_score_correction_bias")
                   and e.category != "weights")
    assert weights == 4 * params  # every parameter once, fp32, tied weights re-tied
    trainable = weights // 4 - sum(e.nbytes for e in st.events if e.nbytes > 0 and e.op.endswith(
        "e_score_correction_bias")) // 4
    states = sum(e.nbytes for e in st.events if e.nbytes > 0 and e.category == "optimizer_states")
    assert states == 8 * trainable  # AdamW: exp_avg + exp_avg_sq, fp32
    grads = sum(e.nbytes for e in st.events if e.nbytes > 0 and e.category == "gradients")
    assert grads == 4 * trainable
    assert [ph for _, ph in st.marks] == ["forward", "backward", "optimizer", "end"]
    if family == "gpt_oss":
        # no SDPA path (attention sinks): transformers' default falls back to eager, as the trace does
        assert st.sdpa == [] and any("falls back to eager" in n for n in st.notes)
    elif attention == "sdpa" and family != "falcon":
        # full-length causal training with half inputs: flash on an H100 (head dim 64); MLA's query/key
        # head (nope + rope = 96) differs from its value head (64), which flash refuses
        expected = "efficient" if family == "deepseek_v3" else "flash"
        assert {c.backend for c in st.sdpa} == {expected}


def test_falcon_mqa_falls_back_to_the_math_kernel() -> None:
    # FalconAttention hands SDPA one K/V head without enable_gqa: no fused kernel accepts that
    cfg = shrink(catalog_config(FAMILIES["falcon"]), hidden=128, vocab=512)
    _, st = trace(resolve({"model": cfg, "hardware": {"gpu": "h100"}, "train": {"seq_len": 64}}))
    assert {c.backend for c in st.sdpa} == {"math"}


@pytest.mark.parametrize("family", ["llama", "mixtral", "gpt2"])
def test_family_inference(family: str) -> None:
    cfg = shrink(catalog_config(FAMILIES[family]), hidden=128, vocab=512)
    doc = {"model": cfg, "task": "inference", "hardware": {"gpu": "a100"},
           "inference": {"batch_size": 2, "prompt_len": 64, "new_tokens": 16}}
    rep = estimate(doc)
    pg = rep.per_gpu
    assert rep.engine == "trace"
    assert pg.breakdown["kv_cache"] > 0
    assert set(pg.phases) == {"prefill", "decode"}
    # weights in bf16, counted once
    assert pg.breakdown["weights"] >= 2 * rep.model["parameters"]


@pytest.mark.parametrize("checkpointing", ["none", "full", "selective"])
def test_nothing_saved_for_backward_survives_into_the_optimizer_step(checkpointing: str) -> None:
    # a recomputed layer's autocast casts, attribution bookkeeping or early-stopped recomputations
    # must not keep activations alive once the backward is over
    cfg = shrink(catalog_config(FAMILIES["llama"]), hidden=128, vocab=512)
    doc = {"model": cfg, "hardware": {"gpu": "a100"},
           "train": {"micro_batch_size": 2, "seq_len": 64, "gradient_checkpointing": checkpointing,
                     "attention": "eager"}}
    _, st = trace(resolve(doc))
    opt = {ph: seq for seq, ph in st.marks}["optimizer"]
    live: dict[int, str] = {}
    for ev in st.events[:opt]:
        if ev.nbytes > 0:
            live[ev.storage_id] = ev.category
        else:
            live.pop(ev.storage_id, None)
    assert "activations" not in live.values()


def test_inference_names_the_release_it_traced() -> None:
    # the scenario names transformers 4.32, whose generate kept two caches; the trace runs the installed
    # release and says so (the analytic engine models 4.32)
    cfg = shrink(catalog_config(FAMILIES["llama"]), hidden=128, vocab=512)
    doc = {"model": cfg, "task": "inference", "hardware": {"gpu": "a100"},
           "inference": {"batch_size": 1, "prompt_len": 16, "new_tokens": 4}, "software": {"transformers": "4.32"}}
    rep = estimate(doc)
    assert any("not the 4.32 the scenario names" in a for a in rep.assumptions)
