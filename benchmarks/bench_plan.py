"""Speed of the planner.

Targets (issue 5): the search evaluates at least 10,000 candidates per second, and ``vramplan plan``
for an 8B model on 8 GPUs answers in under 2 s end to end (process start, imports, search,
explanation, rendering) on the project's 2-core reference machine.

What counts as *evaluated*: a candidate setup of the search space whose predicted step time the
step-time model has computed and whose place in the answer is decided -- by the memory lower
bound (rejected: it cannot fit), by a full estimate from the analytic engine (fits or not), or by
the branch-and-bound rule (a setup of its family, or ``top`` whole families, that fit with a shorter
predicted step were already found, so it cannot enter the answer).  The exhaustive mode, which
checks the memory of every candidate (bound or full estimate) and skips nothing, is timed too, and
so is the full estimate on its own.

The search is timed by the wall clock and by the process's CPU time (``time.process_time``, median
of the 5 runs): on a shared machine the wall clock also counts the time other processes held the
cores, the CPU time does not; the first line gives the load average when the run started.

Run: ``python benchmarks/bench_plan.py`` (writes ``benchmarks/bench_plan.txt``).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "bench_plan.txt"


def main() -> None:
    from vramplan.plan import ServeJob, TrainJob, plan
    from vramplan.plan.context import make_context
    from vramplan.plan.space import train_candidates
    from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines: list[str] = [(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}, "
                        f"load average at start {load}"), ""]

    def say(text: str) -> None:
        print(text)
        lines.append(text)

    cases = [
        ("Llama-3.1-8B train, 8 x H100, seq 8192, batch 64", "meta-llama/Llama-3.1-8B", "H100-SXM", "8",
         TrainJob(seq_len=8192, global_batch=64)),
        ("Llama-3-70B train, 8 x A100 80GB, seq 2048, batch 32", "meta-llama/Meta-Llama-3-70B", "A100-80GB", "8",
         TrainJob(seq_len=2048, global_batch=32)),
        ("Llama-3.1-8B train, 1-64 x H100, seq 4096, batch 256", "meta-llama/Llama-3.1-8B", "H100-SXM", "1-64",
         TrainJob(seq_len=4096, global_batch=256)),
        ("Llama-2-7B train + PEFT, 1 x A100 80GB, batch 16", "meta-llama/Llama-2-7b-hf", "A100-80GB", "1",
         TrainJob(seq_len=2048, global_batch=16, peft="allow")),
        ("Llama-3.1-8B serve, 1-8 x L4, 8192 x 32", "meta-llama/Llama-3.1-8B", "L4", "1-8",
         ServeJob(max_model_len=8192, concurrency=32, allow_quantization=True)),
    ]
    say("search (median of 5; explain=False: the search alone)")
    say(f"{'case':52s} {'cands':>6s} {'bound':>6s} {'estim':>6s} {'pruned':>6s} {'ms':>7s} {'cands/s':>9s}"
        f" {'cpu ms':>7s} {'cands/cpu-s':>11s}   exhaustive: {'estim':>6s} {'ms':>7s} {'cands/s':>9s}")
    for name, model, gpu, counts, job in cases:
        plan(model, gpu, counts, job, explain=False)  # warm caches (catalog, model specs)
        runs, cpu = [], []
        for _ in range(5):
            c0 = time.process_time()
            r = plan(model, gpu, counts, job, explain=False)
            cpu.append(time.process_time() - c0)
            runs.append(r.stats)
        st = sorted(runs, key=lambda s: s.seconds)[2]
        cpu_s = statistics.median(cpu)
        ex = sorted((plan(model, gpu, counts, job, explain=False, exhaustive=True).stats for _ in range(3)),
                    key=lambda s: s.seconds)[1]
        say(f"{name:52s} {st.candidates:6d} {st.bound_rejected:6d} {st.estimated:6d} {st.pruned:6d} "
            f"{st.seconds * 1e3:7.1f} {st.candidates_per_s:9,.0f} {cpu_s * 1e3:7.1f} {st.candidates / cpu_s:11,.0f}"
            f"   {'':11s} {ex.estimated:6d} "
            f"{ex.seconds * 1e3:7.1f} {ex.candidates_per_s:9,.0f}")

    say("")
    ctx = make_context("meta-llama/Llama-3.1-8B", "H100-SXM", 0.1, DEFAULT_ASSUMPTIONS, "train")
    cands = list(train_candidates(ctx.model, ctx.gpu, 8, TrainJob(seq_len=8192, global_batch=64)))
    for s in cands:
        ctx.step_time(s)
    t0 = time.perf_counter()
    for s in cands:
        ctx.step_time(s)
    t_step = (time.perf_counter() - t0) / len(cands)
    t0 = time.perf_counter()
    for s in cands:
        ctx.lower_bound(s)
    t_bound = (time.perf_counter() - t0) / len(cands)
    sample = cands[:: max(1, len(cands) // 100)]
    t0 = time.perf_counter()
    for s in sample:
        ctx.estimate(s)
    t_est = (time.perf_counter() - t0) / len(sample)
    say(f"per candidate (Llama-3.1-8B, 8 GPUs): step-time model {t_step * 1e6:,.0f} us, memory lower bound "
        f"{t_bound * 1e6:,.0f} us, full estimate {t_est * 1e6:,.0f} us ({1 / t_est:,.0f} estimates/s)")

    say("")
    cmd = [sys.executable, "-m", "vramplan.cli.main", "plan", "--model", "meta-llama/Llama-3.1-8B", "--gpu",
           "H100-SXM", "--num-gpus", "8", "--seq-len", "8192", "--global-batch", "64"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "140"}
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        walls.append(time.perf_counter() - t0)
    say(f"`vramplan plan` Llama-3.1-8B on 8 x H100 end to end (new process, explanation, rendering): "
        f"median {statistics.median(walls):.2f} s, max {max(walls):.2f} s over 5 runs")
    json_cmd = [*cmd, "--json"]
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(json_cmd, check=True, capture_output=True, env=env)
        walls.append(time.perf_counter() - t0)
    say(f"the same with --json: median {statistics.median(walls):.2f} s")

    # the whole GPU catalog for one job (plan/every_gpu.py, the web page's "which GPUs fit" table): each example in
    # a new process's first call (cold: nothing remembered) and again (warm)
    from vramplan.plan.every_gpu import fit_on_every_gpu, smallest_fitting_counts

    say("")
    for ex in ("examples/llama3-8b-fsdp-8xh100.yaml", "examples/llama2-7b-inference-a100.yaml"):
        path = str(ROOT / ex)
        code = ("import time; from vramplan.plan.every_gpu import fit_on_every_gpu; t = time.perf_counter(); "
                f"r = fit_on_every_gpu({path!r}); print(len(r), time.perf_counter() - t)")
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
        n, cold = out.split()
        t0 = time.perf_counter()
        fit_on_every_gpu(path)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        smallest_fitting_counts(path)
        counts = time.perf_counter() - t0
        say(f"every catalog GPU ({n}) for {ex}: {float(cold):.2f} s cold, {warm:.2f} s warm; smallest fitting count "
            f"(1, 2, 4, 8) on each: {counts:.2f} s")
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
