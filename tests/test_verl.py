"""framework: verl (analytic/verl.py, facts/verl.py): verl's hybrid engine, phase by phase, against hand arithmetic.

Qwen2.5-0.5B (V = 151,936, H = 896, I = 4,864, 494,032,768 parameters, tied embedding) on 2 x A100-80GB, GRPO,
ppo_micro_batch_size_per_gpu 4, log_prob_micro_batch_size_per_gpu 2, prompt and response 512 (verl's defaults).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic import verl
from vramplan.analytic.lifecycle.steps import between_steps
from vramplan.analytic.moment import K
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.verl import READ_AT, verl_defaults
from vramplan.report import Report
from vramplan.serve.rollout import RolloutMemory, rollout_memory
from vramplan.spec.load import Resolved
from vramplan.spec.scenario import Scenario

V, H = 151_936, 896


def _scenario(**verl_keys: Any) -> dict[str, Any]:
    rl: dict[str, Any] = {"verl": {"log_prob_micro_batch_size_per_gpu": 2, **verl_keys}}
    return {"model": "Qwen/Qwen2.5-0.5B", "framework": "verl", "hardware": {"gpu": "A100-80GB", "num_gpus": 2},
            "train": {"objective": "grpo", "micro_batch_size": 4}, "rl": rl}


def _with(sc: dict[str, Any], **rl: Any) -> dict[str, Any]:
    return {**sc, "rl": {**sc["rl"], **rl}}


def _parts(sc: dict[str, Any]) -> tuple[Resolved, TrainResult, RolloutMemory]:
    r = resolve(sc)
    pr = Resolved(verl.policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    v = verl.verl_setup(r.scenario)
    actor = between_steps(tr.terms, "rollout").get(K.PARAMETERS)
    ro = rollout_memory(pr, 0 if v.param_offload else actor, 0, "verl",
                        (verl.rollout_scenario(r.scenario), v.sleep_level, ""))
    return r, tr, ro


@pytest.fixture(scope="module")
def base() -> tuple[Report, Resolved, TrainResult, RolloutMemory]:
    sc = _with(_scenario(ref_log_prob_micro_batch_size_per_gpu=2), reference_model="separate")
    return (estimate(sc), *_parts(sc))


def _phase(rep: Report, name: str) -> int:
    assert rep.per_gpu.lifecycle is not None
    return rep.per_gpu.lifecycle[name]["allocated_bytes"]


def test_defaults_per_release_are_filled_into_the_echo() -> None:
    s = resolve(_scenario()).scenario
    # facts/verl.py: gpu_memory_utilization 0.5, tensor_model_parallel_size 2, free_cache_engine and enforce_eager
    # true, offloads false (v0.5.0 rollout/rollout.yaml lines 29, 41, 38, 35; actor/dp_actor.yaml lines 57, 60)
    v = s.rl.verl
    assert (v.release, v.gpu_memory_utilization, v.tensor_model_parallel_size) == ("0.5.0", 0.5, 2)
    assert (v.free_cache_engine, v.enforce_eager, v.param_offload, v.optimizer_offload) == (True, True, False, False)
    assert (v.strategy, v.rollout_name) == ("fsdp", "vllm")  # dp_actor.yaml line 17, rollout.yaml line 2
    # enable_gradient_checkpointing: true; max_response_length 512; TRL's GRPO defaults are not filled in
    assert s.train.gradient_checkpointing == "full" and s.rl.rollout.max_completion_len == 512
    assert s.rl.beta is None and s.rl.rollout.num_generations is None
    assert READ_AT == ("0.4.1", "0.5.0") and not verl_defaults("0.4.1").reads_free_cache_engine


def test_report_scenario_estimates_again_to_itself(base: tuple[Report, Resolved, TrainResult, RolloutMemory]) -> None:
    rep = base[0]
    again = estimate(Scenario.model_validate(rep.scenario))
    assert again.per_gpu.lifecycle == rep.per_gpu.lifecycle


def test_log_prob_forward_by_hand(base: tuple[Report, Resolved, TrainResult, RolloutMemory]) -> None:
    _, _, tr, _ = base
    assert tr.context is not None and tr.layout is not None
    # b = 2, P = R = 512, bf16: L = 2 x 1,024 x V x 2 = 622,329,856; b R V c = 311,164,928 (flash-attn's copy of the
    # slice); entropy: softmax and its product with the logits, 2 x that; residual 2 x 2,048 x 896 x 2 = 7,340,032
    # (analytic/verl.py log_prob_forward_bytes)
    assert verl.log_prob_forward_bytes(tr.context, tr.layout, 2, entropy=True) == (
        622_329_856 + 2 * 311_164_928 + 7_340_032) == 1_251_999_744
    assert verl.log_prob_forward_bytes(tr.context, tr.layout, 2, entropy=False) == 940_834_816
    # the largest parameter, the embedding, whole in fp32: 151,936 x 896 x 4
    assert verl.sync_gather_bytes(tr.context) == V * H * 4 == 544_538_624


def test_weight_sync_phase(base: tuple[Report, Resolved, TrainResult, RolloutMemory]) -> None:
    rep, _, tr, ro = base
    kept = between_steps(tr.terms, "rollout")
    actor = kept.get(K.PARAMETERS)
    # the actor's fp32 shards: 494,032,768 x 4 / 2 ranks
    assert actor == 494_032_768 * 4 // 2 == 988_065_536
    # the state dict's transient: the root unit (151,936 x 896 + 896 = 136,135,552 parameters) unsharded in fp32,
    # 544,542,208 B, and the embedding's full clone 544,538,624 B (above a layer unit, 14,912,384 parameters, and its
    # largest linear, 4,864 x 896, in fp32: 77,082,112 B)
    assert tr.context is not None
    assert verl.state_dict_bytes(tr.context) == 544_542_208 + 544_538_624 == 1_089_080_832
    # what stays between steps, one more copy of the shards (SHARDED_STATE_DICT's clones), the engine's non-torch
    # memory, and the larger of the state dict's transient and the woken weights with the embedding whole in fp32
    feeding = ro.weights + 544_538_624
    assert feeding < 1_089_080_832  # Qwen2.5-0.5B over tp 2: the state dict's moment is the higher
    assert _phase(rep, "weight sync") == kept.total + actor + ro.other + max(1_089_080_832, feeding)


def test_rollout_phase(base: tuple[Report, Resolved, TrainResult, RolloutMemory]) -> None:
    rep, _, tr, ro = base
    kept = between_steps(tr.terms, "rollout")
    assert _phase(rep, "rollout") == kept.total + ro.weights + ro.kv_cache + ro.activations + ro.other
    # no CUDA graphs (enforce_eager): the engine keeps only its non-torch memory while it sleeps
    assert ro.decision.cudagraph_bytes == 0 and ro.training_bytes == {"weights": 0, "kv_cache": 0, "other": ro.other}
    # the KV cache fills gpu_memory_utilization 0.5 of the total after weights, profile peak and non-torch
    d = ro.decision
    assert ro.kv_cache <= d.requested_bytes - d.weights_bytes - d.activation_peak_bytes - d.non_torch_bytes
    # vLLM >= 0.9.1: requested = gpu_memory_utilization x total (85,100,068,864 B on an A100-80GB)
    assert abs(d.requested_bytes - 0.5 * 85_100_068_864) < 1


def test_scoring_phases(base: tuple[Report, Resolved, TrainResult, RolloutMemory]) -> None:
    rep, _, tr, ro = base
    kept = between_steps(tr.terms, "rollout")
    assert tr.layout is not None
    gathered = tr.layout.gathered
    # old log-probs: everything kept, the sleeping engine, the FSDP units gathered and the forward with entropies
    assert _phase(rep, "scoring") == kept.total + ro.other + gathered + 1_251_999_744
    # reference log-probs: its shards in host memory (CPUOffload), the forward without entropies
    assert _phase(rep, "reference scoring") == kept.total + ro.other + gathered + 940_834_816


def test_training_step_is_the_fsdp_step_beside_the_sleeping_engine(
        base: tuple[Report, Resolved, TrainResult, RolloutMemory]) -> None:
    rep, _, tr, ro = base
    assert _phase(rep, "training step") == tr.peak.total + ro.other
    assert list(rep.per_gpu.lifecycle or {}) == ["weight sync", "rollout", "scoring", "reference scoring",
                                                 "training step"]
    # host: the reference's bf16 shards (494,032,768 x 2 / 2) and the engine's weights offloaded by sleep level 1
    assert rep.host.offloaded_bytes == 494_032_768 + ro.weights


def test_offload_moves_shards_and_states_out_of_the_other_phases() -> None:
    plain, off = estimate(_scenario()), estimate(_scenario(param_offload=True, optimizer_offload=True))
    _, tr, _ = _parts(_scenario())
    kept = between_steps(tr.terms, "rollout")
    actor = kept.get(K.PARAMETERS)
    states = sum(kept.parts[K.OPTIMIZER_STATES.part].values())
    assert states == 2 * actor  # AdamW's two fp32 states over the fp32 shards
    # the rollout holds neither; the sync and the scoring load the shards but not the states; the update both
    assert _phase(plain, "rollout") - _phase(off, "rollout") == actor + states
    assert _phase(plain, "weight sync") - _phase(off, "weight sync") == states
    assert _phase(plain, "scoring") - _phase(off, "scoring") == states
    assert _phase(plain, "training step") == _phase(off, "training step")
    assert off.host.offloaded_bytes - plain.host.offloaded_bytes == actor + states


def test_free_cache_engine_off_keeps_the_engine_awake() -> None:
    asleep, awake = estimate(_scenario()), estimate(_scenario(free_cache_engine=False))
    _, _, ro = _parts(_scenario())
    # v0.5.0's __exit__ sleeps only with free_cache_engine: its weights and KV cache stay through the update
    assert _phase(awake, "training step") - _phase(asleep, "training step") == ro.weights + ro.kv_cache
    assert awake.host.offloaded_bytes == 0


@pytest.mark.parametrize(("keys", "rl", "where"), [
    ({"log_prob_micro_batch_size_per_gpu": None}, {}, "rl.verl.log_prob_micro_batch_size_per_gpu"),
    ({"use_dynamic_bsz": True}, {}, "rl.verl.use_dynamic_bsz"),
    ({"use_remove_padding": True}, {}, "rl.verl.use_remove_padding"),
    ({"entropy_coeff": 0.01}, {}, "rl.verl.entropy_coeff"),
    ({"tensor_model_parallel_size": 4}, {}, "rl.verl.tensor_model_parallel_size"),
    ({"enforce_eager": False}, {}, "rl.verl.enforce_eager"),
    ({"release": "0.4.1", "free_cache_engine": False}, {}, "rl.verl.free_cache_engine"),
    ({"strategy": "megatron"}, {}, "rl.verl.strategy"),
    ({"strategy": "fsdp2"}, {}, "rl.verl.strategy"),
    ({"rollout_name": "sglang"}, {}, "rl.verl.rollout_name"),
    ({}, {"beta": 0.04}, "rl.beta"),
    ({}, {"rollout": {"gpu_memory_utilization": 0.6}}, "rl.rollout.gpu_memory_utilization"),
    ({}, {"reference_model": "shared"}, "rl.reference_model"),
    # v0.4.1 / v0.5.0 ray_trainer.py: with a reference policy the ref section's micro-batch is checked too (null
    # in verl's config): "Please set at least one of 'actor_rollout_ref.ref.log_prob_micro_batch_size' or ..."
    ({}, {"reference_model": "separate"}, "rl.verl.ref_log_prob_micro_batch_size_per_gpu"),
])
def test_refused_with_the_reason(keys: dict[str, Any], rl: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as err:
        estimate(_with(_scenario(**keys), **rl))
    assert where in [p.where for p in err.value.problems]


def test_ppo_objective_refused() -> None:
    sc = _scenario()
    sc["train"] = {**sc["train"], "objective": "ppo"}
    with pytest.raises(ScenarioError) as err:
        estimate(sc)
    assert "train.objective" in [p.where for p in err.value.problems]


def test_offload_is_what_makes_a_7b_fit_on_two_gpus() -> None:
    # Qwen2.5-7B (7,615,616,512 parameters) over 2 x A100-80GB at verl's defaults: the rollout holds the actor's fp32
    # shards (15.2 GB) and AdamW's states (30.5 GB) beside the engine's 0.5 x 85.1 GB = 42.6 GB: over 80 GiB.  With
    # param_offload and optimizer_offload the rollout drops both and the update (76 GiB) is the peak.
    sc = {"model": "Qwen/Qwen2.5-7B", "framework": "verl", "hardware": {"gpu": "A100-80GB", "num_gpus": 2},
          "train": {"objective": "grpo", "micro_batch_size": 2},
          "rl": {"verl": {"log_prob_micro_batch_size_per_gpu": 4}}}
    plain = estimate(sc)
    assert not plain.fits and plain.per_gpu.lifecycle_peak_phase == "rollout"
    rollout = plain.per_gpu.lifecycle["rollout"]["allocated_bytes"]
    assert rollout > 7_615_616_512 * (4 + 8) // 2 + 85_100_068_864 // 2 - 1  # shards + states + the engine's budget
    off = estimate(_with(sc, verl={"log_prob_micro_batch_size_per_gpu": 4, "param_offload": True,
                                   "optimizer_offload": True}))
    assert off.fits and off.per_gpu.lifecycle_peak_phase == "training step"


def test_engine_that_cannot_start_beside_the_actor_does_not_fit() -> None:
    # vLLM >= 0.9.1 refuses to start when less than gpu_memory_utilization x total is free; the actor's fp32 shards
    # (988,065,536 B) and the CUDA context are on the GPU when vLLMRollout builds the engine: 0.99 x 85.1 GB is not free
    rep = estimate(_scenario(gpu_memory_utilization=0.99))
    assert not rep.fits
    assert any("vLLM would not start" in a and "when verl starts vLLM" in a for a in rep.assumptions)


def test_verl_keys_under_trl_are_stated_as_not_read() -> None:
    sc = {"model": "Qwen/Qwen2.5-0.5B", "hardware": {"gpu": "A100-80GB"},
          "train": {"objective": "grpo", "micro_batch_size": 8}, "rl": {"verl": {"param_offload": True}}}
    assert any(a.startswith("rl.verl set but not used") for a in estimate(sc).assumptions)


def test_vllm_085_charges_the_actor_at_start() -> None:
    # verl v0.5.0 pins vllm<=0.8.5 (setup.py VLLM_REQUIRES); vLLM 0.8.5's V1 budget takes torch's allocated peak and
    # every non-torch byte from gpu_memory_utilization x total, so the actor's fp32 shards on the GPU when the engine
    # starts (988,065,536 B) come out of its KV cache, with the CUDA context and NCCL's buffers; from 0.9.1 they do not
    new = _parts(_scenario())[2]
    old = _parts(_with(_scenario(), rollout={"vllm_version": "0.8.5"}))[2]
    assert new.kv_cache - old.kv_cache >= 988_065_536
    pinned = estimate(_with(_scenario(), rollout={"vllm_version": "0.8.5"}))
    assert not any("pins vllm<=0.8.5" in a for a in pinned.assumptions)
    assert any("pins vllm<=0.8.5" in a for a in estimate(_scenario()).assumptions)


def test_weight_sync_feeding_the_engine_is_the_higher_moment_for_a_7b() -> None:
    # Qwen2.5-7B (untied, V = 152,064, H = 3,584) over tp 2: the state dict's transient is the root unit (2 x 152,064
    # x 3,584 + 3,584 parameters) in fp32, 4,359,993,344 B, plus the embedding's clone 2,179,989,504 B; feeding the
    # engine holds its woken weights (half the model in bf16, about 7.6 GB) and the same 2,179,989,504 B: higher
    sc = {"model": "Qwen/Qwen2.5-7B", "framework": "verl", "hardware": {"gpu": "A100-80GB", "num_gpus": 2},
          "train": {"objective": "grpo", "micro_batch_size": 2},
          "rl": {"verl": {"log_prob_micro_batch_size_per_gpu": 4, "param_offload": True, "optimizer_offload": True}}}
    _, tr, ro = _parts(sc)
    assert tr.context is not None
    assert verl.sync_gather_bytes(tr.context) == 152_064 * 3_584 * 4 == 2_179_989_504
    assert verl.state_dict_bytes(tr.context) == (2 * 152_064 * 3_584 + 3_584) * 4 + 2_179_989_504
    assert ro.weights + 2_179_989_504 > verl.state_dict_bytes(tr.context)
    kept = _without_states(between_steps(tr.terms, "rollout"))
    actor = kept.get(K.PARAMETERS)
    assert _phase(estimate(sc), "weight sync") == kept.total + actor + ro.other + ro.weights + 2_179_989_504


def _without_states(mo: Any) -> Any:
    out = mo.copy(mo.phase)
    out.parts.pop(K.OPTIMIZER_STATES.part, None)  # optimizer_offload: the AdamW states in host memory
    return out


def test_engine_takes_vllm_s_default_max_num_seqs() -> None:
    # verl v0.4.1 / v0.5.0 vllm_rollout_spmd.py builds LLM(...) without max_num_seqs (rollout.max_num_seqs: 1024 in
    # the config is not passed), so vLLM's default applies: at 0.11 (_set_default_args, rule v1-70gib-not-a100)
    # 256 sequences on an A100 (its exception to the >= 70 GiB rule) and 1,024 on an H100
    a100 = _parts(_scenario())[2]
    assert a100.decision.max_num_seqs == 256 and a100.decision.max_num_batched_tokens == 8192
    h100 = _scenario()
    h100["hardware"] = {"gpu": "H100", "num_gpus": 2}
    assert _parts(h100)[2].decision.max_num_seqs == 1024
