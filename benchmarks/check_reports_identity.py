"""Dump every task's report and the CLI's JSON answers, to check that a refactoring keeps them identical.

Complements ``check_replay_identity.py`` (training reports and allocator replays): this script records
the analytic report of every example and of every entry of validation/published.yaml, whatever the task
(train, inference, serve), and the ``--json`` output of the commands that are not ``estimate``
(plan with its exported files, solve, serve, kv, generate, simulate) on a fixed set of command lines.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/check_reports_identity.py --out /tmp/before.json
    # ... change the code ...
    PYTHONPATH=src python benchmarks/check_reports_identity.py --out /tmp/after.json --against /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# the records never depend on the network or on this machine's Hugging Face cache: a Hub id outside the
# catalog (two published.yaml entries) resolves offline against an empty cache at a fixed path, so its error
# reads the same on every run (catalog/hub.py reads these at each call)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = os.path.join(tempfile.gettempdir(), "vramplan-identity-empty-hf-home")
os.environ.pop("HF_HUB_CACHE", None)
sys.path.insert(0, str(ROOT / "benchmarks"))
from check_replay_identity import compare  # the sibling script, found through the path above

# command lines whose --json answer is recorded (run in-process through typer's CliRunner)
COMMANDS: list[list[str]] = [
    ["plan", "--model", "llama-3-70b", "--gpu", "A100-80GB", "--num-gpus", "8", "--seq-len", "2048",
     "--global-batch", "32", "--json"],
    ["plan", "--model", "llama-3-8b", "--gpu", "RTX-4090", "--num-gpus", "1", "--seq-len", "1024",
     "--global-batch", "16", "--peft", "allow", "--json"],
    ["plan", "--model", "llama-3-8b", "--gpu", "H100", "--num-gpus", "1-8", "--task", "serve",
     "--max-model-len", "8192", "--concurrency", "32", "--json"],
    ["solve", "max-batch", "examples/lora-llama3-8b-a10g.yaml", "--json"],
    ["solve", "max-seq", "examples/llama3-8b-fsdp-8xh100.yaml", "--json"],
    ["solve", "min-gpus", "examples/llama3-70b-zero3-offload-8xa100.yaml", "--json"],
    ["serve", "--model", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "32768", "--json"],
    ["serve", "examples/llama3-8b-serve-h100.yaml", "--json"],
    ["kv", "llama-3.1-8b", "--seq", "1024,8192", "--batch", "1,8", "--json"],
    ["generate", "examples/llama2-7b-inference-a100.yaml", "--json"],
    ["simulate", "--workload", "sharegpt", "--requests", "200", "--model", "llama-3.1-8b", "--gpu", "H100", "--json"],
]


def _documents() -> list[tuple[str, Any]]:
    from vramplan.spec.load import read_document
    from vramplan.validate import load_dataset

    out: list[tuple[str, Any]] = []
    for p in sorted((ROOT / "examples").iterdir()):
        if p.suffix in (".yaml", ".yml", ".json", ".toml"):
            out.append((f"example:{p.name}", read_document(p)))
    ds = load_dataset(ROOT / "validation" / "published.yaml")
    out += [(f"published:{e.id}", e.scenario) for e in ds.entries]
    return out


def _report(doc: Any) -> dict[str, Any]:
    from vramplan import estimate

    try:
        return {"report": estimate(doc).to_json_dict()}
    except Exception as exc:  # noqa: BLE001 (recorded: an error is part of the behaviour)
        return {"error": f"{type(exc).__name__}: {exc}"}


def _command(args: list[str]) -> dict[str, Any]:
    from typer.testing import CliRunner

    from vramplan.cli.main import app

    rec: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--export", tmp] if args[0] == "plan" else []
        res = CliRunner().invoke(app, args + extra)
        rec["exit_code"] = res.exit_code
        out = res.stdout.replace(tmp, "<export dir>")
        try:
            rec["json"] = _untimed(json.loads(out))
        except ValueError:
            rec["stdout"] = out
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                rec[f"export:{f.relative_to(tmp)}"] = f.read_text()
    return rec


def _untimed(doc: Any) -> Any:
    """The document without its wall-clock fields (the planner's ``seconds`` and ``candidates_per_s``)."""
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if k not in ("seconds", "candidates_per_s")}
    if isinstance(doc, list):
        return [_untimed(v) for v in doc]
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where to write the records (JSON)")
    ap.add_argument("--against", type=Path, help="records to compare with (an earlier --out)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    records: dict[str, Any] = {name: _report(doc) for name, doc in _documents()}
    for cmd in COMMANDS:
        records["cli:" + " ".join(cmd)] = _command(cmd)
    args.out.write_text(json.dumps(records, indent=1, sort_keys=True))
    print(f"{len(records)} records in {time.perf_counter() - t0:.1f} s -> {args.out}")
    if args.against is None:
        return 0
    return compare(json.loads(args.against.read_text()), records, "records")


if __name__ == "__main__":
    sys.exit(main())
