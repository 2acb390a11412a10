"""`vramplan measure`: output, JSON, and bad input (one message per problem, exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from vramplan.cli.main import app
from vramplan.cli.measure_cmd import parse_bytes

pytest.importorskip("transformers")

runner = CliRunner()
ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "_name_or_path": "tiny-gpt2"}


def scenario(tmp_path: Path, **train: object) -> Path:
    doc = {"model": TINY_GPT2, "hardware": {"gpu": "T4"},
           "train": {"micro_batch_size": 1, "seq_len": 16, "precision": "fp32", "optimizer": "adamw", **train}}
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


def test_text_output_says_what_was_measured(tmp_path: Path) -> None:
    code, out, err = run("measure", str(scenario(tmp_path)), "--device", "cpu")
    assert code == 0, err
    assert "tiny-gpt2 · train · measured on cpu: cpu live tensor bytes (tracker)" in out
    assert "weights" in out and "673.00 KiB" in out  # 172,288 parameters x 4 B = 689,152 B
    assert "peak allocated" in out and "cuBLAS workspaces" in out and "Traceback" not in out + err


def test_json_output(tmp_path: Path) -> None:
    code, out, _ = run("measure", str(scenario(tmp_path)), "--device", "cpu", "--json", "--layers", "1")
    assert code == 0
    r = json.loads(out)
    assert r["measured"] == "cpu live tensor bytes (tracker)"
    # one layer: 172,288 - 49,984 = 122,304 parameters
    assert r["parameters"] == 122_304 and r["breakdown"]["weights"] == 122_304 * 4
    assert sum(r["breakdown"].values()) == r["peak_allocated_bytes"]
    assert r["prediction"]["engine"] == "analytic" and r["peak_reserved_bytes"] is None
    assert {row["part"] for row in r["rows"]} >= {"weights", "optimizer_states", "peak allocated"}


def test_refusal_above_the_cpu_bound(tmp_path: Path) -> None:
    code, out, err = run("measure", str(scenario(tmp_path)), "--device", "cpu", "--max-cpu-bytes", "1KB")
    assert code == 2 and out == ""
    assert "--max-cpu-bytes" in err and "1,000 bytes" in err and "--layers" in err and "Traceback" not in err


def test_bitsandbytes_optimizer_on_cpu(tmp_path: Path) -> None:
    code, _, err = run("measure", str(scenario(tmp_path, optimizer="paged-adamw-8bit")), "--device", "cpu")
    assert code == 2 and "paged-adamw-8bit needs bitsandbytes on CUDA" in err


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    code, _, err = run("measure", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file" in err
    code, _, err = run("measure", str(scenario(tmp_path)), "--max-cpu-bytes", "lots")
    assert code == 2 and "cannot read 'lots' as a size" in err
    code, _, err = run("measure", str(scenario(tmp_path)), "--device", "tpu")
    assert code == 2 and "unknown device 'tpu'" in err
    code, _, err = run("measure", str(scenario(tmp_path)), "--layers", "0")
    assert code == 2 and "--layers: must be at least 1" in err
    p = tmp_path / "typo.yaml"
    p.write_text("model: gtp2\nhardware: {gpu: T4}\n")
    code, _, err = run("measure", str(p))
    assert code == 2 and "gpt2" in err  # the suggestion
    p.write_text("model: gpt2\ntask: serve\nhardware: {gpu: T4}\n")
    code, _, err = run("measure", str(p))
    assert code == 2 and "vLLM" in err


def test_parse_bytes() -> None:
    assert parse_bytes("8000000000") == 8 * 10**9
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("7.5 GiB") == int(7.5 * 2**30)
    assert parse_bytes("512mib") == 512 * 2**20


@pytest.mark.parametrize(("exc", "expected"), [
    (RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB\nmore text"), "RuntimeError: CUDA out of memory."),
    (ValueError("`get_seq_length` can only be called on Attention layers"), "ValueError: `get_seq_length`"),
])
def test_a_failing_step_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch, exc: Exception, expected: str) -> None:
    """The real step raising (an out-of-memory error, the model code refusing its inputs) is the run's failure, not
    the scenario's: one line naming the exception (its first line only), exit status 1, no traceback."""
    import vramplan.measure.run as run_mod

    def boom(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(run_mod, "measure", boom)
    res = runner.invoke(app, ["measure", "--model", "gpt2", "--task", "train", "--gpu", "T4", "--device", "cpu"], env=ENV)
    assert res.exit_code == 1
    assert f"error: the measured step failed: {expected}" in res.output
    assert "Traceback" not in res.output and "more text" not in res.output
