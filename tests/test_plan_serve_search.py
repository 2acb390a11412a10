"""The serving search's branch and bound (plan/search.py ``_walk_serve``) against its exhaustive walk.

Two bounds let the search skip estimates: the weights vLLM loads on a rank (``PlanContext.serve_weights_floor``)
bound each deployment's tokens per second from above, and, with the KV bytes a request of ``max_model_len`` needs,
prove that a deployment cannot hold its requests (``PlanContext.serve_cannot_fit``).  Both must be bounds of what
the estimate says, and the answer must be the exhaustive walk's, on models with sliding windows (Mistral 7B v0.1,
Gemma 2 and 3), MLA (DeepSeek-V2-Lite), experts and a plain dense model.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramplan.errors import ScenarioError
from vramplan.plan import ServeJob, plan
from vramplan.plan.context import make_context
from vramplan.plan.fit import band_fits
from vramplan.plan.space import serve_candidates
from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS

MODELS = ["meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B-v0.1", "google/gemma-2-9b", "google/gemma-3-4b-it",
          "deepseek-ai/DeepSeek-V2-Lite", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen2.5-0.5B"]
GPUS = ["L4", "A100-80GB", "H100-SXM", "RTX-4090", "A10G"]
SLOW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _answer(res):  # type: ignore[no-untyped-def]
    return [(r.label, r.tokens_per_s) for r in ([res.chosen] if res.chosen else []) + res.runners_up]


@SLOW
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), counts=st.sampled_from(["1", "1-4", "1,2,8", "2-8"]),
       top=st.sampled_from([1, 3, 5]), length=st.sampled_from([2048, 4096, 8192]),
       concurrency=st.sampled_from([1, 8, 64]), quant=st.booleans())
def test_serving_branch_and_bound_equals_exhaustive(model: str, gpu: str, counts: str, top: int, length: int,
                                                    concurrency: int, quant: bool) -> None:
    job = ServeJob(max_model_len=length, concurrency=concurrency, allow_quantization=quant)
    fast = plan(model, gpu, counts, job, top=top, explain=False)
    full = plan(model, gpu, counts, job, top=top, explain=False, exhaustive=True)
    assert _answer(fast) == _answer(full)
    assert fast.by_gpu_count == full.by_gpu_count
    # the notes too, but the count of refused deployments, which counts only those the walk reached
    assert [n for n in fast.notes if "refuses them" not in n] == [n for n in full.notes if "refuses them" not in n]
    # the exhaustive walk estimates every deployment (no screen), so a deployment the screen drops wrongly shows here
    assert full.stats.pruned == 0 and full.stats.bound_rejected == 0 and full.stats.estimated >= fast.stats.estimated
    assert fast.stats.candidates == fast.stats.bound_rejected + fast.stats.estimated + fast.stats.pruned


@SLOW
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), n=st.sampled_from([1, 2, 4, 8]),
       length=st.sampled_from([1024, 4096, 8192]), concurrency=st.sampled_from([1, 4, 32, 256]))
def test_serving_bounds_hold_against_the_estimate(model: str, gpu: str, n: int, length: int, concurrency: int) -> None:
    """Every candidate: the weights floor is at most the report's weights, the tokens-per-second bound at least the
    walk's figure, and a candidate the KV screen rejects is one the estimate does not fit."""
    from vramplan.plan.steptime.serve import decode_step_time

    ctx = make_context(model, gpu, 0.1, DEFAULT_ASSUMPTIONS, "serve", {"serve": {"max_model_len": length}})
    job = ServeJob(max_model_len=length, concurrency=concurrency, allow_quantization=True)
    for s in serve_candidates(ctx.model, ctx.gpu, n, job, 0.1):
        rep = ctx.estimate(s)
        floor = ctx.serve_weights_floor(s)
        assert 0 < floor <= rep.per_gpu.breakdown["weights"], s.label()
        kv = ctx.kv_bytes_per_token(s)
        bound = decode_step_time(s, ctx.facts, ctx.gpu, ctx.assumptions, floor, kv, s.max_num_seqs).tokens_per_s
        exact = decode_step_time(s, ctx.facts, ctx.gpu, ctx.assumptions, rep.per_gpu.breakdown["weights"], kv,
                                 s.max_num_seqs).tokens_per_s
        assert bound >= exact
        if ctx.serve_cannot_fit(s):
            assert not band_fits(rep, s.max_num_seqs), s.label()
        # at the boundary: as many requests as the band's low pool holds fit, so the screen must let them through
        most = rep.serve.max_concurrency_low or 0
        if most >= 1:
            edge = dataclasses.replace(s, max_num_seqs=most)
            if band_fits(ctx.estimate(edge), most):
                assert not ctx.serve_cannot_fit(edge), edge.label()


def test_the_screen_rejects_what_cannot_hold_its_requests() -> None:
    """Llama 3.1 8B (32 layers, 8 KV heads of 128: 32 x 2 x 8 x 128 x 2 B = 131,072 B per token in bf16) on one
    L4: 32 requests of 8,192 tokens need 32 x 8,192 x 131,072 B = 32 GiB of KV cache, more than the whole card
    (about 22 GiB), so the screen rejects it; one request (1 GiB) is not rejected."""
    ctx = make_context("meta-llama/Llama-3.1-8B", "L4", 0.1, DEFAULT_ASSUMPTIONS, "serve",
                       {"serve": {"max_model_len": 8192}})
    many = next(iter(serve_candidates(ctx.model, ctx.gpu, 1, ServeJob(max_model_len=8192, concurrency=32), 0.1)))
    one = next(iter(serve_candidates(ctx.model, ctx.gpu, 1, ServeJob(max_model_len=8192, concurrency=1), 0.1)))
    assert ctx.kv_bytes_per_token(many) == 131_072
    assert ctx.serve_cannot_fit(many) and not ctx.serve_cannot_fit(one)
    assert not band_fits(ctx.estimate(many), 32)


def test_the_walk_prunes_the_bench_case() -> None:
    """The benchmark's serving search (benchmarks/bench_plan.py): 90 candidates over 1-8 L4s; the walk estimates a
    few of them (each count's best at least, 8), not all 90, and finds what the exhaustive walk finds."""
    job = ServeJob(max_model_len=8192, concurrency=32, allow_quantization=True)
    fast = plan("meta-llama/Llama-3.1-8B", "L4", "1-8", job, explain=False)
    full = plan("meta-llama/Llama-3.1-8B", "L4", "1-8", job, explain=False, exhaustive=True)
    assert fast.stats.candidates == full.stats.candidates == 90
    assert full.stats.estimated == 90 and full.stats.bound_rejected == 0  # the exhaustive walk estimates them all
    assert 8 <= fast.stats.estimated < 30
    assert _answer(fast) == _answer(full)


def test_a_loose_floor_still_gives_the_exhaustive_answer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The catalog's floors are tight (a count's first fitting deployment is its best), so the walk's other
    condition, that a count stops only once its best is found, is exercised here with a floor of one byte, still a
    lower bound: the bounds then order by the KV cache alone, and a count's first fit is not its best."""
    from vramplan.plan.context import PlanContext

    monkeypatch.setattr(PlanContext, "serve_weights_floor", lambda self, s: 1)
    for model, counts, top, length, concurrency in [("meta-llama/Llama-3.1-8B", "1-4", 1, 2048, 64),
                                                    ("Qwen/Qwen3-30B-A3B", "1,2,8", 3, 8192, 8)]:
        job = ServeJob(max_model_len=length, concurrency=concurrency, allow_quantization=True)
        fast = plan(model, "L4", counts, job, top=top, explain=False)
        full = plan(model, "L4", counts, job, top=top, explain=False, exhaustive=True)
        assert _answer(fast) == _answer(full)
        assert fast.by_gpu_count == full.by_gpu_count


def test_what_the_estimator_refuses_of_every_deployment_is_raised() -> None:
    """Yi-34B (4,096 positions) at max_model_len 32,768 on one L4: every deployment is screened out (the weights alone
    exceed the card), but the plan's first deployment is still estimated, so the estimator's refusal of the length is
    raised, as the exhaustive walk raises it, rather than answered with "nothing fits"."""
    job = ServeJob(max_model_len=32768, concurrency=64)
    for exhaustive in (False, True):
        with pytest.raises(ScenarioError, match="max_position_embeddings"):
            plan("01-ai/Yi-34B", "L4", "1", job, explain=False, exhaustive=exhaustive)


def test_a_deployment_the_estimator_refuses_is_skipped_not_the_plan() -> None:
    """Qwen3-30B-A3B-FP8 holds block-wise fp8 weights (128 x 128 blocks): vLLM needs every tensor-parallel slice to be a
    multiple of 128, and its K / V projections (4 KV heads x 128 = 512 rows) split over 8 ranks give 64.  On 8 H100s the
    TP8 deployments are refused, counted in a note, and the plan answers with the others (the plan once raised the
    refusal from the chosen setup's validation)."""
    res = plan("Qwen/Qwen3-30B-A3B-FP8", "H100-SXM", "8", ServeJob(max_model_len=2048, concurrency=8), top=3,
               explain=False)
    assert res.chosen is not None
    assert all(r.scenario["parallel"]["tp"] < 8 for r in [res.chosen, *res.runners_up])
    assert any("refuses them" in n and "multiple of 128" in n for n in res.notes)


def test_ties_in_tokens_per_second_keep_the_exhaustive_order(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Decode rates rounded to whole thousands of tokens per second (a rate that stays an upper bound when its
    weights are a lower bound): many deployments tie, in their bound and in their rate, so the walk's strict
    comparisons decide; the answer and each count's best must still be the exhaustive walk's, whose ties go to the
    smaller tp, then to the candidates' order."""
    import math

    from vramplan.plan import search

    real = search.decode_step_time

    def coarse(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = real(*args, **kwargs)
        return dataclasses.replace(t, tokens_per_s=float(math.ceil(t.tokens_per_s / 1000) * 1000))

    monkeypatch.setattr(search, "decode_step_time", coarse)
    for model, gpu, counts, top, length, concurrency in [("meta-llama/Llama-3.1-8B", "L4", "1-8", 5, 2048, 32),
                                                         ("Qwen/Qwen2.5-0.5B", "H100-SXM", "1-4", 3, 2048, 256),
                                                         ("Qwen/Qwen3-30B-A3B", "A100-80GB", "1,2,8", 2, 8192, 8)]:
        job = ServeJob(max_model_len=length, concurrency=concurrency, allow_quantization=True)
        fast = plan(model, gpu, counts, job, top=top, explain=False)
        full = plan(model, gpu, counts, job, top=top, explain=False, exhaustive=True)
        assert _answer(fast) == _answer(full), (model, gpu)
        assert fast.by_gpu_count == full.by_gpu_count, (model, gpu)
