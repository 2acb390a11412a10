"""measure/callbacks.py: per-step records, capacity warnings, leak detection, CSV/plot, adapters."""

from __future__ import annotations

import csv
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramplan.errors import MissingExtraError
from vramplan.measure.callbacks import (
    LightningMemoryHooks,
    MemoryMonitor,
    MemoryStats,
    StatsProvider,
    device_stats,
    fit_line,
    lightning_callback,
    name_cause,
    rss_stats,
    tracker_stats,
)

KiB, MiB = 2**10, 2**20


def scripted(readings: list[MemoryStats]) -> StatsProvider:
    it: Iterator[MemoryStats] = iter(readings)
    return lambda: next(it)


def growing(n: int, start: int, slope: int, transient: int, reserved_extra: int = 0,
            capacity: int | None = None) -> list[MemoryStats]:
    """End-of-step allocation start + slope*i, each step peaking ``transient`` above its start."""
    out = []
    for i in range(n):
        alloc = start + slope * i
        out.append(MemoryStats(alloc, alloc + reserved_extra, alloc, alloc - slope + transient, capacity))
    return out


# ---------------------------------------------------------------- records and fragmentation

def test_step_records_and_fragmentation() -> None:
    mon = MemoryMonitor(scripted([MemoryStats(600, 1000, 750, 900, 4000)]))
    rec = mon.step()
    assert (rec.step, rec.allocated_bytes, rec.reserved_bytes, rec.active_bytes, rec.peak_allocated_bytes) == (
        0, 600, 1000, 750, 900)
    assert rec.fragmentation == pytest.approx(0.25)  # 1 - 750/1000
    assert mon.capacity_bytes == 4000  # taken from the provider


def test_step_begin_sets_the_transient_base() -> None:
    mon = MemoryMonitor(scripted([MemoryStats(100, 100, 100), MemoryStats(120, 120, 120, 500)]))
    mon.step_begin()
    assert mon.step(7).transient_bytes == 400  # peak 500 - start 100


def test_device_stats_reads_and_resets_the_peak() -> None:
    calls: list[str] = []
    mem = SimpleNamespace(
        allocated_bytes=lambda: 10, reserved_bytes=lambda: 20, active_bytes=lambda: 15,
        max_allocated_bytes=lambda: 18, capacity_bytes=lambda: 100, reset_peak=lambda: calls.append("reset"))
    assert device_stats(mem)() == MemoryStats(10, 20, 15, 18, 100)
    assert calls == ["reset"]
    device_stats(mem, reset_peak=False)()
    assert calls == ["reset"]


def test_rss_stats_reads_this_process() -> None:
    s = rss_stats()()
    assert s.allocated_bytes > 1 * MiB and s.reserved_bytes == s.allocated_bytes


# ---------------------------------------------------------------- capacity warnings

def test_capacity_warning_once_per_crossing() -> None:
    readings = [MemoryStats(100, 100, 100, p, 1000) for p in (800, 950, 960, 700, 920)]
    seen: list[str] = []
    mon = MemoryMonitor(scripted(readings), warn_fraction=0.9, on_warning=seen.append)
    for _ in readings:
        mon.step()
    assert len(mon.warnings) == 2 and seen == mon.warnings
    assert mon.warnings[0].startswith("step 1: memory at 95% of capacity")
    assert "step 4" in mon.warnings[1]


def test_warn_fraction_configurable_and_validated() -> None:
    mon = MemoryMonitor(scripted([MemoryStats(500, 500, 500, 500, 1000)]), warn_fraction=0.5)
    mon.step()
    assert len(mon.warnings) == 1
    with pytest.raises(ValueError):
        MemoryMonitor(warn_fraction=1.5)
    with pytest.raises(ValueError):
        MemoryMonitor(window=2)


# ---------------------------------------------------------------- growth detection (synthetic)

def test_graph_retained_growth() -> None:
    # each step keeps 1 MiB while its own transient is 1.2 MiB: a whole graph survives
    mon = MemoryMonitor(scripted(growing(10, 50 * MiB, MiB, int(1.2 * MiB))), window=8, growth_bytes_per_step=KiB)
    for _ in range(10):
        mon.step()
    assert mon.leak is not None and mon.leak.cause == "graph-retained"
    assert mon.leak.slope_bytes_per_step == pytest.approx(MiB)
    assert "loss.item()" in mon.leak.message and len(mon.warnings) == 1


def test_stored_outputs_growth() -> None:
    # 2 x 64 KiB of logits kept per step, a 10 MiB step transient
    mon = MemoryMonitor(scripted(growing(8, 50 * MiB, 128 * KiB, 10 * MiB)), window=8,
                        growth_bytes_per_step=KiB, output_bytes=64 * KiB)
    for _ in range(8):
        mon.step()
    assert mon.leak is not None and mon.leak.cause == "stored-outputs"
    assert "detach().cpu()" in mon.leak.message


def test_reserved_growth_without_allocated_growth() -> None:
    readings = [MemoryStats(10 * MiB, 20 * MiB + i * MiB, 10 * MiB, 12 * MiB) for i in range(8)]
    mon = MemoryMonitor(scripted(readings), window=8, growth_bytes_per_step=KiB)
    for _ in range(8):
        mon.step()
    assert mon.leak is not None and mon.leak.cause == "reserved-growth" and mon.leak.quantity == "reserved"
    assert mon.records[-1].fragmentation == pytest.approx(1 - 10 / 27)


def test_no_report_for_flat_noisy_or_short_series() -> None:
    flat = [MemoryStats(100 * MiB + (i % 2) * KiB, 100 * MiB, 100 * MiB, 110 * MiB) for i in range(12)]
    mon = MemoryMonitor(scripted(flat), window=8, growth_bytes_per_step=4 * KiB)
    for _ in range(12):
        mon.step()
    assert mon.leak is None
    # a noisy series (r^2 low) with a positive slope is not a leak either
    noisy = [MemoryStats(100 * MiB + (i % 3) * 10 * MiB + i * KiB, 200 * MiB, 1, 1) for i in range(8)]
    mon2 = MemoryMonitor(scripted(noisy), window=8, growth_bytes_per_step=1)
    for _ in range(8):
        mon2.step()
    assert mon2.leak is None
    short = MemoryMonitor(scripted(growing(5, MiB, MiB, MiB)), window=8, growth_bytes_per_step=1)
    for _ in range(5):
        short.step()
    assert short.leak is None


def test_default_threshold_is_headroom_over_horizon() -> None:
    # capacity 1 GiB, 100 MiB used: a leak of 1 KiB/step would need ~900k steps -> not reported;
    # 200 KiB/step exhausts the ~924 MiB headroom in ~4,600 steps (< 10,000) -> reported
    cap = 2**30
    slow = MemoryMonitor(scripted(growing(8, 100 * MiB, KiB, MiB, capacity=cap)), window=8)
    fast = MemoryMonitor(scripted(growing(8, 100 * MiB, 200 * KiB, MiB, capacity=cap)), window=8)
    for _ in range(8):
        slow.step()
        fast.step()
    assert slow.leak is None
    assert fast.leak is not None and fast.leak.steps_to_capacity is not None
    assert 4_000 < fast.leak.steps_to_capacity < 5_000


def test_name_cause_rules() -> None:
    assert name_cause(MiB, 1.2 * MiB, None) == "graph-retained"
    assert name_cause(2 * MiB, 50 * MiB, MiB) == "stored-outputs"
    assert name_cause(512, 50 * MiB, MiB) == "tensor-list"
    assert name_cause(512, None, None) == "tensor-list"


@given(st.integers(-10**6, 10**6), st.integers(0, 10**12), st.integers(0, 10**6), st.integers(3, 30))
def test_fit_line_recovers_exact_lines(slope: int, intercept: int, first_step: int, n: int) -> None:
    """Byte counts on a straight line (integers, as allocations are) give back the line, r^2 = 1."""
    xs = [float(first_step + i) for i in range(n)]
    s, b, r2 = fit_line(xs, [float(intercept + slope * x) for x in xs])
    assert s == pytest.approx(slope, rel=1e-6, abs=1e-6)
    assert b == pytest.approx(intercept, rel=1e-6, abs=1e-3)
    assert r2 == pytest.approx(1.0, abs=1e-6)


# ---------------------------------------------------------------- real CPU loops, measured by the tracker

torch = pytest.importorskip("torch")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))


def _run(loop: str, steps: int = 8) -> MemoryMonitor:
    from vramplan.trace.tracker import Tracker

    model = _model()
    x = torch.randn(16, 32)
    kept: list[torch.Tensor] = []
    total: torch.Tensor | float = 0.0
    with Tracker() as tr:
        tr.track(list(model.parameters()), "weights")
        tr.track([x], "inputs")
        # outputs: 16 x 10 fp32 = 640 B
        mon = MemoryMonitor(tracker_stats(tr), window=6, growth_bytes_per_step=1, output_bytes=640)
        for i in range(steps):
            mon.step_begin()
            if loop == "stored-outputs":
                with torch.no_grad():
                    kept.append(model(x))
            else:
                loss = model(x).pow(2).mean()
                if loop == "accumulate-graph":
                    total = total + loss  # the seeds' leak: `total_loss += loss` keeps the graph
                elif loop == "item":
                    total += loss.item()  # the fix
                del loss
            mon.step(i)
    return mon


def test_real_loop_accumulating_loss_with_graph_is_detected() -> None:
    mon = _run("accumulate-graph")
    assert mon.leak is not None and mon.leak.cause == "graph-retained"
    # each step keeps what its graph saved: Linear 1's output (16 x 256 fp32 = 16,384 B) for GELU,
    # GELU's output (16,384 B) for Linear 2, the model output (640 B) for pow; x is shared by all
    # steps and the running total replaces the previous one: 33,408 B per step exactly
    assert mon.leak.slope_bytes_per_step == pytest.approx(16_384 + 16_384 + 640)
    assert mon.records[-1].allocated_bytes > mon.records[0].allocated_bytes


def test_real_loop_storing_outputs_is_detected() -> None:
    mon = _run("stored-outputs")
    assert mon.leak is not None and mon.leak.cause == "stored-outputs"
    assert mon.leak.slope_bytes_per_step == pytest.approx(640)


def test_real_loop_with_item_does_not_leak() -> None:
    mon = _run("item")
    assert mon.leak is None
    assert len({r.allocated_bytes for r in mon.records}) == 1  # flat: the same bytes after every step


# ---------------------------------------------------------------- CSV and plot

def test_csv_and_plot(tmp_path: Path) -> None:
    mon = MemoryMonitor(scripted(growing(8, MiB, 64 * KiB, 2 * MiB, capacity=16 * MiB)), window=8,
                        growth_bytes_per_step=1)
    for _ in range(8):
        mon.step()
    files = mon.finish(tmp_path / "out")
    rows = list(csv.DictReader(files["csv"].open()))
    assert len(rows) == 8 and rows[0]["step"] == "0" and rows[1]["allocated_bytes"] == str(MiB + 64 * KiB)
    assert set(rows[0]) == {"step", "allocated_bytes", "reserved_bytes", "active_bytes", "peak_allocated_bytes",
                            "fragmentation"}
    pytest.importorskip("matplotlib")
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- framework adapters

def test_hf_callback_hooks(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import TrainerCallback

    from vramplan.measure.callbacks import HFMemoryCallback

    cb = HFMemoryCallback(MemoryMonitor(scripted([MemoryStats(10, 10, 10)] * 4 + [MemoryStats(20, 30, 15)])))
    assert isinstance(cb, TrainerCallback)
    args = SimpleNamespace(output_dir=str(tmp_path), process_index=0)
    for step in (1, 2):
        cb.on_step_begin(args, SimpleNamespace(global_step=step - 1), None)
        cb.on_step_end(args, SimpleNamespace(global_step=step), None)
    cb.on_train_end(args, SimpleNamespace(global_step=2), None)
    assert [r.step for r in cb.monitor.records] == [1, 2]
    assert cb.files["csv"] == tmp_path / "memory.csv" and cb.files["csv"].exists()


def test_hf_callback_in_a_real_trainer(tmp_path: Path) -> None:
    """Three optimizer steps of a tiny model through transformers.Trainer on the CPU."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from vramplan.measure.callbacks import HFMemoryCallback
    from vramplan.trace.tracker import Tracker

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}

    data = [{"x": torch.randn(8), "labels": torch.randn(())} for _ in range(12)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3,
                             report_to=[], save_strategy="no", use_cpu=True, logging_strategy="no",
                             disable_tqdm=True)
    with Tracker() as tr:
        cb = HFMemoryCallback(stats=tracker_stats(tr), window=3)
        Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb]).train()
    assert [r.step for r in cb.monitor.records] == [1, 2, 3]
    assert (tmp_path / "memory.csv").exists()
    # after each step: weights (9 fp32) + AdamW states (2 x 9 fp32) at least
    assert cb.monitor.records[-1].allocated_bytes >= 3 * 9 * 4


def test_lightning_hooks_called_directly(tmp_path: Path) -> None:
    hooks = LightningMemoryHooks(MemoryMonitor(scripted([MemoryStats(5, 5, 5)] * 3 + [MemoryStats(6, 8, 6)] * 3)),
                                 out_dir=tmp_path)
    trainer = SimpleNamespace(global_step=0, global_rank=0, default_root_dir=str(tmp_path))
    for i in range(3):
        hooks.on_train_batch_start(trainer, None, batch=None, batch_idx=i)
        trainer.global_step = i + 1
        hooks.on_train_batch_end(trainer, None, outputs={"loss": 0.0}, batch=None, batch_idx=i)
    hooks.on_train_end(trainer, None)
    assert [r.step for r in hooks.monitor.records] == [1, 2, 3]
    assert hooks.monitor.records[0].start_allocated_bytes == 5
    assert (tmp_path / "memory.csv").exists()


def test_lightning_callback_subclasses_lightnings_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pkg = types.ModuleType("lightning")
    fake = types.ModuleType("lightning.pytorch")

    class Callback:
        pass

    fake.Callback = Callback  # type: ignore[attr-defined]
    fake_pkg.pytorch = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", fake_pkg)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", fake)
    cb = lightning_callback(MemoryMonitor(scripted([MemoryStats(1, 1, 1)])))
    assert isinstance(cb, Callback) and isinstance(cb, LightningMemoryHooks)
    cb.on_train_batch_end(SimpleNamespace(global_step=4), None, None, None, 0)
    assert cb.monitor.records[0].step == 4


def test_lightning_callback_without_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    with pytest.raises(MissingExtraError, match="pip install lightning"):
        lightning_callback()
