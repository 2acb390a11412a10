"""Speed of the analytic engine.

Targets: one estimate in under 5 ms after import; ``vramplan estimate`` on an example,
end to end with imports, under 0.5 s.  Run: ``python benchmarks/bench_estimate.py``.

Training estimates are timed three ways: ``reserved="packed"`` (the closed-form terms with the
peak's tensors packed into segments), the default allocator replay of the step's event stream
with its cache cleared before every call (what a new scenario costs), and the replay cached (a
repeated scenario, as in the planner's solvers).  The first two also clear the per-layout cache of
the rank's parameter tallies (analytic/terms/context.py) before every call, so they time a new
scenario; the cached replay keeps it.  Each line gives the median, p90 and minimum: on a machine
shared with other work, compare versions by their minimums, from runs interleaved in one session.  The default replay runs in C where
``vramplan/alloc/_replay.c`` was built (``pip install``); ``VRAMPLAN_NATIVE=0`` times the Python
replay.  The first 7B case runs out of memory on its GPU, where the replay stops.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout_cache_clear() -> None:
    """Forget this rank's parameter tallies (analytic/terms/context.py keeps them per model and layout), so
    that a timed estimate costs what a new scenario costs; a no-op for code without that cache."""
    try:
        from vramplan.analytic.terms.context import _RANK_PARAMS
    except ImportError:
        return
    _RANK_PARAMS.clear()


def main() -> None:
    from vramplan import estimate
    from vramplan.analytic.allocator import train_reserved_bytes

    try:
        from vramplan.catalog.resolve import resolve
    except ImportError:  # the code before the redesign, for figures side by side
        from vramplan.spec.load import resolve  # type: ignore[attr-defined,no-redef]

    cases = {
        "llama-2-7b train (no ckpt, 1 GPU: OOM)": ROOT / "examples" / "llama2-7b-full-naive-a100.yaml",
        "llama-2-7b zero3 + ckpt, 8 GPUs": ROOT / "examples" / "llama2-7b-zero3-ckpt-8xa100.yaml",
        "llama-3-8b fsdp, 8 GPUs": ROOT / "examples" / "llama3-8b-fsdp-8xh100.yaml",
        "lora llama-3-8b": ROOT / "examples" / "lora-llama3-8b-a10g.yaml",
        "llama-3-70b zero3 offload, 8 GPUs": ROOT / "examples" / "llama3-70b-zero3-offload-8xa100.yaml",
        "qlora 7b": ROOT / "examples" / "qlora-7b-rtx4090.yaml",
        "llama-3-8b serve": ROOT / "examples" / "llama3-8b-serve-h100.yaml",
    }
    for name, path in cases.items():
        r = resolve(path)
        estimate(r)  # warm caches
        modes = [("packed", "packed", False), ("replay, cold", "replay", True), ("replay, cached", "replay", False)]
        for label, mode, cold in modes if r.scenario.task == "train" else modes[2:]:
            times = []
            for _ in range(20 if cold else 200):
                if cold:
                    train_reserved_bytes.cache_clear()
                if mode == "packed" or cold:
                    _layout_cache_clear()
                t0 = time.perf_counter()
                estimate(r, reserved=mode)
                times.append(time.perf_counter() - t0)
            print(f"{name:40s} median {statistics.median(times) * 1e3:6.2f} ms  p90 "
                  f"{sorted(times)[int(0.9 * len(times))] * 1e3:6.2f} ms  min {min(times) * 1e3:6.2f} ms  "
                  f"(resolved scenario, {label})")
        t_all = []
        for _ in range(50):
            t0 = time.perf_counter()
            estimate(path)
            t_all.append(time.perf_counter() - t0)
        print(f"{'':40s} median {statistics.median(t_all) * 1e3:6.2f} ms  min {min(t_all) * 1e3:6.2f} ms  "
              "(from the file, parse + resolve)")
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "vramplan.cli.main", "estimate",
                        str(ROOT / "examples" / "llama2-7b-inference-a100.yaml")], check=True,
                       capture_output=True)
        runs.append(time.perf_counter() - t0)
    print(f"CLI end to end (python -m vramplan.cli.main estimate ...): median {statistics.median(runs):.3f} s, "
          f"min {min(runs):.3f} s")


if __name__ == "__main__":
    main()
