"""Speed of the request-level simulator, and the waste it measures.

Target: a trace of 100,000 requests in under 10 s per mode (drawing the trace included).
Run: ``python benchmarks/bench_simulate.py``; the output is recorded in
``benchmarks/bench_simulate.txt``.

Cases: ShareGPT and Alpaca lengths (Kwon et al. 2023, Fig. 11), all arriving at step 0 and
arriving as a Poisson stream; KV capacity 45,000 tokens (about what a 13B model leaves on a
40 GB card), max_model_len 2048, 256 sequences, 8192 batched tokens, blocks of 16.
"""

from __future__ import annotations

import time
from dataclasses import replace

from vramplan.serve.simulate import SimConfig, simulate
from vramplan.serve.workloads import synthesize

N = 100_000


def main() -> None:
    base = SimConfig(capacity_tokens=45_000, max_model_len=2048)
    print(f"{N:,} requests per run; capacity {base.capacity_tokens:,} tokens, block {base.block_size}, "
          f"max_model_len {base.max_model_len}")
    print(f"{'workload':10s} {'arrivals':9s} {'mode':11s} {'seconds':>7s} {'steps':>10s} {'waste':>6s} "
          f"{'reserv':>6s} {'intern':>6s} {'extern':>6s} {'running':>8s} {'preempt':>8s} {'tok/step':>8s}")
    worst = 0.0
    for name in ("sharegpt", "alpaca"):
        for rate in (None, 2.0):
            t0 = time.perf_counter()
            trace = synthesize(name, N, seed=0, rate=rate)
            t_draw = time.perf_counter() - t0
            for mode in ("contiguous", "paged"):
                t1 = time.perf_counter()
                r = simulate(trace, replace(base, mode=mode))  # type: ignore[arg-type]
                secs = time.perf_counter() - t1 + t_draw
                worst = max(worst, secs)
                print(f"{name:10s} {('step 0' if rate is None else f'{rate:g}/step'):9s} {mode:11s} {secs:7.2f} "
                      f"{r.steps:10,d} {r.waste:6.1%} {r.share('reservation'):6.1%} {r.share('internal'):6.1%} "
                      f"{r.share('external'):6.1%} {r.mean_running:8.1f} {r.preemptions:8,d} {r.throughput:8.2f}")
    print(f"slowest run: {worst:.2f} s (target < 10 s)")


if __name__ == "__main__":
    main()
