"""Memory monitoring during training: per-step statistics, capacity warnings, leak detection.

One monitor (``MemoryMonitor``) and three ways to drive it:

* a plain loop: call ``monitor.step()`` after each optimizer step (``monitor.step_begin()``
  before it, optionally, for the step's own transient);
* Hugging Face: ``trainer.add_callback(HFMemoryCallback())`` (``transformers.TrainerCallback``);
* Lightning: ``Trainer(callbacks=[lightning_callback()])``.

Per step it records what the caching allocator holds: *allocated* (live tensors),
*reserved* (allocated + cached free blocks), *active* (blocks in use, including those freed on
the host but still owed to a pending kernel) and the *fragmentation ratio* 1 - active/reserved
(the share of reserved memory that holds nothing; PyTorch docs, "CUDA semantics: memory
management" and ``torch.cuda.memory_stats``).  At the end it writes a CSV and a plot.

Warnings
--------
* Capacity: when the step's peak (or reserved memory) reaches ``warn_fraction`` of the device's
  capacity (default 0.9, the seeds' "approaching memory limit" check), once per crossing.
* Steady growth: a least-squares line through the last ``window`` end-of-step allocations with
  slope above ``growth_bytes_per_step`` and r^2 >= ``min_r2`` is a leak.  The default threshold
  is the growth that would use up the remaining headroom within ``horizon_steps`` (10,000)
  steps: a leak that will not kill the run is not reported.

Naming the cause (the seeds' leak patterns, and PyTorch's FAQ "My model reports 'cuda runtime
error(2): out of memory'" which describes the first):

* ``graph-retained``: each step leaves behind about as much as the step's own transient
  (peak - start >= growth >= half of it): a step's autograd graph with its saved activations
  survives: ``total_loss += loss`` (or ``losses.append(loss)``) without ``.item()``, outputs
  kept with their graph, typically in an evaluation loop without ``torch.no_grad()``; a
  training loop's backward frees the saved tensors, leaving only the scalar per step;
* ``stored-outputs``: the growth is a multiple of the outputs' size (``output_bytes``, e.g. the
  logits, b * s * V * bytes): outputs/logits appended to a list across steps; keep
  ``.detach().cpu()`` or a metric instead;
* ``tensor-list``: smaller steady growth: tensors (losses, metrics, histories) appended to a
  growing Python list on the device; store ``.item()``;
* ``reserved-growth``: reserved grows while allocated does not: the allocator caches more and
  more blocks (fragmentation from varying shapes, or caches kept between experiments): try
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` or ``torch.cuda.empty_cache()`` between
  experiments.

On a machine without CUDA the statistics come from an injectable provider: the storage
tracker's live bytes (``tracker_stats``, exact) or the process's resident memory
(``rss_stats``, coarse: it includes Python's own heap).  Without a caching allocator,
reserved = active = allocated and the fragmentation ratio is 0.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramplan.errors import MissingExtraError

__all__ = [
    "LeakDiagnosis", "LightningMemoryHooks", "MemoryMonitor", "MemoryStats", "StatsProvider",
    "StepRecord", "cuda_stats", "default_stats", "device_stats", "fit_line", "lightning_callback", "name_cause",
    "rss_stats", "tracker_stats",
]

log = logging.getLogger("vramplan.measure")

MiB = 2**20
DEFAULT_GROWTH_BYTES_PER_STEP = 1 * MiB  # when the capacity is unknown


@dataclass(frozen=True)
class MemoryStats:
    """One reading of a device's memory (bytes)."""

    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    peak_allocated_bytes: int | None = None  # the highest allocation since the previous reading
    capacity_bytes: int | None = None


StatsProvider = Callable[[], MemoryStats]


@dataclass(frozen=True)
class StepRecord:
    step: int
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    peak_allocated_bytes: int
    start_allocated_bytes: int  # allocated when the step began (step_begin, or the previous step's end)

    @property
    def fragmentation(self) -> float:
        """1 - active/reserved: the share of reserved memory that holds no live block."""
        return 1.0 - self.active_bytes / self.reserved_bytes if self.reserved_bytes > 0 else 0.0

    @property
    def transient_bytes(self) -> int:
        """What the step held above its start at its peak (activations, gradients, temporaries)."""
        return max(0, self.peak_allocated_bytes - self.start_allocated_bytes)


@dataclass(frozen=True)
class LeakDiagnosis:
    quantity: str  # "allocated" or "reserved"
    slope_bytes_per_step: float
    r2: float
    first_step: int
    last_step: int
    cause: str  # graph-retained | stored-outputs | tensor-list | reserved-growth
    message: str
    steps_to_capacity: int | None = None


# --------------------------------------------------------------------------------------
# statistics providers
# --------------------------------------------------------------------------------------

def device_stats(mem: Any, reset_peak: bool = True) -> StatsProvider:
    """Readings from a ``vramplan.measure.device.DeviceMemory`` (torch.cuda counters).

    With ``reset_peak`` the peak is reset after each reading, so each reading's peak is the
    step's own (this also resets the counters ``max_memory_allocated`` reports to the user).
    """

    def read() -> MemoryStats:
        stats = MemoryStats(
            allocated_bytes=mem.allocated_bytes(), reserved_bytes=mem.reserved_bytes(),
            active_bytes=mem.active_bytes(), peak_allocated_bytes=mem.max_allocated_bytes(),
            capacity_bytes=mem.capacity_bytes(),
        )
        if reset_peak:
            mem.reset_peak()
        return stats

    return read


def cuda_stats(device: int | None = None, reset_peak: bool = True) -> StatsProvider:
    """torch.cuda's caching-allocator counters for one device (default: the current one)."""
    import torch

    from vramplan.measure.device import CudaMemory

    index = torch.cuda.current_device() if device is None else device
    return device_stats(CudaMemory(index), reset_peak=reset_peak)


def tracker_stats(tracker: Any) -> StatsProvider:
    """Exact live tensor bytes from a running ``vramplan.trace.tracker.Tracker`` (CPU or CUDA).

    The peak since the previous reading is replayed from the tracker's events.  There is no
    caching allocator behind it: reserved = active = allocated.
    """
    state = {"index": len(tracker.events), "live": int(tracker.live_bytes)}

    def read() -> MemoryStats:
        events = tracker.events
        live = best = state["live"]
        for e in events[state["index"]:]:
            live += e.nbytes
            best = max(best, live)
        now = int(tracker.live_bytes)
        state["index"], state["live"] = len(events), now
        return MemoryStats(now, now, now, max(best, now), None)

    return read


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_stats() -> StatsProvider:
    """The process's resident memory (Linux /proc/self/statm): a coarse host-side fallback.

    It counts Python's heap and freed-but-cached allocator pages too, so a leak shows as
    growth, but the bytes are not tensor bytes.  Capacity = the machine's MemTotal.
    """
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    total = _meminfo("MemTotal")

    def read() -> MemoryStats:
        try:
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            import resource

            rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        return MemoryStats(rss, rss, rss, rss, total)

    return read


def default_stats() -> StatsProvider:
    """CUDA counters when torch sees a GPU, else the process's resident memory."""
    try:
        import torch

        if torch.cuda.is_available():
            return cuda_stats()
    except ImportError:
        pass
    return rss_stats()


# --------------------------------------------------------------------------------------
# the analysis: a line through the allocations, and the cause
# --------------------------------------------------------------------------------------

def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares (slope, intercept, r^2); r^2 = 1 for a perfectly flat or straight series.

    Example: xs 0,1,2,3, ys 10,20,30,40 -> slope 10, intercept 10, r^2 1.
    """
    n = len(xs)
    if n < 2:
        return 0.0, ys[0] if ys else 0.0, 1.0
    # fit y - y0 (byte counts are large; a flat series then sums exact zeros)
    y0 = ys[0]
    ys = [y - y0 for y in ys]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx else 0.0
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return slope, intercept + y0, r2


_FIXES = {
    "graph-retained": ("each step leaves behind about as much memory as its own activations: an autograd graph "
                       "with its saved tensors survives the step, e.g. `total_loss += loss` or "
                       "`losses.append(loss)` instead of `loss.item()`, or outputs kept with their graph (typically "
                       "an evaluation loop without torch.no_grad()); accumulate `loss.item()` / `.detach()`"),
    "stored-outputs": ("the growth per step is a multiple of the outputs' size: outputs or logits are stored "
                       "across steps (`all_outputs.append(output)`); store `output.detach().cpu()` or a metric"),
    "tensor-list": ("small steady growth: tensors (losses, metrics, histories) are appended to a Python list on "
                    "the device; store `.item()` or move them to the CPU"),
    "reserved-growth": ("reserved memory grows while live tensors do not: the caching allocator keeps more and more "
                        "cached blocks (fragmentation from changing shapes, or caches kept between experiments); "
                        "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or torch.cuda.empty_cache() between "
                        "experiments"),
}


def name_cause(slope_bytes: float, transient_bytes: float | None, output_bytes: int | None) -> str:
    """The likely cause of steady allocated growth (see the module docstring for the rules).

    Examples: slope 1 MB with a 1.2 MB step transient -> graph-retained; slope 2 MB with
    1 MB outputs and a 50 MB transient -> stored-outputs; slope 512 B -> tensor-list.
    """
    if transient_bytes is not None and transient_bytes > 0 and slope_bytes >= 0.5 * transient_bytes:
        return "graph-retained"
    if output_bytes:
        k = round(slope_bytes / output_bytes)
        if k >= 1 and abs(slope_bytes - k * output_bytes) <= 0.25 * output_bytes:
            return "stored-outputs"
    return "tensor-list"


def _median(xs: list[int]) -> float:
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


# --------------------------------------------------------------------------------------
# the monitor
# --------------------------------------------------------------------------------------

class MemoryMonitor:
    """Records memory per step, warns near capacity, detects steady growth; writes CSV + plot.

    ``stats``: a provider of ``MemoryStats`` (default: CUDA counters, else process RSS).
    ``capacity_bytes``: overrides the provider's capacity.  ``output_bytes``: the size of the
    outputs a step produces (e.g. logits), to recognise stored outputs.
    ``on_warning``: called with each warning's text (also logged to ``vramplan.measure``).
    """

    def __init__(
        self,
        stats: StatsProvider | None = None,
        *,
        capacity_bytes: int | None = None,
        warn_fraction: float = 0.9,
        window: int = 8,
        growth_bytes_per_step: float | None = None,
        horizon_steps: int = 10_000,
        min_r2: float = 0.9,
        output_bytes: int | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        if not 0 < warn_fraction <= 1:
            raise ValueError(f"warn_fraction must be in (0, 1], got {warn_fraction}")
        if window < 3:
            raise ValueError(f"window must be at least 3 steps, got {window}")
        self._stats = stats
        self.capacity_bytes = capacity_bytes
        self.warn_fraction = warn_fraction
        self.window = window
        self.growth_bytes_per_step = growth_bytes_per_step
        self.horizon_steps = horizon_steps
        self.min_r2 = min_r2
        self.output_bytes = output_bytes
        self.on_warning = on_warning
        self.records: list[StepRecord] = []
        self.warnings: list[str] = []
        self.leak: LeakDiagnosis | None = None
        self._start: int | None = None
        self._above = False

    @property
    def stats(self) -> StatsProvider:
        if self._stats is None:
            self._stats = default_stats()
        return self._stats

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        log.warning(text)
        if self.on_warning is not None:
            self.on_warning(text)

    def step_begin(self) -> None:
        """Mark the start of a step (its allocation then is the base of the step's transient)."""
        self._start = self.stats().allocated_bytes

    def step(self, step: int | None = None) -> StepRecord:
        """Read the statistics at the end of a step, record them and run the checks."""
        s = self.stats()
        if self.capacity_bytes is None and s.capacity_bytes:
            self.capacity_bytes = s.capacity_bytes
        index = step if step is not None else (self.records[-1].step + 1 if self.records else 0)
        start = self._start if self._start is not None else (
            self.records[-1].allocated_bytes if self.records else s.allocated_bytes)
        self._start = None
        rec = StepRecord(index, s.allocated_bytes, s.reserved_bytes, s.active_bytes,
                         max(s.peak_allocated_bytes or 0, s.allocated_bytes), start)
        self.records.append(rec)
        self._check_capacity(rec)
        diagnosis = self.check_growth()
        if diagnosis is not None and (self.leak is None or self.leak.cause != diagnosis.cause):
            self.leak = diagnosis
            self._warn(diagnosis.message)
        return rec

    def _check_capacity(self, rec: StepRecord) -> None:
        cap = self.capacity_bytes
        if not cap:
            return
        used = max(rec.peak_allocated_bytes, rec.reserved_bytes)
        above = used >= self.warn_fraction * cap
        if above and not self._above:
            self._warn(f"step {rec.step}: memory at {used / cap:.0%} of capacity ({used:,} of {cap:,} bytes; warning "
                       f"threshold {self.warn_fraction:.0%}): the next larger batch or sequence may run out of memory")
        self._above = above

    def threshold_bytes_per_step(self) -> float:
        """Growth per step worth reporting (see the module docstring)."""
        if self.growth_bytes_per_step is not None:
            return self.growth_bytes_per_step
        if self.capacity_bytes and self.records:
            last = self.records[-1]
            headroom = self.capacity_bytes - max(last.peak_allocated_bytes, last.reserved_bytes)
            return max(1.0, headroom / self.horizon_steps)
        return DEFAULT_GROWTH_BYTES_PER_STEP

    def check_growth(self) -> LeakDiagnosis | None:
        """A diagnosis when the last ``window`` steps grow steadily, else None."""
        if len(self.records) < self.window:
            return None
        recs = self.records[-self.window:]
        xs = [float(r.step) for r in recs]
        limit = self.threshold_bytes_per_step()
        slope, _, r2 = fit_line(xs, [float(r.allocated_bytes) for r in recs])
        quantity = "allocated"
        if slope > limit and r2 >= self.min_r2:
            transient = _median([r.transient_bytes for r in recs])
            cause = name_cause(slope, transient, self.output_bytes)
        else:
            slope, _, r2 = fit_line(xs, [float(r.reserved_bytes) for r in recs])
            if not (slope > limit and r2 >= self.min_r2):
                return None
            quantity, cause = "reserved", "reserved-growth"
        steps_left = None
        if self.capacity_bytes:
            last = recs[-1]
            room = self.capacity_bytes - max(last.peak_allocated_bytes, last.reserved_bytes)
            steps_left = max(0, int(room / slope))
        when = f"; at this rate memory runs out in about {steps_left:,} steps" if steps_left is not None else ""
        message = (f"steady {quantity} growth of {slope:,.0f} bytes per step over steps {recs[0].step}-{recs[-1].step} "
                   f"(r^2 {r2:.2f}){when}. Likely cause ({cause}): {_FIXES[cause]}")
        return LeakDiagnosis(quantity, slope, r2, recs[0].step, recs[-1].step, cause, message, steps_left)

    # ---- output -------------------------------------------------------------------
    def write_csv(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["step", "allocated_bytes", "reserved_bytes", "active_bytes", "peak_allocated_bytes",
                        "fragmentation"])
            for r in self.records:
                w.writerow([r.step, r.allocated_bytes, r.reserved_bytes, r.active_bytes, r.peak_allocated_bytes,
                            f"{r.fragmentation:.4f}"])
        return p

    def plot(self, path: str | Path) -> Path | None:
        """A PNG of the per-step series (None when matplotlib is not installed)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        steps = [r.step for r in self.records]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        gib = 2**30
        ax.plot(steps, [r.peak_allocated_bytes / gib for r in self.records], label="peak allocated")
        ax.plot(steps, [r.allocated_bytes / gib for r in self.records], label="allocated (end of step)")
        ax.plot(steps, [r.reserved_bytes / gib for r in self.records], label="reserved")
        ax.plot(steps, [r.active_bytes / gib for r in self.records], label="active", linestyle=":")
        if self.capacity_bytes:
            ax.axhline(self.capacity_bytes / gib, color="red", linestyle="--", label="capacity")
            ax.axhline(self.warn_fraction * self.capacity_bytes / gib, color="orange", linestyle=":",
                       label=f"warning ({self.warn_fraction:.0%})")
        if self.leak is not None:
            ax.set_title(f"steady growth: {self.leak.slope_bytes_per_step:,.0f} B/step ({self.leak.cause})")
        ax.set_xlabel("step")
        ax.set_ylabel("GiB")
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(p)
        plt.close(fig)
        return p

    def finish(self, out_dir: str | Path, prefix: str = "memory") -> dict[str, Path]:
        """Write ``<prefix>.csv`` and ``<prefix>.png`` (when matplotlib is present) into ``out_dir``."""
        out = {"csv": self.write_csv(Path(out_dir) / f"{prefix}.csv")}
        png = self.plot(Path(out_dir) / f"{prefix}.png")
        if png is not None:
            out["plot"] = png
        return out


# --------------------------------------------------------------------------------------
# framework adapters
# --------------------------------------------------------------------------------------

class LightningMemoryHooks:
    """Lightning hooks driving a ``MemoryMonitor`` (duck-typed: see ``lightning_callback``)."""

    def __init__(self, monitor: MemoryMonitor | None = None, out_dir: str | Path | None = None,
                 **monitor_kwargs: Any) -> None:
        self.monitor = monitor if monitor is not None else MemoryMonitor(**monitor_kwargs)
        self.out_dir = out_dir
        self.files: dict[str, Path] = {}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.monitor.step_begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.monitor.step(int(getattr(trainer, "global_step", batch_idx)))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        out = self.out_dir or getattr(trainer, "log_dir", None) or getattr(trainer, "default_root_dir", None) or "."
        rank = int(getattr(trainer, "global_rank", 0) or 0)
        self.files = self.monitor.finish(out, prefix=f"memory_rank{rank}" if rank else "memory")


def lightning_callback(monitor: MemoryMonitor | None = None, out_dir: str | Path | None = None,
                       **monitor_kwargs: Any) -> Any:
    """A ``lightning.pytorch.Callback`` (or ``pytorch_lightning.Callback``) with the memory hooks."""
    base: Any = None
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = __import__(name, fromlist=["Callback"])
            base = module.Callback
            break
        except ImportError:
            continue
    if base is None:
        raise MissingExtraError("the Lightning callback needs Lightning: pip install lightning")
    cls = type("LightningMemoryCallback", (LightningMemoryHooks, base), {})
    return cls(monitor, out_dir, **monitor_kwargs)


_HF_CLASS: Any = None


def _hf_class() -> Any:
    """``HFMemoryCallback``: a ``transformers.TrainerCallback`` driving a ``MemoryMonitor``."""
    global _HF_CLASS
    if _HF_CLASS is not None:
        return _HF_CLASS
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise MissingExtraError("the Hugging Face callback needs transformers: pip install 'vramplan[trace]'") from None

    class HFMemoryCallback(TrainerCallback):
        """Per-step memory for ``transformers.Trainer``: ``trainer.add_callback(HFMemoryCallback())``.

        Writes ``memory.csv`` and ``memory.png`` into ``args.output_dir`` at the end of training
        (``memory_rank<N>.*`` on other ranks).
        """

        def __init__(self, monitor: MemoryMonitor | None = None, out_dir: str | Path | None = None,
                     **monitor_kwargs: Any) -> None:
            self.monitor = monitor if monitor is not None else MemoryMonitor(**monitor_kwargs)
            self.out_dir = out_dir
            self.files: dict[str, Path] = {}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.monitor.step_begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.monitor.step(int(state.global_step))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            out = self.out_dir or getattr(args, "output_dir", None) or "."
            rank = int(getattr(args, "process_index", 0) or 0)
            self.files = self.monitor.finish(out, prefix=f"memory_rank{rank}" if rank else "memory")

    _HF_CLASS = HFMemoryCallback
    return _HF_CLASS


def __getattr__(name: str) -> Any:
    if name == "HFMemoryCallback":
        return _hf_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
