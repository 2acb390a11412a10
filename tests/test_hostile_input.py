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


def test_progress_is_silent_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from vramplan.cli.common import progress

    with progress("working") as update:
        update("still working")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


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
