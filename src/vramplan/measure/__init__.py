"""Measure and diagnose real runs: one real step against the prediction, callbacks, OOM snapshots.

Nothing here imports torch at import time; the functions that run a step import it when called.
``record`` is exported from ``vramplan`` itself: here the name belongs to the ``record`` submodule.
"""

from __future__ import annotations

from vramplan.measure.callbacks import (
    LeakDiagnosis,
    LightningMemoryHooks,
    MemoryMonitor,
    MemoryStats,
    StepRecord,
    cuda_stats,
    lightning_callback,
    rss_stats,
    tracker_stats,
)
from vramplan.measure.config import shrink
from vramplan.measure.result import MeasureResult, PartRow
from vramplan.measure.run import measure
from vramplan.measure.safe import BatchPlan, SafeStep, largest_fitting_micro_batch, micro_batches
from vramplan.measure.snapshot import read_snapshot

__all__ = [
    "BatchPlan", "HFMemoryCallback", "LeakDiagnosis", "LightningMemoryHooks", "MeasureResult", "MemoryMonitor",
    "MemoryStats", "PartRow", "SafeStep", "StepRecord", "cuda_stats", "largest_fitting_micro_batch",
    "lightning_callback", "measure", "micro_batches", "read_snapshot", "rss_stats", "shrink",
    "tracker_stats",
]


def __getattr__(name: str) -> object:
    # HFMemoryCallback subclasses transformers.TrainerCallback, so it is built on first use.
    if name == "HFMemoryCallback":
        from vramplan.measure import callbacks

        return callbacks.HFMemoryCallback
    raise AttributeError(name)
