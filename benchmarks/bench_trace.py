"""Speed and memory of the traced engine, end to end (a fresh Python process per scenario).

Run from the repository root:

    PYTHONPATH=src python benchmarks/bench_trace.py > benchmarks/bench_trace.txt

Each row starts a new interpreter that imports vramplan and the torch stack, builds the model
on the meta device, traces the step and prints the report's peak; the wall time includes all
of it.  ``max RSS`` is the process's peak resident memory (the tracer's own memory: meta
tensors hold no data).  Targets (issue 3): an 8B training step under 10 s, 70B under 30 s,
tracer memory under 2 GiB.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

SCENARIOS: list[tuple[str, dict[str, object]]] = [
    ("Llama-3.1-8B train bf16-mixed 1x2048 AdamW", {
        "model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "h100"},
        "train": {"micro_batch_size": 1, "seq_len": 2048}}),
    ("Llama-3.1-8B train checkpointing 4x2048", {
        "model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "h100"},
        "train": {"micro_batch_size": 4, "seq_len": 2048, "gradient_checkpointing": "full"}}),
    ("Llama-3.1-8B QLoRA nf4-dq 1x2048", {
        "model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "rtx-4090"},
        "train": {"micro_batch_size": 1, "seq_len": 2048, "peft": {"method": "qlora", "rank": 16},
                  "quantization": "nf4-dq", "gradient_checkpointing": "full"}}),
    ("Llama-3.1-8B inference 8x1024+256", {
        "model": "meta-llama/Llama-3.1-8B", "task": "inference", "hardware": {"gpu": "h100"},
        "inference": {"batch_size": 8, "prompt_len": 1024, "new_tokens": 256}}),
    ("Llama-3-8B FSDP2 full_shard x8 ckpt 1x2048", {
        "model": "meta-llama/Meta-Llama-3-8B", "hardware": {"gpu": "h100", "num_gpus": 8},
        "train": {"micro_batch_size": 1, "seq_len": 2048, "gradient_checkpointing": "full"},
        "parallel": {"fsdp": "full_shard"}}),
    ("Mixtral-8x7B train bf16-true 1x2048", {
        "model": "mistralai/Mixtral-8x7B-v0.1", "hardware": {"gpu": "h100"},
        "train": {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-true"}}),
    ("Llama-3.1-70B train bf16-mixed 1x2048 AdamW", {
        "model": "meta-llama/Llama-3.1-70B", "hardware": {"gpu": "h100"},
        "train": {"micro_batch_size": 1, "seq_len": 2048}}),
]

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from vramplan.trace import estimate
t1 = time.perf_counter()
rep = estimate(json.loads(sys.argv[1]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "trace_s": t2 - t1,
                  "peak_allocated_bytes": rep.per_gpu.peak_allocated_bytes,
                  "peak_reserved_bytes": rep.per_gpu.peak_reserved_bytes, "peak_phase": rep.per_gpu.peak_phase,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def main() -> None:
    env = dict(os.environ)
    print(f"# bench_trace: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"{'scenario':<46} {'wall s':>7} {'import s':>8} {'trace s':>8} {'max RSS GiB':>11} "
          f"{'peak alloc GiB':>14} {'reserved GiB':>12}  phase")
    for name, doc in SCENARIOS:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(doc)], capture_output=True, text=True,
                             env=env, check=True)
        wall = time.perf_counter() - t0
        res = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<46} {wall:>7.2f} {res['import_s']:>8.2f} {res['trace_s']:>8.2f} "
              f"{res['maxrss_kib'] / 2**20:>11.2f} {res['peak_allocated_bytes'] / 2**30:>14.2f} "
              f"{res['peak_reserved_bytes'] / 2**30:>12.2f}  {res['peak_phase']}")


if __name__ == "__main__":
    main()
