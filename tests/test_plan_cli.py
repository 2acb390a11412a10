"""`vramplan plan` and `vramplan solve`: rendering, JSON, export, and bad input (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vramplan.cli.main import app
from vramplan.plan import TrainJob, plan

ROOT = Path(__file__).resolve().parents[1]
SNAP = Path(__file__).parent / "snapshots"
ENV = {"COLUMNS": "140", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()
QLORA = ["plan", "--model", "meta-llama/Llama-2-7b-hf", "--gpu", "RTX-4090", "--seq-len", "1024",
         "--global-batch", "16", "--peft", "qlora"]


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


def test_plan_snapshot() -> None:
    code, out, _ = run(*QLORA, "--top", "3")
    assert code == 0
    # the search's own timing changes run to run
    text = re.sub(r"searched .* pruned \(slower than the answer\)", "searched ...", out, flags=re.DOTALL)
    snap = SNAP / "plan_qlora_7b_4090.txt"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snap.write_text(text)
    assert text == snap.read_text()


def test_plan_text_has_the_parts() -> None:
    code, out, _ = run("plan", "--model", "meta-llama/Meta-Llama-3-70B", "--gpu", "A100-80GB", "--num-gpus", "8",
                       "--seq-len", "2048", "--global-batch", "32")
    assert code == 0
    for part in ("FITS", "Ranked setups", "Chosen: memory per GPU", "predicted time per step",
                 "Decision tree", "ZeRO-3", "host memory", "Assumptions"):
        assert part in out, part


def test_plan_json_is_the_python_result() -> None:
    code, out, _ = run(*QLORA, "--json")
    assert code == 0
    doc = json.loads(out)
    api = plan("meta-llama/Llama-2-7b-hf", "RTX-4090", 1, TrainJob(seq_len=1024, global_batch=16, peft="qlora"))
    ref = api.to_json_dict()
    for key in ("task", "model", "gpu", "num_gpus", "margin", "usable_bytes", "fits", "ladder", "suggestions",
                "explanation", "assumptions", "by_gpu_count"):
        assert doc[key] == ref[key], key
    assert doc["chosen"]["label"] == ref["chosen"]["label"]
    assert doc["chosen"]["report"]["per_gpu"] == ref["chosen"]["report"]["per_gpu"]
    assert set(doc["stats"]) >= {"candidates", "estimated", "bound_rejected", "pruned", "seconds", "candidates_per_s"}


def test_plan_from_a_scenario_file_and_export(tmp_path: Path) -> None:
    code, out, _ = run("plan", str(ROOT / "examples" / "llama3-70b-naive-8xa100.yaml"), "--export",
                       str(tmp_path / "cfg"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == "meta-llama/Meta-Llama-3-70B" and doc["num_gpus"] == [8]
    assert doc["job"]["seq_len"] == 4096 and doc["job"]["global_batch_sequences"] == 8
    names = {Path(p).name for p in doc["exported"]}
    assert "README.md" in names and (tmp_path / "cfg" / "README.md").exists()


def test_plan_serve() -> None:
    code, out, _ = run("plan", "--task", "serve", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM",
                       "--num-gpus", "2", "--max-model-len", "8192", "--concurrency", "64", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["chosen"]["max_concurrency"] >= doc["chosen"]["setup"]["max_num_seqs"]
    assert doc["chosen"]["tokens_per_s"] > 0


def test_nothing_fits_exits_1_with_suggestions() -> None:
    code, out, _ = run("plan", "--model", "meta-llama/Meta-Llama-3-70B", "--gpu", "RTX-4090", "--seq-len", "8192",
                       "--global-batch", "8")
    assert code == 1
    assert "NOTHING FITS" in out and "would fit:" in out


@pytest.mark.parametrize(("args", "needle"), [
    (["plan", "--model", "llama-3-8", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch", "8"], "did you mean"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H10", "--seq-len", "1024", "--global-batch", "8"],
     "unknown gpu"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--global-batch", "8"], "--seq-len"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024"], "global batch"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--peft", "qlra"], "did you mean 'qlora'"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1000",
      "--global-batch-tokens", "4096"], "whole number"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--num-gpus", "eight", "--seq-len",
      "1024", "--global-batch", "8"], "--num-gpus"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--task", "infer", "--seq-len", "8"],
     "--task"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--margin", "1.5"], "--margin"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--mfu", "0"], "--mfu"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--host-memory-gib", "-1"], "--host-memory-gib"),
    (["solve", "max-bach", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml")], "did you mean 'max-batch'"),
    (["solve", "max-batch", "nope.yaml"], "no such file"),
])
def test_bad_input_exits_2_without_traceback(args: list[str], needle: str) -> None:
    code, out, err = run(*args)
    assert code == 2, (out, err)
    assert needle in err
    assert "Traceback" not in err + out


def test_solve_cli() -> None:
    code, out, _ = run("solve", "max-batch", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "max-batch" and doc["value"] >= 1
    assert doc["report"]["per_gpu"]["device_used_bytes"] <= doc["usable_bytes"]
    code, out, _ = run("solve", "min-gpus", str(ROOT / "examples" / "llama2-7b-full-naive-a100.yaml"))
    assert code == 1 and "nothing fits" in out
