"""Dump the analytic engine's training results for many scenarios, to check that a change keeps them identical.

For every scenario it records the full analytic report (``estimate(...).to_json_dict()``, default
``reserved="replay"``) and, for the step's event stream (``analytic/events.py``), every field of the
allocator replay (``vramplan.alloc.replay_compact``) and of ``analytic.allocator.train_reserved_bytes``
with no capacity, with capacities of 40%, 70%, 90%, 99% and 100% of the unlimited peak (out-of-memory
and release-and-retry paths), and with ``expandable_segments``.  Scenarios: every file in examples/
whose task is ``train``, every ``train`` entry of validation/published.yaml (through the validate
dataset loader), and a grid of variations (ZeRO 0-3, FSDP, offload, checkpointing none/full/selective,
LoRA/QLoRA, micro-batch and sequence sizes, MoE and mixed-layer models, small GPUs that run out of memory).

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/check_replay_identity.py --out /tmp/before.json
    # ... change the code ...
    PYTHONPATH=src python benchmarks/check_replay_identity.py --out /tmp/after.json --against /tmp/before.json

``--against`` prints every scenario whose record differs (the first differing keys) and exits 1 if any
does; ``--quick`` runs the examples and the published entries only.  Scenarios that do not resolve are
recorded with their error, so a difference in them shows too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _examples() -> list[tuple[str, Any]]:
    from vramplan.spec.load import read_document

    out: list[tuple[str, Any]] = []
    for p in sorted((ROOT / "examples").iterdir()):
        if p.suffix not in (".yaml", ".yml", ".json", ".toml"):
            continue
        doc = read_document(p)
        if doc.get("task", "train") == "train":
            out.append((f"example:{p.name}", doc))
    return out


def _published() -> list[tuple[str, Any]]:
    from vramplan.validate import load_dataset

    ds = load_dataset(ROOT / "validation" / "published.yaml")
    return [(f"published:{e.id}", e.scenario) for e in ds.entries if e.task == "train"]


def _grid() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []

    def add(name: str, model: str, gpu: str, n: int = 1, *, train: dict[str, Any] | None = None,
            parallel: dict[str, Any] | None = None, framework: str | None = None) -> None:
        doc: dict[str, Any] = {"model": model, "task": "train", "hardware": {"gpu": gpu, "num_gpus": n},
                               "train": train or {}, "parallel": parallel or {}}
        if framework:
            doc["framework"] = framework
        out.append((f"grid:{name}", doc))

    llama7, llama8, llama70 = "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-70B"
    # ZeRO stages x checkpointing x sizes on 8 GPUs
    for zero, ckpt, (mbs, seq) in itertools.product((0, 1, 2, 3), ("none", "full", "selective"),
                                                    ((1, 512), (2, 2048), (8, 1024))):
        add(f"llama7-zero{zero}-{ckpt}-{mbs}x{seq}", llama7, "A100-80GB", 8,
            train={"micro_batch_size": mbs, "seq_len": seq, "gradient_checkpointing": ckpt},
            parallel={"zero_stage": zero}, framework="deepspeed")
    for fsdp, ckpt in itertools.product(("full_shard", "shard_grad_op", "hybrid_shard", "no_shard"),
                                        ("none", "full")):
        add(f"llama8-fsdp-{fsdp}-{ckpt}", llama8, "H100-80GB", 8,
            train={"micro_batch_size": 2, "seq_len": 4096, "gradient_checkpointing": ckpt},
            parallel={"fsdp": fsdp}, framework="accelerate")
    for offload, zero in (("optimizer", 2), ("optimizer", 3), ("optimizer+params", 3)):
        add(f"llama70-zero{zero}-offload-{offload}", llama70, "A100-80GB", 8,
            train={"micro_batch_size": 1, "seq_len": 4096, "gradient_checkpointing": "full"},
            parallel={"zero_stage": zero, "offload": offload}, framework="deepspeed")
    for method, quant, ckpt, (mbs, seq) in itertools.product(
            ("lora", "qlora"), ("none", "nf4"), ("none", "full"), ((1, 512), (4, 1024), (16, 2048))):
        if method == "qlora" and quant == "none":
            continue
        add(f"peft-{method}-{quant}-{ckpt}-{mbs}x{seq}", llama7, "RTX-4090",
            train={"micro_batch_size": mbs, "seq_len": seq, "gradient_checkpointing": ckpt, "quantization": quant,
                   "optimizer": "paged-adamw-8bit" if quant != "none" else "adamw",
                   "peft": {"method": method, "rank": 16, "target_modules": "all-linear"}})
    for model in ("mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V2-Lite",
                  "openai/gpt-oss-20b", "google/gemma-2-2b", "google/gemma-3-1b-pt", "openai-community/gpt2",
                  "EleutherAI/pythia-410m-deduped", "google-bert/bert-large-uncased"):
        for ckpt, att in (("none", "sdpa"), ("full", "sdpa"), ("selective", "eager")):
            add(f"{model.split('/')[1]}-{ckpt}-{att}", model, "H100-80GB", 8,
                train={"micro_batch_size": 2, "seq_len": 1024, "gradient_checkpointing": ckpt, "attention": att},
                parallel={"zero_stage": 3}, framework="deepspeed")
    # small devices: out of memory, and fits only after the allocator's release-and-retry
    for gpu, (mbs, seq), prec, opt in itertools.product(
            ("T4", "RTX-4090", "A10G"), ((1, 256), (4, 1024), (8, 2048)), ("bf16-mixed", "fp32"),
            ("adamw", "sgd", "adafactor")):
        add(f"small-{gpu}-{mbs}x{seq}-{prec}-{opt}", "Qwen/Qwen2.5-0.5B", gpu,
            train={"micro_batch_size": mbs, "seq_len": seq, "precision": prec, "optimizer": opt})
    for gpu, ckpt in itertools.product(("T4", "A100-40GB", "A100-80GB"), ("none", "full")):
        add(f"oom-llama7-{gpu}-{ckpt}", llama7, gpu,
            train={"micro_batch_size": 4, "seq_len": 2048, "gradient_checkpointing": ckpt})
    add("llama7-gradaccum", llama7, "A100-80GB", 8, train={"micro_batch_size": 1, "grad_accum_steps": 8},
        parallel={"zero_stage": 2}, framework="deepspeed")
    add("llama8-tp2-pp2", llama8, "H100-80GB", 8, train={"micro_batch_size": 1, "seq_len": 8192},
        parallel={"tp": 2, "pp": 2}, framework="torchtitan")
    return out


def _replays(layout: Any) -> dict[str, Any]:
    from vramplan.alloc import replay_compact
    from vramplan.analytic.allocator import train_reserved_bytes
    from vramplan.analytic.events import train_run_stream

    stream = train_run_stream(layout)
    rec: dict[str, Any] = {"events": len(stream), "stream_sha256": hashlib.sha256(repr(stream).encode()).hexdigest()}
    base = replay_compact(stream)
    caps: list[tuple[str, int | None]] = [("none", None)]
    caps += [(f"{pct}%", base.peak_reserved_bytes * pct // 100) for pct in (40, 70, 90, 99, 100)]
    for expandable in (False, True):
        for label, cap in caps:
            key = f"{'expandable' if expandable else 'default'}/{label}"
            res = replay_compact(stream, expandable_segments=expandable, capacity_bytes=cap)
            d = dataclasses.asdict(res)
            d["fragmentation_at_peak_reserved"] = res.fragmentation_at_peak_reserved
            rec[key] = d
            train_reserved_bytes.cache_clear()
            rec[key + "/train_reserved_bytes"] = list(train_reserved_bytes(layout, expandable, cap))
    return rec


def record(name: str, doc: Any) -> dict[str, Any]:
    from vramplan import estimate
    from vramplan.analytic.allocator import train_reserved_bytes
    from vramplan.analytic.train import train_step
    from vramplan.catalog.resolve import resolve

    try:
        r = resolve(doc)
    except Exception as exc:  # noqa: BLE001 (recorded: a scenario that stops resolving is a difference too)
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {}
    try:
        train_reserved_bytes.cache_clear()
        out["report"] = estimate(r).to_json_dict()
        out["report_packed"] = estimate(r, reserved="packed").to_json_dict()
        layout = train_step(r).layout
        if layout is not None:
            out["replay"] = _replays(layout)
    except Exception as exc:  # noqa: BLE001 (recorded, as above)
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'after' if k not in a else 'before'}")
            else:
                out += _diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def compare(before: dict[str, Any], records: dict[str, Any], noun: str) -> int:
    """Print every record that differs from ``before`` (its first differences); 1 if any does.

    Keys present only in the new records (keys added beside the existing ones) are not a
    difference: they are listed once, at the end, with the number of records that gained them."""
    bad = 0
    added: dict[str, int] = {}
    for name in sorted(set(before) | set(records)):
        if name not in before or name not in records:
            print(f"{name}: only in {'before' if name in before else 'after'}")
            bad += 1
            continue
        d = _diff(before[name], json.loads(json.dumps(records[name])))
        for x in d:
            if x.endswith(": only in after"):
                key = re.sub(r"\[\d+\]", "[]", x.removesuffix(": only in after"))
                added[key] = added.get(key, 0) + 1
        d = [x for x in d if not x.endswith(": only in after")]
        if d:
            bad += 1
            print(f"{name}: {len(d)} differences, e.g. " + "; ".join(d[:3]))
    for key, n in sorted(added.items()):
        print(f"added key {key} (in {n} records)")
    print(f"{bad} of {len(records)} {noun} differ" if bad else f"all {len(records)} {noun} identical"
          + (f" apart from {len(added)} added keys" if added else ""))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where to write the records (JSON)")
    ap.add_argument("--against", type=Path, help="records to compare with (an earlier --out)")
    ap.add_argument("--quick", action="store_true", help="examples and published entries only")
    args = ap.parse_args()
    scenarios = _examples() + _published() + ([] if args.quick else _grid())
    t0 = time.perf_counter()
    records = {name: record(name, doc) for name, doc in scenarios}
    args.out.write_text(json.dumps(records, indent=1, sort_keys=True))
    n_err = sum(1 for r in records.values() if "error" in r)
    print(f"{len(records)} scenarios ({n_err} with an error recorded) in {time.perf_counter() - t0:.1f} s "
          f"-> {args.out}")
    if args.against is None:
        return 0
    return compare(json.loads(args.against.read_text()), records, "scenarios")


if __name__ == "__main__":
    sys.exit(main())
