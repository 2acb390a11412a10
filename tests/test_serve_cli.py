"""CLI: `vramplan serve`, `kv`, `simulate`, `generate`: exit codes, JSON, figures, bad input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from vramplan.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


def test_serve_scenario_file_json() -> None:
    code, out, _ = run("serve", str(ROOT / "examples" / "llama3-8b-serve-h100.yaml"), "--json")
    assert code == 0
    data = json.loads(out)
    v = data["vllm"]
    assert v["starts"] and data["fits"]
    assert v["num_gpu_blocks"] * 16 == v["kv_cache_tokens"]
    assert v["vllm_version_modelled"] == "0.11"
    for key in ("requested_bytes", "weights_bytes", "activation_peak_bytes", "non_torch_bytes", "available_kv_bytes",
                "max_concurrency", "max_model_len_that_fits", "page_bytes"):
        assert key in v


def test_serve_flags_text() -> None:
    code, out, _ = run("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--max-model-len", "16384",
                       "--gpu-memory-utilization", "0.95", "--vllm-version", "0.19")
    assert code == 0
    assert "STARTS" in out and "num_gpu_blocks 29,777" in out


def test_vllm_version_from_the_scenario_equals_the_flag(tmp_path: Path) -> None:
    # the scenario key and the flag select the same behaviour: 29,777 blocks under 0.19 (as above);
    # under 0.11 the estimate differs, so the key is really read
    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.95, "vllm_version": "0.19"}}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    code, out, _ = run("serve", str(f), "--json")
    assert code == 0 and json.loads(out)["vllm"]["num_gpu_blocks"] == 29_777
    code, out, _ = run("serve", str(f), "--json", "--vllm-version", "0.11")
    assert code == 0 and json.loads(out)["vllm"]["num_gpu_blocks"] != 29_777
    code, out, _ = run("estimate", str(f), "--json")
    assert json.loads(out)["serve"]["num_gpu_blocks"] == 29_777
    code, _, err = run("estimate", str(f), "--vllm-version", "0.2")
    assert code == 2 and "serve.vllm_version" in err and "Traceback" not in err


def test_serve_that_does_not_fit_exits_1_with_the_fix() -> None:
    code, out, _ = run("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "L4")
    assert code == 1
    out = " ".join(out.split())  # rich wraps long lines
    assert "WILL NOT START" in out and "estimated maximum model length" in out
    assert "change: serve.max_model_len <=" in out


def test_serve_bad_input_exits_2_with_suggestion() -> None:
    code, _, err = run("serve", "--model", "llama-3-8", "--gpu", "H100")
    assert code == 2 and "unknown model" in err and "did you mean" in err and "Traceback" not in err
    code, _, err = run("serve", "--model", "meta-llama/Llama-2-7b-hf", "--gpu", "H100", "--max-model-len", "100000")
    assert code == 2 and "max_position_embeddings" in err
    code, _, err = run("serve", "--model", "gpt2", "--gpu", "T4", "--vllm-version", "0.3")
    # vLLM 0.3 is older than the oldest modelled release: the error names the range and the nearest release
    assert code == 2 and "serve.vllm_version" in err and "0.6 to 0.33" in err and "nearest is 0.6.0" in err


def test_serve_refuses_a_training_scenario() -> None:
    code, _, err = run("serve", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml"))
    assert code == 2 and "task: serve" in err


def test_kv_table_and_page_capacity_json() -> None:
    code, out, _ = run("kv", "meta-llama/Meta-Llama-3-8B", "--seq", "4096", "--batch", "32", "--dtype", "fp16",
                       "--budget-gb", "60", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["bytes_per_token"] == 131_072
    assert data["growth"] == [{"seq_len": 4096, "batch": 32, "kv_bytes": 17_179_869_184}]
    assert data["page_capacity"]["total_pages"] == 28_610


def test_kv_plot(tmp_path: Path) -> None:
    fig = tmp_path / "kv.png"
    code, out, _ = run("kv", "meta-llama/Llama-2-7b-hf", "--seq", "1024,4096", "--batch", "1,32", "--plot", str(fig))
    assert code == 0 and fig.stat().st_size > 1000
    assert "64.00" in out  # 4096 tokens x 32 sequences x 524,288 B = 2^36 B = 64 GiB (the table prints GiB)


def test_kv_bad_input_exits_2() -> None:
    code, _, err = run("kv", "meta-llama/Llama-2-7b-hf", "--seq", "10x")
    assert code == 2 and "--seq" in err
    code, _, err = run("kv", "meta-llama/Llama-2-7b-hf", "--kv-cache-dtype", "int4")
    assert code == 2 and "--kv-cache-dtype" in err


def test_simulate_json_and_plot(tmp_path: Path) -> None:
    fig = tmp_path / "sim.png"
    code, out, _ = run("simulate", "--workload", "sharegpt", "--requests", "500", "--capacity-tokens", "30000",
                       "--seed", "2", "--plot", str(fig), "--json")
    assert code == 0 and fig.stat().st_size > 1000
    data = json.loads(out)
    res = data["results"]
    assert set(res) == {"contiguous", "paged"}
    assert res["paged"]["waste"] < res["contiguous"]["waste"]
    _, out2, _ = run("simulate", "--workload", "sharegpt", "--requests", "500", "--capacity-tokens", "30000",
                         "--seed", "2", "--json")
    assert json.loads(out2)["results"] == res  # deterministic for a seed


def test_simulate_capacity_from_vllm() -> None:
    code, out, _ = run("simulate", "--workload", "alpaca", "--requests", "300", "--model", "meta-llama/Llama-2-7b-hf",
                       "--gpu", "A100-40GB", "--mode", "paged", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["capacity_source"].startswith("vLLM") and data["capacity_tokens"] % 16 == 0


def test_simulate_csv(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("prompt_tokens,output_tokens\n3,2\n2,3\n4,1\n")
    code, out, _ = run("simulate", "--csv", str(p), "--capacity-tokens", "16", "--max-model-len", "8",
                       "--mode", "contiguous", "--json")
    assert code == 0
    assert json.loads(out)["results"]["contiguous"]["slot_steps"]["used"] == 20


def test_simulate_bad_input_exits_2() -> None:
    code, _, err = run("simulate", "--workload", "sharegpt")
    assert code == 2 and "--capacity-tokens" in err
    code, _, err = run("simulate", "--workload", "sharegtp", "--capacity-tokens", "5000")
    assert code == 2 and "did you mean" in err
    code, _, err = run("simulate", "--capacity-tokens", "5000", "--mode", "pagd")
    assert code == 2 and "--mode" in err


def test_generate_reports_solvers() -> None:
    code, out, _ = run("generate", str(ROOT / "examples" / "llama2-7b-inference-a100.yaml"), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["max_batch_size"] >= 8 and data["max_prompt_len"] >= 1024
    assert set(data["phases"]) == {"prefill", "decode"}
    code, _, _ = run("generate", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "L4")
    assert code == 1
