"""vLLM's Model Runner V2 by release (facts/vllm_releases.py ``MODEL_RUNNER_RULES``, serve/vllm.py ``model_runner``).

Sources: each release's wheel, vllm/config/vllm.py ``VllmConfig.use_v2_model_runner``,
``_is_default_v2_model_runner_model``, ``_get_v2_model_runner_unsupported_features`` and
``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``; vllm/envs.py ``VLLM_USE_V2_MODEL_RUNNER`` (False to 0.21.0, None from
0.22.0); vllm/v1/worker/gpu/model_runner.py ``_dummy_sampler_run`` and sample/sampler.py, sample/gumbel.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.facts.vllm_releases import (
    MODEL_RUNNER_RULES,
    MODEL_RUNNER_V2_FIRST,
    NEWEST,
    model_runner_rule,
)
from vramplan.serve.vllm import (
    decide,
    model_runner,
    sampler_peak_bytes,
    v2_input_buffer_bytes,
    v2_sampler_peak_bytes,
)

LLAMA = "meta-llama/Llama-3.1-8B"  # LlamaForCausalLM, dense
QWEN3 = "Qwen/Qwen3-8B"  # Qwen3ForCausalLM, dense
QWEN3_MOE = "Qwen/Qwen3-30B-A3B"  # Qwen3MoeForCausalLM, MoE, not in any DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES


def _doc(version: str, model: str = LLAMA, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": "H100-80GB"},
            "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "max_num_seqs": 1024,
                      "max_num_batched_tokens": 2048, "vllm_version": version, **serve}}


def _runner(version: str, model: str = LLAMA, **serve: Any) -> str:
    rule, why = model_runner(resolve(_doc(version, model, **serve)), version)
    assert (rule is None) == (not why.startswith("model runner: V2")), why
    return "V2" if rule is not None else ("V1" if why else "")


def test_rows_are_ordered_read_and_sourced() -> None:
    firsts = [r.first for r in MODEL_RUNNER_RULES]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)
    assert firsts[0] == MODEL_RUNNER_V2_FIRST == (0, 22, 0)
    assert MODEL_RUNNER_RULES[-1].first <= NEWEST
    for row in MODEL_RUNNER_RULES:
        assert row.first in row.read_at and row.sources, row.first
        # a listed-architecture rule names its architectures; "all" needs none
        assert bool(row.architectures) == (row.models != "all"), row.first


@pytest.mark.parametrize(("version", "models", "sampler"), [
    ("0.22.0", "listed-dense", "fp32-copy"), ("0.23.0", "listed-dense", "fp32-copy"), ("0.24.0", "listed", "fp32-copy"),
    ("0.25.0", "dense-or-listed", "fp32-copy"), ("0.26.0", "dense-or-listed", "in-place"),
    ("0.27.0", "dense-or-listed", "in-place"), ("0.28.0", "dense-or-listed", "in-place"), ("0.29.0", "all", "in-place"),
    ("0.30.0", "all", "in-place"), ("0.31.0", "all", "in-place"), ("0.32.0", "all", "in-place"),
    ("0.33.0", "all", "warmup-pass"),
])
def test_each_release_row(version: str, models: str, sampler: str) -> None:
    row = model_runner_rule(version)
    assert row is not None and (row.models, row.sampler) == (models, sampler)


def test_before_0_22_there_is_no_v2_default() -> None:
    # 0.21.0 vllm/envs.py line 251: VLLM_USE_V2_MODEL_RUNNER: bool = False
    assert model_runner_rule("0.21.0") is None
    assert _runner("0.21.0", QWEN3) == ""


def test_which_models_default_to_v2_by_release() -> None:
    # 0.22.0 lists only Qwen3ForCausalLM; 0.23.0 adds Llama and Mistral
    assert (_runner("0.22.0", QWEN3), _runner("0.22.0", LLAMA)) == ("V2", "V1")
    assert _runner("0.23.0", LLAMA) == "V2"
    # 0.22-0.23 also need an unquantized model (not model_config.is_quantized); 0.24.0 drops that
    assert _runner("0.23.0", QWEN3, quantization="awq-4bit") == "V1"
    assert _runner("0.24.0", QWEN3, quantization="awq-4bit") == "V2"
    # a MoE model not listed: V1 up to 0.28 (0.25-0.28: ``listed or not is_moe``), V2 from 0.29 (no model check)
    assert [_runner(v, QWEN3_MOE) for v in ("0.24.0", "0.25.0", "0.28.0", "0.29.0")] == ["V1", "V1", "V1", "V2"]


def test_speculative_methods_fall_back_to_v1() -> None:
    # vllm-lab's 0.29.0 log (validation/published.yaml vllm-vllmlab-ngram-qwen3-8b-4090-48gb-v0290-eager): "Model
    # Runner V2 does not yet support ngram/ngram_gpu speculative decoding; using the V1 model runner instead."
    ngram = {"speculative": {"method": "ngram", "num_speculative_tokens": 2}}
    assert _runner("0.29.0", QWEN3, **ngram) == "V1"
    assert _runner("0.31.0", QWEN3, **ngram) == "V1"  # 0.31.0 still lists ngram
    assert _runner("0.32.0", QWEN3, **ngram) == "V2"  # 0.32.0 lists only suffix, medusa, mlp_speculator, custom_class
    draft = {"speculative": {"method": "draft", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 2}}
    assert _runner("0.30.0", QWEN3, **draft) == "V1"  # 0.30.0 lists "draft_model"
    assert _runner("0.31.0", QWEN3, **draft) == "V2"


def test_v2_sampler_bytes_hand_computed() -> None:
    # Llama-3.1-8B: hidden 4,096, vocabulary 128,256, bf16; 2,048 batched tokens, 1,024 dummy requests.
    # logits 1,024 x 128,256 = 131,334,144 entries; gumbel blocks ceil(128,256 / 1,024) = 126,
    #   partials 1,024 x 126 x 12 B = 1,548,288; hidden (2,048 + 1,024) x 4,096 x 2 B = 25,165,824
    # fp32 copy (0.22-0.25): 131,334,144 x (2 + 4) = 788,004,864 -> 814,718,976
    # in place (0.26 on):    131,334,144 x 2       = 262,668,288 -> 289,382,400
    m = resolve(_doc("0.23.0")).model
    assert v2_sampler_peak_bytes(m, 2048, 1024, 2, fp32_copy=True) == 814_718_976
    assert v2_sampler_peak_bytes(m, 2048, 1024, 2, fp32_copy=False) == 289_382_400
    assert decide(resolve(_doc("0.23.0")), version="0.23.0").sampler_peak_bytes == 814_718_976
    assert decide(resolve(_doc("0.26.0")), version="0.26.0").sampler_peak_bytes == 289_382_400
    # V1 at 0.22.0 (Llama not listed): the V1 term, native Triton top-k/top-p, 12 B class:
    #   131,334,144 x 14 + (2,048 + 2 x 1,024) x 4,096 x 2 = 1,838,678,016 + 33,554,432 = 1,872,232,448
    assert decide(resolve(_doc("0.22.0")), version="0.22.0").sampler_peak_bytes == 1_872_232_448


def test_v2_kv_budget_gains_the_sampler_difference() -> None:
    # the sampler is the profile run's peak in both (forward over 2,048 tokens: 0.24 GB), so the KV budget of 0.23.0
    # (V2, Llama) exceeds 0.22.0's (V1) by 1,872,232,448 - 814,718,976 = 1,057,513,472 (the rows agree otherwise:
    # facts/vllm_releases.py row 0.20.0 holds for both)
    v1, v2 = (decide(resolve(_doc(v)), version=v) for v in ("0.22.0", "0.23.0"))
    assert v2.available_kv_bytes - v1.available_kv_bytes == 1_057_513_472


def test_0_33_warmup_pass_is_stated_not_modelled() -> None:
    d = decide(resolve(_doc("0.33.0")), version="0.33.0")
    assert any(a.startswith("not modelled: Model Runner V2's second dummy sampler pass") for a in d.assumptions)
    # the V1 sampler's bytes stand in (0.33.0 default FlashInfer path, 12 B class), as the note says
    m = resolve(_doc("0.33.0")).model
    assert d.sampler_peak_bytes == sampler_peak_bytes(m, 2048, 1024, 2, "flashinfer") == 1_872_232_448


def test_v2_notes_widen_only_where_not_modelled() -> None:
    eager = decide(resolve(_doc("0.29.0", QWEN3, cuda_graphs=False)), version="0.29.0")
    graphs = decide(resolve(_doc("0.29.0", QWEN3)), version="0.29.0")
    assert not [a for a in eager.assumptions if a.startswith("not modelled: Model Runner V2")]
    # V2's graphs are stated with the graph term's own band, not as an unmodelled input (which would widen the whole
    # band to the widest class for every default 0.22+ server)
    assert not [a for a in graphs.assumptions if a.startswith("not modelled: Model Runner V2")]
    stated = [a for a in graphs.assumptions if a.startswith("Model Runner V2 captures and estimates its CUDA graphs")]
    assert stated and f"{graphs.cudagraph_bytes / 2**30:.2f} GiB" in stated[0]
    assert any(a.startswith("model runner: V2 (vLLM 0.29.0") for a in eager.assumptions)
    # the first line no longer names a top-k/top-p path the V2 profile run does not take
    assert eager.assumptions[0] == ("vLLM V1 engine, behaviour of vLLM 0.29.0 (Model Runner V2: no top-k/top-p in the "
                                    "profile run's sampling)")
    assert "flashinfer top-k/top-p sampler" in decide(resolve(_doc("0.33.0")), version="0.33.0").assumptions[0]


def test_v2_input_buffers_hand_computed() -> None:
    # 8,192 x 13 + 1,025 x 4 + 2 x 1,024 x 4 = 106,496 + 4,100 + 8,192 = 118,788
    assert v2_input_buffer_bytes(8192, 1024) == 118_788


def test_rocm_runner_choice_is_stated_not_modelled() -> None:
    # vllm/config/vllm.py 0.29.0 line 71: ROCM_DEFAULT_MRV1_ARCHITECTURES keeps V1 on ROCm for some architectures
    doc = _doc("0.29.0", QWEN3)
    doc["hardware"] = {"gpu": "MI300X"}
    d = decide(resolve(doc), version="0.29.0")
    assert "not modelled: the model runner vLLM picks on AMD GPUs (the rule above is CUDA's; ROCm defaults some " \
           "architectures to V1)" in d.assumptions
    assert not [a for a in decide(resolve(_doc("0.29.0", QWEN3)), version="0.29.0").assumptions if "AMD" in a]
