"""GRPO at TRL releases before v1.9.0 (``software.trl``, facts/trl.py ``GRPO_EARLY_ROWS``): v0.15.0-v1.8.x modelled,
v0.14.x refused; GRPOConfig's defaults by release (beta, gradient checkpointing, completion length) and the colocated
vLLM engine from v0.18.0 only.

The oracle is Qwen2.5-0.5B (vocabulary V = 151,936, tied embeddings) on an A100-80GB, bf16 autocast (logits in
bf16, e = 2), 8 completions (b) of 512 prompt + 256 completion (C) tokens.  L = b (C + 1) V e = 8 x 257 x 151,936 x
2 = 624,760,832 B (the head's logits); X = b C V e = 8 x 256 x 151,936 x 2 = 622,329,856 B (the quotient by the
temperature, and the saved log_softmax outputs).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vramplan.analytic.grpo import grpo_loss_tensors
from vramplan.analytic.grpo import policy_scenario as grpo_policy_scenario
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.trl import (
    GRPO_BETA_ROWS,
    GRPO_EARLY_ROWS,
    LOG_PROB_ROWS,
    gradient_checkpointing_default,
    grpo_beta_default,
    grpo_completion_default,
    grpo_early_row,
)
from vramplan.spec.load import Resolved

V = 151_936
L = 8 * 257 * V * 2  # 624,760,832
X = 8 * 256 * V * 2  # 622,329,856
ROW = 256 * V * 2  # one sequence's C V: 77,791,232
# the step pinned so that the releases' other defaults (beta, checkpointing) do not move it
GRPO: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "grpo", "micro_batch_size": 8, "gradient_checkpointing": "full"},
                        "rl": {"beta": 0.0, "rollout": {"colocate": False, "max_completion_len": 256}}}


def _at(doc: dict[str, Any], trl: str | None) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(doc))
    if trl is not None:
        out["software"] = {"trl": trl}
    return out


def _loss_record(doc: dict[str, Any]) -> int:
    r = resolve(doc)
    tr = train_step(Resolved(grpo_policy_scenario(r.scenario), r.model, r.gpu, r.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    value: int = fwd.parts["temporaries"]["logits and loss"]
    return value


@pytest.mark.parametrize(("version", "first"), [
    ((0, 14, 0), (0, 0, 0)), ((0, 15, 0), (0, 15, 0)), ((0, 15, 2), (0, 15, 0)), ((0, 16, 1), (0, 16, 0)),
    ((0, 19, 1), (0, 16, 0)), ((0, 20, 0), (0, 20, 0)), ((0, 22, 2), (0, 20, 0)), ((0, 23, 1), (0, 23, 0)),
    ((0, 29, 0), (0, 23, 0)), ((1, 0, 0), (1, 0, 0)), ((1, 8, 0), (1, 0, 0)),
])
def test_early_rows_by_release(version: tuple[int, ...], first: tuple[int, int, int]) -> None:
    row = grpo_early_row(version)
    assert row is not None and row.first == first


def test_early_rows_end_where_the_release_table_begins() -> None:
    assert grpo_early_row((1, 9, 0)) is None and grpo_early_row(None) is None
    firsts = [r.first for r in GRPO_EARLY_ROWS]
    assert firsts == sorted(firsts) and firsts[-1] < LOG_PROB_ROWS[0].first
    # only v0.14.x (the first row) is not modelled
    assert [r.modelled for r in GRPO_EARLY_ROWS] == [False, True, True, True, True, True]


def test_loss_tensors_by_hand_per_rule() -> None:
    # v1.0.0-v1.9.0: saved X; forward extra L + reshape copy X + 3 x 128 x V x 2 (116,686,848) = 1,363,777,536
    at19 = grpo_loss_tensors(8, 256, V, 2)
    assert (at19.saved, at19.forward_extra) == (X, 1_363_777_536)
    assert grpo_loss_tensors(8, 256, V, 2, grpo_early_row((1, 0, 0))) == at19
    # v0.15.x: no division, no entropy: the logits stay, forward extra L
    at15 = grpo_loss_tensors(8, 256, V, 2, grpo_early_row((0, 15, 2)))
    assert (at15.saved, at15.forward_extra) == (X, L) == (622_329_856, 624_760_832)
    # v0.16-v0.19: the quotient made while L lives (L + X, nothing saved yet), then L dropped: max(L, X) = L
    at16 = grpo_loss_tensors(8, 256, V, 2, grpo_early_row((0, 16, 1)))
    assert (at16.saved, at16.forward_extra) == (X, 624_760_832)
    # v0.20-v0.22: one sequence's log_softmax, exp and product (3 x 77,791,232 = 233,373,696) beside X:
    #   max(L, 622,329,856 + 233,373,696) = 855,703,552
    at20 = grpo_loss_tensors(8, 256, V, 2, grpo_early_row((0, 20, 0)))
    assert at20.forward_extra == X + 3 * ROW == 855_703_552
    # v0.23-v0.29: chunks of 128 rows of the contiguous quotient, no reshape copy: X + 116,686,848 = 739,016,704
    at23 = grpo_loss_tensors(8, 256, V, 2, grpo_early_row((0, 23, 1)))
    assert at23.forward_extra == 739_016_704
    # the backward is bounded the same at every release: 2 L + 2 C V e = 1,249,521,664 + 155,582,464
    assert {t.backward_extra for t in (at15, at16, at20, at23, at19)} == {1_405_104_128}


def test_loss_tensors_fp32_by_hand() -> None:
    # fp32 logits (e = 4): L4 = 8 x 257 x V x 4 = 1,249,521,664; X4 = 8 x 256 x V x 4 = 1,244,659,712; one
    # sequence's exp inside logsumexp C V 4 = 155,582,464
    l4, x4, row4 = 1_249_521_664, 1_244_659_712, 155_582_464
    # v0.15: logsumexp keeps the logits themselves; one sequence's exp at a time
    at15 = grpo_loss_tensors(8, 256, V, 4, grpo_early_row((0, 15, 0)))
    assert (at15.saved, at15.forward_extra) == (l4, row4)
    # v0.16: logsumexp keeps the quotient; the division's moment L4 + X4 dominates: forward extra L4
    at16 = grpo_loss_tensors(8, 256, V, 4, grpo_early_row((0, 16, 0)))
    assert (at16.saved, at16.forward_extra) == (x4, l4)
    # v0.20: the end X4 + 3 C V 4 (466,747,392) + row 155,582,464 = 622,329,856 above nothing but L4 at the division
    at20 = grpo_loss_tensors(8, 256, V, 4, grpo_early_row((0, 20, 0)))
    assert at20.forward_extra == max(l4, 3 * row4 + row4) == l4


@pytest.mark.parametrize(("trl", "record"), [
    # saved X + forward extra (test_loss_tensors_by_hand_per_rule)
    (None, 622_329_856 + 1_363_777_536), ("1.8.0", 622_329_856 + 1_363_777_536), ("1.0.0", 1_986_107_392),
    ("0.29.0", 622_329_856 + 739_016_704), ("0.23.1", 1_361_346_560), ("0.20.0", 622_329_856 + 855_703_552),
    ("0.19.1", 622_329_856 + 624_760_832), ("0.16.1", 1_247_090_688), ("0.15.2", 1_247_090_688),
])
def test_the_step_takes_the_release_rule(trl: str | None, record: int) -> None:
    assert _loss_record(_at(GRPO, trl)) == record


@pytest.mark.parametrize(("trl", "head"), [
    # the scoring's head: L + one sequence's log_softmax (C V e = 77,791,232) = 702,552,064 at v1.9.0 and v0.15;
    # L + X = 1,247,090,688 where the division copies (v0.16.0-v0.29.x); the MLP's 6,144 x 4,864 x 2 x 3 =
    # 179,306,496 is smaller
    ("1.9.0", 702_552_064), ("1.0.0", 702_552_064), ("0.15.2", 702_552_064), ("0.16.1", 1_247_090_688),
    ("0.29.0", 1_247_090_688),
])
def test_scoring_head_by_release(trl: str, head: int) -> None:
    # beta 0.04: the reference is scored at every release (the same second copy resident at each)
    def scoring(at: str) -> int:
        doc = _at(GRPO, at)
        doc["rl"]["beta"] = 0.04
        value: int = estimate(doc).per_gpu.lifecycle["scoring"]["allocated_bytes"]
        return value
    assert scoring(trl) - scoring("1.9.0") == head - 702_552_064


def test_scoring_with_the_colocated_engine_at_0_23() -> None:
    # v1.9.0's scoring with the engine between rollouts: 32,110,964,468 (tests/test_trl_release.py); at v0.23.1 (the
    # old log-probabilities always scored with vLLM, as at v1.9.0) the head holds X instead of one sequence's C V:
    # + 622,329,856 - 77,791,232 = 32,655,503,092
    doc = {**_at(GRPO, "0.23.1"), "rl": {"beta": 0.0, "rollout": {"max_completion_len": 256}}}
    assert estimate(doc).per_gpu.lifecycle["scoring"]["allocated_bytes"] == 32_655_503_092


@pytest.mark.parametrize(("trl", "forward"), [("0.15.2", False), ("0.19.1", False), ("0.22.2", False),
                                              ("0.23.1", True), ("1.9.0", True)])
def test_no_scoring_forward_before_0_23_with_beta_0(trl: str, forward: bool) -> None:
    # before v0.23.0, beta 0 and GRPOConfig's defaults: neither the reference nor the old log-probabilities are
    # computed; the phase is what stays between steps.  v1.9.0's forward: the residual in and out 44,040,192 + the
    # head 702,552,064 = 746,592,256; v0.23's head 1,247,090,688 + 44,040,192 = 1,291,130,880
    base = estimate(_at(GRPO, "1.9.0")).per_gpu.lifecycle["scoring"]["allocated_bytes"]
    rep = estimate(_at(GRPO, trl))
    got = rep.per_gpu.lifecycle["scoring"]["allocated_bytes"]
    stated = any(a.startswith(f"GRPO scoring (TRL v{trl}): no forward") for a in rep.assumptions)
    if forward:
        # 1,291,130,880 - 746,592,256 = 544,538,624 above v1.9.0's at v0.23.1
        assert got - base == {"0.23.1": 544_538_624, "1.9.0": 0}[trl] and not stated
    else:
        assert got == base - 746_592_256 and stated


def test_grpo_config_defaults_by_release() -> None:
    # GRPOConfig.beta: 0.04 to v0.18.x, 0.0 from v0.19.0
    assert [b for _, b in GRPO_BETA_ROWS] == [0.04, 0.0]
    assert grpo_beta_default((0, 18, 2)) == 0.04 and grpo_beta_default((0, 19, 0)) == 0.0
    assert grpo_beta_default(None) == 0.0 and grpo_beta_default((1, 16, 0)) == 0.0
    # gradient_checkpointing: TrainingArguments' False to v0.21.x, GRPOConfig's True from v0.22.0
    assert not gradient_checkpointing_default((0, 21, 0)) and gradient_checkpointing_default((0, 22, 0))
    assert gradient_checkpointing_default((0, 29, 0)) and gradient_checkpointing_default(None)
    # max_completion_length 256 in every 0.x wheel read
    assert grpo_completion_default((0, 15, 0)) == 256 and grpo_completion_default((0, 29, 0)) == 256


def test_beta_default_loads_a_reference_before_0_19() -> None:
    doc = {k: v for k, v in _at(GRPO, "0.17.0").items()}
    doc["rl"] = {"rollout": {"colocate": False, "max_completion_len": 256}}
    rep = estimate(doc)
    assert rep.scenario["rl"]["beta"] == 0.04
    # a second copy in the policy's dtype: 494,032,768 x 4 = 1,976,131,072
    assert rep.per_gpu.breakdown_detail["weights"]["reference model"] == 1_976_131_072
    assert rep.scenario["train"]["gradient_checkpointing"] == "full"  # given
    doc["software"] = {"trl": "0.19.1"}
    rep = estimate(doc)
    assert rep.scenario["rl"]["beta"] == 0.0 and "reference model" not in rep.per_gpu.breakdown_detail["weights"]


def test_checkpointing_default_before_0_22_is_off() -> None:
    doc = _at(GRPO, "0.21.0")
    del doc["train"]["gradient_checkpointing"]
    assert estimate(doc).scenario["train"]["gradient_checkpointing"] == "none"
    doc["software"] = {"trl": "0.22.2"}
    assert estimate(doc).scenario["train"]["gradient_checkpointing"] == "full"


@pytest.mark.parametrize("trl", ["0.14.0", "0.14.9", "0.13", "0.11.4"])
def test_refused_before_0_15(trl: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(_at(GRPO, trl))
    problem = next(p for p in exc.value.problems if p.where == "software.trl")
    assert "modelled from TRL v0.15.0" in problem.message and "0.15.0" in problem.hint


def test_modelled_from_0_15() -> None:
    rep = estimate(_at(GRPO, "0.15.0"))
    assert any(a.startswith("GRPO (TRL v0.15.0 GRPOTrainer)") and "no temperature division" in a
               for a in rep.assumptions)


@pytest.mark.parametrize(("trl", "beta", "refused"), [
    ("0.17.0", 0.04, False), ("0.18.0", 0.04, True), ("0.18.2", None, True), ("0.18.2", 0.0, False),
    ("0.19.0", 0.04, False), ("0.19.1", None, False),
])
def test_reference_inside_the_step_at_0_18_is_refused(trl: str, beta: float | None, refused: bool) -> None:
    # 0.18.x: _compute_loss runs the reference's no-grad forward over the policy's graph when beta != 0 (0.04 its
    # default); 0.17 and 0.19 score it before the step
    doc = _at(GRPO, trl)
    if beta is None:
        del doc["rl"]["beta"]
    else:
        doc["rl"]["beta"] = beta
    if not refused:
        estimate(doc)
        return
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == "rl.beta" and "_compute_loss" in p.message for p in exc.value.problems)


@pytest.mark.parametrize(("trl", "refused"), [("0.15.2", True), ("0.17.0", True), ("0.18.0", False),
                                                 ("1.9.0", False)])
def test_colocated_vllm_from_0_18(trl: str, refused: bool) -> None:
    doc = _at(GRPO, trl)
    doc["rl"]["rollout"]["colocate"] = True
    if not refused:
        estimate(doc)
        return
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == "rl.rollout.colocate" for p in exc.value.problems)


@pytest.mark.parametrize(("trl", "sleep", "refused"), [
    ("0.22.2", 2, True), ("0.22.2", 0, False), ("0.23.1", 1, False), ("0.24.0", 2, True), ("0.25.1", 2, False),
    ("0.25.1", 1, True), ("1.8.0", 2, False),
])
def test_sleep_mode_by_release(trl: str, sleep: int, refused: bool) -> None:
    # vllm_enable_sleep_mode from 0.23.0; llm.sleep(level=1) at 0.23-0.24, level=2 from 0.25.0 (as at v1.9.0)
    doc = _at(GRPO, trl)
    doc["rl"]["rollout"].update({"colocate": True, "sleep_mode": sleep})
    if not refused:
        estimate(doc)
        return
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert any(p.where == "rl.rollout.sleep_mode" for p in exc.value.problems)
