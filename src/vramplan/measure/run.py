"""``measure``: run one real step of a scenario and set its memory beside the prediction.

What runs (the analytic engine models the same things):

* training: one warm-up step (so the optimizer states exist and the measured step is the
  steady state the prediction describes), gradients set to None, then the measured step:
  ``grad_accum_steps`` micro-steps of forward (``model(input_ids, labels=input_ids)``, the
  loss divided by the accumulation steps) and backward, then ``optimizer.step()``;
* inference: ``model.generate`` of ``new_tokens`` greedy tokens after a ``prompt_len`` prompt
  for ``batch_size`` sequences, with a ``DynamicCache`` (encoder models: one forward pass).

Which quantity is measured, said in every result (``MeasureResult.measured``):

* on CUDA: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the measured
  step (peak statistics reset just before it) and NVML's used memory for this process;
* on the CPU: the live tensor-storage bytes the storage tracker
  (``vramplan.trace.tracker.Tracker``) counts, and their peak.  No caching allocator, so no
  reserved memory; the counts are exact bytes of every storage, views counted once.

On both, the tracker's events (labelled by the part of the step that created each storage)
give the breakdown at the peak (``vramplan.measure.breakdown``).  On CUDA the allocator's
peak minus the tracker's peak (block rounding, cuBLAS workspaces, anything created outside
the tracked step) is reported in ``other``.

A CPU run is refused when the predicted peak exceeds a safe share of the host's available
memory (``SAFE_HOST_FRACTION``), with a message naming the bytes and the ``max_cpu_bytes``
option; ``shrink`` options measure a smaller version of the same model.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.measure import breakdown as bd
from vramplan.measure.build import Built, build, require_torch, unsupported
from vramplan.measure.config import raw_config, read_scenario_document, shrink
from vramplan.measure.device import CudaMemory, CudaReadings, DeviceMemory, read_after
from vramplan.measure.result import CPU_MEASURED, CUDA_MEASURED, MeasureResult, comparable_prediction, compare
from vramplan.spec.scenario import Scenario
from vramplan.units import GiB, MiB

__all__ = ["SAFE_HOST_FRACTION", "available_host_bytes", "cpu_bound_problem", "measure", "pick_device"]

# Share of the host's available memory a CPU measurement may be predicted to use.  The step
# also needs the Python process itself, the model's random initialisation and the OS's page
# cache; half leaves room for them on any machine.
SAFE_HOST_FRACTION = 0.5


def available_host_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` from /proc/meminfo (Linux), else free physical pages, else None."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,} B"


def cpu_bound_problem(predicted_bytes: int, max_cpu_bytes: int | None, available_bytes: int | None) -> Problem | None:
    """A refusal when a CPU step is predicted to need more than the safe bound, else None.

    The bound is ``max_cpu_bytes`` when given, else ``SAFE_HOST_FRACTION`` of the available
    host memory (no bound when neither is known).
    Example: predicted 9 GiB, 16 GiB available -> bound 8 GiB -> refused.
    """
    if max_cpu_bytes is not None:
        bound, why = max_cpu_bytes, "the --max-cpu-bytes bound"
    elif available_bytes is not None:
        bound = int(available_bytes * SAFE_HOST_FRACTION)
        why = f"the safe bound ({SAFE_HOST_FRACTION:.0%} of the {_size(available_bytes)} of available host memory)"
    else:
        return None
    if predicted_bytes <= bound:
        return None
    return Problem(
        "--max-cpu-bytes",
        f"this step is predicted to need {_size(predicted_bytes)} ({predicted_bytes:,} bytes) on the CPU, "
        f"above {why} of {_size(bound)} ({bound:,} bytes)",
        "measure a smaller version with --layers N, --seq-len, --micro-batch-size (inference: --batch-size, "
        "--prompt-len, --new-tokens), or raise the bound with --max-cpu-bytes BYTES",
    )


def pick_device(device: str) -> Any:
    """``auto`` -> cuda when torch sees a GPU, else cpu; ``cpu``; ``cuda``/``cuda:N``."""
    import torch

    if device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ScenarioError([Problem("--device", f"{device} asked but torch sees no CUDA device",
                                         "use --device cpu (or auto)")])
        dev = torch.device(device)
        return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    raise ScenarioError([Problem("--device", f"unknown device {device!r}", "use auto, cpu, cuda or cuda:N")])


# --------------------------------------------------------------------------------------
# labelling the step's storages
# --------------------------------------------------------------------------------------

def _labeler(tracker: Any) -> Any:
    """A dispatch mode, entered inside the tracker, that labels autocast's weight copies.

    Under ``torch.autocast`` the first use of an fp32 parameter in a matmul casts it
    (``aten._to_copy`` of the ``Parameter``) and caches the copy until autocast exits; the
    analytic engine counts these copies as temporaries.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _AutocastLabeler(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten._to_copy.default and args and isinstance(args[0], torch.nn.Parameter):
                with tracker.category(bd.AUTOCAST):
                    return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    return _AutocastLabeler()


@contextlib.contextmanager
def _category_while(tracker: Any, start: Any, end: Any, name: Callable[[], str]) -> Iterator[None]:
    """Label allocations ``name()`` from each forward of module ``start`` to the end of ``end``'s forward."""
    stack: list[contextlib.ExitStack] = []

    def enter(*_: Any) -> None:
        es = contextlib.ExitStack()
        es.enter_context(tracker.category(name()))
        stack.append(es)

    def leave(*_: Any) -> None:
        while stack:
            stack.pop().close()

    h1 = start.register_forward_pre_hook(enter)
    h2 = end.register_forward_hook(leave)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()
        leave()


@contextlib.contextmanager
def _logits_category(tracker: Any, model: Any) -> Iterator[None]:
    """From the LM head's input to the end of the model's forward: category ``logits``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield
        return
    with _category_while(tracker, head, model, lambda: bd.LOGITS):
        yield


def _unique(tensors: Any) -> list[Any]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _track_setup(tr: Any, built: Built, inputs: list[Any]) -> None:
    model = built.model
    tr.track(_unique(model.parameters()), bd.WEIGHTS)
    tr.track(_unique(model.buffers()), bd.BUFFERS)
    tr.track(inputs, bd.INPUTS)
    if built.optimizer is not None:
        states = []
        for st in built.optimizer.state.values():
            for key, v in st.items():
                # AdamW's ``step`` counters live on the host when the parameters are on CUDA
                # (capturable=False); they are not device memory, so they are not counted.
                if key != "step" and hasattr(v, "untyped_storage"):
                    states.append(v)
        tr.track(states, bd.OPTIMIZER_STATES)


@dataclass
class _StepTrace:
    events: list[Any]
    marks: list[tuple[int, str]]
    end: int
    readings: CudaReadings | None


def _autocast(built: Built) -> Any:
    import torch

    if built.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=built.device.type, dtype=built.autocast_dtype)


def _train_step(built: Built, ids: Any, accum: int, mark: Callable[[str], None], tr: Any = None) -> None:
    """``accum`` micro-steps of forward + backward, then the optimizer step (as the Trainer runs it)."""
    model, opt, scaler = built.model, built.optimizer, built.scaler
    cat = tr.category if tr is not None else (lambda _name: contextlib.nullcontext())

    def labels() -> contextlib.ExitStack:
        # autocast copies and the LM head are labelled in the forward pass only (an optimizer's own
        # casts of the parameters, e.g. Adafactor's p.float(), are step temporaries)
        es = contextlib.ExitStack()
        if tr is not None:
            es.enter_context(_labeler(tr))
            es.enter_context(_logits_category(tr, model))
        return es

    for _ in range(accum):
        mark("forward")
        with cat(bd.FORWARD), labels(), _autocast(built):
            out = model(input_ids=ids, labels=ids)
            loss = out.loss / accum
            del out
        mark("backward")
        with cat(bd.BACKWARD):
            (scaler.scale(loss) if scaler is not None else loss).backward()
            del loss
    if opt is not None:
        mark("optimizer")
        with cat(bd.OPTIMIZER):
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()


def _start_peak(memory: DeviceMemory | None) -> None:
    """Drop unreachable tensors and start the device's peak counters from here."""
    gc.collect()
    if memory is not None:
        memory.synchronize()
        memory.reset_peak()


def _run_train(r: Any, built: Built, memory: DeviceMemory | None, warmup: bool, seed: int) -> _StepTrace:
    import torch

    from vramplan.trace.tracker import Tracker

    t = r.scenario.train
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, built.vocab_size, (t.micro_batch_size, t.seq_len), generator=gen).to(built.device)
    if warmup:
        _train_step(built, ids, t.grad_accum_steps, lambda _p: None)
        if built.optimizer is not None:
            built.optimizer.zero_grad(set_to_none=True)
    built.model.zero_grad(set_to_none=True)
    _start_peak(memory)
    marks: list[tuple[int, str]] = []
    readings = None
    with Tracker() as tr:
        _track_setup(tr, built, [ids])

        def mark(phase: str) -> None:
            marks.append((len(tr.events), phase))

        _train_step(built, ids, t.grad_accum_steps, mark, tr)
        gc.collect()
        end = len(tr.events)
        if memory is not None:
            readings = read_after(memory)
        events = list(tr.events)
    if built.optimizer is not None:
        built.optimizer.zero_grad(set_to_none=True)
    built.model.zero_grad(set_to_none=True)
    return _StepTrace(events, marks, end, readings)


def _run_inference(r: Any, built: Built, memory: DeviceMemory | None, seed: int) -> _StepTrace:
    import torch

    from vramplan.trace.tracker import Tracker

    inf = r.scenario.inference
    model = built.model
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, built.vocab_size, (inf.batch_size, inf.prompt_len), generator=gen).to(built.device)
    mask = torch.ones_like(ids)
    _start_peak(memory)
    marks: list[tuple[int, str]] = []
    readings = None
    keep: list[Any] = []
    with Tracker() as tr:
        _track_setup(tr, built, [ids, mask])
        calls = [0]

        def phase() -> str:
            name = bd.PREFILL if calls[0] == 0 else bd.DECODE
            calls[0] += 1
            marks.append((len(tr.events), name))
            return name

        with _category_while(tr, model, model, phase), tr.category(bd.GENERATE), torch.no_grad():
            if built.encoder_only:
                keep.append(model(input_ids=ids, attention_mask=mask).logits)
            else:
                from transformers import DynamicCache

                # a family whose forward takes only its own cache class gets one (Traits.cache_class: MiniMax's
                # MiniMaxCache; its model raises on a DynamicCache, modeling_minimax.py 5.24 lines 652-657)
                own = r.model.traits.cache_class
                cache = (getattr(sys.modules[type(model).__module__], own)() if own
                         else DynamicCache(config=model.config))
                original = cache.update

                def update(*args: Any, **kwargs: Any) -> Any:
                    with tr.category(bd.KV_CACHE):
                        return original(*args, **kwargs)

                cache.update = update  # type: ignore[method-assign]
                keep.append(cache)
                # Mamba, FalconMamba and Mamba2 before transformers 5.18 take their own cache (cache_params) and
                # refuse past_key_values in generate's model_kwargs: let generate build theirs
                m = r.model
                given = ({} if m.mamba is not None and len(m.mamba.layers) == m.num_layers
                         else {"past_key_values": cache})
                if inf.new_tokens == 0:
                    model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **given)
                else:
                    keep.append(model.generate(
                        ids, attention_mask=mask, max_new_tokens=inf.new_tokens, **given,
                        min_new_tokens=inf.new_tokens, do_sample=False, use_cache=True,
                        num_beams=inf.num_beams, pad_token_id=0))
        gc.collect()
        end = len(tr.events)
        if memory is not None:
            readings = read_after(memory)
        events = list(tr.events)
    keep.clear()
    return _StepTrace(events, marks, end, readings)


# --------------------------------------------------------------------------------------
# the public function
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    import warnings

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)


def measure(
    scenario: str | Path | dict[str, Any] | Scenario,
    *,
    device: str = "auto",
    layers: int | None = None,
    seq_len: int | None = None,
    micro_batch_size: int | None = None,
    batch_size: int | None = None,
    prompt_len: int | None = None,
    new_tokens: int | None = None,
    max_cpu_bytes: int | None = None,
    warmup: bool = True,
    memory: DeviceMemory | None = None,
    seed: int = 0,
) -> MeasureResult:
    """Run one real step of ``scenario`` and return its memory beside the analytic prediction.

    ``layers``/``seq_len``/``micro_batch_size``/``batch_size``/``prompt_len``/``new_tokens``
    shrink the scenario first (the prediction is for the shrunken scenario too).
    ``memory`` replaces the CUDA counters (tests inject a fake; normally left None).
    Raises ``ScenarioError`` for a scenario that cannot be measured here (one problem per reason).
    """
    require_torch()
    from vramplan.catalog.resolve import resolve
    from vramplan.engine import estimate

    doc = shrink(read_scenario_document(scenario), layers=layers, seq_len=seq_len,
                 micro_batch_size=micro_batch_size, batch_size=batch_size, prompt_len=prompt_len,
                 new_tokens=new_tokens)
    r = resolve(doc)
    dev = pick_device(device)
    problems = unsupported(r, dev.type)
    if problems:
        raise ScenarioError(problems)
    report = estimate(r)
    if dev.type == "cpu" and memory is None:
        refusal = cpu_bound_problem(report.per_gpu.peak_allocated_bytes, max_cpu_bytes, available_host_bytes())
        if refusal is not None:
            raise ScenarioError([refusal])
    if memory is None and dev.type == "cuda":
        memory = CudaMemory(dev.index or 0)
    raw = raw_config(r.scenario.model)
    with _quiet_transformers():
        built = build(r, raw, dev, seed)
        if r.scenario.task == "train":
            trace = _run_train(r, built, memory, warmup, seed)
        else:
            trace = _run_inference(r, built, memory, seed)
    return _result(r, report, built, trace, memory, dev)


def _result(r: Any, report: Any, built: Built, trace: _StepTrace, memory: DeviceMemory | None, dev: Any) -> MeasureResult:
    events, end = trace.events, trace.end
    peak = bd.find_peak(events, 0, end)
    alive_end = bd.live_at(events, end - 1)
    detail = bd.classify(bd.live_at(events, peak.index), alive_end, optimizer_name=built.optimizer_name)
    phases = bd.phase_peaks(events[:end], trace.marks)
    peak_phase = bd.phase_of(peak.index, trace.marks)
    notes = list(built.notes)
    readings = trace.readings
    on_cuda = readings is not None
    peak_allocated = peak.bytes
    if readings is not None:
        # the headline is the allocator's own peak; the tracker's breakdown is fitted under it
        peak_allocated = readings.peak_allocated_bytes
        gap = peak_allocated - peak.bytes
        if gap > 0:
            detail.setdefault("other", {})["allocator rounding, cuBLAS workspaces, untracked"] = gap
        elif gap < 0:
            notes.append(f"the breakdown sums to the tracker's peak, {-gap:,} B above max_memory_allocated "
                         "(host tensors created during the step, such as optimizer step counters)")
        notes.append("breakdown at the peak: the tracker's storages at its peak; phases are tracker peaks")
    else:
        notes.append("no caching allocator on the CPU: reserved memory, fragmentation and NVML are not measured")
    parts = {k: sum(v.values()) for k, v in detail.items()}
    dev_type = "cuda" if on_cuda else "cpu"
    predicted, excluded = comparable_prediction(report, dev_type)
    for key, nbytes in excluded.items():
        notes.append(f"predicted {key} ({nbytes:,} B) exists only on CUDA: left out of the comparison")
    predicted_total = sum(predicted.values())
    extra: list[tuple[str, int | None, int | None]] = []
    if readings is not None:
        pg = report.per_gpu
        extra = [("peak reserved", readings.peak_reserved_bytes, pg.peak_reserved_bytes),
                 ("device used (NVML)", readings.device_used_bytes, pg.device_used_bytes)]
        if readings.device_used_bytes is None:
            notes.append("NVML did not report this process's memory (no NVML, or the container hides the pid)")
    rows = compare(parts, predicted, peak_allocated, predicted_total, extra)
    params = _unique(built.model.parameters())
    name = r.model.name
    device_label = "cpu" if dev.type == "cpu" else f"{dev.type}:{dev.index} ({getattr(memory, 'device_name', '')})"
    if on_cuda and dev.type == "cpu":
        device_label = f"cpu (counters: {getattr(memory, 'name', 'injected')})"
    return MeasureResult(
        model_name=name, task=r.scenario.task, device=device_label,
        measured=CUDA_MEASURED if on_cuda else CPU_MEASURED, peak_allocated_bytes=peak_allocated,
        peak_phase=peak_phase, breakdown=parts, breakdown_detail=detail, phases=phases,
        parameters=sum(p.numel() for p in params),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        prediction=report, predicted_comparable=predicted, predicted_peak_bytes=predicted_total,
        excluded_predicted=excluded, rows=rows, scenario=r.scenario.model_dump(mode="json"),
        # the excluded CUDA-only parts (cuBLAS workspaces) are static: present in every predicted moment
        predicted_phases={k: v - sum(excluded.values()) for k, v in report.per_gpu.phases.items()},
        peak_reserved_bytes=readings.peak_reserved_bytes if readings else None,
        peak_active_bytes=readings.peak_active_bytes if readings else None,
        device_used_bytes=readings.device_used_bytes if readings else None,
        outside_allocator_bytes=readings.outside_allocator_bytes if readings else None,
        capacity_bytes=readings.capacity_bytes if readings else None,
        notes=tuple(dict.fromkeys(notes)),
    )
