"""framework: openrlhf with train.objective ppo (advantage_estimator gae): OpenRLHF v0.8.11's critic and reward model
beside the actor, the reference and the vLLM engines (analytic/openrlhf.py, analytic/lifecycle/openrlhf.py), against
hand arithmetic.

TinyLlama-1.1B (V = 32,000, H = 2,048, I = 5,632, 22 layers, untied head, 1,100,048,384 parameters) on 4 x
A100-80GB, --bf16, prompt_max_len and generate_max_len 1024, micro_train_batch_size 4, micro_rollout_batch_size 8
(OpenRLHF's defaults), vLLM 0.10.2, the reward model and the critic from the policy's checkpoint (--reward_pretrain,
--critic_pretrain: the policy's architecture with a value head).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic import openrlhf
from vramplan.analytic.lifecycle.openrlhf import CriticStep, critic_step
from vramplan.analytic.lifecycle.steps import between_steps
from vramplan.analytic.moment import K
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.report import Report
from vramplan.serve.rollout import RolloutMemory, rollout_memory
from vramplan.spec.checks import ignored_sections
from vramplan.spec.load import Resolved

M = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
P = 1_100_048_384
# the critic and the reward model: P - V H (the untied LM head, 32,000 x 2,048 = 65,536,000) + H (the value head,
# nn.Linear(2,048, 1, bias=False)) = 1,100,048,384 - 65,536,000 + 2,048
CP = 1_034_514_432
# one no-grad critic or reward forward of b = 8 sequences of S = 2,048 tokens (b S = 16,384): no logits; the MLP's
# gate, up and product 16,384 x 5,632 x 2 x 3 = 553,648,128 (above the values, 16,384 x 2 + 8 x 8 x 1,024 =
# 98,304); the residual in and out of a layer 2 x 16,384 x 2,048 x 2 = 134,217,728
VALUE_FORWARD = 553_648_128 + 134_217_728
# the reward model's ZeRO-3 eval shard over 4 GPUs: 2 x 1,034,514,432 / 4
REWARD_SHARD = 517_257_216

COLOCATED = {"colocate_all_models": True, "zero_stage": 3, "vllm_num_engines": 4, "vllm_gpu_memory_utilization": 0.4,
             "vllm_enable_sleep": True, "deepspeed_enable_sleep": True}
APART = {"vllm_num_engines": 2, "vllm_tensor_parallel_size": 2, "colocate_actor_ref": True}


def _scenario(objective: str = "ppo", reward: bool = True, **keys: Any) -> dict[str, Any]:
    rl: dict[str, Any] = {"rollout": {"vllm_version": "0.10.2"}, "openrlhf": {"bf16": True, **keys}}
    if reward:
        rl["reward_model"] = M
    return {"model": M, "framework": "openrlhf", "hardware": {"gpu": "A100-80GB", "num_gpus": 4},
            "train": {"objective": objective}, "rl": rl}


def _parts(sc: dict[str, Any]) -> tuple[TrainResult, RolloutMemory, CriticStep]:
    r = resolve(sc)
    pr = Resolved(openrlhf.policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    o = openrlhf.openrlhf_setup(r.scenario)
    ro = rollout_memory(pr, 0, 0, "OpenRLHF", (openrlhf.rollout_scenario(r.scenario), o.sleep_level, ""),
                        usage="llm")
    return train_step(pr), ro, critic_step(pr)


def _phase(rep: Report, name: str) -> int:
    assert rep.per_gpu.lifecycle is not None
    return rep.per_gpu.lifecycle[name]["allocated_bytes"]


@pytest.fixture(scope="module")
def colocated() -> tuple[Report, TrainResult, RolloutMemory, CriticStep]:
    sc = _scenario(**COLOCATED)
    return estimate(sc), *_parts(sc)


def test_critic_and_reward_pieces_by_hand() -> None:
    tr, _, _ = _parts(_scenario(**COLOCATED))
    c, lay = tr.context, tr.layout
    assert c is not None and lay is not None and c.rp.total == P
    assert openrlhf.critic_params(c) == CP
    assert openrlhf.value_forward_bytes(c, lay, 8, 2048, 1024) == VALUE_FORWARD == 687_865_856
    o = openrlhf.openrlhf_setup(resolve(_scenario(**COLOCATED)).scenario)
    assert openrlhf.reward_bytes(c, o, 4) == REWARD_SHARD
    # below ZeRO-3 the eval engine is stage 0: a whole bf16 copy, 2 x 1,034,514,432; with ref_reward_offload at
    # ZeRO-3 nothing (offload_param)
    o2 = openrlhf.openrlhf_setup(resolve(_scenario(**APART)).scenario)
    assert openrlhf.reward_bytes(c, o2, 4) == 2_069_028_864
    o3 = openrlhf.openrlhf_setup(resolve(_scenario(**COLOCATED, ref_reward_offload=True)).scenario)
    assert openrlhf.reward_bytes(c, o3, 4) == 0


def test_critic_engine_is_the_policys_scaled_without_logits() -> None:
    # ZeRO-2 over 4 GPUs (APART): the critic keeps its whole bf16 parameters 2 x CP = 2,069,028,864, AdamW's two
    # fp32 states over its partition 8 x CP / 4 = 2,069,028,864, the fp32 master 4 x CP / 4 = 1,034,514,432, and
    # DeepSpeed's reduce bucket (reduce_bucket_size 5e8 elements in bf16, not sized by the parameters)
    tr, _, cs = _parts(_scenario(**APART))
    kept = between_steps(tr.terms, "rollout")
    assert kept.get(K.PARAMETERS) == 2 * P and cs.resident.get(K.CRITIC_WEIGHTS) == 2_069_028_864
    assert cs.resident.get(K.CRITIC_OPTIMIZER) == 2_069_028_864 and cs.resident.get(K.CRITIC_MASTER) == 1_034_514_432
    assert cs.resident.get(K.CRITIC_GRADIENTS) == kept.get(K.DS_REDUCE_BUCKETS) == 1_000_000_000
    assert cs.offloadable == 2_069_028_864 + 1_034_514_432 + 1_000_000_000
    # a value head: no logits and no loss tensors of the vocabulary's size in any moment, no actor rows
    for mo in cs.moments:
        assert mo.get(K.LOSS_FORWARD) == mo.get(K.LOSS_BACKWARD) == mo.get(K.OUTPUT_LOGITS_HELD) == 0
        assert mo.get(K.PARAMETERS) == mo.get(K.MASTER) == 0
    # the same saved activations as the actor's model (the value head's input is the LM head's)
    assert max(mo.get(K.CRITIC_ACTIVATIONS) for mo in cs.moments) == max(mo.get(K.SAVED) for mo in tr.moments)


def test_colocated_phases(colocated: tuple[Report, TrainResult, RolloutMemory, CriticStep]) -> None:
    rep, tr, ro, cs = colocated
    assert tr.layout is not None
    gathered = tr.layout.gathered
    away = between_steps(tr.terms, "rollout").without(K.OPTIMIZER_STATES, K.MASTER, K.DS_REDUCE_BUCKETS)
    # the reference's ZeRO-3 shard 2 P / 4 = 550,024,192; the reward model's 517,257,216; the critic's engine with
    # its states in host memory (deepspeed_enable_sleep): its bf16 shard 2 CP / 4 = 517,257,216 and ZeRO-3's
    # persistent small parameters
    critic_kept = cs.resident.total - cs.offloadable
    assert cs.resident.get(K.CRITIC_WEIGHTS) == 517_257_216
    guests = 550_024_192 + REWARD_SHARD + critic_kept
    assert _phase(rep, "rollout") == away.total + guests + ro.weights + ro.kv_cache + ro.activations + ro.other
    # the reward model's and the critic's forwards: a gathered layer (their own ZeRO-3 engines), no logits
    assert _phase(rep, "reward scoring") == away.total + guests + ro.other + gathered + VALUE_FORWARD
    assert _phase(rep, "critic scoring") == away.total + guests + ro.other + gathered + VALUE_FORWARD
    # the critic's update: its states back, its step's highest moment beside the others (not its kept rows)
    step = max(mo.total for mo in cs.moments)
    assert _phase(rep, "critic training step") == away.total + 550_024_192 + REWARD_SHARD + ro.other + step
    # the actor's update: the critic asleep beside it
    assert _phase(rep, "training step") == tr.peak.total + guests + ro.other
    assert list(rep.per_gpu.lifecycle or {}) == ["rollout", "reward scoring", "scoring", "critic scoring",
                                                 "reference scoring", "critic training step", "training step",
                                                 "weight sync"]
    # five processes on the GPU, a CUDA context each
    assert any("(actor, reference, vLLM engine, critic, reward model)" in a for a in rep.assumptions)


def test_critic_free_job_differs_by_the_guests(colocated: tuple[Report, TrainResult, RolloutMemory, CriticStep]
                                               ) -> None:
    rep, _, _, cs = colocated
    grpo = estimate(_scenario("grpo", reward=False, **COLOCATED))
    # the same actor step; the critic's kept engine and the reward model's shard added to every shared phase
    critic_kept = cs.resident.total - cs.offloadable
    for phase in ("rollout", "scoring", "reference scoring", "weight sync"):
        assert _phase(rep, phase) - _phase(grpo, phase) == critic_kept + REWARD_SHARD
    assert "critic training step" not in (grpo.per_gpu.lifecycle or {})
    # a reward model under a critic-free estimator (OpenRLHF builds it without --remote_rm_url)
    with_rm = estimate(_scenario("grpo", **COLOCATED))
    assert _phase(with_rm, "scoring") - _phase(grpo, "scoring") == REWARD_SHARD
    assert "reward scoring" in (with_rm.per_gpu.lifecycle or {})


def test_deepspeed_sleep_moves_the_critics_states_too(
        colocated: tuple[Report, TrainResult, RolloutMemory, CriticStep]) -> None:
    rep, tr, _, cs = colocated
    awake = estimate(_scenario(**{**COLOCATED, "deepspeed_enable_sleep": False}))
    kept = between_steps(tr.terms, "rollout")
    actor = kept.get(K.MASTER) + sum(kept.parts[K.OPTIMIZER_STATES.part].values()) + kept.get(K.DS_REDUCE_BUCKETS)
    # the critic's AdamW states 8 CP / 4 = 2,069,028,864, master 4 CP / 4 = 1,034,514,432, its reduce bucket
    assert cs.offloadable == 2_069_028_864 + 1_034_514_432 + 1_000_000_000
    for phase in ("rollout", "scoring", "critic scoring", "weight sync"):
        assert _phase(awake, phase) - _phase(rep, phase) == actor + cs.offloadable
    assert _phase(awake, "critic training step") - _phase(rep, "critic training step") == actor


def test_apart_the_actor_gpu_is_the_critic_free_ones() -> None:
    sc = _scenario(**APART, colocate_critic_reward=True)
    rep = estimate(sc)
    grpo = estimate(_scenario("grpo", reward=False, **APART))
    # the critic and the reward model on GPUs of their own: the actor's GPU holds what the GRPO job's does
    assert rep.per_gpu.lifecycle == grpo.per_gpu.lifecycle
    notes = [a for a in rep.assumptions if a.startswith("OpenRLHF critic GPU (not this one)")]
    assert len(notes) == 1 and "colocate_critic_reward" in notes[0]
    alone = estimate(_scenario(**APART))
    assert any(a.startswith("OpenRLHF reward model GPU (not this one)") for a in alone.assumptions)


def test_critic_pretrain_defaults_to_the_reward_model_or_the_policy() -> None:
    rep = estimate(_scenario(reward=False, **COLOCATED))
    # --remote_rm_url: no reward model; --critic_pretrain null is the policy's path (train_ppo_ray.py line 486)
    assert "reward scoring" not in (rep.per_gpu.lifecycle or {}) and "critic scoring" in (rep.per_gpu.lifecycle or {})
    assert any(f"--critic_pretrain {M})" in a or f"--critic_pretrain {M} " in a for a in rep.assumptions)


@pytest.mark.parametrize(("objective", "keys", "rl", "where"), [
    ("grpo", {"advantage_estimator": "gae"}, {}, "rl.openrlhf.advantage_estimator"),
    ("ppo", {"advantage_estimator": "group_norm"}, {}, "rl.openrlhf.advantage_estimator"),
    ("dpo", {}, {}, "train.objective"),
    ("ppo", {}, {"reward_model": "meta-llama/Llama-3.2-1B"}, "rl.reward_model"),
    ("ppo", {}, {"value_model": "meta-llama/Llama-3.2-1B"}, "rl.value_model"),
    ("grpo", {}, {"reward_model": "meta-llama/Llama-3.2-1B"}, "rl.reward_model"),
    # the reward model's offload below ZeRO-3 (no reference: init_kl_coef 0)
    ("ppo", {"ref_reward_offload": True}, {"reference_model": "none"}, "rl.openrlhf.ref_reward_offload"),
])
def test_refused_with_the_reason(objective: str, keys: dict[str, Any], rl: dict[str, Any], where: str) -> None:
    sc = _scenario(objective, **APART, **keys)
    sc["rl"] = {**sc["rl"], **rl}
    with pytest.raises(ScenarioError) as err:
        estimate(sc)
    assert where in [p.where for p in err.value.problems]


def test_keys_read_or_said_unused() -> None:
    # reward_model is read under every estimator (a RewardModelActor), value_model only with a critic
    grpo = resolve({**_scenario("grpo", **APART), "rl": {**_scenario("grpo", **APART)["rl"], "value_model": M}})
    notes = ignored_sections(grpo.scenario)
    assert any(n.startswith("rl.value_model set but not used") for n in notes)
    assert not any("rl.reward_model" in n for n in notes)
    ppo = resolve({**_scenario(**APART), "rl": {**_scenario(**APART)["rl"], "value_model": M}})
    assert not any("rl.value_model" in n or "rl.reward_model" in n for n in ignored_sections(ppo.scenario))
    # colocate_critic_reward without a critic: said not read
    rep = estimate(_scenario("grpo", **APART, colocate_critic_reward=True))
    assert any("colocate_critic_reward not read" in a for a in rep.assumptions)


def test_estimator_default_follows_the_objective() -> None:
    # --advantage_estimator gae (line 384) under ppo; group_norm under grpo
    assert resolve(_scenario(**APART)).scenario.rl.openrlhf.advantage_estimator == "gae"
    assert resolve(_scenario("grpo", **APART)).scenario.rl.openrlhf.advantage_estimator == "group_norm"


def test_report_scenario_estimates_again_to_itself(
        colocated: tuple[Report, TrainResult, RolloutMemory, CriticStep]) -> None:
    from vramplan.spec.scenario import Scenario

    rep = colocated[0]
    assert estimate(Scenario.model_validate(rep.scenario)).per_gpu.lifecycle == rep.per_gpu.lifecycle


def test_critic_defaults_of_the_release_read() -> None:
    from vramplan.facts.openrlhf import openrlhf_defaults

    # train_ppo_ray.py v0.8.11: --colocate_critic_reward false (line 211), --advantage_estimator gae (384)
    row = openrlhf_defaults("0.8.11")
    assert (row.colocate_critic_reward, row.advantage_estimator) == (False, "gae")
    # null colocate_critic_reward is filled into the echo
    assert resolve(_scenario(**APART)).scenario.rl.openrlhf.colocate_critic_reward is False


def test_value_model_given_as_the_policy_is_the_default() -> None:
    sc = _scenario(**COLOCATED)
    given = {**sc, "rl": {**sc["rl"], "value_model": M}}
    assert estimate(given).per_gpu.lifecycle == estimate(sc).per_gpu.lifecycle


def test_tied_head_critic() -> None:
    # Qwen2.5-0.5B ties its head to the embedding (494,032,768 parameters, the embedding counted once): the critic
    # keeps the embedding and adds the value head, 494,032,768 + 896 = 494,033,664; the tied head's gradient
    # contribution to the embedding's is the actor's only
    q = "Qwen/Qwen2.5-0.5B"
    sc = {"model": q, "framework": "openrlhf", "hardware": {"gpu": "A100-80GB", "num_gpus": 2},
          "train": {"objective": "ppo"}, "rl": {"reward_model": q, "rollout": {"vllm_version": "0.10.2"},
                                                "openrlhf": {"bf16": True, "vllm_num_engines": 2}}}
    r = resolve(sc)
    pr = Resolved(openrlhf.policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    tr, cs = train_step(pr), critic_step(pr)
    assert tr.context is not None and openrlhf.critic_params(tr.context) == 494_033_664
    # ZeRO-2: the critic's whole bf16 parameters, 2 x 494,033,664
    assert cs.resident.get(K.CRITIC_WEIGHTS) == 988_067_328
    assert max(mo.get(K.TIED_EMBEDDING) for mo in tr.moments) > 0
    assert max(mo.get(K.TIED_EMBEDDING) for mo in cs.moments) == 0
