"""Expert capacity factor (``parallel.moe_expert_capacity_factor``, ``moe_pad_to_capacity``;
analytic/moe_capacity.py): Megatron-LM's capacity C = ceil(T x top_k / E x f), the routed rows a rank's experts
hold (padded: E x min(C, T); dropping: at most that and at most ep x T x min(k, E / ep)), the saved bytes they
add, the stated balanced assumption without a factor, and the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic import activations as act
from vramplan.analytic.moe_capacity import expert_capacity, routed_rows
from vramplan.analytic.terms import StepContext
from vramplan.analytic.terms.layers import capacity_rows_bytes
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError


def test_capacity_by_hand() -> None:
    # T 4,096, k 2, E 8: T k / E = 1,024; f 1.25 -> 1,280; f 1.1 -> ceil(1,126.4) = 1,127; f 1 -> 1,024
    assert [expert_capacity(4096, 2, 8, f) for f in (1.25, 1.1, 1.0)] == [1280, 1127, 1024]
    # 10 tokens, k 2, E 4, f 3: ceil(5 x 3) = 15 > T: every expert takes all 10 tokens when padded: 4 x 10 = 40
    assert expert_capacity(10, 2, 4, 3.0) == 15 and routed_rows(10, 2, 4, 1, 3.0, True) == 40


def test_routed_rows_by_hand() -> None:
    # dropless: T k = 8,192; padded f 1.25: 8 x 1,280 = 10,240
    assert routed_rows(4096, 2, 8, 1, None, False) == 8192
    assert routed_rows(4096, 2, 8, 8, 1.25, True) == 10240
    # dropping without padding, ep 1: min(10,240, 1 x 4,096 x min(2, 8)) = 8,192 (never more than routed)
    assert routed_rows(4096, 2, 8, 1, 1.25, False) == 8192
    # ep 8 (one expert a rank): min(10,240, 8 x 4,096 x min(2, 1)) = 10,240; ep 2: min(10,240, 2 x 4,096 x 2) = 10,240
    assert routed_rows(4096, 2, 8, 8, 1.25, False) == 10240
    assert routed_rows(4096, 2, 8, 2, 1.25, False) == 10240
    # f 4, ep 2, dropping: padded bound 8 x min(4,096, 4,096) = 32,768; routed bound 2 x 4,096 x 2 = 16,384
    assert routed_rows(4096, 2, 8, 2, 4.0, False) == 16384


def _doc(**par: Any) -> dict[str, Any]:
    return {"model": "mistralai/Mixtral-8x7B-v0.1", "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 8},
            "train": {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed"},
            "parallel": {"ep": 8, "fsdp": "full_shard", **par}}


def test_padded_rows_add_saved_bytes() -> None:
    # Mixtral (h 4,096, expert width 14,336), bf16 mixed precision: the grouped experts compute in the fp32
    # experts' dtype (4 B): per routed row gathered input 4,096 + gate_up 2 x 14,336 + act 14,336 + down input
    # 14,336 + down output 4,096 = 65,536 elements x 4 B = 262,144 B.  f 1.25 padded: 10,240 - 8,192 = 2,048 more
    # rows per layer: 2,048 x 262,144 = 536,870,912 B; 32 layers, all saved at the forward's end:
    # 17,179,869,184 B more at the peak.
    r = resolve(_doc(moe_expert_capacity_factor=1.25, moe_pad_to_capacity=True))
    c = StepContext(r, 0, "flash", False)
    assert act.grouped_experts_saved(c.m, c.act) == 262_144
    assert capacity_rows_bytes(c) == 536_870_912
    base, padded = train_step(resolve(_doc())), train_step(r)
    assert padded.peak.total - base.peak.total == 32 * 536_870_912
    assert any("C = ceil(4096 x 2 / 8 x 1.25) = 1280" in a and "exactly 10240 routed rows" in a
               for a in padded.assumptions)
    # dropping without padding under ep 8: the same bound, stated as "at most"
    dropped = train_step(resolve(_doc(moe_expert_capacity_factor=1.25)))
    assert dropped.peak.total == padded.peak.total
    assert any("at most 10240 routed rows" in a for a in dropped.assumptions)


def test_balanced_assumption_stated_under_ep() -> None:
    res = train_step(resolve(_doc()))
    assert any(a.startswith("expert parallelism (ep 8): dropless routing assumed perfectly balanced")
               and "4096 x 2 routed rows" in a for a in res.assumptions)
    one = train_step(resolve({**_doc(), "parallel": {"fsdp": "full_shard"}}))
    assert not any(a.startswith("expert parallelism") for a in one.assumptions)


@pytest.mark.parametrize(("doc", "field", "words"), [
    (_doc(moe_pad_to_capacity=True), "parallel.moe_pad_to_capacity", "needs a capacity"),
    ({**_doc(moe_expert_capacity_factor=1.5), "model": "gpt2", "parallel": {"moe_expert_capacity_factor": 1.5}},
     "parallel.moe_expert_capacity_factor", "no routed experts"),
    ({**_doc(moe_expert_capacity_factor=1.5), "train": {"peft": {"method": "lora"}}},
     "parallel.moe_expert_capacity_factor", "grouped experts"),
    (_doc(moe_expert_capacity_factor=1.5, tp=2, ep=4), "parallel.moe_expert_capacity_factor", "tp=2"),
    ({**_doc(moe_expert_capacity_factor=1.5), "train": {"gradient_checkpointing": "attention-core"}},
     "parallel.moe_expert_capacity_factor", "attention-core"),
])
def test_refusals(doc: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(doc)
    assert any(p.where == field and words in p.message for p in e.value.problems), e.value.problems


def test_factor_below_one_is_refused() -> None:
    with pytest.raises(ScenarioError, match="moe_expert_capacity_factor"):
        resolve(_doc(moe_expert_capacity_factor=0.5))


def test_full_checkpointing_keeps_only_the_inputs() -> None:
    # full checkpointing keeps each layer's input only: the extra rows are recomputed in the backward, so the
    # kept bytes do not move, and the recomputed layer (``full``) carries the 536,870,912 extra bytes
    from vramplan.analytic.terms.layers import layer_activations
    ck = {"gradient_checkpointing": "full", "micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed"}
    base = layer_activations(StepContext(resolve({**_doc(), "train": ck}), 0, "flash", False))
    cap = layer_activations(StepContext(resolve({**_doc(moe_expert_capacity_factor=1.25, moe_pad_to_capacity=True),
                                                 "train": ck}), 0, "flash", False))
    assert cap.kept == base.kept
    assert [a - b for a, b in zip(cap.full, base.full, strict=True)] == [536_870_912] * len(base.full)
