"""KTO post-training (train.objective: kto): TRL v1.16.0's KTOTrainer.

The oracle is Qwen2.5-0.5B (494,032,768 parameters, hidden 896, MLP 4,864, 24 layers, vocabulary 151,936, tied
embeddings) on an A100-80GB, TRL's defaults: bf16 autocast over fp32 parameters, AdamW, gradient checkpointing,
4 unpaired examples per device of 512 tokens, a separate reference copy (no PEFT).
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
from vramplan.analytic.kto import FUSED_TOKEN_ROWS, FUSED_VOCAB_COLUMNS, kto_loss_tensors, policy_scenario
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.spec.load import Resolved

BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": "A100-80GB"},
                        "train": {"objective": "kto", "micro_batch_size": 4, "seq_len": 512}}
V, H = 151_936, 896
N = 4 * 511  # labelled positions: b (s - 1) = 2,044


def _doc(**train: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    doc["train"].update(train)
    return doc


def test_kto_loss_tensors_by_hand() -> None:
    # bf16 autocast over fp32 weights: hidden states x = 4 (the RMSNorm's fp32 output), c = 2, head w = 4, trainable
    # saved: hidden[mask] 2,044 x 896 x 4 = 7,325,696 + targets (int64), log_z and entropy (fp32) 16 x 2,044 = 32,704
    # tiles: mm_buf 2,044 x 32,768 x 2 = 133,955,584 + a head chunk cast 32,768 x 896 x 2 = 58,720,256 + a hidden
    #   chunk cast 2,044 x 896 x 2 = 3,662,848: 196,338,688
    # forward extra: outputs 12 x 2,044 = 24,528 + the reference's hidden 7,325,696 + its stats 28 x 2,044 = 57,232
    #   + tiles 196,338,688 = 203,746,144
    # backward extra: grad_hidden 7,325,696 + grad_weight 151,936 x 896 x 4 = 544,538,624 + tiles = 748,203,008
    lt = kto_loss_tensors(N, V, H, 4, 2, 4, True)
    assert (lt.saved, lt.forward_extra, lt.backward_extra) == (7_358_400, 203_746_144, 748_203_008)
    # a frozen bf16 head (PEFT over a bf16 base) with bf16 hidden states: no casts, no weight gradient, and the
    # gradient cast back to bf16: saved 2,044 x 896 x 2 + 32,704 = 3,695,552; tiles 133,955,584; backward
    # 2,044 x 896 x 4 + 133,955,584 + 2,044 x 896 x 2 = 144,944,128
    peft = kto_loss_tensors(N, V, H, 2, 2, 2, False)
    assert (peft.saved, peft.backward_extra) == (3_695_552, 144_944_128)
    assert peft.forward_extra == 24_528 + 3_662_848 + 57_232 + 133_955_584
    # the reference's layers when larger replace its head's bytes; its cached layer casts add
    assert kto_loss_tensors(N, V, H, 4, 2, 4, True, reference_layer=10**10).forward_extra == 24_528 + 10**10
    assert kto_loss_tensors(N, V, H, 4, 2, 4, True, reference_casts=7).forward_extra == 203_746_144 + 7


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20_000), st.sampled_from([2, 4]), st.sampled_from([2, 4]))
def test_the_tile_is_always_there(tokens: int, c: int, w: int) -> None:
    # the tile buffer is min(N, 4,096) x 32,768 wide whatever the vocabulary (torch.empty((min(N, 4096), chunk_size))),
    # in the forward (the reference's call) and the backward alike; nothing grows with the vocabulary but the head's
    # fp32 weight gradient
    tile = min(tokens, FUSED_TOKEN_ROWS) * FUSED_VOCAB_COLUMNS * c
    small, large = kto_loss_tensors(tokens, 1_000, 64, 4, c, w, True), kto_loss_tensors(tokens, 2_000, 64, 4, c, w, True)
    assert small.forward_extra >= tile and small.backward_extra >= tile
    assert (small.saved, small.forward_extra) == (large.saved, large.forward_extra)
    assert large.backward_extra - small.backward_extra == 1_000 * 64 * 4


def test_trl_kernel_saves_and_allocates_what_the_model_counts() -> None:
    # a real CPU run of TRL v1.16.0's ChunkedLogProbFunction: the tensors it saves for the backward and the buffers
    # it makes, against kto_loss_tensors' terms (a vocabulary far below 32,768 still gets a 32,768-wide tile)
    torch = pytest.importorskip("torch")
    kernels = pytest.importorskip("trl.kernels")
    dispatch = pytest.importorskip("torch.utils._python_dispatch")
    n, h, v = 37, 16, 50
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(v, h))
    made = (torch.ops.aten.empty.memory_format, torch.ops.aten.zeros.default, torch.ops.aten.full.default)

    class Made(dispatch.TorchDispatchMode):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func in made:
                self.shapes.append(tuple(out.shape))
            return out

    saved: list[Any] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), Made() as fwd:
        lp, ent, _, _, _ = kernels.ChunkedLogProbFunction.apply(
            hidden, weight, None, torch.randint(0, v, (n,)), 1.0, FUSED_VOCAB_COLUMNS, None, 1.0,
            ("log_probs", "entropy", "mean_logits"))
    new = sum(t.numel() * t.element_size() for t in saved if t.data_ptr() != weight.data_ptr())
    # fp32 everywhere here (x = c = w = 4): saved n h 4 + 16 n = 2,368 + 592 = 2,960
    assert new == kto_loss_tensors(n, v, h, 4, 4, 4, True).saved == 2_960
    # seven fp32 statistics and one tile of (min(n, 4,096), 32,768)
    assert sorted(fwd.shapes) == sorted([(n,)] * 7 + [(n, FUSED_VOCAB_COLUMNS)])
    with Made() as bwd:
        (lp.sum() + ent.sum()).backward()
    # grad_hidden (n, h), grad_weight (v, h) in fp32, and the tile again
    assert sorted(bwd.shapes) == sorted([(n, h), (v, h), (n, FUSED_VOCAB_COLUMNS)])


def test_policy_scenario_keeps_the_batch_and_checkpoints() -> None:
    s = resolve(BASE).scenario
    p = policy_scenario(s)
    # DataCollatorForUnpairedPreference: one sequence per example (unpaired); KTOConfig gradient_checkpointing=True
    assert p.train.micro_batch_size == 4 and p.train.seq_len == 512 and p.train.gradient_checkpointing == "full"
    assert policy_scenario(resolve(_doc(gradient_checkpointing="none")).scenario).train.gradient_checkpointing == "none"


def test_estimate_by_hand() -> None:
    rep = estimate(BASE)
    # the separate reference copy in the policy's dtype (fp32): 494,032,768 x 4 = 1,976,131,072, in every phase after
    # the load; the load: the reference made after the Trainer put the policy on the GPU: 2 x 1,976,131,072
    assert rep.per_gpu.breakdown_detail["weights"]["reference model"] == 1_976_131_072
    assert rep.per_gpu.lifecycle["load"]["allocated_bytes"] == 3_952_262_144
    r = resolve(BASE)
    tr = train_step(Resolved(policy_scenario(r.scenario), r.model, r.gpu, r.assumptions))
    fwd = max((mo for mo in tr.moments if mo.phase == "forward"), key=lambda mo: mo.total)
    # the loss's record at the forward's end: saved 7,358,400 + forward extra 203,746,144 = 211,104,544 (every layer
    # checkpointed: the reference's cached layer casts are those the policy's region dropped; the fused head casts
    # its chunks outside autocast's cache, so no head copy)
    assert fwd.parts["temporaries"]["logits and loss"] == 211_104_544
    assert rep.per_gpu.phases["forward"] == fwd.total + 1_976_131_072
    # no cached bf16 head (151,936 x 896 x 2 = 272,269,312 under SFT): the fused head never calls F.linear on it
    assert not any(t.name == "casts.head" for t in tr.terms)
    sft = resolve({**BASE, "train": {"micro_batch_size": 4, "seq_len": 512, "gradient_checkpointing": "full"}})
    assert any(t.name == "casts.head" and t.nbytes == 272_269_312 for t in train_step(sft).terms)


def test_peft_shares_the_reference() -> None:
    rep = estimate(_doc(peft={"method": "lora"}))
    assert rep.per_gpu.breakdown_detail.get("weights", {}).get("reference model", 0) == 0
    assert any("KTO reference model: the policy with its adapters disabled" in a for a in rep.assumptions)
    assert any("TRL v1.16.0" in a and "KTOTrainer" in a for a in rep.assumptions)


@pytest.mark.parametrize(("change", "where"), shared_refusals(BASE["train"]) + [
    ({"parallel": {"fsdp": "full_shard"}, "hardware": {"gpu": "A100-80GB", "num_gpus": 8}}, "parallel"),
    ({"rl": {"reference_model": "shared"}}, "rl.reference_model"),
    ({"rl": {"reference_model": "none"}}, "rl.reference_model"),
    ({"rl": {"beta": 0.1}}, "rl"),
    ({"rl": {"precompute_ref_log_probs": True}}, "rl.precompute_ref_log_probs"),
    ({"train": {**BASE["train"], "micro_batch_size": 1}}, "train.micro_batch_size"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    assert_refused(BASE, change, where)



def test_reference_model_as_trl_would_is_accepted() -> None:
    rep = estimate({**BASE, "rl": {"reference_model": "separate"}})
    assert rep.per_gpu.peak_allocated_bytes == estimate(BASE).per_gpu.peak_allocated_bytes
    # KTO reads rl.reference_model: no "set but not used" note (spec/checks.py ignored_sections)
    assert not any("set but not used" in a for a in rep.assumptions)


runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_cli_estimate_kto() -> None:
    res = runner.invoke(app, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--objective", "kto",
                              "--micro-batch-size", "4", "--seq-len", "512", "--json"], env=ENV)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["scenario"]["train"]["objective"] == "kto"
    assert doc["per_gpu"]["breakdown_detail"]["weights"]["reference model"] == 1_976_131_072


def test_trace_and_plan_refuse_kto(tmp_path: Path) -> None:
    path = tmp_path / "kto.json"
    path.write_text(json.dumps(BASE))
    res = runner.invoke(app, ["plan", str(path)], env=ENV)
    assert res.exit_code == 2 and "plan searches supervised fine-tuning (sft) setups only" in res.stdout + res.stderr
    res = runner.invoke(app, ["estimate", str(path), "--engine", "trace"], env=ENV)
    assert res.exit_code == 2 and "objective kto is not traced" in res.stdout + res.stderr
