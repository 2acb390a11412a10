"""framework: openrlhf (analytic/openrlhf.py, facts/openrlhf.py): OpenRLHF v0.8.11's Ray layout on an actor GPU,
phase by phase, against hand arithmetic.

Qwen2.5-7B (V = 152,064, H = 3,584, I = 18,944, 28 layers, untied head, 7,615,616,512 parameters) on 8 x H100-80GB,
critic-free GRPO (advantage_estimator group_norm), --bf16, prompt_max_len and generate_max_len 1024 (OpenRLHF's),
micro_train_batch_size 4 and micro_rollout_batch_size 8 (OpenRLHF's), vLLM 0.10.2 (OpenRLHF's setup.py pin).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic import openrlhf
from vramplan.analytic.lifecycle.steps import between_steps
from vramplan.analytic.moment import K
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.openrlhf import ADVANTAGE_ESTIMATORS, CRITIC_FREE, READ_AT, VLLM_PIN, openrlhf_defaults
from vramplan.report import Report
from vramplan.serve.rollout import RolloutMemory, rollout_memory
from vramplan.spec.load import Resolved
from vramplan.spec.scenario import Scenario

V, H, P = 152_064, 3_584, 7_615_616_512
# a ZeRO-3 shard of the bf16 parameters over 8 GPUs: 2 x 7,615,616,512 / 8
SHARD = 1_903_904_128
# one no-grad Actor.forward of b = 8 sequences of 2,048 tokens: L = 8 x 2,048 x 152,064 = 2,491,416,576 elements;
# the bf16 logits and their fp32 copy, 6 L = 14,948,499,456 B (above the MLP, 16,384 x 18,944 x 2 x 3 =
# 1,862,270,976); the residual stream in and out of a layer, 2 x 16,384 x 3,584 x 2 = 234,881,024
SCORING = 14_948_499_456 + 234_881_024


def _scenario(**keys: Any) -> dict[str, Any]:
    return {"model": "Qwen/Qwen2.5-7B", "framework": "openrlhf", "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
            "train": {"objective": "grpo"},
            "rl": {"rollout": {"vllm_version": "0.10.2"}, "openrlhf": {"bf16": True, **keys}}}


# the colocated setup: everything on every GPU, ZeRO-3, 8 engines of tp 1 at 0.5 asleep between uses, the actor's
# states asleep outside its update
COLOCATED = {"colocate_all_models": True, "zero_stage": 3, "vllm_num_engines": 8, "vllm_gpu_memory_utilization": 0.5,
             "vllm_enable_sleep": True, "deepspeed_enable_sleep": True}
# apart: ZeRO-2 (OpenRLHF's default), 4 engines of tp 2 on GPUs of their own, the reference on the actor's GPUs
APART = {"vllm_num_engines": 4, "vllm_tensor_parallel_size": 2, "colocate_actor_ref": True}


def _parts(sc: dict[str, Any]) -> tuple[Resolved, TrainResult, RolloutMemory]:
    r = resolve(sc)
    pr = Resolved(openrlhf.policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    tr = train_step(pr)
    o = openrlhf.openrlhf_setup(r.scenario)
    ro = rollout_memory(pr, 0, 0, "OpenRLHF", (openrlhf.rollout_scenario(r.scenario), o.sleep_level, ""),
                        usage="llm")
    return r, tr, ro


@pytest.fixture(scope="module")
def colocated() -> tuple[Report, TrainResult, RolloutMemory]:
    sc = _scenario(**COLOCATED)
    _, tr, ro = _parts(sc)
    return estimate(sc), tr, ro


def _phase(rep: Report, name: str) -> int:
    assert rep.per_gpu.lifecycle is not None
    return rep.per_gpu.lifecycle[name]["allocated_bytes"]


def test_defaults_of_the_release_read() -> None:
    # train_ppo_ray.py v0.8.11: --zero_stage 2 (line 272), --vllm_gpu_memory_utilization 0.95 (244),
    # --micro_train_batch_size 4 (338), --micro_rollout_batch_size 8 (323), --prompt_max_len / --generate_max_len
    # 1024 (325, 326), --advantage_estimator gae (384), --bf16 false (275), --vllm_num_engines None (225)
    row = openrlhf_defaults(None)
    assert READ_AT == ("0.8.11",) and row.release == "0.8.11" and VLLM_PIN == (0, 10, 2)
    assert (row.zero_stage, row.vllm_gpu_memory_utilization, row.micro_train_batch_size) == (2, 0.95, 4)
    assert (row.micro_rollout_batch_size, row.prompt_max_len, row.generate_max_len) == (8, 1024, 1024)
    assert (row.advantage_estimator, row.bf16, row.vllm_num_engines, row.sleep_level) == ("gae", False, None, 1)
    assert (row.vllm_tensor_parallel_size, row.enforce_eager, row.gradient_checkpointing) == (1, False, False)
    assert set(ADVANTAGE_ESTIMATORS) - set(CRITIC_FREE) == {"gae"}


def test_defaults_are_filled_into_the_echo() -> None:
    s = resolve(_scenario(vllm_num_engines=8)).scenario
    o = s.rl.openrlhf
    assert (o.release, o.zero_stage, o.vllm_gpu_memory_utilization, o.advantage_estimator) == (
        "0.8.11", 2, 0.95, "group_norm")
    assert (o.micro_train_batch_size, o.micro_rollout_batch_size, o.prompt_max_len, o.generate_max_len) == (
        4, 8, 1024, 1024)
    # --init_kl_coef 0.01 > 0 builds the reference; --gradient_checkpointing false; TRL's beta not filled in
    assert s.rl.reference_model == "separate" and s.train.gradient_checkpointing == "none" and s.rl.beta is None


def test_loss_tensors_by_hand() -> None:
    # b = 4, S = 2,048: L = 4 x 2,048 x 152,064 = 1,245,708,288 elements; the fp32 logits saved by flash-attn's
    # cross_entropy_loss 4 L; the bf16 logits beside them at the cast 2 L; the backward's fresh fp32 gradient 4 L
    # with its bf16 cast 2 L (ToCopyBackward), the held fp32 logits still alive
    lt = openrlhf.openrlhf_loss_tensors(4, 2048, V, 2)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (4_982_833_152, 2_491_416_576, 7_474_249_728)


def test_output_logits_held_through_the_optimizer_step(colocated: tuple[Report, TrainResult, RolloutMemory]) -> None:
    _, tr, _ = colocated
    # training_step's output keeps the fp32 logits (4 L = 4,982,833,152 B) through the backward and the optimizer
    # step, not between steps
    opt = [mo for mo in tr.moments if mo.phase == "optimizer"]
    assert opt and opt[-1].get(K.OUTPUT_LOGITS_HELD) == 4_982_833_152
    assert tr.moments[0].get(K.OUTPUT_LOGITS_HELD) == 0
    assert between_steps(tr.terms, "rollout").get(K.OUTPUT_LOGITS_HELD) == 0


def test_colocated_pieces_by_hand(colocated: tuple[Report, TrainResult, RolloutMemory]) -> None:
    _, tr, _ = colocated
    c, lay = tr.context, tr.layout
    assert c is not None and lay is not None and c.rp.total == P
    assert openrlhf.log_prob_forward_bytes(c, lay, 8, 2048) == SCORING == 15_183_380_480
    o = openrlhf.openrlhf_setup(resolve(_scenario(**COLOCATED)).scenario)
    # the embedding (152,064 x 3,584) whole in bf16, gathered (ZeRO-3) and cloned (CUDA IPC): 2 x 1,089,994,752
    assert openrlhf.sync_bytes(c, o) == 2 * V * H * 2 == 2_179_989_504
    # the reference's ZeRO-3 eval engine: a shard of its bf16 parameters
    assert openrlhf.reference_bytes(c, o, 8) == SHARD
    assert between_steps(tr.terms, "rollout").get(K.PARAMETERS) == SHARD


def test_colocated_phases(colocated: tuple[Report, TrainResult, RolloutMemory]) -> None:
    rep, tr, ro = colocated
    assert tr.layout is not None
    # deepspeed_enable_sleep: optimizer states, fp32 master and the gradient buffer in host memory
    away = between_steps(tr.terms, "rollout").without(K.OPTIMIZER_STATES, K.MASTER, K.DS_REDUCE_BUCKETS)
    gathered = tr.layout.gathered
    # generation: the actor's half shards, the reference's shard, the woken engine whole
    assert _phase(rep, "rollout") == away.total + SHARD + ro.weights + ro.kv_cache + ro.activations + ro.other
    # scorings: the engine asleep (level 1: only its graphs and non-torch memory), a gathered layer, the forward
    assert _phase(rep, "scoring") == away.total + SHARD + ro.other + gathered + SCORING
    assert _phase(rep, "reference scoring") == _phase(rep, "scoring")
    # the update: DeepSpeed's step (states reloaded) beside the reference's shard and the sleeping engine
    assert _phase(rep, "training step") == tr.peak.total + SHARD + ro.other
    # weight sync: the engine woken whole (wake_up()), the embedding gathered and cloned
    assert _phase(rep, "weight sync") == away.total + SHARD + ro.weights + ro.kv_cache + ro.other + 2_179_989_504
    assert list(rep.per_gpu.lifecycle or {}) == ["rollout", "scoring", "reference scoring", "training step",
                                                 "weight sync"]
    # vLLM >= 0.9.1: the engine's budget is 0.5 x the H100's total
    d = ro.decision
    assert abs(d.requested_bytes - 0.5 * d.total_memory_bytes) < 1 and ro.sleep_level == 1
    # OpenRLHF passes neither batch limit to vllm.LLM: the offline LLM class's V1 defaults on an H100 (>= 70 GiB,
    # not an A100), 16,384 tokens and 1,024 sequences (vLLM _set_default_args_v1)
    assert (d.max_num_batched_tokens, d.max_num_seqs) == (16_384, 1_024)
    # host: the fp32 master and Adam's two states over the shard (12 P / 8 = 11,423,424,768), the gradient buffer
    # and the engine's weights
    kept = between_steps(tr.terms, "rollout")
    assert kept.get(K.MASTER) + sum(kept.parts[K.OPTIMIZER_STATES.part].values()) == 11_423_424_768
    assert rep.host.offloaded_bytes == 11_423_424_768 + kept.get(K.DS_REDUCE_BUCKETS) + ro.weights


def test_apart_phases() -> None:
    sc = _scenario(**APART)
    rep = estimate(sc)
    _, tr, ro = _parts(sc)
    kept = between_steps(tr.terms, "rollout")
    # the reference's stage-0 eval engine below ZeRO-3: a whole bf16 copy on each GPU, 2 x 7,615,616,512
    ref = 15_231_233_024
    # no engine on the actor's GPU; ZeRO-2: nothing gathered, rank 0 broadcasts param.data itself (no copy)
    assert _phase(rep, "rollout") == kept.total + ref
    assert _phase(rep, "scoring") == _phase(rep, "reference scoring") == kept.total + ref + SCORING
    assert _phase(rep, "training step") == tr.peak.total + ref
    assert _phase(rep, "weight sync") == kept.total + ref
    assert any(a.startswith("OpenRLHF engine GPU (not this one)") for a in rep.assumptions)
    # the engines apart: over tp 2, their weights are half the model's on each of their GPUs
    assert ro.decision.weights_bytes < 2 * P // 2 + 10**9


def test_report_scenario_estimates_again_to_itself(colocated: tuple[Report, TrainResult, RolloutMemory]) -> None:
    rep = colocated[0]
    assert estimate(Scenario.model_validate(rep.scenario)).per_gpu.lifecycle == rep.per_gpu.lifecycle


@pytest.mark.parametrize(("keys", "rl", "train", "where"), [
    ({"bf16": None}, {}, {}, "rl.openrlhf.bf16"),
    ({"vllm_num_engines": None}, {}, {}, "rl.openrlhf.vllm_num_engines"),
    ({**COLOCATED, "vllm_num_engines": 4}, {}, {}, "rl.openrlhf.vllm_num_engines"),
    ({"vllm_num_engines": 8, "advantage_estimator": "gae"}, {}, {}, "rl.openrlhf.advantage_estimator"),
    ({"vllm_num_engines": 8, "packing_samples": True}, {}, {}, "rl.openrlhf.packing_samples"),
    ({"vllm_num_engines": 8, "colocate_actor_ref": True, "ref_reward_offload": True}, {}, {},
     "rl.openrlhf.ref_reward_offload"),
    ({"vllm_num_engines": 8, "ref_reward_offload": True}, {}, {}, "rl.openrlhf.ref_reward_offload"),
    ({"vllm_num_engines": 8, "deepspeed_enable_sleep": True}, {}, {}, "rl.openrlhf.deepspeed_enable_sleep"),
    ({"vllm_num_engines": 8}, {"beta": 0.04}, {}, "rl.beta"),
    ({"vllm_num_engines": 8}, {"reference_model": "shared"}, {}, "rl.reference_model"),
    ({"vllm_num_engines": 8}, {"rollout": {"gpu_memory_utilization": 0.6}}, {}, "rl.rollout.gpu_memory_utilization"),
    ({"vllm_num_engines": 8}, {"rollout": {"max_prompt_len": 256}}, {}, "rl.rollout.max_prompt_len"),
    ({"vllm_num_engines": 8}, {}, {"micro_batch_size": 2}, "train.micro_batch_size"),
    ({"vllm_num_engines": 8}, {}, {"objective": "dpo"}, "train.objective"),
    ({"vllm_num_engines": 8}, {}, {"peft": {"method": "lora"}}, "train.peft"),
])
def test_refused_with_the_reason(keys: dict[str, Any], rl: dict[str, Any], train: dict[str, Any], where: str) -> None:
    sc = _scenario(**keys)
    sc["rl"] = {**sc["rl"], **rl, "openrlhf": sc["rl"]["openrlhf"] | {k: v for k, v in keys.items() if v is None}}
    sc["train"] = {**sc["train"], **train}
    with pytest.raises(ScenarioError) as err:
        estimate(sc)
    assert where in [p.where for p in err.value.problems]


def test_openrlhf_block_unused_elsewhere_is_said() -> None:
    from vramplan.spec.checks import ignored_sections

    s = Scenario.model_validate({"model": "Qwen/Qwen2.5-7B", "train": {"objective": "grpo"},
                                 "rl": {"openrlhf": {"zero_stage": 3}}})
    assert any(n.startswith("rl.openrlhf set but not used") for n in ignored_sections(s))


def test_engine_awake_without_vllm_enable_sleep(colocated: tuple[Report, TrainResult, RolloutMemory]) -> None:
    rep, _, ro = colocated
    awake = estimate(_scenario(**{**COLOCATED, "vllm_enable_sleep": False}))
    # the engine keeps its weights and KV cache through the update, and nothing goes to host memory for it
    assert _phase(awake, "training step") - _phase(rep, "training step") == ro.weights + ro.kv_cache
    assert _phase(awake, "scoring") - _phase(rep, "scoring") == ro.weights + ro.kv_cache
    assert rep.host.offloaded_bytes - awake.host.offloaded_bytes == ro.weights


def test_deepspeed_sleep_moves_the_states_out_of_the_other_phases(
        colocated: tuple[Report, TrainResult, RolloutMemory]) -> None:
    rep, tr, _ = colocated
    awake = estimate(_scenario(**{**COLOCATED, "deepspeed_enable_sleep": False}))
    kept = between_steps(tr.terms, "rollout")
    moved = kept.get(K.MASTER) + sum(kept.parts[K.OPTIMIZER_STATES.part].values()) + kept.get(K.DS_REDUCE_BUCKETS)
    for phase in ("rollout", "scoring", "reference scoring", "weight sync"):
        assert _phase(awake, phase) - _phase(rep, phase) == moved
    assert _phase(awake, "training step") == _phase(rep, "training step")
