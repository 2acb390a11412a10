"""CPU time of expandable-segments training estimates (``expandable_segments:True``, torchtitan's default).

``time.process_time`` per whole estimate (the machine may be shared: wall time is noisy), with the replay
cache (``train_reserved_bytes``) cleared before each estimate so that every one replays its stream: two
torchtitan scenarios from ``examples/`` and a sample of the planner's expandable-segments candidates for
Llama-3.1-8B on 8 x H100 (``bench_plan.py``'s first case).  Run:
``PYTHONPATH=src python benchmarks/bench_expandable.py [repeats]``; run it with ``PYTHONPATH`` at an earlier
checkout for the figures before a change (``docs/allocator.md``, Speed).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main(repeats: int) -> None:
    from vramplan.alloc import native
    from vramplan.analytic.allocator import train_reserved_bytes
    from vramplan.catalog.resolve import resolve
    from vramplan.engine import estimate
    from vramplan.plan import TrainJob
    from vramplan.plan.context import make_context
    from vramplan.plan.space import train_candidates
    from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS
    from vramplan.spec.defaults import expandable_segments

    print(f"C replay built: {native._MODULE is not None}, used: {native.available()}")
    docs: dict[str, Any] = {
        "qwen25-7b torchtitan tp2 fsdp 4xA100-40GB": json.loads((EXAMPLES / "qwen25-7b-bf16-true-tp2.json").read_text()),
    }
    d = yaml.safe_load((EXAMPLES / "llama3-8b-fsdp-8xh100.yaml").read_text())
    docs["llama3-8b fsdp 8xH100, framework torchtitan"] = {**d, "framework": "torchtitan"}
    for name, doc in docs.items():
        r = resolve(doc)
        assert expandable_segments(r.scenario), name
        estimate(r)  # warm the other caches
        ts = []
        for _ in range(repeats):
            train_reserved_bytes.cache_clear()
            t0 = time.process_time()
            estimate(r)
            ts.append(time.process_time() - t0)
        print(f"{name}: median {statistics.median(ts) * 1e3:.1f} ms CPU per estimate, min {min(ts) * 1e3:.1f} ms")

    ctx = make_context("meta-llama/Llama-3.1-8B", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train")
    cands = list(train_candidates(ctx.model, ctx.gpu, 8, TrainJob(seq_len=8192, global_batch=64)))
    exp = [s for s in cands if expandable_segments(ctx.scenario(s))]
    sample = exp[:: max(1, len(exp) // 40)]
    for s in sample:
        ctx.estimate(s)
    ts = []
    for s in sample:
        train_reserved_bytes.cache_clear()
        t0 = time.process_time()
        ctx.estimate(s)
        ts.append(time.process_time() - t0)
    print(f"planner Llama-3.1-8B 8xH100 seq 8192: {len(cands)} candidates, {len(exp)} with expandable segments, "
          f"{len(sample)} sampled: mean {statistics.mean(ts) * 1e3:.1f} ms, median {statistics.median(ts) * 1e3:.1f} ms "
          "CPU per estimate")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
