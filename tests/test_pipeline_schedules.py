"""Pipeline schedules (``parallel.pp_schedule``, facts/pipeline_schedules.py): the micro-batches in flight per rank,
the chunk layout of virtual stages, the saved-activation bytes the engine holds for them, the refusals, the step
time and the torchtitan export.

Hand counts use m = 8 micro-batches (``train.grad_accum_steps``), pp 2 and 4, v 2 chunks per rank:

* 1f1b, rank r: min(m, pp - r) -> pp 4: 4, 3, 2, 1; pp 2: 2, 1.
* gpipe: m x v = 8 on every rank.
* interleaved-1f1b: rounds = max(1, m // pp), per_round = m // rounds; warmup = min((v - 1) x per_round
  + 2 (pp - 1 - r), m v); peak = warmup + 1 (in chunk-micro-batches).
  pp 4: rounds 2, per_round 4: warmup 4 + 6, 4 + 4, 4 + 2, 4 + 0 = 10, 8, 6, 4 -> 11, 9, 7, 5.
  pp 2: rounds 4, per_round 2: warmup 2 + 2, 2 + 0 = 4, 2 -> 5, 3.
* zbv-zero-bubble, dualpipev (V layout, 2 chunks per rank): torch's action lists walked in the comment above
  ``test_v_schedules_in_flight_by_hand``: 2 pp and 2 pp + 1 on every rank.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramplan.analytic.layout import chunk_layers, chunk_stages, rank_params, stage_layers
from vramplan.analytic.terms import StepContext, step_terms
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.pipeline_schedules import (
    PIPELINE_SCHEDULES,
    in_flight_chunks,
    interleaved_rounds,
    peak_saved_bytes,
    pipeline_schedule,
    pipeline_schedule_names,
    rank_actions,
)
from vramplan.plan.steptime.pipeline import pipeline_bubble_seconds, pipeline_slots

ONE, GPIPE, IL, ZB = (pipeline_schedule(n) for n in ("1f1b", "gpipe", "interleaved-1f1b", "interleaved-zero-bubble"))
ZBV, DPV = pipeline_schedule("zbv-zero-bubble"), pipeline_schedule("dualpipev")


@pytest.mark.parametrize(("row", "pp", "v", "expected"), [
    (ONE, 4, 1, [4, 3, 2, 1]), (ONE, 2, 1, [2, 1]),
    (GPIPE, 4, 1, [8, 8, 8, 8]), (GPIPE, 2, 1, [8, 8]),
    (IL, 4, 2, [11, 9, 7, 5]), (IL, 2, 2, [5, 3]),
])
def test_in_flight_per_rank_by_hand(row: Any, pp: int, v: int, expected: list[int]) -> None:
    assert [in_flight_chunks(row, pp, r, v, 8) for r in range(pp)] == expected


def test_interleaved_first_rank_is_megatrons_factor() -> None:
    # arXiv 2104.04473 sec. 2.2.2: the first stage holds pp (1 + (pp - 1)/(pp v)) micro-batches' activations;
    # pp 4, v 2: 4 x 11/8 = 5.5 = 11 chunks / 2; pp 2, v 2: 2 x 5/4 = 2.5 = 5 / 2 (per_round = pp in both)
    for pp, v in ((4, 2), (2, 2), (4, 4)):
        paper = pp * (1 + Fraction(pp - 1, pp * v))
        assert Fraction(in_flight_chunks(IL, pp, 0, v, 8), v) == paper


def test_interleaved_where_torch_and_the_paper_differ() -> None:
    # m = 6, pp = 4: one round of 6 (torch's flexible rounds), warmup (2 - 1) x 6 + 2 x 3 = 12 = m v, so every
    # forward runs before the first backward: 12 chunks (the paper's 4 x 11/8 x 2 = 11 assumes per_round = pp)
    assert interleaved_rounds(4, 6) == (1, 6)
    assert in_flight_chunks(IL, 4, 0, 2, 6) == 12
    # fewer micro-batches than ranks: m 2, pp 4, v 2 -> warmup 2 + 6 capped at m v = 4: all 4 chunks
    assert in_flight_chunks(IL, 4, 0, 2, 2) == 4


def _torch_interleaved_peaks(pp: int, v: int, m: int) -> list[int]:
    """Peak (forwards - backwards) per rank over torch's own action list for ScheduleInterleaved1F1B."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    _, per_round = interleaved_rounds(pp, m)
    fake = SimpleNamespace(n_local_stages=v, microbatches_per_round=per_round, pp_group_size=pp, _n_microbatches=m)
    peaks = []
    for rank in range(pp):
        ops = schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, rank)
        alive = peak = 0
        for op in ops:
            if op is None:
                continue
            kind = op.computation_type
            alive += 1 if kind == schedules._ComputationType.FORWARD else -1
            peak = max(peak, alive)
        assert alive == 0
        peaks.append(peak)
    return peaks


@pytest.mark.parametrize(("pp", "v", "m"), [(4, 2, 8), (2, 2, 8), (4, 3, 8), (4, 2, 6), (8, 2, 16), (4, 2, 2)])
def test_interleaved_matches_torchs_action_list(pp: int, v: int, m: int) -> None:
    assert [in_flight_chunks(IL, pp, r, v, m) for r in range(pp)] == _torch_interleaved_peaks(pp, v, m)


def _torch_interleaved_peak_bytes(pp: int, v: int, m: int, rank: int, chunk_bytes: tuple[int, ...]) -> int:
    """The saved-bytes peak over torch's own ScheduleInterleaved1F1B action list (local chunk = stage // pp)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    _, per_round = interleaved_rounds(pp, m)
    fake = SimpleNamespace(n_local_stages=v, microbatches_per_round=per_round, pp_group_size=pp, _n_microbatches=m)
    alive = peak = 0
    for op in schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, rank):
        if op is None:
            continue
        sign = 1 if op.computation_type == schedules._ComputationType.FORWARD else -1
        alive += sign * chunk_bytes[op.stage_index // pp]
        peak = max(peak, alive)
    return peak


@pytest.mark.parametrize(("pp", "v", "m", "chunk_bytes"), [
    (4, 2, 8, (2, 1)), (4, 2, 8, (1, 2)), (2, 3, 8, (3, 1, 2)), (4, 2, 6, (5, 3)), (8, 2, 16, (1, 1))])
def test_interleaved_bytes_match_torchs_action_list(pp: int, v: int, m: int, chunk_bytes: tuple[int, ...]) -> None:
    for rank in range(pp):
        assert peak_saved_bytes(IL, pp, rank, v, m, chunk_bytes) == \
            _torch_interleaved_peak_bytes(pp, v, m, rank, chunk_bytes)


@given(pp=st.integers(2, 16), m=st.integers(1, 64), v=st.integers(2, 6))
def test_equal_chunks_peak_is_the_count(pp: int, m: int, v: int) -> None:
    """With equal chunks the byte walk's peak is the closed form's count of chunks (the docstring's rule)."""
    if m % interleaved_rounds(pp, m)[0]:
        return
    for rank in (0, pp - 1):
        assert peak_saved_bytes(IL, pp, rank, v, m, (1,) * v) == in_flight_chunks(IL, pp, rank, v, m)


@given(pp=st.integers(2, 16), m=st.integers(1, 64), v=st.integers(2, 6))
def test_first_rank_order_gpipe_interleaved_1f1b(pp: int, m: int, v: int) -> None:
    """In micro-batches of the rank's layers: GPipe (m) >= interleaved (peak / v) >= 1F1B (min(m, pp))."""
    if m % interleaved_rounds(pp, m)[0]:
        return  # torch refuses this m (and so does the scenario check)
    gpipe = Fraction(in_flight_chunks(GPIPE, pp, 0, 1, m))
    inter = Fraction(in_flight_chunks(IL, pp, 0, v, m), v)
    one = Fraction(in_flight_chunks(ONE, pp, 0, 1, m))
    assert gpipe >= inter >= one


def test_a_row_without_a_rule_refuses() -> None:
    # every row is modelled; a row without an in-flight rule would raise with its refusal
    assert all(row.in_flight is not None for row in PIPELINE_SCHEDULES)
    unmodelled = replace(ZBV, in_flight=None, refusal="not laid out")
    with pytest.raises(ValueError, match="not laid out"):
        in_flight_chunks(unmodelled, 4, 0, 2, 8)
    assert {"zbv-zero-bubble", "interleaved-zero-bubble", "dualpipev"} <= set(pipeline_schedule_names())
    assert ZB.in_flight == ZBV.in_flight == DPV.in_flight == "split" and ZBV.style == DPV.style == "v"


def test_zero_bubble_walk_by_hand() -> None:
    # pp 2, v 2, m 2: rounds max(1, 2 // 2) = 1, per_round 2; warmup = min((v - 1) per_round + (pp - 1 - r), 4):
    # rank 0: 3 -> F0 F0 F1 | F1 I1 W1 | I1 W1 | I0 W0 | I0 W0 (W as soon as op - warmup >= 0)
    # rank 1: 2 -> F0 F0 | F1 I1 | F1 I1 W1 | I0 W1 | I0 W0 | W0 (W once op - warmup >= 1)
    assert rank_actions(ZB, 2, 1, 2, 2) == [("F", 0), ("F", 0), ("F", 1), ("I", 1), ("F", 1), ("I", 1), ("W", 1),
                                             ("I", 0), ("W", 1), ("I", 0), ("W", 0), ("W", 0)]
    # rank 0, saved (a, b) = (100, 10), held (x, y) = (1, 1000): a, 2a, 2a+b, 2a+2b, 2a+2b+y = 1220 (peak), ...
    assert peak_saved_bytes(ZB, 2, 0, 2, 2, (100, 10), (1, 1000)) == 1220
    # rank 1, saved (10, 100), held (1, 1000): ... F1 I1 -> 20 + 200 + 2000 = 2220 (two I passes of chunk 1 wait)
    assert peak_saved_bytes(ZB, 2, 1, 2, 2, (10, 100), (1, 1000)) == 2220
    # counts: rank 0 peaks at 4 chunk-micro-batches; pp 4, v 2, m 8: warmup 4 + (3 - r), then F I W: 8 on each rank
    assert in_flight_chunks(ZB, 2, 0, 2, 2) == 4
    assert [in_flight_chunks(ZB, 4, r, 2, 8) for r in range(4)] == [8, 8, 8, 8]


@pytest.mark.parametrize(("pp", "v"), [(2, 2), (4, 2), (3, 3), (8, 2)])
def test_zero_bubble_order_is_torchs(pp: int, v: int) -> None:
    """The rank's F, I, W order equals torch's ``ScheduleInterleavedZeroBubble._calculate_single_rank_operations``
    (idle slots dropped; ``_add_bubbles_to_actions`` only inserts idle slots)."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining import schedules
    kind = {schedules._ComputationType.FORWARD: "F", schedules._ComputationType.BACKWARD_INPUT: "I",
            schedules._ComputationType.BACKWARD_WEIGHT: "W"}
    for m in range(1, 3 * pp + 1):
        rounds, per_round = interleaved_rounds(pp, m)
        if m % rounds:
            continue
        fake = SimpleNamespace(n_local_stages=v, microbatches_per_round=per_round, pp_group_size=pp,
                               _n_microbatches=m)
        for rank in range(pp):
            ops = schedules.ScheduleInterleavedZeroBubble._calculate_single_rank_operations(fake, rank)
            assert rank_actions(ZB, pp, rank, v, m) == [(kind[a.computation_type], a.stage_index // pp)
                                                         for a in ops if a is not None]


def test_zero_bubble_held_bytes_by_hand() -> None:
    # GPT-2 (h 768, vocab 50,257), torchtitan bf16 (FSDP2 mixed precision: compute and residual 2 B, no autocast),
    # 1,024 tokens, pp 2, v 2: 12 layers in 4 chunks of 3.  Per layer per token: linears c_attn 2,304 + c_proj 768
    # + c_fc 3,072 + c_proj 768 = 6,912, norms ln_1 + ln_2 = 1,536 -> 8,448 elements.
    # rank 0: chunk 0 (stage 0) keeps only its output gradient: 768 x 1,024 x 2 = 1,572,864;
    #         chunk 2 (middle): (3 x 8,448 + 768) x 1,024 x 2 = 26,112 x 2,048 = 53,477,376
    # rank 1: chunk 1 (middle) the same; chunk 3 (last): 3 x 8,448 + vocab 50,257 + ln_f 768 = 76,369 x 2,048
    #         = 156,403,712
    r = resolve(_doc(2, "interleaved-zero-bubble", 2, m=2))
    c0, c1 = StepContext(r, 0, "flash", False), StepContext(r, 1, "flash", False)
    assert c0.held_until_weight_pass(chunk_layers(12, 2, 0, 2)) == [1_572_864, 53_477_376]
    assert c1.held_until_weight_pass(chunk_layers(12, 2, 1, 2)) == [53_477_376, 156_403_712]
    # rank 1's in-flight term: the walk's peak (2a + 2b + 2y above, a = b = one chunk's saved bytes, y =
    # 156,403,712) less the walked micro-batch over the rank's two chunks (k = a + b): 2 (a + b) + 2 y - k = k + 2 y
    in_flight, k = _in_flight_term(_doc(2, "interleaved-zero-bubble", 2, m=2), 1)
    assert in_flight == k + 2 * 156_403_712


def test_zero_bubble_holds_more_than_interleaved_on_the_last_rank() -> None:
    # the last rank: interleaved 1F1B keeps 5 chunk-micro-batches (pp 4, v 2, m 8); ZB1P 8, and the I passes'
    # gradients (the logits' among them)
    zb, k = _in_flight_term(_doc(4, "interleaved-zero-bubble", 2), 3)
    il, k_il = _in_flight_term(_doc(4, "interleaved-1f1b", 2), 3)
    assert k == k_il and zb > il
    res = train_step(resolve(_doc(4, "interleaved-zero-bubble", 2)))
    assert any(a.startswith("pipeline schedule interleaved-zero-bubble") and ": 8 chunk-micro-batches" in a
               for a in res.assumptions)


# V schedules, local chunk 0 = stage r, chunk 1 = stage 2 pp - 1 - r.  Each rank's actions (idle slots left out) as
# torch 2.13 lists them (ScheduleZBVZeroBubble / ScheduleDualPipeV ._calculate_single_rank_operations; ZBV plans
# max(2 pp - 1, m) micro-batches; DualPipeV's OVERLAP_F_B (F, B) spelt as its sub-actions, the forward first),
# each followed by the chunk-micro-batches whose saved tensors the rank then holds: F adds one, I keeps it (until
# its W), W and a full backward B take one off.
# ZBV, pp 4, m 8:
#  r0: F0 1, F0 2, F0 3, F0 4, F0 5, F0 6, F0 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F1 8, I1 8,
#      W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, I0 7, W0 6, F1 7, I1 7, W1 6, I0 6, W0 5, F1 6, I1 6, W1 5, I0 5,
#      W0 4, F1 5, I1 5, W1 4, I0 4, W0 3, I0 3, W0 2, I0 2, W0 1, I0 1, W0 0 -> peak 8
#  r1: F0 1, F0 2, F0 3, F0 4, F0 5, F1 6, F0 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F0 8, I0 8,
#      W0 7, F1 8, I1 8, W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, I0 7, W0 6, F1 7, I1 7, W1 6, I0 6, W0 5, F1 6,
#      I1 6, W1 5, I0 5, I1 5, I0 5, W0 4, I0 4, W0 3, I0 3, W0 2, W1 1, W0 0 -> peak 8
#  r2: F0 1, F0 2, F0 3, F1 4, F0 5, F1 6, F0 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F0 8, I0 8, W0 7, F1 8, I1 8,
#      W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, I0 7, W0 6, F1 7, I1 7, W1 6,
#      I0 6, I1 6, I0 6, I1 6, I0 6, W0 5, I0 5, W0 4, W1 3, W1 2, W0 1, W0 0 -> peak 8
#  r3: F0 1, F1 2, F0 3, F1 4, F0 5, F1 6, F0 7, F1 8, I1 8, W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, F0 8, I0 8,
#      W0 7, F1 8, I1 8, W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, F0 8, I0 8, W0 7, F1 8, I1 8, W1 7, I0 7, I1 7,
#      I0 7, I1 7, I0 7, I1 7, I0 7, W0 6, W1 5, W1 4, W1 3, W0 2, W0 1, W0 0 -> peak 8
# ZBV, pp 2, m 4:
#  r0: F0 1, F0 2, F0 3, F1 4, I1 4, W1 3, F1 4, I1 4, W1 3, F0 4, I0 4, W0 3, F1 4, I1 4, W1 3, I0 3, W0 2, F1 3,
#      I1 3, W1 2, I0 2, W0 1, I0 1, W0 0 -> peak 4
#  r1: F0 1, F1 2, F0 3, F1 4, I1 4, W1 3, F0 4, I0 4, W0 3, F1 4, I1 4, W1 3, F0 4, I0 4, W0 3, F1 4, I1 4, W1 3,
#      I0 3, I1 3, I0 3, W0 2, W1 1, W0 0 -> peak 4
# DualPipeV, pp 4, m 8:
#  r0: F0 1, F0 2, F0 3, F0 4, F0 5, F0 6, F0 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F1 8, F0 9,
#      B1 8, F1 9, B0 8, B1 7, F1 8, B0 7, B1 6, F1 7, B0 6, B1 5, F1 6, B0 5, B1 4, I0 4, W0 3, I0 3, W0 2, I0 2,
#      W0 1, I0 1, W0 0 -> peak 9
#  r1: F0 1, F0 2, F0 3, F0 4, F0 5, F1 6, F0 7, F1 8, I1 8, W1 7, F1 8, I1 8, W1 7, F1 8, F0 9, B1 8, F1 9, B0 8,
#      F0 9, B1 8, F1 9, B0 8, B1 7, F1 8, B0 7, B1 6, F1 7, B0 6, B1 5, B0 4, I1 4, I0 4, W1 3, I0 3, W0 2, I0 2,
#      W0 1, W0 0 -> peak 9
#  r2: F0 1, F0 2, F0 3, F1 4, F0 5, F1 6, F0 7, F1 8, I1 8, W1 7, F1 8, F0 9, B1 8, F1 9, B0 8, F0 9, B1 8, F1 9,
#      B0 8, F0 9, B1 8, F1 9, B0 8, B1 7, F1 8, B0 7, B1 6, B0 5, B1 4, I0 4, I1 4, I0 4, W0 3, I0 3, W1 2, W0 1,
#      W0 0 -> peak 9
#  r3: F0 1, F1 2, F0 3, F1 4, F0 5, F1 6, F0 7, F1 8, F0 9, B1 8, F1 9, B0 8, F0 9, B1 8, F1 9, B0 8, F0 9, B1 8,
#      F1 9, B0 8, F0 9, B1 8, F1 9, B0 8, B1 7, B0 6, B1 5, B0 4, I1 4, I0 4, I1 4, I0 4, W1 3, W0 2, W1 1, W0 0
#      -> peak 9
# DualPipeV, pp 2, m 4:
#  r0: F0 1, F0 2, F0 3, F1 4, I1 4, W1 3, F1 4, F0 5, B1 4, F1 5, B0 4, B1 3, F1 4, B0 3, B1 2, I0 2, W0 1, I0 1,
#      W0 0 -> peak 5
#  r1: F0 1, F1 2, F0 3, F1 4, F0 5, B1 4, F1 5, B0 4, F0 5, B1 4, F1 5, B0 4, B1 3, B0 2, I1 2, I0 2, W1 1, W0 0
#      -> peak 5
@pytest.mark.parametrize(("row", "pp", "m", "expected"), [
    (ZBV, 4, 8, [8, 8, 8, 8]), (ZBV, 2, 4, [4, 4]), (DPV, 4, 8, [9, 9, 9, 9]), (DPV, 2, 4, [5, 5])])
def test_v_schedules_in_flight_by_hand(row: Any, pp: int, m: int, expected: list[int]) -> None:
    assert [in_flight_chunks(row, pp, r, 2, m) for r in range(pp)] == expected


def test_v_schedule_orders_by_hand() -> None:
    def spell(actions: list[tuple[str, int]]) -> str:
        return " ".join(f"{a}{c}" for a, c in actions)

    assert spell(rank_actions(ZBV, 2, 0, 2, 4)) == ("F0 F0 F0 F1 I1 W1 F1 I1 W1 F0 I0 W0 F1 I1 W1 I0 W0 F1 I1 W1 "
                                                     "I0 W0 I0 W0")
    assert spell(rank_actions(ZBV, 2, 1, 2, 4)) == ("F0 F1 F0 F1 I1 W1 F0 I0 W0 F1 I1 W1 F0 I0 W0 F1 I1 W1 I0 I1 "
                                                     "I0 W0 W1 W0")
    assert spell(rank_actions(DPV, 2, 0, 2, 4)) == "F0 F0 F0 F1 I1 W1 F1 F0 B1 F1 B0 B1 F1 B0 B1 I0 W0 I0 W0"
    assert spell(rank_actions(DPV, 2, 1, 2, 4)) == "F0 F1 F0 F1 F0 B1 F1 B0 F0 B1 F1 B0 B1 B0 I1 I0 W1 W0"
    # ZBV with fewer micro-batches than 2 pp - 1: torch plans 3 (pp 2) and blanks micro-batch 2's actions
    assert spell(rank_actions(ZBV, 2, 0, 2, 2)) == "F0 F0 F1 I1 W1 F1 I1 W1 I0 W0 I0 W0"


def _torch_v_actions(cls_name: str, pp: int, rank: int, m: int) -> list[tuple[str, int]]:
    """torch's own action list of a V schedule for one rank, OVERLAP_F_B spelt as its sub-actions in order, as
    (F | I | W | B, local chunk: 0 for stage ``rank``, 1 for stage 2 pp - 1 - rank)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ct = schedules._ComputationType
    kind = {ct.FORWARD: "F", ct.BACKWARD_INPUT: "I", ct.BACKWARD_WEIGHT: "W", ct.FULL_BACKWARD: "B"}
    fake = SimpleNamespace(pp_group_size=pp, num_stages=2 * pp, _n_microbatches=m)
    out = []
    for a in getattr(schedules, cls_name)._calculate_single_rank_operations(fake, rank):
        if a is None:
            continue
        for sub in a.sub_actions if a.computation_type == ct.OVERLAP_F_B else (a,):
            assert sub.stage_index in chunk_stages(pp, rank, 2, "v")
            out.append((kind[sub.computation_type], chunk_stages(pp, rank, 2, "v").index(sub.stage_index)))
    return out


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_v_schedule_orders_are_torchs(pp: int) -> None:
    for m in range(1, 4 * pp + 3):
        for rank in range(pp):
            assert rank_actions(ZBV, pp, rank, 2, m) == _torch_v_actions("ScheduleZBVZeroBubble", pp, rank, m)
            if m >= 2 * pp:  # torch's DualPipeV refuses fewer
                assert rank_actions(DPV, pp, rank, 2, m) == _torch_v_actions("ScheduleDualPipeV", pp, rank, m)


def test_v_stage_mapping_is_torchs() -> None:
    utils = pytest.importorskip("torch.distributed.pipelining._utils")
    for pp in (2, 4, 8):
        mapping = utils.generate_rank_to_stage_mapping(pp, 2 * pp, style="v")
        assert all(tuple(mapping[r]) == chunk_stages(pp, r, 2, "v") for r in range(pp))


def test_v_layer_split_32_layers_pp_4() -> None:
    # 32 layers over pp 4 x 2 = 8 chunks of 4: stage s holds layers 4 s .. 4 s + 3; rank r holds stages r and 7 - r
    assert [chunk_layers(32, 4, r, 2, "v") for r in range(4)] == [
        ((0, 1, 2, 3), (28, 29, 30, 31)), ((4, 5, 6, 7), (24, 25, 26, 27)),
        ((8, 9, 10, 11), (20, 21, 22, 23)), ((12, 13, 14, 15), (16, 17, 18, 19))]
    assert stage_layers(32, 4, 3, 2, "v") == tuple(range(12, 20))
    # 10 layers over 4 chunks: 3, 3, 2, 2; pp 2 V: rank 0 stages 0 and 3 (0-2, 8-9), rank 1 stages 1 and 2
    assert chunk_layers(10, 2, 0, 2, "v") == ((0, 1, 2), (8, 9)) and stage_layers(10, 2, 1, 2, "v") == (3, 4, 5, 6, 7)


def test_v_layout_puts_embedding_and_head_on_rank_0() -> None:
    # GPT-2, pp 2, V: rank 0 holds layers 0-2 and 9-11, the embeddings (wte 50,257 x 768 = 38,597,376, wpe 1,024 x
    # 768 = 786,432), ln_f (768 + 768) and the tied head; rank 1 layers 3-8 and nothing outside the layers
    r = resolve(_doc(2, "zbv-zero-bubble", 2, m=4))
    c0, c1 = StepContext(r, 0, "flash", False), StepContext(r, 1, "flash", False)
    assert c0.rp.layers == (0, 1, 2, 9, 10, 11) and c0.rp.has_embedding and c0.rp.has_lm_head and c0.last
    assert c1.rp.layers == (3, 4, 5, 6, 7, 8) and not (c1.rp.has_embedding or c1.rp.has_lm_head or c1.last)
    assert c0.rp.outside_layers == 38_597_376 + 786_432 + 1_536 and c1.rp.outside_layers == 0
    assert c0.rp.total - c1.rp.total == c0.rp.outside_layers  # the same 6 layers' worth on each
    loop = rank_params(r.model, 1, 2, 1, 1, None, virtual=2)
    assert loop.has_lm_head and not rank_params(r.model, 1, 2, 1, 1, None, virtual=2, style="v").has_lm_head


def test_v_schedule_estimate_end_to_end() -> None:
    # GPT-2, torchtitan bf16, 1,024 tokens, pp 2, m 4, ZBV: 4 chunks of 3 layers, each chunk's saved bytes a = k / 2
    # (k: the rank's 6 layers, one micro-batch).  Held from I to W (test_zero_bubble_held_bytes_by_hand's sizes):
    # rank 0 chunk 0 (stage 0) x = 1,572,864, chunk 1 (stage 3, the head) y = 156,403,712; rank 1 both chunks
    # (stages 1, 2) h = 53,477,376.
    # rank 0 walk (test_v_schedules_in_flight_by_hand): F0 F0 F0 F1 = 4a, I1 -> 4a + y, the peak (later steps reach
    # 4a + x or 4a + y at most); in flight = 4a + y - k = k + y.
    # rank 1: ... F1 I1 -> 4a + h; the cooldown I0 I1 I0 -> 3a + 3h, lower as a = 137,035,776 > 2h = 106,954,752;
    # in flight = 4a + h - k = k + h.
    doc = _doc(2, "zbv-zero-bubble", 2, m=4)
    in0, k0 = _in_flight_term(doc, 0)
    in1, k1 = _in_flight_term(doc, 1)
    assert k0 == k1 == 2 * 137_035_776
    assert in0 == k0 + 156_403_712 and in1 == k1 + 53_477_376
    res = train_step(resolve(doc))
    # rank 0 (the head's logits and loss, the embedding) is the reported GPU; every rank was estimated
    assert res.context.stage == 0
    assert any(a.startswith("pipeline schedule zbv-zero-bubble") and ": 4 chunk-micro-batches" in a
               for a in res.assumptions)
    assert any("rank r holding chunks r and 3 - r" in a for a in res.assumptions)
    dual = train_step(resolve(_doc(2, "dualpipev", 2, m=4)))
    # DualPipeV rank 0: F0 F0 F0 F1 = 4a, I1 -> 4a + y (then W1 F1 F0 = 5a, B1 4a, F1 5a: 5a < 4a + y as a < y)
    assert dual.context.stage == 0 and _in_flight_term(_doc(2, "dualpipev", 2, m=4), 0)[0] == k0 + 156_403_712


def test_stage_layers_under_virtual_stages() -> None:
    assert stage_layers(8, 2, 0, 2) == (0, 1, 4, 5) and stage_layers(8, 2, 1, 2) == (2, 3, 6, 7)
    # 10 layers over 4 chunks: 3, 3, 2, 2 (the first chunks take the remainder); rank 0 holds chunks 0 and 2
    assert stage_layers(10, 2, 0, 2) == (0, 1, 2, 6, 7) and stage_layers(10, 2, 1, 2) == (3, 4, 5, 8, 9)
    # one chunk per rank: today's contiguous split
    assert stage_layers(12, 4, 1) == stage_layers(12, 4, 1, 1) == (3, 4, 5)


def _doc(pp: int, schedule: str = "1f1b", v: int = 1, m: int = 8, **par: Any) -> dict[str, Any]:
    return {"model": "gpt2", "task": "train", "hardware": {"gpu": "A100-80GB", "num_gpus": pp},
            "framework": "torchtitan",
            "train": {"micro_batch_size": 1, "seq_len": 1024, "precision": "bf16-mixed", "optimizer": "adamw",
                      "grad_accum_steps": m},
            "parallel": {"pp": pp, "pp_schedule": schedule, "pp_virtual_stages": v, **par}}


def _in_flight_term(doc: dict[str, Any], stage: int) -> tuple[int, int]:
    """(saved.in_flight bytes, one micro-batch's kept bytes over the rank's layers) of one stage."""
    c = StepContext(resolve(doc), stage, "flash", False)
    terms = step_terms(c)
    kept = sum(t.nbytes for t in terms if t.name == "saved.kept")
    return sum(t.nbytes for t in terms if t.name == "saved.in_flight"), kept


@pytest.mark.parametrize("pp", [2, 4])
def test_in_flight_bytes_per_schedule(pp: int) -> None:
    # GPT-2's 12 layers keep the same bytes per layer, L; K = (12 / pp) L per micro-batch on a rank.
    # 1f1b rank 0: (pp - 1) K; gpipe: (8 - 1) K.  Interleaved, v 2, rank 0:
    #   pp 2: 4 chunks of 3 layers, peak 5 chunks = 15 L, less the walked micro-batch (6 L): 9 L = 3 K / 2;
    #   pp 4: 8 chunks of 2, 2, 2, 2, 1, 1, 1, 1 layers; rank 0 holds chunks 0 (2 layers) and 4 (1 layer):
    #   peak 19 L (facts.pipeline_schedules.peak_saved_bytes's example), less 3 L: 16 L = 16 K / 3
    one, k = _in_flight_term(_doc(pp), 0)
    assert one == (pp - 1) * k
    gpipe, k_g = _in_flight_term(_doc(pp, "gpipe"), 0)
    assert k_g == k and gpipe == 7 * k
    inter, k_i = _in_flight_term(_doc(pp, "interleaved-1f1b", 2), 0)
    layer = k // (12 // pp)
    assert k_i == k == layer * (12 // pp)
    assert inter == {2: 9, 4: 16}[pp] * layer
    assert gpipe > inter > one
    # the last rank: 1f1b holds one micro-batch (no extra), gpipe still all 8
    assert _in_flight_term(_doc(pp), pp - 1)[0] == 0
    assert _in_flight_term(_doc(pp, "gpipe"), pp - 1)[0] == 7 * _in_flight_term(_doc(pp, "gpipe"), pp - 1)[1]


def test_gpipe_two_walks() -> None:
    # ScheduleGPipe: every forward, then every backward.  The first backward walks with the other 7 micro-batches
    # in flight and no gradient before it; a later one with 6 in flight and every gradient there
    r = resolve(_doc(4, "gpipe"))
    first, later = StepContext(r, 0, "flash", False), StepContext(r, 0, "flash", False, gpipe_later=True)
    assert not first.grads_during_fwd and later.grads_during_fwd
    f_terms, l_terms = step_terms(first), step_terms(later)
    kept = sum(t.nbytes for t in f_terms if t.name == "saved.kept")
    assert [sum(t.nbytes for t in ts if t.name == "saved.in_flight") for ts in (f_terms, l_terms)] == [7 * kept,
                                                                                                      6 * kept]
    peak = train_step(r).peak.total
    from vramplan.analytic.timeline import sweep_totals
    from vramplan.analytic.train import stage_timeline
    walks = [max(sweep_totals(step_terms(c), stage_timeline(c))[1]) for c in (first, later)]
    assert peak >= max(walks)
    # 1f1b keeps its single walk (gradients from the forward whenever m > 1)
    assert StepContext(resolve(_doc(4)), 0, "flash", False).grads_during_fwd


def test_engine_peak_order_and_assumptions() -> None:
    peaks = {}
    for name, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("gpipe", 1)):
        res = train_step(resolve(_doc(4, name, v)))
        peaks[name] = res.peak.total
        notes = [a for a in res.assumptions if a.startswith("pipeline schedule")]
        assert (notes == []) == (name == "1f1b")
    assert peaks["gpipe"] > peaks["interleaved-1f1b"] > peaks["1f1b"]


def test_interleaved_layout_moves_layers_not_the_embedding() -> None:
    # GPT-2, pp 2, v 2: 4 chunks of 3 layers; rank 0 holds layers 0-2 and 6-8 and the embeddings, rank 1 the head
    c0 = StepContext(resolve(_doc(2, "interleaved-1f1b", 2)), 0, "flash", False)
    c1 = StepContext(resolve(_doc(2, "interleaved-1f1b", 2)), 1, "flash", False)
    assert c0.rp.layers == (0, 1, 2, 6, 7, 8) and c0.rp.has_embedding and not c0.rp.has_lm_head
    assert c1.rp.layers == (3, 4, 5, 9, 10, 11) and c1.rp.has_lm_head


@pytest.mark.parametrize(("doc", "field", "words"), [
    (_doc(4, "dualpipev", 2, m=7), "train.grad_accum_steps", "at least as many micro-batches as stages"),
    (_doc(4, "zbv-zero-bubble", 3), "parallel.pp_virtual_stages", "runs 2 model chunks per rank, not 3"),
    (_doc(4, "zbv-zero-bubble", 2, tp=2), "parallel.pp_schedule", "without tensor parallelism"),
    ({**_doc(4, "dualpipev", 2), "train": {"gradient_checkpointing": "full"}}, "parallel.pp_schedule",
     "gradient_checkpointing full"),
    (_doc(4, "interleaved-zero-bubble", 2, tp=2), "parallel.pp_schedule", "without tensor parallelism"),
    (_doc(4, "interleaved-zero-bubble", 2, m=9), "train.grad_accum_steps", "multiple of its 2 rounds"),
    ({**_doc(4, "interleaved-zero-bubble", 2), "train": {"gradient_checkpointing": "full"}}, "parallel.pp_schedule",
     "gradient_checkpointing full"),
    ({**_doc(4, "interleaved-zero-bubble", 2), "train": {"loss": "chunked"}}, "parallel.pp_schedule", "fused loss"),
    ({**_doc(4, "interleaved-zero-bubble", 2), "model": "Qwen/Qwen3-0.6B"}, "parallel.pp_schedule",
     "per-head norms"),
    (_doc(1, "gpipe"), "parallel.pp_schedule", "pp > 1"),
    (_doc(4, "interleaved-1f1b", 1), "parallel.pp_virtual_stages", ">= 2"),
    (_doc(4, "1f1b", 2), "parallel.pp_virtual_stages", "runs 1 model chunks"),
    (_doc(4, "interleaved-1f1b", 4), "parallel.pp_virtual_stages", "16 chunks exceed the 12 layers"),
    (_doc(4, "interleaved-1f1b", 2, m=9), "train.grad_accum_steps", "multiple of its 2 rounds"),
    ({**_doc(4, "gpipe"), "framework": "deepspeed"}, "parallel.pp_schedule", "deepspeed is modelled with 1f1b"),
])
def test_refusals(doc: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(doc)
    assert any(p.where == field and words in p.message for p in e.value.problems), e.value.problems


def test_trace_refuses_pipelines() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import trace
    with pytest.raises(ScenarioError, match="pipeline"):
        trace(_doc(2, "gpipe"))


def test_bubble_and_slots() -> None:
    # p 4, m 8, 1 s slots: 1f1b/gpipe 11 s with a 3 s bubble; interleaved v 2: 9.5 s with 1.5 s
    assert pipeline_slots(8, 4) == 11 and pipeline_bubble_seconds(1.0, 4) == 3.0
    assert pipeline_slots(8, 4, 2) == 9.5 and pipeline_bubble_seconds(1.0, 4, 2) == 1.5


def test_torchtitan_export_names_the_schedule() -> None:
    from vramplan.export.torchtitan import torchtitan_config
    from vramplan.plan.setup import TrainSetup
    from vramplan.spec.scenario import Parallel

    def par(schedule: str, v: int) -> dict[str, Any]:
        s = TrainSetup(framework="torchtitan", num_gpus=4, micro_batch_size=1, grad_accum_steps=8, seq_len=2048,
                       parallel=Parallel(pp=2, fsdp="full_shard", pp_schedule=schedule, pp_virtual_stages=v))
        return torchtitan_config(s, "llama", 30, 4096)["parallelism"]

    assert par("1f1b", 1)["pipeline_parallel_schedule"] == "1F1B"
    assert par("gpipe", 1)["pipeline_parallel_schedule"] == "GPipe"
    two = par("interleaved-1f1b", 2)
    # torchtitan's default for a multi-stage schedule is 2 chunks per rank: no layers_per_stage written
    assert two["pipeline_parallel_schedule"] == "Interleaved1F1B" and "pipeline_parallel_layers_per_stage" not in two
    # 30 layers + embedding + head = 32 effective over pp 2 x v 4 = 8 stages: 4 layers per stage
    assert par("interleaved-1f1b", 4)["pipeline_parallel_layers_per_stage"] == 4
    with pytest.raises(ValueError, match="no pipeline_parallel_layers_per_stage"):
        par("interleaved-1f1b", 3)  # 32 / 6 is not whole
    # the V schedules: torchtitan's default of 2 chunks per rank, its stage_ids_this_rank style "v" for them
    for name, torchtitan in (("zbv-zero-bubble", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")):
        v_keys = par(name, 2)
        assert v_keys["pipeline_parallel_schedule"] == torchtitan and "pipeline_parallel_layers_per_stage" not in v_keys


def test_rows_name_torchs_classes() -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for row in PIPELINE_SCHEDULES:  # get_schedule_class reads the torchtitan name case-insensitively
        assert schedules.get_schedule_class(row.torchtitan).__name__ == row.torch_class


def test_cli_flags_set_the_schedule() -> None:
    import json

    from typer.testing import CliRunner

    from vramplan.cli.main import app

    base = ["estimate", "--model", "gpt2", "--gpu", "A100-80GB", "--num-gpus", "4", "--framework", "torchtitan",
            "--pp", "4", "--grad-accum-steps", "8", "--json"]
    env = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    res = CliRunner().invoke(app, [*base, "--pp-schedule", "interleaved-1f1b", "--pp-virtual-stages", "2"], env=env)
    assert res.exit_code in (0, 1), res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["scenario"]["parallel"]["pp_schedule"] == "interleaved-1f1b"
    # pp 4, v 2, m 8, rank 0: 11 chunk-micro-batches (module docstring)
    assert any(a.startswith("pipeline schedule interleaved-1f1b") and ": 11 chunk-micro-batches" in a
               for a in doc["assumptions"])
    zb = CliRunner().invoke(app, [*base, "--pp-schedule", "interleaved-zero-bubble", "--pp-virtual-stages", "2"],
                            env=env)
    assert zb.exit_code in (0, 1), zb.stdout + zb.stderr
    # pp 4, v 2, m 8: 8 chunk-micro-batches on the first rank (test_zero_bubble_walk_by_hand)
    assert any(": 8 chunk-micro-batches" in a for a in json.loads(zb.stdout)["assumptions"])
    zbv = CliRunner().invoke(app, [*base, "--pp-schedule", "zbv-zero-bubble", "--pp-virtual-stages", "2"], env=env)
    assert zbv.exit_code in (0, 1), zbv.stdout + zbv.stderr
    # pp 4, m 8: 2 pp = 8 chunk-micro-batches on rank 0 (test_v_schedules_in_flight_by_hand)
    assert any(a.startswith("pipeline schedule zbv-zero-bubble") and ": 8 chunk-micro-batches" in a
               for a in json.loads(zbv.stdout)["assumptions"])
    # DualPipeV needs m >= 2 pp = 8 micro-batches (ScheduleDualPipeV.__init__): 7 are refused
    bad = CliRunner().invoke(app, [*base[:-3], "--grad-accum-steps", "7", "--json", "--pp-schedule", "dualpipev",
                                   "--pp-virtual-stages", "2"], env=env)
    assert bad.exit_code == 2 and "at least as many micro-batches" in bad.stdout + bad.stderr
