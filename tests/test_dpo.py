"""DPO post-training (train.objective: dpo): TRL v1.9.0's DPOTrainer.

The oracle is Qwen2.5-0.5B (494,032,768 parameters, hidden 896, MLP 4,864, 24 layers, vocabulary 151,936, tied
embeddings) on an A100-80GB, TRL's defaults: bf16 autocast over fp32 parameters, AdamW, gradient checkpointing,
2 pairs per device (4 sequences per forward) of 512 tokens, a separate reference copy (no PEFT).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from preference_refusals import assert_refused, shared_refusals
from vramplan.analytic.dpo import dpo_loss_tensors, policy_scenario, reference_kind
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.spec.load import Resolved

BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "dpo", "micro_batch_size": 2, "seq_len": 512}}
V = 151_936


def _doc(**train: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    doc["train"].update(train)
    return doc


def test_dpo_loss_tensors_by_hand() -> None:
    # n = 4 sequences (2 pairs), s = 512, bf16: L = 4 x 512 x 151,936 x 2 = 622,329,856
    # saved: the 4 sequences' log_softmax outputs over s - 1 = 511 positions: 4 x 511 x 151,936 x 2 = 621,114,368
    # forward extra: the policy's logits L + the reference's logits L + one reference row's log_softmax
    #   511 x 151,936 x 2 = 155,278,592: 1,399,938,304
    # backward extra: 2 L (1,244,659,712) + 2 x 155,278,592 (310,557,184) = 1,555,216,896
    lt = dpo_loss_tensors(4, 512, V, 2)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (621_114_368, 1_399_938_304, 1_555_216_896)
    # fp32 logits: logsumexp keeps the logits (4 x 512 x V x 4 = 1,244,659,712); the reference's logits and row add
    f32 = dpo_loss_tensors(4, 512, V, 4)
    assert f32.saved == 1_244_659_712 and f32.forward_extra == 1_244_659_712 + 511 * V * 4
    # a reference layer larger than its head replaces the head's bytes; cached reference casts add
    assert dpo_loss_tensors(4, 512, V, 2, reference_layer=10**10).forward_extra == 622_329_856 + 10**10
    assert dpo_loss_tensors(4, 512, V, 2, reference_casts=7).forward_extra == 1_399_938_304 + 7


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(2, 4096), st.sampled_from([2, 4]))
def test_reference_forward_never_below_its_logits(n: int, s: int, e: int) -> None:
    # the reference's logits (n s V e) are live at the forward's end whatever the dtype
    lt = dpo_loss_tensors(n, s, 1_000, e)
    assert lt.forward_extra >= n * s * 1_000 * e and lt.backward_extra > 2 * n * s * 1_000 * e - 1


def test_policy_scenario_doubles_the_batch_and_checkpoints() -> None:
    s = resolve(BASE).scenario
    p = policy_scenario(s)
    # DataCollatorForPreference: chosen and rejected concatenated along the batch; DPOConfig gradient_checkpointing
    assert p.train.micro_batch_size == 4 and p.train.seq_len == 512 and p.train.gradient_checkpointing == "full"
    assert policy_scenario(resolve(_doc(gradient_checkpointing="none")).scenario).train.gradient_checkpointing == "none"
    assert reference_kind(s) == "separate"
    assert reference_kind(resolve(_doc(peft={"method": "lora"})).scenario) == "shared"


def test_estimate_by_hand() -> None:
    rep = estimate(BASE)
    # the separate reference copy, fp32 like the policy (create_model_from_path's dtype default "float32"):
    #   494,032,768 x 4 = 1,976,131,072, beside the policy's parameters in every phase after the load
    assert rep.per_gpu.breakdown_detail["weights"]["reference model"] == 1_976_131_072
    # the load: DPOTrainer.__init__ creates the reference after the Trainer put the policy on the GPU: 2 x 1,976,131,072
    assert rep.per_gpu.lifecycle["load"]["allocated_bytes"] == 3_952_262_144
    r = resolve(BASE)
    tr = train_step(Resolved(policy_scenario(r.scenario), r.model, r.gpu, r.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    # the loss's record at the forward's end: 621,114,368 + 1,399,938,304 = 2,021,052,672, plus the reference's
    # cached bf16 head (tied embedding, not checkpointed): 151,936 x 896 x 2 = 272,269,312 -> 2,293,321,984
    assert fwd.parts["temporaries"]["logits and loss"] == 2_293_321_984
    # the report's forward phase is the step's plus the reference copy
    assert rep.per_gpu.phases["forward"] == fwd.total + 1_976_131_072


def test_peft_shares_the_reference() -> None:
    rep = estimate(_doc(peft={"method": "lora"}))
    assert rep.per_gpu.breakdown_detail.get("weights", {}).get("reference model", 0) == 0
    assert any("adapters disabled" in a for a in rep.assumptions)


def test_sft_unchanged_by_the_objective_code() -> None:
    # the same 4 sequences as SFT: no reference, the standard loss (the DPO step is larger)
    sft = estimate({**BASE, "train": {"micro_batch_size": 4, "seq_len": 512, "gradient_checkpointing": "full"}})
    assert estimate(BASE).per_gpu.peak_allocated_bytes > sft.per_gpu.peak_allocated_bytes


@pytest.mark.parametrize(("change", "where"), shared_refusals(BASE["train"]) + [
    ({"parallel": {"fsdp": "full_shard"}, "hardware": {"gpu": "A100-80GB", "num_gpus": 8}}, "parallel"),
    ({"rl": {"reference_model": "shared"}}, "rl.reference_model"),
    ({"rl": {"reference_model": "none"}}, "rl.reference_model"),
    ({"rl": {"beta": 0.1}}, "rl"),
    ({"rl": {"precompute_ref_log_probs": True}}, "rl.precompute_ref_log_probs"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    assert_refused(BASE, change, where)



def test_reference_model_as_trl_would_is_accepted() -> None:
    assert estimate({**BASE, "rl": {"reference_model": "separate"}}).per_gpu.peak_allocated_bytes == \
        estimate(BASE).per_gpu.peak_allocated_bytes


runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_cli_estimate_dpo() -> None:
    res = runner.invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--objective", "dpo",
                              "--micro-batch-size", "2", "--seq-len", "512", "--json"], env=ENV)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["scenario"]["train"]["micro_batch_size"] == 2  # pairs, as given
    assert doc["per_gpu"]["breakdown_detail"]["weights"]["reference model"] == 1_976_131_072


def test_plan_refuses_dpo(tmp_path: Path) -> None:
    path = tmp_path / "dpo.json"
    path.write_text(json.dumps(BASE))
    res = runner.invoke(app, ["plan", str(path)], env=ENV)
    assert res.exit_code == 2 and "plan searches supervised fine-tuning (sft) setups only" in res.stdout + res.stderr
