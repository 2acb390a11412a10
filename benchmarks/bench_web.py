"""Server time of the web API's analytic estimate (target: under 50 ms), and of its other routes.

A real ``vramplan web`` server (uvicorn, one worker) runs on a free localhost port; each request's
server time is read from the ``Server-Timing`` header the app sets (from the first byte of the request
reaching the app to its response: body read, checks, the library call, the JSON text).  A job that is not
``FITS`` also gets its verified remedies (plan/remedies.py: each a further estimate); the rows
``?remedies=false`` time the report alone.  The training
estimate is timed cold (the allocator replay's cache cleared in the server, as for a scenario it has
not seen: ``/api/estimate`` with a new ``seq_len`` each time) and repeated (the same scenario again).
Run: ``PYTHONPATH=src python benchmarks/bench_web.py``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
N = 30


def _post(url: str, doc: Any) -> tuple[int, float]:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            status, timing = r.status, r.headers["Server-Timing"]
            r.read()
    except urllib.error.HTTPError as e:
        status, timing = e.code, e.headers["Server-Timing"]
    return status, float(timing.split("dur=")[1])


def _row(name: str, times: list[float]) -> str:
    times = sorted(times)
    p90 = times[int(0.9 * (len(times) - 1))]
    return f"{name:<62} median {statistics.median(times):7.2f} ms  p90 {p90:7.2f} ms  min {times[0]:7.2f} ms"


def main() -> None:
    from vramplan.engine import estimate
    from vramplan.spec.load import read_document

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "vramplan.cli.main", "web", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        cases = {
            "lora llama-3-8b (A10G)": "lora-llama3-8b-a10g.yaml",
            "llama-3-8b fsdp, 8 GPUs": "llama3-8b-fsdp-8xh100.yaml",
            "qlora 7b (RTX 4090)": "qlora-7b-rtx4090.yaml",
            "llama-3-70b zero3 offload, 8 GPUs": "llama3-70b-zero3-offload-8xa100.yaml",
            "llama-2-7b inference": "llama2-7b-inference-a100.yaml",
            "llama-3-8b serve": "llama3-8b-serve-h100.yaml",
        }
        print(f"# made by: PYTHONPATH=src python benchmarks/bench_web.py; {N} requests per row after one warm-up;"
              f" load average {os.getloadavg()[0]:.2f} at the start")
        medians: list[float] = []  # the analytic estimate (the report)
        with_remedies: list[float] = []  # the whole document of a job that is not FITS, remedies included
        # the page's opening setup, the README's question: Llama-3.1-8B LoRA on an RTX 4090 (web/static/app.js)
        opening = {"model": "meta-llama/Llama-3.1-8B", "task": "train", "hardware": {"gpu": "RTX-4090"},
                   "train": {"gradient_checkpointing": "full", "peft": {"method": "lora"}}}
        docs = {"the page's opening setup: Llama-3.1-8B LoRA (RTX 4090)": opening,
                **{name: read_document(ROOT / "examples" / file) for name, file in cases.items()}}
        for name, doc in docs.items():
            _post(base + "/api/estimate", doc)  # warm-up: imports, catalog
            same = [_post(base + "/api/estimate", doc)[1] for _ in range(N)]
            # a job that FITS has no remedies: its document is the report
            whole = medians if estimate(doc).verdict == "FITS" else with_remedies
            whole.append(statistics.median(same))
            print(_row(f"POST /api/estimate {name}, repeated", same))
            if doc.get("task", "train") == "train":
                seq = doc.get("train", {}).get("seq_len", 2048)
                # a new seq_len each time: the server has not seen the scenario (replay cache miss)
                new = [_post(base + "/api/estimate", {**doc, "train": {**doc.get("train", {}), "seq_len": seq + 8 * (i + 1)}})[1]
                       for i in range(N)]
                print(_row(f"POST /api/estimate {name}, new scenario", new))
                # the report alone: a job that is not FITS also gets its verified remedies, each one a further
                # estimate (plan/remedies.py), which ?remedies=false leaves out
                alone = [_post(base + "/api/estimate?remedies=false",
                               {**doc, "train": {**doc.get("train", {}), "seq_len": seq + 8 * (N + i + 1)}})[1]
                         for i in range(N)]
                medians.append(statistics.median(alone))
                whole.append(statistics.median(new))
                print(_row(f"POST /api/estimate?remedies=false {name}, new scenario", alone))
        from vramplan.catalog.gpus import list_gpus

        lora = read_document(ROOT / "examples" / "lora-llama3-8b-a10g.yaml")
        print(_row(f"POST /api/fit lora llama-3-8b ({len(list_gpus())} GPUs)",
                   [_post(base + "/api/fit", lora)[1] for _ in range(10)]))
        serve = read_document(ROOT / "examples" / "llama3-8b-serve-h100.yaml")
        print(_row("POST /api/serve llama-3-8b (vLLM)", [_post(base + "/api/serve", serve)[1] for _ in range(N)]))
        sglang = {**serve, "serve": {**serve.get("serve", {}), "engine": "sglang"}}
        print(_row("POST /api/serve llama-3-8b (SGLang)", [_post(base + "/api/serve", sglang)[1] for _ in range(N)]))
        print(_row("POST /api/serve/curve llama-3-8b", [_post(base + "/api/serve/curve", serve)[1] for _ in range(N)]))
        bad = {**lora, "train": {"seq_len": 0}}
        print(_row("POST /api/estimate, bad input (422)", [_post(base + "/api/estimate", bad)[1] for _ in range(N)]))
        print(f"# load average {os.getloadavg()[0]:.2f} at the end")
        worst = max(medians)
        print(f"# analytic estimate (the report): the largest median above is {worst:.2f} ms, "
              f"{'under' if worst < 50 else 'NOT under'} the 50 ms target")
        print(f"# the whole document of a job that is not FITS (the report and its verified remedies): the largest "
              f"median is {max(with_remedies, default=0.0):.2f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
