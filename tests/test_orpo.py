"""ORPO post-training (train.objective: orpo): TRL v1.16.0's ORPOTrainer (trl.experimental.orpo).

The oracle is Qwen2.5-0.5B (494,032,768 parameters, vocabulary 151,936, tied embeddings) on an A100-80GB, TRL's
defaults: bf16 autocast over fp32 parameters under the HF Trainer, AdamW, gradient checkpointing, 2 pairs per
device (4 sequences per forward) of 512 tokens, no reference model.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from preference_refusals import assert_refused, shared_refusals
from vramplan.analytic.orpo import orpo_loss_tensors, policy_scenario
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.spec.load import Resolved

BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "orpo", "micro_batch_size": 2, "seq_len": 512}}
V = 151_936


def test_orpo_loss_tensors_by_hand() -> None:
    # L = 4 x 512 x 151,936 = 311,164,928 elements; R (chosen half, shifted) = 2 x 511 x 151,936 = 155,278,592
    # converted (fp32 logits, e = 4, c = 2): saved = 4 L + 4 R = 1,244,659,712 + 621,114,368 = 1,865,774,080
    # forward extra = max(4 R = 621,114,368, 6 L - saved = 1,215,488) = 621,114,368
    # backward extra = 8 L + 4 R = 2,489,319,424 + 621,114,368 = 3,110,433,792
    lt = orpo_loss_tensors(2, 512, V, 2, True)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (1_865_774_080, 621_114_368, 3_110_433_792)
    # not converted (a bf16 model without autocast: e = c = 2): saved 2 L + 2 R = 622,329,856 + 310,557,184 =
    # 932,887,040; forward extra 2 R = 310,557,184; backward 4 L + 2 R = 1,244,659,712 + 310,557,184 = 1,555,216,896
    half = orpo_loss_tensors(2, 512, V, 2, False)
    assert (half.saved, half.forward_extra, half.backward_extra) == (932_887_040, 310_557_184, 1_555_216_896)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(2, 4096), st.sampled_from([2, 4]), st.booleans())
def test_the_logits_live_to_the_backward(pairs: int, s: int, c: int, converted: bool) -> None:
    # TRL's log-prob kernel saves the logits (2 pairs s V e) whatever the dtype; the conversion's moment holds both
    # dtypes' logits at once
    lt = orpo_loss_tensors(pairs, s, 1_000, c, converted)
    e = 4 if converted else c
    assert lt.saved >= 2 * pairs * s * 1_000 * e
    if converted and c < 4:
        assert lt.forward_peak >= (c + 4) * 2 * pairs * s * 1_000


def test_trl_concatenates_the_pairs() -> None:
    # a real CPU run of TRL v1.16.0's ORPOTrainer.concatenated_inputs: chosen and rejected padded to the longer and
    # stacked along the batch: 2 pairs of 3 and 5 tokens -> a (4, 5) batch
    torch = pytest.importorskip("torch")
    orpo = pytest.importorskip("trl.experimental.orpo")
    batch = {"chosen_input_ids": torch.ones(2, 3, dtype=torch.long), "chosen_attention_mask": torch.ones(2, 3),
             "chosen_labels": torch.ones(2, 3, dtype=torch.long),
             "rejected_input_ids": torch.ones(2, 5, dtype=torch.long), "rejected_attention_mask": torch.ones(2, 5),
             "rejected_labels": torch.ones(2, 5, dtype=torch.long)}
    out = orpo.ORPOTrainer.concatenated_inputs(batch, padding_value=0)
    assert tuple(out["concatenated_input_ids"].shape) == (4, 5)
    assert policy_scenario(resolve(BASE).scenario).train.micro_batch_size == 4


def test_estimate_by_hand() -> None:
    rep = estimate(BASE)
    # no reference model: the weights are the policy's 494,032,768 x 4 = 1,976,131,072 only, the load likewise
    assert rep.per_gpu.breakdown_detail["weights"] == {"parameters": 1_976_131_072}
    assert rep.per_gpu.lifecycle["load"]["allocated_bytes"] == 1_976_131_072
    r = resolve(BASE)
    tr = train_step(Resolved(policy_scenario(r.scenario), r.model, r.gpu, r.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    # the loss's record at the forward's end: 1,865,774,080 + 621,114,368 = 2,486,888,448
    assert fwd.parts["temporaries"]["logits and loss"] == 2_486_888_448
    # the report's peak is the loss's backward: saved + backward extra = 1,865,774,080 + 3,110,433,792
    assert rep.per_gpu.breakdown_detail["temporaries"]["logits and loss gradients"] == 4_976_207_872
    assert any("trl.experimental.orpo" in a and "TRL v1.16.0" in a for a in rep.assumptions)


def test_deepspeed_bf16_keeps_half_logits() -> None:
    # DeepSpeed's bf16 engine runs no autocast wrapper: no fp32 conversion, the logits stay bf16 (e = c = 2):
    # the loss's record at the forward's end is 932,887,040 + 310,557,184 = 1,243,444,224
    ds = resolve({**BASE, "framework": "deepspeed", "parallel": {"zero_stage": 2},
                  "hardware": {"gpu": "A100-80GB", "num_gpus": 2}})
    tr = train_step(Resolved(policy_scenario(ds.scenario), ds.model, ds.gpu, ds.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    assert fwd.parts["temporaries"]["logits and loss"] == 1_243_444_224


@pytest.mark.parametrize(("change", "where"), shared_refusals(BASE["train"], loss="cut-cross-entropy") + [
    ({"rl": {"reference_model": "separate"}}, "rl.reference_model"),
    ({"rl": {"precompute_ref_log_probs": True}}, "rl"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    assert_refused(BASE, change, where)



def test_no_reference_is_accepted() -> None:
    rep = estimate({**BASE, "rl": {"reference_model": "none"}})
    assert rep.per_gpu.peak_allocated_bytes == estimate(BASE).per_gpu.peak_allocated_bytes
    assert not any("set but not used" in a for a in rep.assumptions)


def test_cli_estimate_orpo() -> None:
    res = CliRunner().invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--objective", "orpo",
                                   "--micro-batch-size", "2", "--seq-len", "512", "--json"],
                             env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["scenario"]["train"]["micro_batch_size"] == 2  # pairs, as given
    assert "reference model" not in doc["per_gpu"]["breakdown_detail"]["weights"]
