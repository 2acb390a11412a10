"""``serve.vllm_sampler``: the top-k/top-p path of vLLM's profile-run sampling, by release.

Sources (facts/vllm_releases.py ``flashinfer_sampler``): vllm/v1/sample/ops/topk_topp_sampler.py
``TopKTopPSampler.__init__`` at 0.8.0-0.33.0, vllm/model_executor/layers/sampler.py at 0.6.0-0.7.3, the wheels'
``Requires-Dist`` and flashinfer-python 0.2.1.post2 flashinfer/sampling.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import ScenarioError, VramplanError
from vramplan.facts.vllm_releases import VLLM_RELEASES, release_row
from vramplan.serve.vllm import decide, sampler_class, sampler_path, sampler_peak_bytes

LLAMA = "meta-llama/Llama-3.1-8B"
ENV = {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}


def _doc(version: str, gpu: str = "A100-40GB", **serve: Any) -> dict[str, Any]:
    # the se7en 0.8.2 LoRA deployment of validation/published.yaml, without the LoRA slots
    return {"model": LLAMA, "task": "serve", "hardware": {"gpu": gpu},
            "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "max_num_seqs": 1024,
                      "max_num_batched_tokens": 2048, "vllm_version": version, **serve}}


def _decide(version: str, gpu: str = "A100-40GB", **serve: Any) -> Any:
    return decide(resolve(_doc(version, gpu, **serve)), version=version)


def test_sampler_bytes_by_path_hand_computed_at_0_8_2() -> None:
    # Llama-3.1-8B: hidden 4,096, vocabulary 128,256, bf16 logits (2 B); 2,048 batched tokens, 1,024 dummy requests.
    # hidden states alive: (2,048 + 2 x 1,024) x 4,096 x 2 B = 33,554,432
    # native (sort): 1,024 x 128,256 x (2 + 36) B = 131,334,144 x 38 = 4,990,697,472 -> 5,024,251,904
    # flashinfer: fp32 copy 4 + probs 4 + top_k_renorm_probs 4 (flashinfer 0.2.1 top_k_top_p_sampling_from_probs,
    #   "top_k_first") = 12: 131,334,144 x 14 = 1,838,678,016 -> 1,872,232,448
    native, flashinfer = _decide("0.8.2"), _decide("0.8.2", vllm_sampler="flashinfer")
    assert native.sampler_peak_bytes == 5_024_251_904
    assert flashinfer.sampler_peak_bytes == 1_872_232_448
    assert _decide("0.8.2", vllm_sampler="native").sampler_peak_bytes == native.sampler_peak_bytes
    # the sampler is the profile run's peak on both paths (the forward over 2,048 tokens is below 0.3 GB), so the
    # KV budget grows by the whole difference: 131,334,144 x 24 = 3,152,019,456
    assert flashinfer.available_kv_bytes - native.available_kv_bytes == 3_152_019_456
    m = resolve(_doc("0.8.2")).model
    assert sampler_peak_bytes(m, 2048, 1024, 2, "flashinfer") == 1_872_232_448


def test_auto_is_each_rows_pip_default() -> None:
    # auto keeps every existing report: its bytes class is the row's ``sampler`` in every release
    for row in VLLM_RELEASES:
        assert sampler_class(row, sampler_path(row, "auto")) == row.sampler, row.name
    # 0.24.0 on, FlashInfer is the default path; from 0.17.0 the PyTorch path no longer sorts (Triton, 12 B)
    assert sampler_path(release_row("0.24")[0], "auto") == "flashinfer"
    assert sampler_path(release_row("0.23")[0], "auto") == "native"
    assert sampler_class(release_row("0.17")[0], "native") == "flashinfer"
    assert sampler_class(release_row("0.16")[0], "native") == "native"
    assert _decide("0.19", gpu="H100").sampler_peak_bytes == _decide(
        "0.19", gpu="H100", vllm_sampler="native").sampler_peak_bytes == _decide(
        "0.19", gpu="H100", vllm_sampler="flashinfer").sampler_peak_bytes
    # 0.33 with VLLM_USE_FLASHINFER_SAMPLER=0: the Triton path, the same 12 B class
    assert _decide("0.33", gpu="H100", vllm_sampler="native").sampler_peak_bytes == _decide(
        "0.33", gpu="H100").sampler_peak_bytes


def test_assumption_names_the_path_and_the_docker_ambiguity() -> None:
    auto = _decide("0.11").assumptions[0]
    assert auto.startswith("vLLM V1 engine, behaviour of vLLM 0.11 (native top-k/top-p sampler")
    assert "vllm/vllm-openai image" in auto and "serve.vllm_sampler: flashinfer" in auto
    assert "(< 0.2.3)" in _decide("0.8.2").assumptions[0] and "(< 0.2.3)" not in auto
    # 0.12.0-0.23.x: the image and pip agree (an env var gates FlashInfer), so nothing is added
    assert _decide("0.12").assumptions[0] == ("vLLM V1 engine, behaviour of vLLM 0.12 (native top-k/top-p sampler "
                                              "in the profile run)")
    fi = _decide("0.12", vllm_sampler="flashinfer").assumptions[0]
    assert "(flashinfer top-k/top-p" in fi and "VLLM_USE_FLASHINFER_SAMPLER=1" in fi
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in _decide("0.8.2", vllm_sampler="native").assumptions[0]


def test_flashinfer_is_refused_where_it_cannot_apply() -> None:
    # 0.12.0-0.23.x raise RuntimeError on a GPU FlashInferBackend does not support (7.5 <= capability <= 12.1);
    # a V100 is 7.0
    with pytest.raises(ScenarioError, match="compute capability 7.0") as err:
        _decide("0.12", gpu="V100-32GB", vllm_sampler="flashinfer")
    assert err.value.problems[0].where == "serve.vllm_sampler"
    with pytest.raises(ScenarioError, match="serve.vllm_sampler"):
        _decide("0.30", gpu="V100-32GB", vllm_sampler="flashinfer")
    assert _decide("0.12", gpu="V100-32GB").starts is not None  # auto on the same GPU is fine
    # V0 (0.6.0-0.7.3): FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1; that path is not modelled
    with pytest.raises(ScenarioError, match="V0 engine"):
        _decide("0.7.3", vllm_sampler="flashinfer")
    assert _decide("0.7.3", vllm_sampler="native").sampler_peak_bytes == _decide("0.7.3").sampler_peak_bytes
    # a vLLM option: refused for SGLang (spec/scenario.py VLLM_ONLY_OPTIONS)
    doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"engine": "sglang", "vllm_sampler": "flashinfer"}}
    with pytest.raises(VramplanError, match="serve.vllm_sampler"):
        resolve(doc)
    with pytest.raises(VramplanError):
        resolve(_doc("0.11", vllm_sampler="sort"))


def test_cli_flag_reaches_the_scenario() -> None:
    kv = {}
    for value in ("auto", "flashinfer"):
        res = CliRunner().invoke(app, ["serve", "--model", "llama-3.1-8b", "--gpu", "A100-40GB", "--max-model-len",
                                       "16384", "--vllm-version", "0.8.2", "--vllm-sampler", value, "--json"], env=ENV)
        assert res.exit_code == 0, res.stderr
        kv[value] = json.loads(res.stdout)["vllm"]["profile_sampler_peak_bytes"]
    assert kv["flashinfer"] < kv["auto"]
