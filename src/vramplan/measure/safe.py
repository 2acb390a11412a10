"""A training step that survives an out-of-memory error by halving its micro-batch.

``SafeStep`` wraps a function that runs one optimizer step for a given micro-batch size and
gradient-accumulation count.  On an OOM it frees what it can (gradients set to None, Python
garbage, ``torch.cuda.empty_cache()`` where CUDA exists), halves the micro-batch, doubles the
accumulation so that the global batch (micro-batch x accumulation) stays the same, logs the
change and runs the step again from the start.  An odd micro-batch is divided by its smallest
prime factor instead of 2 (micro-batch 6 -> 3 -> 1, accumulation 1 -> 2 -> 6), so the global
batch is always kept exactly.

The first micro-batch comes from the prediction rather than from trial and error:
``largest_fitting_micro_batch`` asks the analytic engine for each micro-batch that divides the
global batch and keeps the largest whose predicted device memory stays under
``(1 - margin)`` of the GPU's capacity.  (The planner may later take this over; the function
keeps its name and signature.)

Example::

    def train_step(micro_batch_size: int, grad_accum_steps: int) -> float:
        batch = next(loader)                      # the global batch
        total = 0.0
        for mb in micro_batches(batch, micro_batch_size):
            loss = model(**mb).loss / grad_accum_steps
            loss.backward()
            total += loss.item()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        return total

    step = SafeStep.from_scenario(train_step, "llama3-8b.yaml", optimizer=optimizer, model=model)
    for _ in range(steps):
        step()
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from vramplan.monotone import largest_true

__all__ = [
    "Adjustment", "BatchPlan", "MicroBatchChoice", "SafeStep", "free_memory", "is_oom_error",
    "largest_fitting_micro_batch", "micro_batches", "next_smaller",
]

log = logging.getLogger("vramplan.measure")
T = TypeVar("T")


@dataclass(frozen=True)
class BatchPlan:
    micro_batch_size: int
    grad_accum_steps: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps


@dataclass(frozen=True)
class Adjustment:
    before: BatchPlan
    after: BatchPlan
    reason: str


def _smallest_factor(n: int) -> int:
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def next_smaller(plan: BatchPlan) -> BatchPlan | None:
    """Half the micro-batch (or a third, ... for odd sizes), the same global batch; None at 1.

    Examples: 8 x 1 -> 4 x 2; 6 x 2 -> 3 x 4; 3 x 4 -> 1 x 12; 1 x 12 -> None.
    """
    if plan.micro_batch_size <= 1:
        return None
    f = _smallest_factor(plan.micro_batch_size)
    return BatchPlan(plan.micro_batch_size // f, plan.grad_accum_steps * f)


def is_oom_error(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or an allocator's out-of-memory RuntimeError (CUDA or CPU)."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "out of memory" in text or "not enough memory" in text
        or "can't allocate memory" in text)


def free_memory(optimizer: Any = None, model: Any = None, empty_cache: Callable[[], None] | None = None) -> None:
    """Drop gradients (set to None), collect garbage, and return cached blocks to the driver."""
    for owner in (optimizer, model):
        if owner is not None and hasattr(owner, "zero_grad"):
            owner.zero_grad(set_to_none=True)
    gc.collect()
    if empty_cache is not None:
        empty_cache()
        return
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def micro_batches(batch: Any, micro_batch_size: int) -> Iterator[Any]:
    """Split a batch (a tensor, or a mapping / tuple / list of tensors) along dimension 0."""
    def size(x: Any) -> int:
        if isinstance(x, Mapping):
            return size(next(iter(x.values())))
        if isinstance(x, (tuple, list)):
            return size(x[0])
        return len(x)

    def part(x: Any, i: int) -> Any:
        if isinstance(x, Mapping):
            return {k: part(v, i) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(part(v, i) for v in x)
        return x[i:i + micro_batch_size]

    for i in range(0, size(batch), micro_batch_size):
        yield part(batch, i)


@dataclass(frozen=True)
class MicroBatchChoice:
    plan: BatchPlan
    predicted_used_bytes: int  # predicted device memory of this plan
    limit_bytes: int  # (1 - margin) x capacity
    fits: bool  # False: even micro-batch 1 is predicted not to fit
    tried: dict[int, int] = field(default_factory=dict)  # micro-batch -> predicted bytes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_fitting_micro_batch(
    scenario: str | Path | Mapping[str, Any] | Any,
    *,
    global_batch: int | None = None,
    margin: float = 0.1,
    estimator: Callable[[dict[str, Any]], Any] | None = None,
) -> MicroBatchChoice:
    """The largest micro-batch dividing the global batch predicted to fit with ``margin`` to spare.

    The global batch defaults to the scenario's ``micro_batch_size x grad_accum_steps``.  The
    prediction's ``device_used_bytes`` (reserved + CUDA context + NCCL, what nvidia-smi shows)
    must stay under ``(1 - margin) x capacity``.  Memory grows with the micro-batch, so the
    divisors are searched by bisection: about log2(divisors) estimates.
    Example: global 32, capacity 80 GiB, margin 0.1 -> the largest of 1,2,4,8,16,32 under 72 GiB.
    """
    from vramplan.measure.config import read_scenario_document

    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if estimator is None:
        from vramplan.engine import estimate

        estimator = estimate
    doc = read_scenario_document(scenario)
    train = dict(doc.get("train") or {})
    g = global_batch or int(train.get("micro_batch_size", 1)) * int(train.get("grad_accum_steps", 1))
    if g < 1:
        raise ValueError(f"global batch must be at least 1, got {g}")
    tried: dict[int, int] = {}
    limit = 0

    def used(mb: int) -> int:
        nonlocal limit
        if mb not in tried:
            d = dict(doc)
            d["train"] = {**train, "micro_batch_size": mb, "grad_accum_steps": g // mb}
            report = estimator(d)
            limit = int(report.per_gpu.capacity_bytes * (1 - margin))
            tried[mb] = int(report.per_gpu.device_used_bytes)
        return tried[mb]

    divs = _divisors(g)
    best = largest_true(0, len(divs) - 1, lambda i: used(divs[i]) <= limit)
    mb = divs[best] if best is not None else 1
    return MicroBatchChoice(BatchPlan(mb, g // mb), used(mb), limit, best is not None, dict(tried))


class SafeStep(Generic[T]):
    """Run ``step_fn(micro_batch_size, grad_accum_steps)``; on OOM shrink the micro-batch and retry.

    ``is_oom`` decides which exceptions are out-of-memory errors (inject a fake one in tests);
    ``empty_cache`` replaces ``torch.cuda.empty_cache``; ``on_change`` is called with each
    ``Adjustment``.  The plan in force is ``self.plan``; every change is in ``self.history``.
    When micro-batch 1 still runs out of memory the error is raised as it came.
    """

    def __init__(
        self,
        step_fn: Callable[[int, int], T],
        *,
        micro_batch_size: int,
        grad_accum_steps: int = 1,
        optimizer: Any = None,
        model: Any = None,
        is_oom: Callable[[BaseException], bool] = is_oom_error,
        empty_cache: Callable[[], None] | None = None,
        on_change: Callable[[Adjustment], None] | None = None,
    ) -> None:
        if micro_batch_size < 1 or grad_accum_steps < 1:
            raise ValueError("micro_batch_size and grad_accum_steps must be at least 1")
        self.step_fn = step_fn
        self.plan = BatchPlan(micro_batch_size, grad_accum_steps)
        self.optimizer = optimizer
        self.model = model
        self.is_oom = is_oom
        self.empty_cache = empty_cache
        self.on_change = on_change
        self.history: list[Adjustment] = []
        self.choice: MicroBatchChoice | None = None

    @classmethod
    def from_scenario(
        cls,
        step_fn: Callable[[int, int], T],
        scenario: str | Path | Mapping[str, Any] | Any,
        *,
        global_batch: int | None = None,
        margin: float = 0.1,
        **kwargs: Any,
    ) -> SafeStep[T]:
        """Start from the largest micro-batch the prediction says fits (``largest_fitting_micro_batch``)."""
        choice = largest_fitting_micro_batch(scenario, global_batch=global_batch, margin=margin)
        log.info("first micro-batch %d x %d accumulation (predicted %d bytes, limit %d)",
                 choice.plan.micro_batch_size, choice.plan.grad_accum_steps, choice.predicted_used_bytes,
                 choice.limit_bytes)
        step = cls(step_fn, micro_batch_size=choice.plan.micro_batch_size,
                   grad_accum_steps=choice.plan.grad_accum_steps, **kwargs)
        step.choice = choice
        return step

    def __call__(self) -> T:
        while True:
            plan = self.plan
            try:
                return self.step_fn(plan.micro_batch_size, plan.grad_accum_steps)
            except BaseException as exc:
                smaller = next_smaller(plan)
                if not self.is_oom(exc) or smaller is None:
                    raise
                reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            # outside the handler: the exception's frames (and the tensors they hold) are released
            free_memory(self.optimizer, self.model, self.empty_cache)
            change = Adjustment(plan, smaller, reason)
            self.history.append(change)
            self.plan = smaller
            log.warning("out of memory at micro-batch %d x %d accumulation steps; retrying with %d x %d "
                        "(global batch %d kept): %s", plan.micro_batch_size, plan.grad_accum_steps,
                        smaller.micro_batch_size, smaller.grad_accum_steps, smaller.global_batch, reason)
            if self.on_change is not None:
                self.on_change(change)
