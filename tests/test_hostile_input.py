"""Issue 19's hostile inputs, each a regression test with its message and exit status.

Exit status (README): 0 fits, 1 does not fit, 2 bad input.  Messages are compared on stderr with the
lines joined (``_flat``), so neither the terminal's width nor the length of the checkout's path moves
them: a problem is printed as one soft-wrapped line (``cli.common.fail``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import vramplan
from vramplan.cli.main import app
from vramplan.errors import ScenarioError, VramplanError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "lora-llama3-8b-a10g.yaml")
runner = CliRunner()
ENV = {"COLUMNS": "60", "NO_COLOR": "1", "TERM": "dumb"}  # narrow on purpose: nothing may depend on width


def _flat(text: str) -> str:
    return " ".join(text.split())


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, res.stdout, _flat(res.stderr)


def _config(**changes: Any) -> dict[str, Any]:
    from vramplan.catalog.models import list_models

    (row,) = [m for m in list_models("yi-6b") if m.id == "01-ai/Yi-6B"]
    return {**row.config, **changes}


# ---------------------------------------------------------------- tracebacks, now exit 2 with a message


@pytest.mark.parametrize(("args", "needle"), [
    (["kv", "llama-3-8b", "--plot", "/nonexistent-dir/x.png"], "--plot: folder /nonexistent-dir does not exist"),
    (["simulate", "--capacity-tokens", "10000", "--requests", "10", "--plot", "/nonexistent-dir/x.png"],
     "--plot: folder /nonexistent-dir does not exist"),
    (["simulate", "--capacity-tokens", "10000", "--requests", "10", "--plot", "out.xyz"],
     "--plot: unknown plot format '.xyz'"),
    (["snapshot", "x.pickle", "--plot", "/nonexistent-dir/x.png"], "--plot: folder /nonexistent-dir does not exist"),
    (["trace", "--model", "gpt2", "--gpu", "A100", "--timeline", "/nonexistent-dir/t.json"],
     "--timeline: folder /nonexistent-dir does not exist"),
])
def test_output_path_in_a_missing_folder_or_unknown_format(args: list[str], needle: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and needle in err, err


def test_deeply_nested_json_and_yaml(tmp_path: Path) -> None:
    for name, text in (("deep.json", "[" * 100_000 + "]" * 100_000), ("deep.yaml", "a: " + "[" * 100_000)):
        (tmp_path / name).write_text(text)
        code, _, err = run("estimate", str(tmp_path / name))
        assert code == 2 and "nested deeper than 32 levels" in err, err


def test_block_nested_yaml_without_brackets(tmp_path: Path) -> None:
    # 40 levels of indentation: no bracket for the pre-scan, caught by the walk after parsing
    text = "".join(f"{'  ' * i}k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n"
    (tmp_path / "deep.yaml").write_text(text)
    code, _, err = run("estimate", str(tmp_path / "deep.yaml"))
    assert code == 2 and "nested deeper than 32 levels" in err, err


def test_5000_digit_integer(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_text('{"model": "llama-3-8b", "hardware": {"gpu": "A100", "num_gpus": '
                                       + "9" * 5000 + "}}")
    code, _, err = run("estimate", str(tmp_path / "big.json"))
    assert code == 2 and "an integer of 5,000 digits (at most 19)" in err, err


def test_file_name_of_100000_characters() -> None:
    code, _, err = run("estimate", "a" * 99_995 + ".yaml")
    assert code == 2 and "scenario: file name of 100,000 characters is too long" in err, err


def test_config_with_huge_hidden_size(tmp_path: Path) -> None:
    # 1e30 is a float (refused as not an integer), 10**30 beyond 19 digits, 2**40 beyond MAX_SIZE: all exit 2
    for value, needle in ((1e30, "model.hidden_size: must be a positive integer, got 1e+30"),
                          (10**30, "an integer of 31 digits"),
                          (2**40, "model.hidden_size: 1,099,511,627,776 is beyond any model's size")):
        (tmp_path / "config.json").write_text(json.dumps(_config(hidden_size=value)))
        code, _, err = run("estimate", "--model", str(tmp_path / "config.json"), "--gpu", "A100")
        assert code == 2 and needle in err, (value, err)


def test_api_raises_the_package_error_for_huge_sizes() -> None:
    with pytest.raises(ScenarioError, match="beyond any model's size"):
        vramplan.estimate({"model": _config(hidden_size=2**40), "hardware": {"gpu": "A100"}})
    with pytest.raises(ScenarioError, match="integer beyond 64 bits"):
        vramplan.estimate({"model": _config(hidden_size=10**30), "hardware": {"gpu": "A100"}})


@pytest.mark.parametrize("bad", [
    None, 5, [], "", {"model": "llama-3-8b", "hardware": {"gpu": "A100"}, "train": {"peft": {"alpha": math.nan}}},
    {"model": "llama-3-8b", "hardware": {"gpu": "A100", "capacity_gib": math.inf}},
    {"model": "llama-3-8b", "hardware": {"gpu": "A100", "num_gpus": 10**30}},
])
def test_api_bad_dicts_raise_vramplan_errors(bad: Any) -> None:
    with pytest.raises(VramplanError):
        vramplan.estimate(bad)


def test_api_deeply_nested_dict() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ScenarioError, match="nested deeper than 32 levels"):
        vramplan.estimate({"model": "llama-3-8b", "hardware": {"gpu": "A100"}, "extra": deep})


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, 7)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\nmodel: llama-3-8b\n")
    code, _, err = run("estimate", str(tmp_path / "bomb.yaml"))
    assert code == 2 and "more than 100,000 values" in err, err


# ---------------------------------------------------------------- hangs and unbounded memory


def test_model_dev_zero_is_refused() -> None:
    code, _, err = run("estimate", "--model", "/dev/zero", "--gpu", "A100")
    assert code == 2 and "--model / model: /dev/zero is a device or special file, not a regular file" in err, err


def test_scenario_dev_zero_is_refused() -> None:
    code, _, err = run("estimate", "/dev/zero")
    assert code == 2 and "scenario: /dev/zero is a device or special file" in err, err


def test_endless_pipe_is_read_bounded(tmp_path: Path) -> None:
    import os
    import threading

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)

    def feed() -> None:  # more than the 1 MiB limit, then the reader closes
        try:
            with fifo.open("wb") as f:
                for _ in range(20):
                    f.write(b"#" * 100_000)
        except BrokenPipeError:
            pass

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    code, _, err = run("estimate", str(fifo))
    t.join(5)
    assert code == 2 and "is larger than 1,048,576 bytes" in err, err


def test_plan_gpu_count_range_is_capped() -> None:
    code, _, err = run("plan", "--model", "llama-3-8b", "--gpu", "A100", "--num-gpus", "1-100000",
                       "--seq-len", "2048", "--global-batch", "64")
    assert code == 2 and "--num-gpus: '1-100000' names 100,000 GPU counts; a plan searches at most 64" in err, err


def test_simulate_requests_capped() -> None:
    code, _, err = run("simulate", "--capacity-tokens", "100000", "--requests", "100000000")
    assert code == 2 and "--requests: 100,000,000 is outside [1, 100,000]" in err, err


# ---------------------------------------------------------------- silent contradictions, now refused


def test_training_flags_on_an_inference_scenario(tmp_path: Path) -> None:
    (tmp_path / "inf.yaml").write_text("model: llama-3-8b\ntask: inference\nhardware: {gpu: A100}\n")
    code, _, err = run("estimate", str(tmp_path / "inf.yaml"), "--micro-batch-size", "4")
    assert code == 2 and ("--micro-batch-size: sets train.micro_batch_size, but the scenario's task is inference: "
                          "it would be ignored (drop --micro-batch-size, or set --task train)") in err, err


def test_a_document_with_another_task_section_says_so() -> None:
    # a document (file or dict) may carry inert sections (a report's scenario holds them all): the keys that
    # differ from their defaults are stated in the assumptions, not silently dropped
    report = vramplan.estimate({"model": "gpt2", "task": "inference", "hardware": {"gpu": "A100"},
                                "train": {"micro_batch_size": 4}})
    assert "train.micro_batch_size set but not used: the task is inference" in report.assumptions


def test_plan_refuses_an_inference_scenario(tmp_path: Path) -> None:
    (tmp_path / "inf.yaml").write_text("model: llama-3-8b\ntask: inference\nhardware: {gpu: A100}\n")
    code, _, err = run("plan", str(tmp_path / "inf.yaml"))
    assert code == 2 and "task: inference, but plan searches training (train) and vLLM serving (serve)" in err


def test_fp8_on_an_ampere_gpu_is_refused() -> None:
    code, _, err = run("estimate", "--model", "llama-3-8b", "--gpu", "A100", "--precision", "fp8-mixed")
    assert code == 2 and "--precision / train.precision: fp8-mixed (Transformer Engine) needs fp8 support, which A100-80GB" in err, err
    code, _, err = run("estimate", "--model", "llama-3-8b", "--gpu", "H100", "--precision", "fp8-mixed")
    assert code in (0, 1), err


def test_bf16_on_a_t4_is_stated() -> None:
    code, out, _ = run("estimate", "--model", "llama-3-8b", "--gpu", "T4", "--task", "inference", "--dtype",
                       "bf16", "--json")
    assert code == 1
    assumptions = json.loads(out)["assumptions"]
    assert any("T4 (turing) has no bf16 tensor cores" in a and "emulated" in a for a in assumptions)
    code, _, err = run("serve", "--model", "llama-3-8b", "--gpu", "T4", "--dtype", "bf16")
    assert code == 2 and "vLLM refuses bf16 on T4 (compute capability 7.5 < 8.0)" in err, err


def test_ep_on_a_dense_model() -> None:
    code, _, err = run("estimate", "--model", "llama-3-8b", "--gpu", "A100", "--ep", "2", "--num-gpus", "2")
    assert code == 2 and "ep=2, but meta-llama/Meta-Llama-3-8B is a dense model" in err, err


def test_kv_tp_is_checked_as_serve_checks_it() -> None:
    code, _, err = run("kv", "llama-3-8b", "--tp", "3")
    assert code == 2 and "--tp: tp=3 does not divide the 32 attention heads" in err, err
    code, _, err = run("serve", "--model", "llama-3-8b", "--gpu", "A100", "--tp", "3")
    assert code == 2 and "--tp / parallel.tp: tp=3 does not divide the 32 attention heads" in err, err


def test_lora_alpha_nan() -> None:
    code, _, err = run("estimate", "--model", "llama-3-8b", "--gpu", "A100", "--peft", "lora", "--lora-alpha", "nan")
    assert code == 2 and "--lora-alpha / train.peft.alpha: nan is not a finite number" in err, err


@pytest.mark.parametrize("command", [["trace", "--model", "gpt2", "--gpu", "A100"],
                                     ["plan", "--model", "llama-3-8b", "--gpu", "A100", "--seq-len", "2048",
                                      "--global-batch", "8"]])
def test_top_minus_5(command: list[str]) -> None:
    code, _, err = run(*command, "--top", "-5")
    assert code == 2 and "--top: -5 is outside [1," in err, err


# ---------------------------------------------------------------- misleading text, corrected


def test_engine_help_keeps_the_trace_extra() -> None:
    res = runner.invoke(app, ["estimate", "--help"], env={**ENV, "COLUMNS": "400"})
    assert "pip install 'vramplan[trace]'" in res.stdout


def test_unknown_workload_lists_the_workloads() -> None:
    code, _, err = run("simulate", "--workload", "foo", "--capacity-tokens", "1000")
    assert code == 2 and "unknown workload 'foo' (choose one of: sharegpt, alpaca" in err, err
    assert "vramplan workloads" not in err


def test_bad_block_size_is_reported_under_block_size() -> None:
    code, _, err = run("kv", "llama-3-8b", "--block-size", "0")
    assert code == 2 and err.startswith("error: --block-size: 0 is outside [1, 1,024]"), err


def test_serve_names_the_flag() -> None:
    code, _, err = run("serve", "--model", "llama-3-8b", "--gpu", "A100", "--block-size", "0")
    assert code == 2 and "--block-size / serve.block_size" in err, err


def test_relative_model_path_resolves_against_the_scenario_folder(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text(json.dumps(_config()))
    (tmp_path / "scenario.yaml").write_text("model: sub/config.json\nhardware: {gpu: A100}\n")
    code, out, err = run("estimate", str(tmp_path / "scenario.yaml"), "--json")
    assert code in (0, 1), err  # (full fine-tuning of 6B does not fit an A100: exit 1 is an answer)
    report = json.loads(out)
    assert report["scenario"]["model"] == str(tmp_path / "sub" / "config.json")  # the file beside the scenario
    assert report["model"]["parameters"] == 6_061_035_520  # Yi-6B's, as the catalog counts it


def test_kv_prints_gib() -> None:
    code, out, _ = run("kv", "llama-3-8b", "--seq", "8192", "--batch", "1")
    # Llama 3 8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B/token; x 8192 = 1 GiB exactly
    assert code == 0 and "KV cache, GiB" in out and "1.00" in out


# ---------------------------------------------------------------- what a newcomer expects


def test_version() -> None:
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"vramplan {vramplan.__version__}"


def test_shell_completion_is_offered() -> None:
    res = runner.invoke(app, ["--help"], env={**ENV, "COLUMNS": "200"})
    assert "--install-completion" in res.stdout and "--show-completion" in res.stdout


def test_solve_accepts_flags() -> None:
    code, out, err = run("solve", "max-batch", "--model", "llama-3-8b", "--gpu", "A100", "--peft", "lora", "--json")
    assert code == 0, err
    assert json.loads(out)["knob"] == "train.micro_batch_size"


def test_solve_without_a_model() -> None:
    code, _, err = run("solve", "max-batch")
    assert code == 2 and "model: no model given" in err, err


def test_an_error_is_one_line_at_any_width_and_path(tmp_path: Path) -> None:
    # the README's test run failed on a long clone path: rich wrapped the message at the terminal's width
    deep = tmp_path / ("d" * 200) / "missing.yaml"
    for columns in ("40", "80", "300"):
        res = runner.invoke(app, ["estimate", str(deep)], env={**ENV, "COLUMNS": columns})
        assert res.exit_code == 2
        assert f"error: scenario: no such file: {str(deep)[:60]}" in res.stderr.splitlines()[0]


# ---------------------------------------------------------------- remedies, compare, progress


def test_remedies_are_verified_and_in_the_json() -> None:
    from vramplan.plan.fit import fits_with_margin

    code, out, _ = run("estimate", str(ROOT / "examples" / "llama2-7b-full-naive-a100.yaml"), "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["remedies"], "a 7B full fine-tune on one A100 has a change that fits"
    for r in doc["remedies"]:
        # each change, applied to the scenario and estimated again, fits with the planner's 10% margin
        scenario = json.loads(json.dumps(doc["scenario"]))
        for path, value in r["change"].items():
            head, _, leaf = path.rpartition(".")
            node = scenario
            for key in head.split("."):
                node = node.setdefault(key, {})
            node[leaf] = value
        rep = vramplan.estimate(scenario)
        assert fits_with_margin(rep, 0.10)
        assert rep.per_gpu.device_used_bytes == r["device_used_bytes"]
    assert doc["assumed_settings"]["parallel.zero_stage"] == 0  # left at its default by the example


def test_remedies_in_the_table() -> None:
    code, out, _ = run("estimate", str(ROOT / "examples" / "llama2-7b-full-naive-a100.yaml"))
    flat = _flat(out)
    assert code == 1 and "Would fit (each change estimated again: verdict FITS, with a 10% margin):" in flat
    assert "Settings assumed (not given, defaults):" in flat


def test_a_fitting_estimate_has_no_remedies_key() -> None:
    # verdict FITS: 7B bf16 inference on an A100-80GB is far below the band's high bound of the capacity
    code, out, _ = run("estimate", str(ROOT / "examples" / "llama2-7b-inference-a100.yaml"), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "FITS" and "remedies" not in doc


def test_may_not_fit_gets_remedies_and_exit_0() -> None:
    # the point estimate fits (exit 0) but the band's high bound does not: the changes that make it FITS
    code, out, _ = run("estimate", EXAMPLE, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] and doc["verdict"] == "MAY NOT FIT"
    assert doc["remedies"] and all(r["device_used_bytes"] <= r["capacity_bytes"] for r in doc["remedies"])


def test_compare_library_reports_differences() -> None:
    from vramplan.compare import compare

    base = {"model": "llama-3-8b", "hardware": {"gpu": "A100"}, "train": {"peft": {"method": "lora"}}}
    other = {**base, "train": {"peft": {"method": "lora"}, "micro_batch_size": 4}}
    doc = compare([base, other])
    assert [d["key"] for d in doc["differences"]] == ["train.micro_batch_size"]
    assert doc["differences"][0]["values"] == [1, 4]
    assert len(doc["reports"]) == 2 and doc["reports"][0]["scenario"]["train"]["micro_batch_size"] == 1
    used = next(r for r in doc["results"] if r["key"] == "per_gpu.device_used_bytes")
    assert used["differs"] and used["values"][0] < used["values"][1]  # a larger micro-batch needs more
    assert doc["best"] == 0


@pytest.mark.parametrize("bad", [[], [{"model": "llama-3-8b"}], [{}] * 5, "ab", None])
def test_compare_refuses_bad_input(bad: Any) -> None:
    from vramplan.compare import compare

    with pytest.raises(ScenarioError):
        compare(bad)


def test_compare_names_the_setup_of_a_problem() -> None:
    from vramplan.compare import compare

    with pytest.raises(ScenarioError, match="setup 2: hardware.gpu"):
        compare([{"model": "gpt2", "hardware": {"gpu": "A100"}}, {"model": "gpt2", "hardware": {"gpu": "A1OO"}}])


def test_compare_command() -> None:
    code, out, err = run("compare", "--model", "llama-3-8b", "--gpu", "A100", "--peft", "lora",
                         "--setup", "micro-batch-size=1", "--setup", "micro_batch_size=2 gradient-checkpointing=full")
    assert code == 0, err
    flat = _flat(out)
    assert "train.micro_batch_size" in flat and "train.gradient_checkpointing" in flat
    code, out, _ = run("compare", EXAMPLE, str(ROOT / "examples" / "qlora-7b-rtx4090.yaml"), "--json")
    assert code == 0 and len(json.loads(out)["reports"]) == 2
    code, _, err = run("compare", EXAMPLE)
    assert code == 2 and "1 setups given; compare takes 2 to 4" in err


def test_progress_is_silent_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # the spinner's console is a terminal (it would draw), but stdout is a pipe: progress() must not start it.
    # (With the console's own detection alone the test could not fail: rich draws no transient display off a
    # terminal anyway.)
    import io
    import sys

    from rich.console import Console

    from vramplan.cli import common

    drawn = io.StringIO()
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(common, "_stderr", lambda: Console(file=drawn, force_terminal=True, width=100))
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # piped output: isatty() is False
    with common.progress("working") as update:
        update("still working")
    assert drawn.getvalue() == ""
    monkeypatch.setattr(common, "_interactive", lambda: True)  # the same on a terminal draws the line
    with common.progress("working") as update:
        update("still working")
    assert "still working" in drawn.getvalue()


def test_capability_checks_in_the_api() -> None:
    with pytest.raises(ScenarioError, match="fp8 needs fp8 support, which A100-80GB"):
        vramplan.estimate({"model": "llama-3-8b", "task": "inference", "hardware": {"gpu": "A100"},
                           "inference": {"quantization": "fp8"}})
    # vLLM runs fp8 weights on Ampere (Marlin, weight-only), so a serve scenario is accepted there
    vramplan.estimate({"model": "llama-3-8b", "task": "serve", "hardware": {"gpu": "A100"},
                       "serve": {"quantization": "fp8", "max_model_len": 4096}})
    with pytest.raises(ScenarioError, match="fp8 needs fp8 support, which T4"):
        vramplan.estimate({"model": "llama-3-8b", "task": "serve", "hardware": {"gpu": "T4"},
                           "serve": {"quantization": "fp8", "max_model_len": 4096}})


def test_a_report_scenario_round_trips() -> None:
    # a report's scenario holds every section's defaults: it must not be refused as a contradiction
    report = vramplan.estimate(EXAMPLE)
    again = vramplan.estimate(report.scenario)
    assert again.per_gpu == report.per_gpu


@pytest.mark.parametrize(("args", "needle"), [
    (["validate", "/dev/zero"], "DATASET: /dev/zero is a device or special file"),
    (["snapshot", "/dev/zero"], "FILE: /dev/zero is a device or special file"),
    (["simulate", "--csv", "/dev/zero", "--capacity-tokens", "1000"], "--csv: /dev/zero is a device or special file"),
])
def test_other_inputs_refuse_devices(args: list[str], needle: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and needle in err, err


def test_deeply_nested_dataset(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000)
    code, _, err = run("validate", str(tmp_path / "deep.yaml"))
    assert code == 2 and "is not valid YAML/JSON" in err, err


def test_output_width_is_the_runs_not_the_shells() -> None:
    # the README's test run failed when the shell exported a narrow COLUMNS: consoles made at import took it,
    # and a test's own COLUMNS=120 came too late.  A fresh interpreter imports the CLI under COLUMNS=40.
    import os
    import subprocess
    import sys

    code = ("from typer.testing import CliRunner\nfrom vramplan.cli.main import app\n"
            "r = CliRunner().invoke(app, ['models', 'llama'], env={'COLUMNS': '160', 'NO_COLOR': '1'})\n"
            "print(r.exit_code, 'meta-llama/Llama-2-7b-hf' in r.stdout)\n")
    env = {**os.environ, "COLUMNS": "40", "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False,
                         timeout=120)
    assert res.stdout.split() == ["0", "True"], res.stdout + res.stderr


# ---------------------------------------------------------------- progress on a terminal, highlighting


@pytest.fixture
def terminal_stderr(monkeypatch: pytest.MonkeyPatch) -> Any:
    """stderr as a terminal of 100 columns: the spinner's console writes into a buffer the test reads."""
    import io

    from rich.console import Console

    from vramplan.cli import common

    buf = io.StringIO()
    # a real terminal's TERM: under TERM=dumb rich draws no live display at all (Live.refresh)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(common, "_interactive", lambda: True)
    monkeypatch.setattr(common, "_stderr", lambda: Console(file=buf, force_terminal=True, width=100))
    return buf


TERMINAL = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "xterm-256color"}


def _first_entry_dataset(tmp_path: Path) -> Path:
    import yaml

    entries = yaml.safe_load((ROOT / "validation" / "published.yaml").read_text())
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(entries[:1]))
    return path


@pytest.mark.parametrize(("args", "text"), [
    (["plan", "--model", "gpt2", "--gpu", "A100", "--seq-len", "128", "--global-batch", "4"], "searching setups"),
    (["solve", "max-batch", "--model", "gpt2", "--gpu", "A100"], "solving max-batch"),
    (["simulate", "--capacity-tokens", "20000", "--requests", "50"], "simulating 50 requests"),
    (["validate", "ONE", "--engine", "analytic"], "scoring analytic against one.yaml"),
])
def test_progress_shows_on_a_terminal_and_not_with_json(args: list[str], text: str, terminal_stderr: Any,
                                                        tmp_path: Path) -> None:
    args = [str(_first_entry_dataset(tmp_path)) if a == "ONE" else a for a in args]
    res = runner.invoke(app, args, env=TERMINAL)
    assert res.exit_code in (0, 1), res.stderr
    assert text in terminal_stderr.getvalue()  # the spinner's line, drawn on the (forced) terminal
    terminal_stderr.seek(0)
    terminal_stderr.truncate()
    res = runner.invoke(app, [*args, "--json"], env=TERMINAL)
    assert res.exit_code in (0, 1), res.stderr
    assert terminal_stderr.getvalue() == ""  # --json: nothing on stderr, even on a terminal


def test_trace_progress_on_a_terminal(terminal_stderr: Any) -> None:
    pytest.importorskip("torch", reason="the trace engine needs torch")
    res = runner.invoke(app, ["trace", "--model", "gpt2", "--gpu", "A100", "--seq-len", "64"], env=TERMINAL)
    assert res.exit_code in (0, 1), res.stderr
    assert "tracing the model on the meta device" in terminal_stderr.getvalue()


def test_measure_progress_on_a_terminal(terminal_stderr: Any) -> None:
    pytest.importorskip("torch", reason="measure runs a real step with torch")
    res = runner.invoke(app, ["measure", "--model", "gpt2", "--gpu", "A100", "--layers", "1", "--seq-len", "16",
                              "--device", "cpu"], env=TERMINAL)
    assert res.exit_code in (0, 1), res.stderr
    assert "running one step" in terminal_stderr.getvalue()


def test_compare_highlights_the_differences() -> None:
    # FORCE_COLOR makes rich write its styles (ANSI SGR codes) although the runner's stdout is no terminal
    res = runner.invoke(app, ["compare", "--model", "llama-3-8b", "--gpu", "A100", "--peft", "lora",
                              "--setup", "micro-batch-size=1", "--setup", "micro-batch-size=2"],
                        env={"FORCE_COLOR": "1", "COLUMNS": "250"})
    assert res.exit_code == 0, res.stderr
    lines = {line.split("│")[1].strip(): line for line in res.stdout.splitlines() if line.startswith("│")}
    bold = "\x1b[1"  # SGR 1 (bold), alone or with a colour: 1m, 1;33m
    assert bold in lines["train.micro_batch_size"] and bold in lines["device used"]  # the values differ
    assert bold not in lines["capacity"] and bold not in lines["verdict"]  # the same GPU, both FITS


# ---------------------------------------------------------------- more hostile inputs (this round)


def test_scenario_from_dev_stdin_fed_by_dev_zero() -> None:
    # the hang: `vramplan estimate /dev/stdin < /dev/zero` grew to 15 GB in 10 s.  A fresh process with
    # its real stdin on /dev/zero (the runner's stdin is no file descriptor)
    import subprocess
    import sys

    with open("/dev/zero", "rb") as zero:
        res = subprocess.run([sys.executable, "-m", "vramplan.cli.main", "estimate", "/dev/stdin"], stdin=zero,
                             capture_output=True, text=True, timeout=120, check=False,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "80"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "scenario: /dev/stdin is a device or special file" in _flat(res.stderr), res.stderr


def test_api_hidden_size_1e30_raises_the_package_error() -> None:
    with pytest.raises(ScenarioError, match="model.hidden_size: must be a positive integer, got 1e"):
        vramplan.estimate({"model": _config(hidden_size=1e30), "hardware": {"gpu": "A100"}})


@pytest.mark.parametrize(("args", "needle"), [
    (["web", "--port", "99999"], "--port: 99,999 is outside [0, 65,535]"),
    (["web", "--port", "-1"], "--port: -1 is outside [0, 65,535]"),
    (["web", "--workers", "100000"], "--workers: 100,000 is outside [1, 64]"),
    (["web", "--host", "bad host name", "--port", "0"], "--host: cannot listen on bad host name:0"),
])
def test_web_refuses_an_address_it_cannot_listen_on(args: list[str], needle: str) -> None:
    pytest.importorskip("uvicorn", reason="needs the web extra")
    code, _, err = run(*args)
    assert code == 2 and needle in err, err


def test_web_refuses_a_port_in_use() -> None:
    pytest.importorskip("uvicorn", reason="needs the web extra")
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, _, err = run("web", "--port", str(port))
    assert code == 2 and f"--host: cannot listen on 127.0.0.1:{port}: Address already in use" in err, err


@pytest.mark.parametrize(("args", "needle"), [
    # a traceback (pydantic's ValidationError from inside the search) or a silent default before
    (["--seq-len", "999999999999", "--global-batch", "4"], "--seq-len / train.seq_len: must be less than or equal to 100000000"),
    (["--seq-len", "128", "--global-batch", "4", "--peft", "lora", "--lora-alpha", "inf"],
     "--lora-alpha / train.peft.alpha: inf is not a finite number"),
    (["--seq-len", "128", "--global-batch", "4", "--peft", "lora", "--lora-rank", "99999999999"],
     "--lora-rank / train.peft.rank: must be less than or equal to 65536"),
    (["--seq-len", "128", "--global-batch", "4", "--peft", "lora", "--lora-rank", "0"],
     "--lora-rank / train.peft.rank: must be greater than or equal to 1"),
    (["--seq-len", "128", "--global-batch", "4", "--gpus-per-node", "0"],
     "--gpus-per-node / hardware.gpus_per_node: must be greater than or equal to 1"),
    (["--task", "serve", "--max-model-len", "0"], "--max-model-len / serve.max_model_len: must be greater than or equal to 1"),
])
def test_plan_checks_its_scenario_options_as_estimate_does(args: list[str], needle: str) -> None:
    code, _, err = run("plan", "--model", "gpt2", "--gpu", "A100", *args)
    assert code == 2 and needle in err, err
    assert "no max_model_len given" not in err


@pytest.mark.parametrize(("args", "needle"), [
    (["--seq", "99999999999999999999"], "--seq: 99,999,999,999,999,999,999 is more than 100,000,000"),
    (["--batch", "2000000"], "--batch: 2,000,000 is more than 1,000,000"),
    (["--batch", ",".join(str(i) for i in range(1, 101))], "--batch: 100 values; a table takes at most 64"),
    (["--seq", "1" * 5000], "--seq: a list of 5,000 characters"),
])
def test_kv_lists_are_bounded(args: list[str], needle: str) -> None:
    code, _, err = run("kv", "gpt2", *args)
    assert code == 2 and needle in err, err


def test_simulate_csv_that_is_a_folder_or_binary(tmp_path: Path) -> None:
    (tmp_path / "bin.csv").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "inf.csv").write_text("prompt_tokens,output_tokens\n10,inf\n")
    (tmp_path / "big.csv").write_text("prompt_tokens,output_tokens\n10,1e300\n")
    for name, needle in ((".", "is a folder"), ("bin.csv", "is not UTF-8 text (invalid start byte at byte 0)"),
                         ("inf.csv", "line 2: lengths must be finite numbers"),
                         ("big.csv", "line 2: prompt and output must be in [1, 100,000,000]")):
        code, _, err = run("simulate", "--capacity-tokens", "100000", "--csv", str(tmp_path / name))
        assert code == 2 and f"--csv: {tmp_path / name}" in err.replace(f"{tmp_path}/.", str(tmp_path)), err
        assert needle in err, err


def test_simulate_that_would_step_every_decode_is_capped() -> None:
    # --max-num-batched-tokens 1: one running decode uses the whole token budget, so no prompt is admitted beside
    # it and every engine step is replayed one by one (ShareGPT's mean output, 336.6 tokens x 20,000 requests is
    # about 6.7 million steps); the replay stops at 1,000,000 with a message, not after minutes with a traceback
    code, _, err = run("simulate", "--capacity-tokens", "100000", "--requests", "20000", "--mode", "paged",
                       "--max-num-batched-tokens", "1")
    assert code == 2 and "--requests: the replay stepped through 1,000,000 engine steps one at a time" in err, err


def test_simulate_shared_prefix_longer_than_a_prompt_can_be() -> None:
    code, _, err = run("simulate", "--capacity-tokens", "100000", "--requests", "10", "--shared-prefix", "99999999")
    assert code == 2 and ("--shared-prefix: 99,999,999 shared tokens, but --max-model-len 2,048 leaves a prompt "
                          "at most 2,047") in err, err


@pytest.mark.parametrize(("path", "needle"), [
    ("/dev/zero", "--gguf-file / serve.gguf.file: /dev/zero is a device or special file"),
    ("FOLDER", "is a folder"),
])
def test_gguf_file_that_is_a_device_or_folder(path: str, needle: str, tmp_path: Path) -> None:
    code, _, err = run("serve", "--model", "gpt2", "--gpu", "A100", "--engine", "llamacpp", "--gguf-file",
                       str(tmp_path) if path == "FOLDER" else path)
    assert code == 2 and needle in err and "no such file" not in err, err


@pytest.mark.parametrize(("args", "needle"), [
    # odd text: full-width digits, a right-to-left mark, an empty name, a NUL character
    (["estimate", "--model", "ｇｐｔ２", "--gpu", "A100"], "--model / model: unknown model 'ｇｐｔ２'"),
    (["estimate", "--model", "gpt2", "--gpu", "Ａ100"], "--gpu / hardware.gpu: unknown gpu 'Ａ100'"),
    (["estimate", "--model", "gpt2\u202e", "--gpu", "A100"], "--model / model: unknown model 'gpt2\\u202e'"),
    (["estimate", "--model", "gpt2", "--gpu", ""], "--gpu / hardware.gpu: unknown gpu ''"),
    (["estimate", "--model", "", "--gpu", "A100"], "--model / model: Value error, must name a model"),
    (["plan", "--model", "gpt2", "--gpu", "", "--seq-len", "128", "--global-batch", "4"], "--gpu: no GPU given"),
    # zero, negative, huge and non-finite numbers on several commands
    (["estimate", "--model", "gpt2", "--gpu", "A100", "--micro-batch-size", "99999999999999999999"],
     "--micro-batch-size / train.micro_batch_size: integer beyond 64 bits"),
    (["estimate", "--model", "gpt2", "--gpu", "A100", "--capacity-gib", "-5"],
     "--capacity-gib / hardware.capacity_gib: must be greater than 0"),
    (["estimate", "--model", "gpt2", "--capacity-gib", "1e300"], "--capacity-gib / hardware.capacity_gib: must be less than"),
    (["serve", "--model", "gpt2", "--gpu", "A100", "--gpu-memory-utilization", "nan"],
     "--gpu-memory-utilization / serve.gpu_memory_utilization: nan is not a finite number"),
    (["serve", "--model", "gpt2", "--gpu", "A100", "--cpu-offload-gb", "inf"],
     "--cpu-offload-gb / serve.cpu_offload_gb: inf is not a finite number"),
    (["serve", "--model", "gpt2", "--gpu", "A100", "--max-num-seqs", "100000000"],
     "--max-num-seqs / serve.max_num_seqs: must be less than or equal to 1000000"),
    (["generate", "--model", "gpt2", "--gpu", "A100", "--batch-size", "0"],
     "--batch-size / inference.batch_size: must be greater than or equal to 1"),
    (["generate", "--model", "gpt2", "--gpu", "A100", "--new-tokens", "1000000000"],
     "--new-tokens / inference.new_tokens: must be less than or equal to 100000000"),
    (["solve", "max-batch", "--model", "gpt2", "--gpu", "A100", "--margin", "nan"], "--margin: nan is not a finite number"),
    (["kv", "gpt2", "--budget-gb", "-1"], "--budget-gb: -1.0 is outside (0, 1,000,000.0]"),
    (["simulate", "--capacity-tokens", "100000", "--rate", "nan"], "--rate: nan is not a finite number"),
    (["trace", "--model", "gpt2", "--gpu", "A100", "--top", "100000000"], "--top: 100,000,000 is outside [1, 1,000]"),
    # flags of one command on another: click's own message, exit 2
    (["estimate", "--model", "gpt2", "--gpu", "A100", "--budget-gb", "3"], "No such option: --budget-gb"),
    (["serve", "--model", "gpt2", "--gpu", "A100", "--micro-batch-size", "4"], "No such option: --micro-batch-size"),
    (["generate", "--model", "gpt2", "--gpu", "A100", "--seq-len", "4"], "No such option: --seq-len"),
    # compare's own input
    (["compare", EXAMPLE, "--setup", "="], "--setup: '=' is not KEY=VALUE"),
    (["compare", EXAMPLE, "--setup", "nope=3"], "--setup: unknown setting 'nope'"),
    (["solve", "nope", "--model", "gpt2", "--gpu", "A100"], "KIND: unknown solver 'nope'"),
])
def test_odd_text_and_numbers_on_every_command(args: list[str], needle: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and needle in err, err


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "must hold a mapping of keys"),
    (b'"just a string"\n', "must hold a mapping of keys"),
    (bytes(range(128, 256)), "is not UTF-8 text"),
    # 12 bytes "model: gpt2\n" + 22 bytes "hardware: {gpu: A100}\n": the bad byte is at offset 34
    (b"model: gpt2\nhardware: {gpu: A100}\n\xff\xfe", "is not UTF-8 text (invalid start byte at byte 34)"),
])
def test_empty_binary_and_non_mapping_scenarios(content: bytes, needle: str, tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_bytes(content)
    for command in (["estimate"], ["serve"], ["generate"], ["solve", "max-batch"], ["measure"], ["trace"]):
        code, _, err = run(*command, str(tmp_path / "s.yaml"))
        assert code == 2 and needle in err, (command, err)


def test_a_folder_as_a_scenario(tmp_path: Path) -> None:
    for command in (["estimate"], ["serve"], ["generate"], ["solve", "max-batch"], ["trace"], ["compare", EXAMPLE]):
        code, _, err = run(*command, str(tmp_path))
        assert code == 2 and f"{tmp_path} is a directory, not a regular file" in err, (command, err)


@pytest.mark.parametrize("content", ["[1, 2, 3]", "{}", '"config"'])
def test_a_config_json_that_is_not_a_config(content: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(content)
    code, _, err = run("estimate", "--model", str(tmp_path / "config.json"), "--gpu", "A100")
    assert code == 2 and (f"{tmp_path / 'config.json'} is not a JSON object" in err
                          or "config.json has no 'model_type'" in err), err
    code, _, err = run("kv", str(tmp_path))  # the folder holding it
    assert code == 2 and "model:" in err, err


def test_a_huge_list_in_yaml_is_refused_before_parsing(tmp_path: Path) -> None:
    # 200,000 list items: 1.6 MB, over the 1 MiB limit on a scenario file
    items = ", ".join(["q_proj"] * 200_000)
    (tmp_path / "s.yaml").write_text(f"model: gpt2\nhardware: {{gpu: A100}}\ntrain:\n  peft:\n    target_modules: [{items}]\n")
    code, _, err = run("estimate", str(tmp_path / "s.yaml"))
    assert code == 2 and "is larger than 1,048,576 bytes" in err, err


def test_plan_global_batch_is_bounded_by_grad_accum() -> None:
    # found by tests/test_fuzz.py: --global-batch 87,567,295 (under the old 100,000,000 option bound) made a
    # candidate with grad_accum_steps 87,567,295 and pydantic's error for Train escaped from the search
    from vramplan.plan.space import MAX_GLOBAL_BATCH
    from vramplan.spec.scenario import Train

    (le,) = [m.le for m in Train.model_fields["grad_accum_steps"].metadata if hasattr(m, "le")]
    assert MAX_GLOBAL_BATCH == le
    code, _, err = run("plan", "--model", "gpt2", "--gpu", "A100", "--seq-len", "128", "--global-batch", "87567295")
    assert code == 2 and "global batch: 87,567,295 sequences per optimizer step; a plan takes at most 1,000,000" in err
    # in tokens: 2**40 tokens of 1,024-token sequences are 2**30 = 1,073,741,824 sequences
    code, _, err = run("plan", "--model", "gpt2", "--gpu", "A100", "--seq-len", "1024", "--global-batch-tokens",
                       str(2**40))
    assert code == 2 and "global batch: 1,073,741,824 sequences" in err, err


@pytest.mark.parametrize(("job", "needle"), [
    ({"seq_len": 10**12, "global_batch": 4}, "train.seq_len: must be less than or equal to 100000000"),
    ({"seq_len": 128, "global_batch": 4, "peft": "lora", "lora_alpha": math.nan}, "train.peft.alpha: nan is not a finite"),
    ({"seq_len": 128, "global_batch": 4, "peft": "lora", "lora_rank": 10**6}, "train.peft.rank: must be less than"),
    ({"seq_len": 128, "global_batch": 10**7}, "global batch: 10,000,000 sequences"),
])
def test_api_plan_raises_the_package_error(job: dict[str, Any], needle: str) -> None:
    # pydantic's ValidationError escaped from inside the search before
    from vramplan.plan import TrainJob, plan

    with pytest.raises(ScenarioError, match=needle.replace("(", r"\(")):
        plan("gpt2", "A100", "1", TrainJob(**job))


def _at(doc: Any, path: str) -> Any:
    for key in path.split("."):
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


@pytest.mark.parametrize(("args", "path", "value"), [
    (["estimate", "lora-llama3-8b-a10g.yaml", "--micro-batch-size", "3"], "scenario.train.micro_batch_size", 3),
    (["serve", "llama3-8b-serve-h100.yaml", "--max-model-len", "1024"], "vllm.max_model_len", 1024),
    (["generate", "llama2-7b-inference-a100.yaml", "--batch-size", "3"], "report.scenario.inference.batch_size", 3),
    (["solve", "max-batch", "gpt2-eager-fp32-t4.yaml", "--seq-len", "128"], "report.scenario.train.seq_len", 128),
    (["plan", "lora-llama3-8b-a10g.yaml", "--seq-len", "512"], "job.seq_len", 512),
    (["compare", "lora-llama3-8b-a10g.yaml", "qlora-7b-rtx4090.yaml", "--seq-len", "256"],
     "reports.1.scenario.train.seq_len", 256),
])
def test_every_scenario_command_takes_a_file_and_flags(args: list[str], path: str, value: Any) -> None:
    # the file's value (micro-batch 1, max_model_len 8,192, batch 8, seq_len 1,024 in the others) is replaced by the option's
    args = [str(ROOT / "examples" / a) if a.endswith(".yaml") else a for a in args]
    code, out, err = run(*args, "--json")
    assert code in (0, 1), err
    assert _at(json.loads(out), path) == value


@pytest.mark.parametrize(("args", "needle"), [
    # int(float('1e400') * 10**9) raised OverflowError
    (["measure", "--model", "gpt2", "--gpu", "A100", "--max-cpu-bytes", "1e400GB"],
     "--max-cpu-bytes: '1e400GB' is beyond any machine's memory"),
    # an empty name fell back to the default workload, --tp 0 to one GPU
    (["simulate", "--capacity-tokens", "100000", "--requests", "10", "--workload", ""], "--workload: unknown workload ''"),
    (["simulate", "--model", "gpt2", "--gpu", "A100", "--requests", "10", "--max-model-len", "1024", "--tp", "0"],
     "--tp: 0 is outside [1, 1,024]"),
])
def test_sizes_and_empty_names_that_fell_back_silently(args: list[str], needle: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and needle in err, err


def test_yaml_tags_never_run_code(tmp_path: Path) -> None:
    # the security check, kept: yaml.safe_load constructs no Python object from a tag
    marker = tmp_path / "ran"
    tag = f'!!python/object/apply:os.system ["touch {marker}"]'
    (tmp_path / "s.yaml").write_text(f"model: {tag}\nhardware: {{gpu: A100}}\n")
    (tmp_path / "d.yaml").write_text(f"- {tag}\n")
    for args in (["estimate", str(tmp_path / "s.yaml")], ["validate", str(tmp_path / "d.yaml")]):
        code, _, err = run(*args)
        assert code == 2 and "Traceback" not in err and "could not determine a constructor" in err, (args, err)
    assert not marker.exists()
