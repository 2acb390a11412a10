"""A report's ``scenario`` (every field, ``model_dump``) estimates again to the same report.

Settings whose "not given" means an engine's own default are null in the schema (``serve.max_num_seqs``: vLLM's
per-release default; ``serve.gguf.flash_attn``: the llama.cpp build's ``-fa`` default), and engine-specific blocks
count as given only when they differ from their defaults, so the dump of a scenario means what the scenario meant.
Before, a vLLM scenario's dump was refused (``serve.gguf: is set, which only serve.engine: llamacpp reads``) and a
dump that set ``max_num_seqs: 256`` would have replaced vLLM's 1024 on an H100."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vramplan.engine import estimate

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parents[1] / "examples").iterdir()
                  if p.suffix in (".yaml", ".json", ".toml"))

SERVE: dict[str, dict[str, Any]] = {
    "vllm-h100-defaults": {"model": "llama-3-8b", "task": "serve", "hardware": {"gpu": "H100-SXM"},
                           "serve": {"vllm_version": "0.19"}},
    "vllm-tp2-max-seqs": {"model": "llama-3-70b", "task": "serve", "hardware": {"gpu": "H100-SXM", "num_gpus": 2},
                          "parallel": {"tp": 2}, "serve": {"max_num_seqs": 64, "max_model_len": 8192}},
    "sglang": {"model": "llama-3-8b", "task": "serve", "hardware": {"gpu": "H100-SXM"},
               "serve": {"engine": "sglang", "sglang_version": "0.4.6"}},
    "llamacpp": {"model": "llama-3-8b", "task": "serve", "hardware": {"gpu": "RTX-4090"},
                 "serve": {"engine": "llamacpp", "max_model_len": 8192, "gguf": {"quant": "Q4_K_M"}}},
    "llamacpp-fa-off": {"model": "llama-3-8b", "task": "serve", "hardware": {"gpu": "RTX-4090"},
                        "serve": {"engine": "llamacpp", "max_model_len": 8192,
                                  "gguf": {"llamacpp_build": "6327", "flash_attn": False}}},
}


def _same(a: Any, b: Any) -> None:
    assert a.per_gpu == b.per_gpu  # every byte figure and the breakdown
    assert a.serve == b.serve and a.host == b.host
    assert (a.verdict, a.band) == (b.verdict, b.band)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_report_scenario_estimates_again(path: Path) -> None:
    first = estimate(path)
    _same(first, estimate(first.scenario))


@pytest.mark.parametrize("name", sorted(SERVE))
def test_serve_report_scenario_estimates_again(name: str) -> None:
    first = estimate(SERVE[name])
    _same(first, estimate(first.scenario))


def test_null_max_num_seqs_is_vllms_default_and_a_value_is_kept() -> None:
    # vLLM 0.19 on an H100 (>= 70 GiB, not an A100): 1024 sequences by default (facts/vllm_releases.py, batch rule
    # v1-70gib-not-a100); the dump carries null, not the old schema default 256
    from vramplan.catalog.resolve import resolve
    from vramplan.serve.vllm import decide

    rep = estimate(SERVE["vllm-h100-defaults"])
    assert rep.scenario["serve"]["max_num_seqs"] is None
    assert decide(resolve(rep.scenario), "0.19").max_num_seqs == 1024
    assert decide(resolve(SERVE["vllm-tp2-max-seqs"])).max_num_seqs == 64


def test_flash_attn_null_is_the_builds_default() -> None:
    # b6327 turned -fa to auto (on for a CUDA GPU): null follows it, an explicit false turns it off
    on = estimate({**SERVE["llamacpp"], "serve": {"engine": "llamacpp", "max_model_len": 8192,
                                                  "gguf": {"llamacpp_build": "6327"}}})
    off = estimate(SERVE["llamacpp-fa-off"])
    assert on.scenario["serve"]["gguf"]["flash_attn"] is None
    # without flash attention the compute buffer holds the n_ctx x n_ubatch x n_head scores: larger
    assert off.per_gpu.peak_allocated_bytes > on.per_gpu.peak_allocated_bytes
