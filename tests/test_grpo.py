"""GRPO post-training (train.objective: grpo): TRL v1.9.0's GRPOTrainer with a colocated vLLM rollout engine.

The oracle is Qwen2.5-0.5B (494,032,768 parameters, hidden 896, MLP 4,864, 24 layers, 2 KV heads of 64,
vocabulary 151,936, 32,768 positions, tied embeddings) on an A100-80GB (85,100,068,864 B, Ampere), TRL's
defaults: bf16 autocast over fp32 parameters, AdamW, 8 completions per device, 512 + 256 tokens, vLLM 0.11
at gpu_memory_utilization 0.3, no reference model (beta 0), no sleep mode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan.analytic.grpo import grpo_loss_tensors, policy_scenario
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.serve.rollout import rollout_memory
from vramplan.spec.load import Resolved

BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "grpo", "micro_batch_size": 8}}
PARAMS = 494_032_768
# the vLLM engine (serve/vllm.py decide, vLLM 0.11 rules), by hand:
#   requested = int(85,100,068,864 x 0.3) = 25,530,020,659
#   weights = 494,032,768 x 2 (bf16) + rotary cache 32,768 x 64 x 2 = 988,065,536 + 4,194,304 = 992,259,840
#   forward peak (compiled) = (4 x 896 + 3 x 4,864) x 4,096 tokens x 2 = 148,897,792
#   sampler (native) = 8 x 151,936 x (2 + 36) + (4,096 + 2 x 8) x 896 x 2 = 53,557,248; the forward is larger
#   activations = 148,897,792 + cuBLAS 2 x 4 MiB + 8 x 16 KiB (8,519,680) = 157,417,472
#   non-torch = int(0.13 GiB) = 139,586,437 (vLLM 0.11 on H100, facts/vllm_releases.py)
#   available = 25,530,020,659 - 992,259,840 - 157,417,472 - 139,586,437 = 24,240,756,910
#   page = 16 tokens x (2 x 2 x 64 x 2 B) = 8,192; blocks = 24,240,756,910 // 8,192 // 24 = 123,294
#   KV = 123,294 x 8,192 x 24 = 24,240,586,752
#   CUDA graphs (serve/cudagraphs.py, 0.11.0 rules): max min(8 x 2, 512) = 16 -> sizes 1, 2, 4, 8, 16, FULL decode
#   4 (<= 8): (5 + 4) x 25 = 225 segments; pool (4 x 896 + 3 x 4,864) x 16 x 2 = 581,632 + 225 x 204,111 = 46,506,607
VLLM_WEIGHTS = 992_259_840
VLLM_ACT = 157_417_472
VLLM_KV = 24_240_586_752
VLLM_OTHER = 46_506_607 + 139_586_437


def _doc(**rl: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    if rl:
        doc["rl"] = rl
    return doc


def _lifecycle(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    return estimate(doc).per_gpu.lifecycle


def test_grpo_loss_tensors_by_hand() -> None:
    # b = 8, C = 256, V = 151,936, bf16: L = 8 x 257 x 151,936 x 2 = 624,760,832
    # saved: the 8 sequences' log_softmax outputs 8 x 256 x 151,936 x 2 = 622,329,856
    # forward extra: L + the entropy's reshape copy 622,329,856 + 3 x 128 x 151,936 x 2 (116,686,848)
    #   = 1,363,777,536
    # backward extra: 2 L + 2 x 256 x 151,936 x 2 (155,582,464) = 1,405,104,128
    lt = grpo_loss_tensors(8, 256, 151_936, 2)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (622_329_856, 1_363_777_536, 1_405_104_128)
    # one sequence: the slice of a batch of one reshapes without a copy; 128 of its 256 rows per entropy chunk
    one = grpo_loss_tensors(1, 256, 151_936, 2)
    assert one.forward_extra == 257 * 151_936 * 2 + 3 * 128 * 151_936 * 2
    # fp32 logits: logsumexp keeps the logits themselves (257 x V x 4 per sequence), no separate log_softmax
    f32 = grpo_loss_tensors(1, 256, 151_936, 4)
    assert f32.saved == 257 * 151_936 * 4 and f32.forward_extra == 3 * 128 * 151_936 * 4 + 256 * 151_936 * 4


def test_policy_scenario_follows_trl_defaults() -> None:
    s = resolve(_doc()).scenario
    p = policy_scenario(s)
    # TRL v1.9.0: prompt 512 + completion 256; GRPOConfig gradient_checkpointing=True
    assert p.train.seq_len == 768 and p.train.gradient_checkpointing == "full"
    explicit = resolve({**BASE, "train": {**BASE["train"], "gradient_checkpointing": "none"}}).scenario
    assert policy_scenario(explicit).train.gradient_checkpointing == "none"


def test_colocated_vllm_engine_by_hand() -> None:
    r = resolve(_doc())
    ro = rollout_memory(Resolved(policy_scenario(r.scenario), r.model, r.gpu, ()), 0, 0)
    d = ro.decision
    assert d.requested_bytes == 25_530_020_659 and d.max_num_seqs == 8 and d.max_num_batched_tokens == 4096
    assert (ro.weights, ro.activations, ro.kv_cache, ro.other) == (VLLM_WEIGHTS, VLLM_ACT, VLLM_KV, VLLM_OTHER)
    assert ro.starts


def test_rollout_phase_by_hand() -> None:
    # between steps the trainer keeps fp32 parameters 494,032,768 x 4 = 1,976,131,072, AdamW's two fp32 states
    # 3,952,262,144 and two cuBLAS workspaces 17,039,360 (gradients set to None); the engine generating adds
    # 992,259,840 + 24,240,586,752 + 157,417,472 + 186,093,044 (VLLM_OTHER):
    # 1,976,131,072 + 3,952,262,144 + 17,039,360 + 25,576,357,108 = 31,521,789,684
    rep = estimate(_doc())
    assert rep.per_gpu.lifecycle["rollout"]["allocated_bytes"] == 31_521_789_684


def test_scoring_phase_by_hand() -> None:
    # one no-grad forward of 8 completions over 8 x 768 = 6,144 tokens:
    #   head: logits 8 x 257 x 151,936 x 2 = 624,760,832 + one sequence's log_softmax 256 x 151,936 x 2
    #   = 77,791,232 -> 702,552,064; the MLP's 6,144 x 4,864 x 2 x 3 = 179,306,496 is smaller
    #   residual in and out: 2 x 6,144 x 896 x 4 (fp32 under autocast over fp32 parameters) = 44,040,192
    # over the resident 5,945,432,576 and the engine between rollouts 992,259,840 + 24,240,586,752 +
    # 186,093,044 = 25,418,939,636: 5,945,432,576 + 25,418,939,636 + 746,592,256 = 32,110,964,468
    assert estimate(_doc()).per_gpu.lifecycle["scoring"]["allocated_bytes"] == 32_110_964_468


def test_training_step_holds_the_engine_without_sleep_mode() -> None:
    r = resolve(_doc())
    step = train_step(Resolved(policy_scenario(r.scenario), r.model, r.gpu, ())).peak.total
    rep = estimate(_doc())
    held = VLLM_WEIGHTS + VLLM_KV + VLLM_OTHER  # the activation blocks go back to the shared allocator
    assert rep.per_gpu.lifecycle["training step"]["allocated_bytes"] == step + held
    assert rep.per_gpu.breakdown_detail["kv_cache"]["rollout engine (vLLM) KV cache"] == VLLM_KV
    # sleep mode (TRL: llm.sleep(level=2)) frees the weights and the KV cache; graphs and non-torch stay
    asleep = estimate(_doc(rollout={"sleep_mode": 2}))
    assert asleep.per_gpu.lifecycle["training step"]["allocated_bytes"] == step + VLLM_OTHER
    assert asleep.per_gpu.lifecycle["rollout"] == rep.per_gpu.lifecycle["rollout"]
    # level 1 offloads the weights to host memory
    assert estimate(_doc(rollout={"sleep_mode": 1})).host.offloaded_bytes == VLLM_WEIGHTS


def test_server_mode_puts_nothing_of_the_engine_on_the_gpu() -> None:
    r = resolve(_doc())
    step = train_step(Resolved(policy_scenario(r.scenario), r.model, r.gpu, ())).peak.total
    rep = estimate(_doc(rollout={"colocate": False}))
    assert rep.per_gpu.lifecycle["training step"]["allocated_bytes"] == step
    # between steps: parameters, AdamW states and cuBLAS workspaces only
    assert rep.per_gpu.lifecycle["rollout"]["allocated_bytes"] == 1_976_131_072 + 3_952_262_144 + 17_039_360


def test_reference_model_by_trls_rule() -> None:
    base = _lifecycle(_doc())
    # beta != 0 without PEFT: a second fp32 copy (the policy's model_init_kwargs): 494,032,768 x 4 in every
    # phase after the load
    sep = _lifecycle(_doc(beta=0.04))
    for phase in ("rollout", "training step", "first step"):
        assert sep[phase]["allocated_bytes"] - base[phase]["allocated_bytes"] == PARAMS * 4
    assert sep["load"] == base["load"]
    # under PEFT the reference is the base with the adapters disabled: nothing added
    lora = {**BASE, "train": {**BASE["train"], "peft": {"method": "lora"}}}
    assert estimate({**lora, "rl": {"beta": 0.04}}).per_gpu.lifecycle == estimate(lora).per_gpu.lifecycle


def test_vllm_refuses_to_start_beside_the_trainer() -> None:
    # 0.98 x 85,100,068,864 = 83,398,067,486 requested, but the CUDA context and the trainer's fp32 parameters
    # (1,976,131,072) leave less free
    rep = estimate(_doc(rollout={"gpu_memory_utilization": 0.98}))
    assert not rep.fits
    assert any("vLLM would not start" in a and "less than desired GPU memory utilization" in a
               for a in rep.assumptions)


@pytest.mark.parametrize(("change", "where"), [
    # PPO is modelled (tests/test_ppo.py), but not under GRPO's bf16-mixed (autocast reaches only the wrapper)
    ({"train": {"objective": "ppo"}}, "train.precision"),
    ({"parallel": {"zero_stage": 3}, "hardware": {"gpu": "A100-80GB", "num_gpus": 8}}, "parallel"),
    ({"parallel": {"tp": 2}, "hardware": {"gpu": "A100-80GB", "num_gpus": 2}}, "parallel"),
    ({"train": {"objective": "grpo", "micro_batch_size": 8, "loss": "liger-fused-linear-ce"}}, "train.loss"),
    ({"train": {"objective": "grpo", "micro_batch_size": 8, "seq_len": 1024}}, "train.seq_len"),
    ({"train": {"objective": "grpo", "micro_batch_size": 6}}, "rl.rollout.num_generations"),
    ({"rl": {"beta": 0.04, "reference_model": "shared"}}, "rl.reference_model"),
    ({"rl": {"reference_model": "separate"}}, "rl.reference_model"),
    ({"rl": {"rollout": {"vllm_version": "0.8.0"}}}, "rl.rollout.vllm_version"),
    ({"lifecycle": {"evaluation": True}}, "lifecycle.evaluation"),
    ({"rl": {"precompute_ref_log_probs": True}}, "rl.precompute_ref_log_probs"),
    ({"train": {"objective": "grpo", "micro_batch_size": 8, "quantization": "nf4",
                "peft": {"method": "qlora"}}}, "train.quantization"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    doc = {**BASE, **change}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == where for p in exc.value.problems), exc.value


def test_rl_section_without_grpo_is_stated_not_used() -> None:
    rep = estimate({"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"}, "rl": {"beta": 0.04}})
    assert any(a.startswith("rl.beta set but not used") for a in rep.assumptions)


runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_cli_estimate_grpo_flags() -> None:
    res = runner.invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--objective", "grpo",
                              "--micro-batch-size", "8", "--rollout-gpu-memory-utilization", "0.3",
                              "--sleep-mode", "2", "--json"], env=ENV)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["scenario"]["rl"]["rollout"]["sleep_mode"] == 2
    assert doc["per_gpu"]["lifecycle"]["rollout"]["allocated_bytes"] == 31_521_789_684


def test_plan_refuses_grpo(tmp_path: Path) -> None:
    path = tmp_path / "grpo.json"
    path.write_text(json.dumps(BASE))
    res = runner.invoke(app, ["plan", str(path)], env=ENV)
    assert res.exit_code == 2 and "train.objective" in res.stdout + res.stderr
    assert "plan searches supervised fine-tuning (sft) setups only" in res.stdout + res.stderr


def test_trace_engine_refuses_grpo() -> None:
    res = runner.invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--objective", "grpo",
                              "--micro-batch-size", "8", "--engine", "trace"], env=ENV)
    assert res.exit_code == 2 and "objective grpo is not traced" in res.stdout + res.stderr


def test_v0_release_with_the_profiled_increase_rule_is_accepted() -> None:
    # vLLM 0.7.3 (V0, memory_profiling: profiled_increase) charges only the engine's own increase: modelled
    assert estimate(_doc(rollout={"vllm_version": "0.7.3"})).per_gpu.lifecycle["rollout"]["allocated_bytes"] > 0


def test_measure_refuses_grpo() -> None:
    from vramplan.measure.build import unsupported

    r = resolve(_doc())
    (problem,) = [p for p in unsupported(r, "cuda") if p.where == "train.objective"]
    assert "supervised (sft) step" in problem.message
    assert not [p for p in unsupported(resolve({**BASE, "train": {}}), "cuda") if p.where == "train.objective"]


@settings(max_examples=12, deadline=None)
@given(lo=st.sampled_from([0.1, 0.2, 0.3, 0.4]), step=st.sampled_from([0.05, 0.1, 0.3]),
       sleep=st.sampled_from([1, 2]))
def test_more_utilization_more_memory_and_sleep_never_adds(lo: float, step: float, sleep: int) -> None:
    """The engine's KV pool grows with gpu_memory_utilization, so the rollout phase does; sleep mode frees the
    engine's weights and KV cache during the step and changes nothing of the rollout."""
    small = estimate(_doc(rollout={"gpu_memory_utilization": lo})).per_gpu.lifecycle
    large = estimate(_doc(rollout={"gpu_memory_utilization": round(lo + step, 2)})).per_gpu.lifecycle
    assert large["rollout"]["allocated_bytes"] > small["rollout"]["allocated_bytes"]
    asleep = estimate(_doc(rollout={"gpu_memory_utilization": lo, "sleep_mode": sleep})).per_gpu.lifecycle
    assert asleep["training step"]["allocated_bytes"] < small["training step"]["allocated_bytes"]
    assert asleep["rollout"] == small["rollout"]
