"""Set the GPU measurements of ``measure_h200.py`` beside both engines' predictions.

    PYTHONPATH=src python benchmarks/gpu/compare.py benchmarks/gpu/h200-2026-11-26 [--trace] [--markdown OUT.md]

The analytic prediction is re-computed with the engine of this checkout (so the table shows the
engine as it is now, not as it was when the GPU ran), with the transformers and torch releases that
ran (``env.json``) as ``software.transformers``/``software.torch``; ``--trace`` adds the traced engine
(torch on the meta device, slower; it runs the installed transformers, whatever the release).  Each row: measured ``max_memory_allocated``, ``max_memory_reserved``
and NVML's used memory for the process, and each engine's signed error
``(predicted - measured) / measured``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

GiB = 2**30
CLI = [sys.executable, "-c", "from vramplan.cli.main import main; main()"]


def software_flags(env: dict[str, object]) -> list[str]:
    """The releases that ran, as scenario flags, so the prediction follows the same library behaviour."""
    out = []
    for key, flag in (("transformers", "--transformers-version"), ("torch", "--torch-version")):
        text = str(env.get(key) or "").split("+")[0]
        if text:
            out += [flag, ".".join(text.split(".")[:2])]
    return out


def _predict(flags: list[str], gpu: str, engine: str) -> dict[str, int] | None:
    p = subprocess.run([*CLI, "estimate", *flags, "--gpu", gpu, "--engine", engine, "--json"],
                       check=False, capture_output=True, text=True)
    try:
        pg = json.loads(p.stdout)["per_gpu"]
    except (ValueError, KeyError):
        return None
    return {k: int(pg[k]) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")}


def _verdict(flags: list[str], gpu: str) -> str:
    """The analytic engine's verdict for a scenario that failed on the GPU (FITS would be a false fit)."""
    p = subprocess.run([*CLI, "estimate", *flags, "--gpu", gpu, "--json"], check=False, capture_output=True, text=True)
    try:
        doc = json.loads(p.stdout)
        return f"{doc['verdict']}, peak allocated {int(doc['per_gpu']['peak_allocated_bytes']) / GiB:.2f} GiB"
    except (ValueError, KeyError):
        return "no estimate"


def _err(pred: int | None, meas: int | None) -> float | None:
    return None if not pred or not meas else (pred - meas) / meas


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--recorded", action="store_true",
                    help="the analytic prediction the measure run recorded (the engine of the commit that ran)")
    args = ap.parse_args()
    env = json.loads((args.folder / "env.json").read_text())
    rows = []
    for line in (args.folder / "results.jsonl").read_text().splitlines():
        d = json.loads(line)
        r = d["result"]
        if not r:
            tail = " ".join(d["stderr_tail"].split())
            oom = re.search(r"CUDA out of memory\. Tried to allocate [0-9.]+ [GM]iB", tail)
            error = oom.group(0) if oom else tail[-160:].replace("|", "/")
            verdict = _verdict([*d["flags"], *software_flags(env)], args.gpu)
            rows.append({"id": d["id"], "error": f"{error}; analytic now: {verdict}"})
            continue
        meas = {"peak_allocated_bytes": r["peak_allocated_bytes"], "peak_reserved_bytes": r["peak_reserved_bytes"],
                "device_used_bytes": r["device_used_bytes"]}
        flags = [*d["flags"], *software_flags(env)]
        if args.recorded:
            pg = r["prediction"]["per_gpu"]
            analytic = {k: int(pg[k]) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")}
        else:
            analytic = _predict(flags, args.gpu, "analytic")
        row = {"id": d["id"], "flags": flags, "measured": meas, "analytic": analytic}
        if args.trace:
            row["trace"] = _predict(flags, args.gpu, "trace")
        rows.append(row)
        print(d["id"], file=sys.stderr, flush=True)
    engines = ["analytic"] + (["trace"] if args.trace else [])
    keys = [("peak_allocated_bytes", "allocated"), ("peak_reserved_bytes", "reserved"), ("device_used_bytes", "nvidia-smi")]
    out = [(f"GPU: {env.get('gpu')} ({env.get('nvidia_smi')}); torch {env.get('torch')} (CUDA {env.get('cuda')}), "
            f"transformers {env.get('transformers')}, peft {env.get('peft')}."), "",
           ("| scenario | measured allocated / reserved / nvidia-smi (GiB) | "
            + " | ".join(f"{e} error alloc / reserved / smi" for e in engines) + " |"),
           "|---|---|" + "---|" * len(engines)]
    errs: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if "error" in row:
            out.append(f"| {row['id']} | failed: {row['error']} |" + " |" * len(engines))
            continue
        m = row["measured"]
        cells = [" / ".join(f"{m[k] / GiB:.2f}" for k, _ in keys)]
        for e in engines:
            pred = row.get(e)
            parts = []
            for k, label in keys:
                v = _err(pred[k] if pred else None, m[k])
                parts.append("n/a" if v is None else f"{v * 100:+.1f}%")
                if v is not None:
                    errs.setdefault((e, label), []).append(v)
            cells.append(" / ".join(parts))
        out.append(f"| {row['id']} | " + " | ".join(cells) + " |")
    out.append("")
    for (e, label), vs in errs.items():
        absv = sorted(abs(v) for v in vs)
        out.append(f"- {e}, {label}: median |error| {statistics.median(absv) * 100:.1f}%, worst {max(vs, key=abs) * 100:+.1f}%,"
                   f" under-predicted {sum(v < 0 for v in vs)}/{len(vs)} (n = {len(vs)})")
    text = "\n".join(out) + "\n"
    if args.markdown:
        args.markdown.write_text(text)
        (args.markdown.with_suffix(".json")).write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
