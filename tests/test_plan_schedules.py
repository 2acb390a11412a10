"""The planner searches pipeline schedules (issue 17): 1F1B, interleaved 1F1B with 2 or 4 model chunks per rank and
the split-backward schedules (ZB1P interleaved, ZB-V, DualPipeV) at 2, under torchtitan with pp > 1, only where
torch's schedule class takes the micro-batch count; the split schedules' bubble is the walk of torch's action order
(plan/steptime/pipeline.py)."""

from __future__ import annotations

from vramplan.catalog.resolve import resolve
from vramplan.plan.context import make_context
from vramplan.plan.search import plan
from vramplan.plan.space import TrainJob, _pp_schedules, _schedule_takes, train_candidates
from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS
from vramplan.plan.steptime.pipeline import pipeline_slots

V2 = {"pp_schedule": "interleaved-1f1b", "pp_virtual_stages": 2}
V4 = {"pp_schedule": "interleaved-1f1b", "pp_virtual_stages": 4}
ZB = [{"pp_schedule": n, "pp_virtual_stages": 2} for n in ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")]


def _model(name: str):  # type: ignore[no-untyped-def]
    return make_context(name, "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train").model


def test_schedules_searched_per_stage_count() -> None:
    m70 = _model("llama-3-70b")  # 80 layers
    assert m70.num_layers == 80
    assert _pp_schedules(m70, 1) == [{}]  # no pipeline: nothing to schedule
    # pp 2: 2 x 2 = 4 chunks <= 80 layers; 2 x 4 = 8 chunks divide 80 evenly (10 layers each)
    assert _pp_schedules(m70, 2) == [{}, V2, V4, *ZB]
    m8 = _model("llama-3-8b")  # 32 layers
    # pp 3: 6 chunks <= 32 (v = 2 taken, the engine splits unevenly); 12 chunks do not divide 32 -> no v = 4
    assert _pp_schedules(m8, 3) == [{}, V2, *ZB]
    # pp 32: 64 chunks > 32 layers -> 1F1B only
    assert _pp_schedules(m8, 32) == [{}]


def test_interleaved_takes_multiples_of_its_rounds() -> None:
    # torch ScheduleInterleaved1F1B: rounds = max(1, m // pp), m % rounds must be 0
    assert _schedule_takes("interleaved-1f1b", 4, 6)  # rounds max(1, 1) = 1: 6 % 1 = 0
    assert _schedule_takes("interleaved-1f1b", 4, 10)  # rounds 2: 10 % 2 = 0
    assert not _schedule_takes("interleaved-1f1b", 4, 9)  # rounds 2: 9 % 2 = 1
    assert _schedule_takes("1f1b", 4, 9)  # 1F1B takes any count
    assert not _schedule_takes("interleaved-zero-bubble", 4, 9)  # the same rounds as ScheduleInterleaved1F1B
    # ScheduleDualPipeV.__init__: at least 2 pp micro-batches; ScheduleZBVZeroBubble takes any count
    assert _schedule_takes("dualpipev", 4, 8) and not _schedule_takes("dualpipev", 4, 7)
    assert _schedule_takes("zbv-zero-bubble", 4, 3)


def test_every_interleaved_candidate_is_a_valid_scenario() -> None:
    ctx = make_context("llama-3-8b", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train")
    job = TrainJob(seq_len=4096, global_batch=18)
    found = [s for s in train_candidates(ctx.model, ctx.gpu, 8, job) if s.pp_schedule == "interleaved-1f1b"]
    assert found  # e.g. tp 1, pp 4, dp 2: 9 sequences per rank, micro-batch 1 -> 9 micro-batches
    for s in found:
        assert s.framework == "torchtitan" and s.pp > 1 and s.pp_virtual_stages in (2, 4)
        g = s.grad_accum_steps
        assert _schedule_takes("interleaved-1f1b", s.pp, g)
        # the document validates (spec/load.py _schedule_problems raises otherwise) and is the searched scenario
        assert resolve(ctx.document(s)).scenario == ctx.scenario(s)
    # pp 4 with 9 micro-batches (rounds 2) is never produced
    assert not any(s.pp == 4 and s.grad_accum_steps == 9 for s in found)


def test_interleaved_bubble_and_memory_against_1f1b() -> None:
    ctx = make_context("llama-3-70b", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train")
    job = TrainJob(seq_len=8192, global_batch=64)
    cands = [s for s in train_candidates(ctx.model, ctx.gpu, 32, job)
             if s.pp == 2 and s.tp == 2 and s.micro_batch_size == 2 and s.checkpointing == "full"
             and s.precision == "bf16-mixed"]
    one = next(s for s in cands if s.pp_schedule == "1f1b")
    inter = next(s for s in cands if s.pp_schedule == "interleaved-1f1b" and s.pp_virtual_stages == 4)
    # dp = 32 / 4 = 8 ranks, 64 / 8 = 8 sequences each, micro-batch 2 -> m = 4 micro-batches
    assert one.grad_accum_steps == inter.grad_accum_steps == 4
    # slots: 1F1B m + (pp - 1) = 5; interleaved m + (pp - 1) / v = 4.25 (arXiv 2104.04473 sec. 2.2.2)
    assert pipeline_slots(4, 2) == 5.0 and pipeline_slots(4, 2, 4) == 4.25
    assert ctx.step_time(inter).pp_bubble_s < ctx.step_time(one).pp_bubble_s
    # more activations in flight: the interleaved setup needs more memory on its first rank
    a, b = ctx.estimate(one), ctx.estimate(inter)
    assert b.per_gpu.peak_allocated_bytes > a.per_gpu.peak_allocated_bytes


def test_plan_ranks_an_interleaved_setup_and_its_document_reproduces_it() -> None:
    r = plan("llama-3-70b", "H100-SXM", 32, TrainJob(seq_len=8192, global_batch=64), explain=False)
    assert r.fits
    inter = [x for x in [r.chosen, *r.runners_up] if x is not None and x.setup["pp_schedule"] == "interleaved-1f1b"]
    assert inter, "an interleaved 1F1B setup is among the ranked setups"
    x = inter[0]
    assert "interleaved-1f1b x" in x.label
    assert x.scenario["parallel"]["pp_schedule"] == "interleaved-1f1b"
    again = resolve(x.scenario)
    from vramplan.engine import estimate

    assert estimate(again).per_gpu.device_used_bytes == x.device_used_bytes


def test_split_schedule_bubble_walk_by_hand() -> None:
    from vramplan.plan.steptime.pipeline import split_bubble_slots, split_schedule_makespan

    # ZB-V, pp 2, 4 micro-batches, unit passes per chunk: rank 1 starts at 1 (rank 0's first chunk-0 forward) and
    # runs 4 x 2 x 3 = 24 units, so the walk ends no earlier than 25; torch's order reaches that bound
    assert split_schedule_makespan("zbv-zero-bubble", 2, 2, 4, 1.0, 1.0, 1.0) == 25.0
    # in micro-batch slots of 2 chunks x 3 units = 6: (25 - 24) / 6 = 1/6 = (pp - 1) / (3 v)
    assert abs(split_bubble_slots("zbv-zero-bubble", 2, 2, 4, 1.0, 1.0, 1.0) - 1 / 6) < 1e-9
    for name in ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev"):
        # pp 4, m 8, equal passes: (4 - 1) / (3 x 2) = 0.5 slot, a third of interleaved 1F1B's 3 / 2
        assert abs(split_bubble_slots(name, 4, 2, 8, 1.0, 1.0, 1.0) - 0.5) < 1e-9, name
    # frozen weights (no W to fill the idle slots): the bubble grows back to interleaved 1F1B's (pp - 1) / v = 1.5
    assert abs(split_bubble_slots("interleaved-zero-bubble", 4, 2, 8, 1.0, 2.0, 0.0) - 1.5) < 1e-9


def test_split_schedules_time_and_memory_against_interleaved() -> None:
    ctx = make_context("llama-3-70b", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train")
    job = TrainJob(seq_len=8192, global_batch=64)
    cands = [s for s in train_candidates(ctx.model, ctx.gpu, 32, job)
             if s.pp == 4 and s.tp == 1 and s.micro_batch_size == 1 and s.checkpointing == "none"
             and s.precision == "bf16-mixed" and s.pp_virtual_stages == 2]
    inter = next(s for s in cands if s.pp_schedule == "interleaved-1f1b")
    # dp = 32 / 4 = 8 ranks, 8 sequences each, micro-batch 1 -> 8 micro-batches (>= 2 pp: DualPipeV takes it)
    assert inter.grad_accum_steps == 8
    base = ctx.step_time(inter)
    for name in ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev"):
        s = next(c for c in cands if c.pp_schedule == name)
        t = ctx.step_time(s)
        # full fine-tuning: W is a third of the pass times, so the walk leaves well under interleaved's (pp - 1) / v
        assert 0 < t.pp_bubble_s < 0.6 * base.pp_bubble_s, name
        assert t.total_s < base.total_s, name
        # the document validates and is the searched scenario
        assert resolve(ctx.document(s)).scenario == ctx.scenario(s), name


def test_split_schedules_only_where_the_estimator_models_them() -> None:
    ctx = make_context("llama-3-70b", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train")
    job = TrainJob(seq_len=4096, global_batch=64)
    split = [s for s in train_candidates(ctx.model, ctx.gpu, 32, job)
             if s.pp_schedule in ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")]
    assert split
    # spec/load.py _split_backward_problems refuses tensor parallelism and checkpointing with them
    assert all(s.tp == 1 and s.checkpointing == "none" for s in split)
    # a mixture of experts' routed experts are not in the held-gradient model: no split schedule for it
    moe = make_context("mixtral-8x7b", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train").model
    assert _pp_schedules(moe, 4) == [{}, V2, V4]
