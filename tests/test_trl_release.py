"""DPO and GRPO by TRL release (``software.trl``, facts/trl.py): the logits up to 1.13, TRL's Triton kernel at 1.14
(refused), the fused LM head from 1.15 (analytic/fused_head.py).

The oracle is Qwen2.5-0.5B (494,032,768 parameters, hidden 896, MLP 4,864, 24 layers, vocabulary 151,936, tied
embeddings) on an A100-80GB at TRL's defaults: bf16 autocast over fp32 parameters (the final norm's output fp32:
x = 4, c = 2, w = 4), AdamW, gradient checkpointing.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.analytic.dpo import dpo_fused_loss_tensors
from vramplan.analytic.dpo import policy_scenario as dpo_policy_scenario
from vramplan.analytic.fused_head import fused_forward_bytes, fused_loss_tensors
from vramplan.analytic.grpo import grpo_fused_loss_tensors, trl_release, uses_fused_head
from vramplan.analytic.grpo import policy_scenario as grpo_policy_scenario
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.trl import DEFAULT_TRL_RELEASE, LOG_PROB_ROWS, log_prob_row
from vramplan.spec.load import Resolved

V, H = 151_936, 896
DPO: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                       "train": {"objective": "dpo", "micro_batch_size": 2, "seq_len": 512}}
GRPO: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "grpo", "micro_batch_size": 8}}


def _at(doc: dict[str, Any], trl: str | None) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(doc))
    if trl is not None:
        out["software"] = {"trl": trl}
    return out


def _loss_record(doc: dict[str, Any], policy: Any) -> int:
    r = resolve(doc)
    tr = train_step(Resolved(policy(r.scenario), r.model, r.gpu, r.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    value: int = fwd.parts["temporaries"]["logits and loss"]
    return value


@pytest.mark.parametrize(("version", "path"), [
    ((1, 9, 0), "logits"), ((1, 13), "logits"), ((1, 13, 9), "logits"), ((1, 14, 0), "triton-logits"),
    ((1, 14, 2), "triton-logits"), ((1, 15, 0), "fused-head"), ((1, 16, 0), "fused-head"), ((2, 0), "fused-head"),
    (None, "logits"),
])
def test_rows_by_release(version: tuple[int, ...] | None, path: str) -> None:
    row = log_prob_row(version)
    assert row is not None and row.path == path


def test_rows_are_ordered_and_start_at_the_first_release_read() -> None:
    firsts = [r.first for r in LOG_PROB_ROWS]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)
    assert log_prob_row((1, 8, 9)) is None and log_prob_row((0, 19)) is None
    assert DEFAULT_TRL_RELEASE == "1.9.0"


def test_fused_dpo_loss_tensors_by_hand() -> None:
    # n = 4 sequences (2 pairs) of s = 512: N = 4 x 511 = 2,044 labelled positions; x = 4, c = 2, w = 4
    # saved: hidden[mask] 2,044 x 896 x 4 = 7,325,696 + targets/log_z/entropy 16 x 2,044 = 32,704 -> 7,358,400
    # tiles: 2,044 x 32,768 x 2 = 133,955,584 + head chunk cast 32,768 x 896 x 2 = 58,720,256
    #   + hidden chunk cast 2,044 x 896 x 2 = 3,662,848 -> 196,338,688
    # reference forward: 7,325,696 + 28 x 2,044 (57,232) + 196,338,688 = 203,721,616
    # forward extra: the policy's four outputs 13 x 2,044 = 26,572 + 203,721,616 = 203,748,188
    # backward: grad_hidden 7,325,696 + grad_weight 151,936 x 896 x 4 = 544,538,624 + tiles 196,338,688
    #   = 748,203,008 (x = 4: no cast back)
    lt = dpo_fused_loss_tensors(4, 512, V, H, 4, 2, 4, True)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (7_358_400, 203_748_188, 748_203_008)
    # a frozen head (PEFT) gets no grad_weight; a larger reference layer replaces the reference's head bytes
    assert dpo_fused_loss_tensors(4, 512, V, H, 4, 2, 4, False).backward_extra == 748_203_008 - 544_538_624
    assert dpo_fused_loss_tensors(4, 512, V, H, 4, 2, 4, True, reference_layer=10**10).forward_extra == \
        26_572 + 10**10


def test_fused_grpo_loss_tensors_by_hand() -> None:
    # b = 8, P = 512, C = 256: N = 8 x 256 = 2,048 completion positions; outputs over 8 x 767 = 6,136 positions
    # saved: 2,048 x 896 x 4 = 7,340,032 + 16 x 2,048 = 32,768 -> 7,372,800
    # tiles: 2,048 x 32,768 x 2 = 134,217,728 + 58,720,256 + 2,048 x 896 x 2 = 3,670,016 -> 196,608,000
    # forward extra: max(28 x 2,048 + 196,608,000 = 196,665,344, outputs 8 x 6,136 = 49,088) = 196,665,344
    # backward: 7,340,032 + 544,538,624 + 196,608,000 = 748,486,656
    lt = grpo_fused_loss_tensors(8, 512, 256, V, H, 4, 2, 4, True)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (7_372_800, 196_665_344, 748_486_656)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 20_000), st.sampled_from([2, 4]), st.sampled_from([2, 4]))
def test_fused_forward_never_below_its_tile(tokens: int, positions: int, x: int, w: int) -> None:
    # the tile buffer min(N, 4,096) x 32,768 in the compute dtype is live in every fused call, whatever the vocabulary
    tile = min(tokens, 4096) * 32768 * 2
    lt = fused_loss_tensors(tokens, positions, 8, 1_000, 64, x, 2, w, True)
    assert lt.forward_extra >= tile and lt.backward_extra >= tile
    assert fused_forward_bytes(tokens, 64, x, 2, w) >= tile + 28 * tokens


def test_dpo_default_is_v1_9_and_releases_up_to_1_13_agree() -> None:
    # software.trl unset: TRL v1.9.0, the release the DPO module was read at (stated in the report)
    base = estimate(DPO)
    assert any(a.startswith("DPO (TRL v1.9.0 DPOTrainer)") for a in base.assumptions)
    at13 = estimate(_at(DPO, "1.13.0"))
    assert at13.per_gpu.peak_allocated_bytes == base.per_gpu.peak_allocated_bytes
    assert any(a.startswith("DPO (TRL v1.13.0 DPOTrainer)") for a in at13.assumptions)
    # the logits' record (tests/test_dpo.py): 2,293,321,984
    assert _loss_record(_at(DPO, "1.13.0"), dpo_policy_scenario) == 2_293_321_984


def test_dpo_from_1_15_takes_the_fused_head() -> None:
    doc = _at(DPO, "1.16.0")
    s = resolve(doc).scenario
    assert uses_fused_head(s) and trl_release(s) == "1.16.0"
    # at the forward's end: saved 7,358,400 + forward extra 203,748,188 = 211,106,588; no cached bf16 head (the fused
    # head casts its chunks outside autocast's cache) and every layer checkpointed (no layer casts from the reference)
    assert _loss_record(doc, dpo_policy_scenario) == 211_106_588
    assert _loss_record(_at(DPO, "1.15.0"), dpo_policy_scenario) == 211_106_588
    rep = estimate(doc)
    assert any("fused LM head" in a and a.startswith("DPO (TRL v1.16.0") for a in rep.assumptions)
    assert any(a.startswith("loss as TRL's DPOTrainer computes it from v1.15.0") for a in rep.assumptions)
    # the reference copy is the same at every release
    assert rep.per_gpu.breakdown_detail["weights"]["reference model"] == 1_976_131_072


def test_grpo_from_1_15_takes_the_fused_head_in_the_step_and_the_scoring() -> None:
    # the completion pinned at v1.9.0's default 256 (v1.16.0's would be 512: test_grpo_completion_default_by_release)
    doc = {**_at(GRPO, "1.16.0"), "rl": {"rollout": {"max_completion_len": 256}}}
    # at the forward's end: saved 7,372,800 + forward extra 196,665,344 = 204,038,144
    assert _loss_record(doc, grpo_policy_scenario) == 204_038_144
    # scoring: one no-grad fused forward of 8 x 256 = 2,048 completion positions:
    #   2,048 x 896 x 4 (7,340,032) + 28 x 2,048 (57,344) + tiles 196,608,000 = 204,005,376 (above the MLP's
    #   6,144 x 4,864 x 2 x 3 = 179,306,496), the residual in and out 44,040,192, over the resident 5,945,432,576
    #   and the engine between rollouts 25,418,939,636 (tests/test_grpo.py):
    #   5,945,432,576 + 25,418,939,636 + 44,040,192 + 204,005,376 = 31,612,417,780
    rep = estimate(doc)
    assert rep.per_gpu.lifecycle["scoring"]["allocated_bytes"] == 31_612_417_780
    assert any(a.startswith("GRPO (TRL v1.16.0 GRPOTrainer)") and "fused LM head" in a for a in rep.assumptions)
    # unset: v1.9.0's logits (tests/test_grpo.py test_scoring_phase_by_hand)
    assert estimate(GRPO).per_gpu.lifecycle["scoring"]["allocated_bytes"] == 32_110_964_468


@pytest.mark.parametrize(("trl", "completion"), [(None, 256), ("1.9.0", 256), ("1.10.0", 512), ("1.16.0", 512)])
def test_grpo_completion_default_by_release(trl: str | None, completion: int) -> None:
    # GRPOConfig.max_completion_length: 256 at v1.9.0, 512 from v1.10.0; the step's sequences are prompt 512 +
    # completion tokens and the report echoes the length taken
    sc = estimate(_at(GRPO, trl)).scenario
    assert sc["rl"]["rollout"]["max_completion_len"] == completion and sc["train"]["seq_len"] == 512 + completion
    # given explicitly, the scenario's length wins at every release
    pinned = estimate({**_at(GRPO, trl), "rl": {"rollout": {"max_completion_len": 100}}}).scenario
    assert pinned["train"]["seq_len"] == 612
    # train.seq_len must match the release's prompt + completion
    bad = {**_at(GRPO, trl), "train": {**GRPO["train"], "seq_len": 512 + (768 - completion)}}
    with pytest.raises(ScenarioError):
        estimate(bad)


@pytest.mark.parametrize(("doc", "trl"), [
    (DPO, "1.14.0"), (DPO, "1.14.3"), (DPO, "1.8.0"), (DPO, "0.19"), (GRPO, "1.14.0"), (GRPO, "0.14.0"),
    ({**DPO, "train": {**DPO["train"], "objective": "kto", "micro_batch_size": 4}}, "1.15.0"),
    ({**DPO, "train": {**DPO["train"], "objective": "orpo"}}, "1.9.0"),
])
def test_refused_releases(doc: dict[str, Any], trl: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(_at(doc, trl))
    assert any(p.where == "software.trl" for p in exc.value.problems), exc.value


def test_a_release_after_the_last_read_is_stated() -> None:
    rep = estimate(_at(DPO, "2.1"))
    assert any(a.startswith("DPO: TRL v2.1.0 is newer than the last release read (v1.16.0)") for a in rep.assumptions)
    assert not any("newer than the last release read" in a for a in estimate(_at(DPO, "1.16.0")).assumptions)
    grpo = estimate(_at(GRPO, "1.17"))
    assert any(a.startswith("GRPO: TRL v1.17.0 is newer") for a in grpo.assumptions)


def test_trl_release_without_a_post_training_objective_is_stated_not_used() -> None:
    # an SFT step under accelerate is not SFTTrainer's (under the HF Trainer it is: tests/test_trl_sft.py)
    sft = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"}, "software": {"trl": "1.16.0"},
           "framework": "accelerate"}
    rep = estimate(sft)
    assert any(a.startswith("software.trl set but not used") for a in rep.assumptions)
    # the SFT estimate itself is the same
    assert rep.per_gpu.peak_allocated_bytes == estimate({**sft, "software": {}}).per_gpu.peak_allocated_bytes
    # the HF Trainer's SFT step reads it (TRL 1.16's fused head: no logits)
    read = estimate({**sft, "framework": "hf-trainer"})
    assert not any(a.startswith("software.trl set but not used") for a in read.assumptions)
    assert any("SFTTrainer" in a for a in read.assumptions)
    assert not any(a.startswith("software.trl set but not used") for a in estimate(_at(DPO, "1.16.0")).assumptions)


def test_kto_and_orpo_accept_their_release() -> None:
    kto = {**DPO, "train": {**DPO["train"], "objective": "kto", "micro_batch_size": 4}}
    assert estimate(_at(kto, "1.16.0")).per_gpu.peak_allocated_bytes == estimate(kto).per_gpu.peak_allocated_bytes


def test_trl_asks_for_the_outputs_counted() -> None:
    # the installed TRL (1.16.0): DPOTrainer's fused head asks for four outputs (13 bytes per position), GRPOTrainer's
    # for two (8 bytes), as analytic/fused_head.py counts
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer")
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    assert 'outputs = ("log_probs", "entropy", "mean_logits", "is_top1")' in \
        inspect.getsource(dpo_trainer.DPOTrainer.__init__)
    assert 'outputs=("log_probs", "entropy")' in inspect.getsource(grpo_trainer.GRPOTrainer.__init__)


@pytest.mark.parametrize(("outputs", "per_position"), [
    (("log_probs", "entropy", "mean_logits", "is_top1"), 13),  # DPOTrainer's
    (("log_probs", "entropy"), 8),  # GRPOTrainer's
])
def test_trl_fused_head_outputs_on_a_tiny_model(outputs: tuple[str, ...], per_position: int) -> None:
    # a real CPU run of TRL's add_fused_lm_head on a 1-layer Qwen2: the outputs scattered over the batch's
    # b x (s - 1) positions take per_position bytes together, and the kernel saves the entropy (16 N beside hidden)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    utils = pytest.importorskip("trl.trainer.utils")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=50)
    model = transformers.Qwen2ForCausalLM(cfg)
    utils.add_fused_lm_head(model, outputs=outputs)
    b, s = 3, 9
    ids = torch.randint(0, 50, (b, s))
    labels = ids.masked_fill(torch.arange(s) < 4, -100)  # the prompt's labels masked, as DPO and GRPO do
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    fields = [getattr(out, name) for name in ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")]
    given = [f for f in fields if f is not None]
    assert all(tuple(f.shape) == (b, s - 1) for f in given)
    assert sum(f.numel() * f.element_size() for f in given) == per_position * b * (s - 1)


@pytest.mark.parametrize("outputs", [("log_probs", "entropy", "mean_logits", "is_top1"), ("log_probs", "entropy")])
def test_trl_kernel_saves_what_the_model_counts_for_dpo_and_grpo(outputs: tuple[str, ...]) -> None:
    # a real CPU run of TRL v1.16.0's ChunkedLogProbFunction with DPOTrainer's and GRPOTrainer's outputs: both ask for
    # the entropy, so the kernel saves it beside log_z (16 N with the int64 targets) and the hidden states (N H x)
    torch = pytest.importorskip("torch")
    kernels = pytest.importorskip("trl.kernels")
    n, h, v = 29, 16, 50
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(v, h))
    saved: list[Any] = []

    def keep(t: Any) -> Any:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        kernels.ChunkedLogProbFunction.apply(hidden, weight, None, torch.randint(0, v, (n,)), 1.0, 32768, None, 1.0,
                                             outputs)
    new = sum(t.numel() * t.element_size() for t in saved if t.data_ptr() != weight.data_ptr())
    # fp32 everywhere here (x = c = w = 4): n h 4 + 16 n = 1,856 + 464 = 2,320
    assert new == fused_loss_tensors(n, n, 8, v, h, 4, 4, 4, True).saved == 2_320
