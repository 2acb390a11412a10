"""A report's ``scenario`` (every field, ``model_dump``) estimates again to the same report.

Settings whose "not given" means an engine's own default are null in the schema (``serve.max_num_seqs``: vLLM's
per-release default; ``serve.gguf.flash_attn``: the llama.cpp build's ``-fa`` default), and engine-specific blocks
count as given only when they differ from their defaults, so the dump of a scenario means what the scenario meant.
A trainer's defaults (``train.gradient_checkpointing``, ``rl.beta``, ``rl.rollout.num_generations`` and
``max_completion_len``) and ``serve.dtype: auto`` are resolved once (spec/defaults.py) and the report's scenario holds
the resolved values, which resolve to themselves; the round trip is checked over every example and a matrix of
objectives, engines, releases and GPUs (a T4 and a V100 among them), the whole report compared.
Before, a vLLM scenario's dump was refused (``serve.gguf: is set, which only serve.engine: llamacpp reads``) and a
dump that set ``max_num_seqs: 256`` would have replaced vLLM's 1024 on an H100."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramplan.engine import estimate
from vramplan.errors import ScenarioError

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


# ------------------------------------------------------------------ the whole report, over a matrix

def _round_trip(doc: dict[str, Any] | Path) -> None:
    """estimate -> the report's scenario -> estimate again: the identical report, every key (a refusal of either
    estimate fails the test: these scenarios are all valid)."""
    first = estimate(doc)
    again = estimate(first.scenario)
    assert again.to_json_dict() == first.to_json_dict()


SMALL = "qwen2.5-0.5b"
OBJECTIVES: dict[str, dict[str, Any]] = {
    "sft": {"train": {"objective": "sft"}},
    "sft-lora": {"train": {"objective": "sft", "peft": {"method": "lora"}}},
    "dpo": {"train": {"objective": "dpo", "micro_batch_size": 2}},
    "dpo-lora-trl1.15": {"train": {"objective": "dpo", "micro_batch_size": 2, "peft": {"method": "lora"}},
                         "software": {"trl": "1.15.0"}},
    "dpo-no-checkpointing": {"train": {"objective": "dpo", "micro_batch_size": 2, "gradient_checkpointing": "none"}},
    "kto": {"train": {"objective": "kto", "micro_batch_size": 2}},
    "orpo": {"train": {"objective": "orpo", "micro_batch_size": 2}},
    "grpo": {"train": {"objective": "grpo", "micro_batch_size": 8}},
    "grpo-lora-beta": {"train": {"objective": "grpo", "micro_batch_size": 8, "peft": {"method": "lora"}},
                       "rl": {"beta": 0.04}},
    "grpo-trl1.12": {"train": {"objective": "grpo", "micro_batch_size": 8}, "software": {"trl": "1.12.0"}},
    "grpo-hf-generate": {"train": {"objective": "grpo", "micro_batch_size": 8},
                         "rl": {"rollout": {"engine": "hf-generate"}}},
    "rloo": {"train": {"objective": "rloo", "micro_batch_size": 8}},
}
TRAIN_GPUS = ("A100-80GB", "T4", "V100-32GB")


@pytest.mark.parametrize("gpu", TRAIN_GPUS)
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_round_trips(name: str, gpu: str) -> None:
    _round_trip({"model": SMALL, "hardware": {"gpu": gpu}, **OBJECTIVES[name]})


SERVING: dict[str, dict[str, Any]] = {
    "vllm": {},
    "vllm-0.8.5": {"vllm_version": "0.8.5"},
    "vllm-fp16": {"dtype": "fp16"},
    "vllm-awq": {"quantization": "awq-4bit"},
    "sglang": {"engine": "sglang"},
    "llamacpp": {"engine": "llamacpp", "gguf": {"quant": "Q4_K_M"}},
}
SERVE_GPUS = ("H100-SXM", "A100-80GB", "T4", "V100-32GB")


@pytest.mark.parametrize("gpu", SERVE_GPUS)
@pytest.mark.parametrize("name", sorted(SERVING))
def test_every_serving_engine_round_trips(name: str, gpu: str) -> None:
    _round_trip({"model": SMALL, "task": "serve", "hardware": {"gpu": gpu},
                 "serve": {"max_model_len": 4096, **SERVING[name]}})


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_round_trips_whole(path: Path) -> None:
    _round_trip(path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objective=st.sampled_from(["sft", "dpo", "kto", "orpo", "grpo", "rloo"]),
       gpu=st.sampled_from(["H100-SXM", "L4", "T4", "V100-32GB"]),
       peft=st.booleans(), checkpointing=st.sampled_from([None, "none", "full"]),
       trl=st.sampled_from([None, "1.9.0", "1.12.0", "1.15.0", "1.16.0"]))
def test_round_trip_property(objective: str, gpu: str, peft: bool, checkpointing: str | None,
                             trl: str | None) -> None:
    """Any accepted training scenario of the space: its report's scenario estimates to the identical report (a
    scenario refused at first is outside the property; refused at the second estimate, it fails)."""
    train: dict[str, Any] = {"objective": objective, "micro_batch_size": 8 if objective in ("grpo", "rloo") else 2,
                             "gradient_checkpointing": checkpointing}
    if peft:
        train["peft"] = {"method": "lora"}
    doc = {"model": SMALL, "hardware": {"gpu": gpu}, "train": train, "software": {"trl": trl}}
    try:
        first = estimate(doc)
    except ScenarioError:
        return  # a release this trainer is not modelled at (KTO, ORPO and RLOO: v1.16.0 only), say
    assert estimate(first.scenario).to_json_dict() == first.to_json_dict()


def test_trainer_defaults_are_resolved_values_in_the_report() -> None:
    """The report's scenario holds what ran: DPO's checkpointing on (TRL's _BaseConfig.gradient_checkpointing=True),
    RLOO's beta 0.05, 2 generations and 512 completion tokens (RLOOConfig, TRL v1.16.0), GRPO's 512 completion
    tokens at TRL v1.12.0 (GRPOConfig from v1.10.0), SFT's none; a T4's vLLM dtype fp16 (--dtype auto's fallback)."""
    def scenario(extra: dict[str, Any]) -> dict[str, Any]:
        return estimate({"model": SMALL, "hardware": {"gpu": "A100-80GB"}, **extra}).scenario

    assert scenario(OBJECTIVES["dpo"])["train"]["gradient_checkpointing"] == "full"
    assert scenario(OBJECTIVES["dpo-no-checkpointing"])["train"]["gradient_checkpointing"] == "none"
    assert scenario(OBJECTIVES["sft"])["train"]["gradient_checkpointing"] == "none"
    rl = scenario(OBJECTIVES["rloo"])["rl"]
    assert (rl["beta"], rl["rollout"]["num_generations"], rl["rollout"]["max_completion_len"]) == (0.05, 2, 512)
    grpo = scenario(OBJECTIVES["grpo-trl1.12"])
    # the policy's sequence: max_prompt_len 512 + max_completion_len 512 = 1,024 tokens
    assert (grpo["rl"]["rollout"]["max_completion_len"], grpo["train"]["seq_len"]) == (512, 1024)
    t4 = estimate({"model": SMALL, "task": "serve", "hardware": {"gpu": "T4"}, "serve": {"max_model_len": 4096}})
    assert t4.scenario["serve"]["dtype"] == "fp16"
    h100 = estimate({"model": SMALL, "task": "serve", "hardware": {"gpu": "H100-SXM"}, "serve": {"max_model_len": 4096}})
    assert h100.scenario["serve"]["dtype"] == "bf16"


def test_explicit_bf16_on_a_t4_is_refused_as_vllm_refuses_it() -> None:
    """vLLM's _check_if_gpu_supports_dtype refuses --dtype bfloat16 below compute capability 8.0; auto is served in
    fp16 (vLLM >= 0.9.0 casts with a warning; 0.8.5 would refuse a bf16 checkpoint, so the note assumes another)."""
    doc: dict[str, Any] = {"model": SMALL, "task": "serve", "hardware": {"gpu": "T4"}, "serve": {"max_model_len": 4096}}
    with pytest.raises(ScenarioError) as exc:
        estimate({**doc, "serve": {**doc["serve"], "dtype": "bf16"}})
    assert exc.value.problems[0].where == "serve.dtype"
    assert "vLLM refuses bf16 on T4" in exc.value.problems[0].message
    new = next(a for a in estimate(doc).assumptions if a.startswith("T4 (turing) has no bf16"))
    assert "--dtype auto casts a bf16 checkpoint to fp16" in new
    old = estimate({**doc, "serve": {**doc["serve"], "vllm_version": "0.8.5"}}).assumptions
    assert any("vLLM 0.8.5 refuses a bf16 checkpoint under --dtype auto" in a for a in old)
    # the same bytes as the explicit fp16 (2 per weight)
    explicit = estimate({**doc, "serve": {**doc["serve"], "dtype": "fp16"}})
    assert explicit.per_gpu == estimate(doc).per_gpu


def test_dumped_dpo_scenario_is_not_refused_and_rl_settings_still_are() -> None:
    """Before, a DPO report's scenario was refused (``rl.beta, rl.rollout set, but DPO has no rollout``): the keys
    were read by presence.  Now a value equal to the resolved default is no setting, and one away from it still is."""
    first = estimate({"model": SMALL, "hardware": {"gpu": "A100-80GB"}, **OBJECTIVES["dpo"]})
    estimate(first.scenario)
    given = {"model": SMALL, "hardware": {"gpu": "A100-80GB"}, **OBJECTIVES["dpo"], "rl": {"beta": 0.1}}
    with pytest.raises(ScenarioError) as exc:
        estimate(given)
    assert exc.value.problems[0].where == "rl" and "rl.beta set" in exc.value.problems[0].message
