"""PPO (train.objective: ppo): TRL v1.12.0's PPOTrainer (analytic/ppo.py, analytic/lifecycle/ppo.py, docs/rl.md).

Worked example: Qwen2.5-0.5B (494,032,768 parameters, tied head; 24 layers, H 896, V 151,936, I 4,864, 2 KV heads of
64) on an A100-80GB, bf16-true, per_device_train_batch_size 4, gradient_accumulation_steps 2 (rollout batch B = 8,
local_rollout_forward_batch_size min(64, 8) = 8), queries of 128 tokens, response_length 53 (PPOConfig's default).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan.analytic import ppo
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.errors import ScenarioError

BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "ppo", "micro_batch_size": 4, "grad_accum_steps": 2,
                                  "precision": "bf16-true"},
                        "rl": {"rollout": {"max_prompt_len": 128}}}
V, H, PARAMS = 151_936, 896, 494_032_768
W = PARAMS * 2  # the policy (and the reference copy) in bf16: 988,065,536
WV = (PARAMS + H) * 2  # value and reward models: the tied embedding kept, a 896 x 1 score added: 988,067,328
OPT, OPTV = PARAMS * 4, (PARAMS + H) * 4  # AdamW's two bf16 states (bf16-true): 1,976,131,072 and 1,976,134,656
CUBLAS = 17_039_360  # the step's cuBLAS workspaces (analytic/overhead.py), as every training report
SCORES = 8 * 53 * V * 4  # B x R x V fp32 generate scores: 257,683,456


def _doc(**train: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    doc["train"].update(train)
    return doc


def test_loss_tensors_by_hand() -> None:
    # L = 4 x 181 x 151,936 x 2 = 220,003,328; rows b R V x 2 = 4 x 53 x 151,936 x 2 = 64,420,864
    # saved = L + rows = 284,424,192 (logits held by ``output``, the per-sequence log_softmax outputs)
    # backward extra = max(2 x 64,420,864 + 2 x 53 x 151,936 x 2, 2 x 220,003,328 + 64,420,864) = 504,427,520
    kt = ppo.ppo_loss_tensors(4, 128, 53, V, 2)
    assert (kt.saved, kt.forward_extra, kt.backward_extra) == (284_424_192, 0, 504_427_520)
    # fp32 logits: logsumexp keeps the logits only; one sequence's exp at a time (53 x 151,936 x 4 = 32,210,432)
    kt32 = ppo.ppo_loss_tensors(4, 128, 53, V, 4)
    assert (kt32.saved, kt32.forward_extra) == (440_006_656, 32_210_432)


def test_scoring_forward_buffers_and_carry_by_hand() -> None:
    # 25 hidden states x 8 x 181 x 896 x 2 = 64,870,400; logits 8 x 181 x 151,936 x 2 + one sequence's log_softmax
    # 53 x 151,936 x 2 = 456,111,872 (above the MLP's 8 x 181 x 4,864 x 2 x 3 = 42,258,432)
    assert ppo.scoring_forward_bytes(24, 8, 128, 53, H, V, 4_864, True, 2) == 520_982_272
    # 8 x 181 x 8 + 3 x 8 x 53 x 8 + 10 x 8 x 53 x 4 + 2 x 8 x 53 = 11,584 + 10,176 + 16,960 + 848
    assert ppo.rollout_buffers_bytes(8, 128, 53) == 39_568
    # previous micro-batch: logits 220,003,328 + 25 x 4 x 181 x 896 x 2 = 32,435,200 + prob_dist 64,420,864
    assert ppo.carried_bytes(24, 4, 128, 53, H, V, 2) == (316_859_392, 64_420_864)
    assert ppo.value_params(PARAMS, 0, H) == PARAMS + H
    assert ppo.value_params(1000, 300, 10) == 710  # an untied head replaced by the score


def test_training_step_by_hand() -> None:
    rep = estimate(BASE)
    d = rep.per_gpu.breakdown_detail
    assert d["weights"] == {"parameters": W, "value model": WV, "reference model": W, "reward model": WV}
    assert d["optimizer_states"] == {"adamw": OPT, "value model": OPTV}
    # gradient accumulation: both models' gradients alive at the policy's loss backward
    assert d["gradients"] == {"parameter gradients": W, "value model": WV}
    # neither model checkpointed (PPOTrainer never enables it), same tokens: the same saved activations
    assert d["activations"]["value model (saved)"] == d["activations"]["saved by layers"] == 1_002_899_280
    assert d["temporaries"] == {"logits and loss gradients": 284_424_192 + 504_427_520,
                                "generate scores (PPO)": SCORES, "rollout buffers (PPO)": 39_568,
                                "previous micro-batch's outputs (PPO)": 64_420_864}
    # 2 x 988,065,536 + 2 x 988,067,328 + 1,976,131,072 + 1,976,134,656 + 17,039,360 + 988,065,536 + 988,067,328
    # + 2 x 1,002,899,280 + 788,851,712 + 257,683,456 + 39,568 + 64,420,864 = 13,014,497,840
    assert rep.per_gpu.peak_allocated_bytes == 13_014_497_840
    assert rep.per_gpu.lifecycle_peak_phase == "training step"
    # the report names PPO's loss, not the supervised one
    assert any(a.startswith("loss as TRL v1.12.0's PPOTrainer") for a in rep.assumptions)
    assert not any(a.startswith("loss as transformers") for a in rep.assumptions)


def test_scoring_and_rollout_phases_by_hand() -> None:
    life = estimate(BASE).per_gpu.lifecycle
    resident = W + OPT + CUBLAS + WV + OPTV + W + WV  # policy, its states, cuBLAS, value, reference, reward
    # scoring: the residents, the new scores, the buffers and one reference forward of 8 sequences
    assert life["scoring"]["allocated_bytes"] == resident + SCORES + 39_568 + 520_982_272 == 8_700_276_112
    # rollout: the previous scores, this chunk's scores and their stacked copy (B = rf: no earlier chunk), the
    # generate's KV cache (8 x 180 cached tokens x 24 layers x 2 x 2 heads x 64 x 2 B = 17,694,720) and the inference
    # engine's running tensors and sampling (39,264,256, analytic/inference.py); pad's 3 x scores is lower
    assert life["rollout"]["allocated_bytes"] == resident + 3 * SCORES + 17_694_720 + 39_264_256 == 8_751_580_160
    # load: the four models' weights, no optimizer state yet
    assert life["load"]["allocated_bytes"] == 2 * W + 2 * WV


def test_one_micro_batch_per_mini_batch_carries_nothing() -> None:
    rep = estimate(_doc(grad_accum_steps=1))
    assert "previous micro-batch's outputs (PPO)" not in rep.per_gpu.breakdown_detail.get("temporaries", {})
    # num_mini_batches 2 over 2 micro-batches: one micro-batch per mini-batch likewise
    doc = _doc()
    doc["rl"]["num_mini_batches"] = 2
    assert estimate(doc).per_gpu.peak_allocated_bytes < estimate(BASE).per_gpu.peak_allocated_bytes


def test_peft_shares_the_reference_and_trains_the_whole_value_model() -> None:
    rep = estimate(_doc(peft={"method": "lora", "rank": 16}))
    d = rep.per_gpu.breakdown_detail
    assert "reference model" not in d["weights"]  # null_ref_context: the policy with adapters disabled
    assert d["optimizer_states"]["value model"] == OPTV  # get_peft_model reaches the policy only
    assert d["weights"]["reward model"] == WV


def test_dumped_scenario_round_trip() -> None:
    rep = estimate(BASE)
    assert rep.scenario["rl"]["rollout"]["engine"] == "hf-generate"
    assert rep.scenario["rl"]["rollout"]["max_completion_len"] == ppo.PPO_RESPONSE_LENGTH
    again = estimate(json.loads(json.dumps(rep.scenario)))
    assert again.per_gpu == rep.per_gpu and again.assumptions == rep.assumptions


def test_rollout_engine_null_resolves_by_objective_not_by_presence() -> None:
    # null is PPOTrainer's only way (hf-generate) under ppo and vllm under grpo; a value given equal to that is the
    # same input as leaving it out, and with_defaults reads the value, not whether the key was present
    from vramplan.spec.defaults import rollout_engine
    from vramplan.spec.scenario import Scenario
    ppo_s = Scenario.model_validate(_doc())
    assert ppo_s.rl.rollout.engine is None and rollout_engine(ppo_s) == "hf-generate"
    assert ppo.with_defaults(ppo_s).rl.rollout.engine == "hf-generate"
    grpo_s = ppo_s.model_copy(update={"train": ppo_s.train.model_copy(update={"objective": "grpo"})})
    assert rollout_engine(grpo_s) == "vllm"
    null_doc, given_doc = _doc(), _doc()
    null_doc["rl"]["rollout"] = {**null_doc["rl"].get("rollout", {}), "engine": None}
    given_doc["rl"]["rollout"] = {**given_doc["rl"].get("rollout", {}), "engine": "hf-generate"}
    null_rep, given_rep = estimate(null_doc), estimate(given_doc)
    assert null_rep.per_gpu == given_rep.per_gpu and null_rep.scenario == given_rep.scenario


@pytest.mark.parametrize(("change", "where"), [
    ({"train": {"precision": "bf16-mixed"}}, "train.precision"),
    ({"rl": {"rollout": {"engine": "vllm"}}}, "rl.rollout.engine"),
    ({"rl": {"rollout": {"gpu_memory_utilization": 0.5}}}, "rl.rollout"),
    ({"rl": {"rollout": {"num_generations": 4}}}, "rl.rollout.num_generations"),
    ({"rl": {"beta": 0.1}}, "rl.beta"),
    ({"rl": {"reference_model": "none"}}, "rl.reference_model"),
    ({"rl": {"reward_model": "Qwen/Qwen2.5-7B"}}, "rl.reward_model"),
    ({"rl": {"value_model": "Qwen/Qwen2.5-7B"}}, "rl.value_model"),
    ({"rl": {"num_mini_batches": 3}}, "rl.num_mini_batches"),
    ({"software": {"trl": "1.13.0"}}, "software.trl"),
    ({"software": {"trl": "0.11.4"}}, "software.trl"),
    ({"train": {"seq_len": 1024}}, "train.seq_len"),
    ({"train": {"quantization": "nf4", "peft": {"method": "lora"}}}, "train.quantization"),
    ({"parallel": {"zero_stage": 3}, "hardware": {"gpu": "A100-80GB", "num_gpus": 8}}, "parallel"),
    ({"train": {"loss": "liger-fused-linear-ce"}}, "train.loss"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    doc = json.loads(json.dumps(BASE))
    for section, values in change.items():
        if isinstance(values, dict) and isinstance(doc.get(section), dict):
            for k, v in values.items():
                if isinstance(v, dict) and isinstance(doc[section].get(k), dict):
                    doc[section][k].update(v)
                else:
                    doc[section][k] = v
        else:
            doc[section] = values
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == where for p in exc.value.problems), exc.value


def test_release_1_12_and_the_same_model_id_are_accepted() -> None:
    doc = json.loads(json.dumps(BASE))
    doc["software"] = {"trl": "1.12.0"}
    doc["rl"].update(reward_model="qwen2.5-0.5b", value_model="qwen2.5-0.5b")
    assert estimate(doc).per_gpu.peak_allocated_bytes == estimate(BASE).per_gpu.peak_allocated_bytes


@settings(max_examples=10, deadline=None)
@given(r=st.integers(1, 200), extra=st.integers(1, 200))
def test_longer_responses_never_need_less(r: int, extra: int) -> None:
    lo, hi = (json.loads(json.dumps(BASE)) for _ in range(2))
    lo["rl"]["rollout"]["max_completion_len"] = r
    hi["rl"]["rollout"]["max_completion_len"] = r + extra
    a, b = estimate(lo).per_gpu, estimate(hi).per_gpu
    assert b.peak_allocated_bytes >= a.peak_allocated_bytes
    assert b.lifecycle["rollout"]["allocated_bytes"] >= a.lifecycle["rollout"]["allocated_bytes"]


def test_cli_estimate_ppo() -> None:
    res = CliRunner().invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--objective", "ppo",
                                   "--precision", "bf16-true", "--micro-batch-size", "4", "--grad-accum-steps", "2",
                                   "--max-prompt-len", "128", "--num-mini-batches", "1",
                                   "--rollout-forward-batch-size", "64", "--json"],
                             env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["per_gpu"]["peak_allocated_bytes"] == 13_014_497_840
    assert doc["scenario"]["rl"]["rollout_forward_batch_size"] == 64


# --- CPU checks with the installed torch and transformers (tiny random Qwen2 models) ---------------------------------

def _tiny(tied: bool) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied, num_labels=1,
                       id2label={0: "score"}, label2id={"score": 0}, pad_token_id=0)


@pytest.mark.parametrize("tied", [True, False])
def test_value_model_parameters_on_cpu(tied: bool) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cfg = _tiny(tied)
    policy, value = AutoModelForCausalLM.from_config(cfg), AutoModelForSequenceClassification.from_config(cfg)
    n = sum(p.numel() for p in policy.parameters())
    untied_head = 0 if tied else 512 * 64
    assert sum(p.numel() for p in value.parameters()) == ppo.value_params(n, untied_head, 64)


def test_generate_scores_and_hidden_states_on_cpu() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(_tiny(True)).to(torch.bfloat16)
    x = torch.randint(1, 512, (3, 9))
    out = model.generate(input_ids=x, max_new_tokens=5, do_sample=True, top_k=0, top_p=1.0, pad_token_id=0,
                         return_dict_in_generate=True, output_scores=True)
    stacked = torch.stack(out.scores, 1)
    # fp32 scores of a bf16 model: B x R x V x 4 bytes (scores_bytes)
    assert stacked.dtype == torch.float32 and stacked.nbytes == ppo.scores_bytes(3, 5, 512)
    assert out.past_key_values is not None  # the cache lives in the output until it is dropped
    with torch.no_grad():
        fwd = model(input_ids=x, output_hidden_states=True, return_dict=True)
    # layers + 1 hidden states, each its own storage, and bf16 logits (no upcast without labels)
    assert len({h.untyped_storage().data_ptr() for h in fwd.hidden_states}) == 2 + 1
    assert fwd.logits.dtype == torch.bfloat16


def test_selective_log_softmax_saves_one_row_block_per_sequence_on_cpu() -> None:
    import torch
    from trl.trainer.utils import selective_log_softmax

    b, s, r, v = 2, 9, 5, 512
    # a non-leaf, as the head's output is
    logits = torch.randn(b, s, v, dtype=torch.bfloat16, requires_grad=True) * 1.0
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # log_softmax's output is saved twice (LogSoftmaxBackward and gather's backward): one storage
        if t.dim() == 2 and t.shape == (r, v):
            sizes[t.untyped_storage().data_ptr()] = t.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        view = logits[:, s - r - 1: -1]
        view /= 0.7
        selective_log_softmax(view, torch.randint(0, v, (b, r)))
    # the torch path (TRL 1.12.0's, unchanged in the installed release on the CPU): one log_softmax output of R x V
    # per sequence kept for the backward: b R V x 2 bytes, the ``rows`` of ppo_loss_tensors
    assert len(sizes) == b and sum(sizes.values()) == b * r * v * 2


def test_untied_head_value_model_by_hand() -> None:
    # Llama-3.1-8B: 8,030,261,248 parameters, an untied 128,256 x 4,096 head (525,336,576); the value and reward
    # models: 8,030,261,248 - 525,336,576 + 4,096 = 7,504,928,768 parameters x 2 B = 15,009,857,536
    doc = json.loads(json.dumps(BASE))
    doc["model"] = "llama-3.1-8b"
    doc["train"].update(micro_batch_size=1, grad_accum_steps=1)
    w = estimate(doc).per_gpu.breakdown_detail["weights"]
    assert w["value model"] == w["reward model"] == 15_009_857_536
    assert w["parameters"] == w["reference model"] == 8_030_261_248 * 2


@settings(max_examples=8, deadline=None)
@given(rf=st.integers(1, 7))
def test_smaller_rollout_chunks_never_need_more_at_the_rollout(rf: int) -> None:
    # the last chunk's moment is prev B + (B - rf) + 2 rf scores plus its cache: it grows with rf; pad's 3 B does not
    lo, hi = (json.loads(json.dumps(BASE)) for _ in range(2))
    lo["rl"]["rollout_forward_batch_size"] = rf
    hi["rl"]["rollout_forward_batch_size"] = rf + 1
    assert (estimate(lo).per_gpu.lifecycle["rollout"]["allocated_bytes"]
            <= estimate(hi).per_gpu.lifecycle["rollout"]["allocated_bytes"])


@pytest.mark.parametrize(("rl", "where"), [
    ({"rollout_forward_batch_size": 0}, "rl.rollout_forward_batch_size"),
    ({"num_mini_batches": -1}, "rl.num_mini_batches"),
    ({"value_model": 7}, "rl.value_model"),
    ({"reward_model": ["a"]}, "rl.reward_model"),
])
def test_hostile_rl_values_are_refused(rl: dict[str, Any], where: str) -> None:
    doc = json.loads(json.dumps(BASE))
    doc["rl"].update(rl)
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == where for p in exc.value.problems), exc.value
