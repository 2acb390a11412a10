"""RLOO post-training (train.objective: rloo): TRL v1.16.0's RLOOTrainer, modelled as GRPO is.

The oracle is Qwen2.5-0.5B (494,032,768 parameters, hidden 896, MLP 4,864, 24 layers, vocabulary 151,936, tied
embeddings) on an A100-80GB, RLOOConfig's defaults: bf16 autocast over fp32 parameters, AdamW, gradient
checkpointing, beta 0.05 (a separate reference copy without PEFT), num_generations 2, 512 prompt + 512 completion
tokens, 8 completions per device, vLLM 0.11 colocated at gpu_memory_utilization 0.3, no sleep mode.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from vramplan.analytic.grpo import policy_scenario, reference_kind
from vramplan.analytic.rloo import RLOO_BETA, RLOO_MAX_COMPLETION, RLOO_NUM_GENERATIONS, with_defaults
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.load import Resolved

BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "rloo", "micro_batch_size": 8}}
A100 = "A100-80GB"
REFERENCE = 494_032_768 * 4  # the separate fp32 reference copy: 1,976,131,072


def _doc(**rl: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(BASE))
    if rl:
        doc["rl"] = rl
    return doc


def test_rloo_config_defaults_are_filled_in() -> None:
    s = with_defaults(resolve(BASE).scenario)
    assert (s.rl.beta, s.rl.rollout.num_generations, s.rl.rollout.max_completion_len) == (0.05, 2, 512)
    assert reference_kind(s) == "separate" and policy_scenario(s).train.seq_len == 1024
    # given explicitly, the scenario's values win
    given = with_defaults(resolve(_doc(beta=0.0, rollout={"num_generations": 4, "max_completion_len": 128})).scenario)
    assert (given.rl.beta, given.rl.rollout.num_generations, given.rl.rollout.max_completion_len) == (0.0, 4, 128)
    assert reference_kind(given) == "none"


def test_trl_rloo_config_and_trainer_match_the_model() -> None:
    # the installed TRL (1.16.0): RLOOConfig's defaults and the fused head's outputs the estimate takes
    config = pytest.importorskip("trl.trainer.rloo_config")
    trainer = pytest.importorskip("trl.trainer.rloo_trainer")
    fields = config.RLOOConfig.__dataclass_fields__
    assert (fields["beta"].default, fields["num_generations"].default, fields["max_completion_length"].default) == \
        (RLOO_BETA, RLOO_NUM_GENERATIONS, RLOO_MAX_COMPLETION)
    source = inspect.getsource(trainer.RLOOTrainer.__init__)
    assert 'outputs=("log_probs", "entropy")' in source and "self.ref_model = create_model_from_path" in source


def test_estimate_by_hand() -> None:
    rep = estimate(BASE)
    assert rep.scenario["rl"]["beta"] == 0.05 and rep.scenario["train"]["seq_len"] == 1024
    assert rep.per_gpu.breakdown_detail["weights"]["reference model"] == REFERENCE
    # scoring: one no-grad fused-head forward of 8 x 512 = 4,096 completion positions:
    #   gathered hidden 4,096 x 896 x 4 = 14,680,064 + statistics 28 x 4,096 = 114,688 + tiles (4,096 x 32,768 x 2 =
    #   268,435,456 + head chunk cast 32,768 x 896 x 2 = 58,720,256 + hidden chunk cast 4,096 x 896 x 2 = 7,340,032)
    #   = 349,290,496, above the MLP's 8,192 x 4,864 x 2 x 3 = 239,075,328; residual in and out 2 x 8,192 x 896 x 4
    #   = 58,720,256; over the resident 5,945,432,576 (tests/test_grpo.py) + the reference 1,976,131,072 and the
    #   engine between rollouts 25,418,939,636 (the same engine as GRPO's: max_num_seqs 8):
    #   7,921,563,648 + 25,418,939,636 + 58,720,256 + 349,290,496 = 33,748,514,036
    assert rep.per_gpu.lifecycle["scoring"]["allocated_bytes"] == 33_748_514_036
    # the checkpoint save holds the resident, the reference and the engine: 7,921,563,648 + 25,418,939,636
    #   = 33,340,503,284
    assert rep.per_gpu.lifecycle["checkpoint save"]["allocated_bytes"] == 33_340_503_284
    assert any(a.startswith("RLOO (TRL v1.16.0 RLOOTrainer)") for a in rep.assumptions)
    assert any(a.startswith("RLOO rollout: vLLM 0.11 colocated") for a in rep.assumptions)


def test_loss_record_by_hand() -> None:
    # the policy's fused head over N = 8 x 512 = 4,096 completion positions:
    #   saved 4,096 x 896 x 4 = 14,680,064 + 16 x 4,096 = 65,536 -> 14,745,600
    #   forward extra max(28 x 4,096 + 334,495,744 (tiles, as above) = 334,610,432, outputs 8 x 8 x 1,023) = 334,610,432
    #   -> 349,356,032 at the forward's end
    r = resolve(BASE)
    s = policy_scenario(with_defaults(r.scenario))
    tr = train_step(Resolved(s, r.model, r.gpu, r.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    assert fwd.parts["temporaries"]["logits and loss"] == 349_356_032


def test_peft_and_beta_zero_load_no_copy() -> None:
    peft = {**BASE, "train": {**BASE["train"], "peft": {"method": "lora"}}}
    assert estimate(peft).per_gpu.breakdown_detail.get("weights", {}).get("reference model", 0) == 0
    assert estimate(_doc(beta=0.0)).per_gpu.breakdown_detail.get("weights", {}).get("reference model", 0) == 0


@pytest.mark.parametrize(("change", "where"), [
    ({"parallel": {"zero_stage": 3}, "hardware": {"gpu": A100, "num_gpus": 8}}, "parallel"),
    ({"parallel": {"fsdp": "full_shard"}, "hardware": {"gpu": A100, "num_gpus": 8}}, "parallel"),
    ({"parallel": {"tp": 2}, "hardware": {"gpu": A100, "num_gpus": 2}}, "parallel"),
    ({"train": {"objective": "rloo", "micro_batch_size": 8, "loss": "liger-fused-linear-ce"}}, "train.loss"),
    ({"train": {"objective": "rloo", "micro_batch_size": 8, "packing": True}}, "train.packing"),
    ({"train": {"objective": "rloo", "micro_batch_size": 8, "seq_len": 768}}, "train.seq_len"),
    ({"train": {"objective": "rloo", "micro_batch_size": 3}}, "rl.rollout.num_generations"),
    ({"rl": {"rollout": {"num_generations": 1}}}, "rl.rollout.num_generations"),
    ({"rl": {"reference_model": "none"}}, "rl.reference_model"),
    ({"lifecycle": {"evaluation": True}}, "lifecycle.evaluation"),
    ({"software": {"trl": "1.15.0"}}, "software.trl"),
    ({"framework": "torchtune"}, "framework"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate({**BASE, **change})
    assert any(p.where == where for p in exc.value.problems), exc.value


def test_ppo_is_modelled_apart_from_rloo() -> None:
    # PPO is TRL v1.12.0's PPOTrainer (tests/test_ppo.py): no RLOOConfig default reaches it
    rep = estimate({**BASE, "train": {"objective": "ppo", "micro_batch_size": 8, "precision": "bf16-true"}})
    assert rep.scenario["rl"]["beta"] == 0.0 and rep.scenario["rl"]["rollout"]["engine"] == "hf-generate"
    assert any(a.startswith("PPO (TRL v1.12.0") for a in rep.assumptions)


runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_cli_estimate_rloo() -> None:
    res = runner.invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", A100, "--objective", "rloo",
                              "--micro-batch-size", "8", "--json"], env=ENV)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["scenario"]["rl"]["rollout"]["num_generations"] == 2
    assert doc["per_gpu"]["lifecycle"]["scoring"]["allocated_bytes"] == 33_748_514_036


def test_plan_and_trace_refuse_rloo(tmp_path: Path) -> None:
    path = tmp_path / "rloo.json"
    path.write_text(json.dumps(BASE))
    res = runner.invoke(app, ["plan", str(path)], env=ENV)
    assert res.exit_code == 2 and "plan searches supervised fine-tuning (sft) setups only" in res.stdout + res.stderr
    res = runner.invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", A100, "--objective", "rloo",
                              "--micro-batch-size", "8", "--engine", "trace"], env=ENV)
    assert res.exit_code == 2 and "objective rloo is not traced" in res.stdout + res.stderr
