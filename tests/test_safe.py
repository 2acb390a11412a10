"""measure/safe.py: shrinking the micro-batch on OOM, keeping the global batch, and the first choice."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramplan.measure.safe import (
    Adjustment,
    BatchPlan,
    SafeStep,
    free_memory,
    is_oom_error,
    largest_fitting_micro_batch,
    micro_batches,
    next_smaller,
)

torch = pytest.importorskip("torch")


def fake_oom(limit: int) -> Any:
    """A step that runs out of memory above ``limit`` sequences per micro-batch (CPU stand-in)."""
    calls: list[tuple[int, int]] = []

    def step(micro: int, accum: int) -> tuple[int, int]:
        calls.append((micro, accum))
        if micro > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {micro} GiB")
        return micro, accum

    step.calls = calls  # type: ignore[attr-defined]
    return step


def test_halving_sequence_keeps_the_global_batch() -> None:
    plans = [BatchPlan(8, 1)]
    while (nxt := next_smaller(plans[-1])) is not None:
        plans.append(nxt)
    assert [(p.micro_batch_size, p.grad_accum_steps) for p in plans] == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert {p.global_batch for p in plans} == {8}


def test_odd_micro_batches_divide_by_their_smallest_factor() -> None:
    # 6 x 2 -> 3 x 4 -> 1 x 12; 9 x 1 -> 3 x 3 -> 1 x 9
    assert next_smaller(BatchPlan(6, 2)) == BatchPlan(3, 4)
    assert next_smaller(BatchPlan(3, 4)) == BatchPlan(1, 12)
    assert next_smaller(BatchPlan(9, 1)) == BatchPlan(3, 3)
    assert next_smaller(BatchPlan(1, 5)) is None


@given(st.integers(1, 4096), st.integers(1, 64))
def test_global_batch_always_kept(micro: int, accum: int) -> None:
    plan = BatchPlan(micro, accum)
    while (nxt := next_smaller(plan)) is not None:
        assert nxt.global_batch == plan.global_batch and nxt.micro_batch_size < plan.micro_batch_size
        plan = nxt
    assert plan.micro_batch_size == 1


def test_safe_step_halves_on_oom_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    step = fake_oom(limit=2)
    opt = SimpleNamespace(cleared=0)
    opt.zero_grad = lambda set_to_none: setattr(opt, "cleared", opt.cleared + int(set_to_none))
    emptied: list[int] = []
    changes: list[Adjustment] = []
    safe = SafeStep(step, micro_batch_size=8, grad_accum_steps=1, optimizer=opt,
                    empty_cache=lambda: emptied.append(1), on_change=changes.append)
    with caplog.at_level(logging.WARNING, logger="vramplan.measure"):
        assert safe() == (2, 4)
    assert step.calls == [(8, 1), (4, 2), (2, 4)]
    assert [(a.before.micro_batch_size, a.after.micro_batch_size) for a in safe.history] == [(8, 4), (4, 2)]
    assert all(a.after.global_batch == 8 for a in safe.history) and changes == safe.history
    assert opt.cleared == 2 and len(emptied) == 2  # freed before each retry
    assert "retrying with 4 x 2 (global batch 8 kept)" in caplog.text
    # the next call starts from the plan that worked
    assert safe() == (2, 4) and step.calls[-1] == (2, 4)


def test_oom_at_micro_batch_one_is_raised() -> None:
    safe = SafeStep(fake_oom(limit=0), micro_batch_size=2, grad_accum_steps=3, empty_cache=lambda: None)
    with pytest.raises(torch.OutOfMemoryError):
        safe()
    assert safe.plan == BatchPlan(1, 6)


def test_other_errors_pass_through_unchanged() -> None:
    def bad(micro: int, accum: int) -> None:
        raise ValueError("shape mismatch")

    safe = SafeStep(bad, micro_batch_size=8, empty_cache=lambda: None)
    with pytest.raises(ValueError, match="shape mismatch"):
        safe()
    assert safe.history == [] and safe.plan == BatchPlan(8, 1)


def test_injected_oom_predicate() -> None:
    class FakeOOM(Exception):
        pass

    def step(micro: int, accum: int) -> int:
        if micro > 1:
            raise FakeOOM
        return accum

    safe = SafeStep(step, micro_batch_size=4, is_oom=lambda e: isinstance(e, FakeOOM), empty_cache=lambda: None)
    assert safe() == 4


def test_is_oom_error() -> None:
    assert is_oom_error(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_oom_error(RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB"))
    assert is_oom_error(MemoryError())
    assert not is_oom_error(RuntimeError("size mismatch"))


def test_real_cpu_training_step_with_injected_oom_sees_the_whole_batch() -> None:
    """A real model; micro-batches above 2 'run out of memory' after their first backward.

    The aborted attempts' gradients are dropped, so the step that succeeds equals one SGD step
    on the full batch of 8 (the mean loss over the same 8 samples).
    """
    import copy

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 4), "y": torch.randn(8, 1)}
    seen: list[int] = []

    def train_step(micro: int, accum: int) -> float:
        seen.clear()
        total = 0.0
        for mb in micro_batches(batch, micro):
            loss = torch.nn.functional.mse_loss(model(mb["x"]), mb["y"]) / accum
            loss.backward()
            total += loss.item()
            seen.append(len(mb["x"]))
            if micro > 2:
                raise torch.OutOfMemoryError("injected after a backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_loss = torch.nn.functional.mse_loss(reference(batch["x"]), batch["y"])
    ref_loss.backward()
    ref_opt.step()
    safe = SafeStep(train_step, micro_batch_size=8, optimizer=opt, model=model, empty_cache=lambda: None)
    loss = safe()
    assert safe.plan == BatchPlan(2, 4) and seen == [2, 2, 2, 2]
    assert loss == pytest.approx(ref_loss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_free_memory_sets_grads_to_none() -> None:
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None
    free_memory(model=model, empty_cache=lambda: None)
    assert model.weight.grad is None


def test_micro_batches_split_tensors_tuples_and_mappings() -> None:
    t = torch.arange(10)
    assert [len(p) for p in micro_batches(t, 4)] == [4, 4, 2]
    pairs = list(micro_batches((t, t * 2), 5))
    assert len(pairs) == 2 and torch.equal(pairs[1][1], t[5:] * 2)


# ---------------------------------------------------------------- the first micro-batch from the prediction

def _fake_estimator(per_sequence: int, fixed: int, capacity: int) -> Any:
    def estimate(doc: dict[str, Any]) -> Any:
        used = fixed + per_sequence * doc["train"]["micro_batch_size"]
        return SimpleNamespace(per_gpu=SimpleNamespace(device_used_bytes=used, capacity_bytes=capacity))

    return estimate


def test_largest_fitting_micro_batch_by_hand() -> None:
    # capacity 100, margin 0.1 -> limit 90; used = 10 + 12 * mb: mb 6 -> 82 fits, mb 8 -> 106 does not.
    # Divisors of the global batch 24: 1,2,3,4,6,8,12,24 -> 6 (x 4 accumulation)
    choice = largest_fitting_micro_batch({"model": "gpt2", "train": {"micro_batch_size": 24}},
                                         margin=0.1, estimator=_fake_estimator(12, 10, 100))
    assert choice.plan == BatchPlan(6, 4) and choice.fits
    assert choice.predicted_used_bytes == 82 and choice.limit_bytes == 90
    assert len(choice.tried) <= 4  # bisection over 8 divisors


def test_nothing_fits_gives_micro_batch_one() -> None:
    choice = largest_fitting_micro_batch({"model": "gpt2", "train": {"micro_batch_size": 4, "grad_accum_steps": 2}},
                                         estimator=_fake_estimator(50, 200, 100))
    assert choice.plan == BatchPlan(1, 8) and not choice.fits


def test_first_micro_batch_from_the_analytic_prediction() -> None:
    """GPT-2 small, fp32, seq 1024 on a T4, global batch 32: the choice fits and twice it does not."""
    from vramplan.engine import estimate

    doc = {"model": "gpt2", "hardware": {"gpu": "T4"},
           "train": {"micro_batch_size": 32, "seq_len": 1024, "precision": "fp32", "optimizer": "adamw"}}
    choice = largest_fitting_micro_batch(doc, margin=0.1)
    mb = choice.plan.micro_batch_size
    assert choice.fits and choice.plan.global_batch == 32

    def used(m: int) -> tuple[int, int]:
        r = estimate({**doc, "train": {**doc["train"], "micro_batch_size": m, "grad_accum_steps": 32 // m}})
        return r.per_gpu.device_used_bytes, int(r.per_gpu.capacity_bytes * 0.9)

    got, limit = used(mb)
    assert got <= limit and got == choice.predicted_used_bytes
    if mb < 32:
        bigger, _ = used(mb * 2)
        assert bigger > limit

    safe = SafeStep.from_scenario(lambda m, a: (m, a), doc, margin=0.1)
    assert safe.plan == choice.plan and safe() == (mb, 32 // mb)
