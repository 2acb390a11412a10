"""CLI: output snapshots, JSON schema, and bad input -> one message per problem, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vramplan.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
SNAP = Path(__file__).parent / "snapshots"
runner = CliRunner()
ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


def test_estimate_snapshot() -> None:
    code, out, _ = run("estimate", str(ROOT / "examples" / "llama2-7b-inference-a100.yaml"))
    assert code == 0
    snap = SNAP / "estimate_llama2_7b_inference.txt"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snap.write_text(out)
    assert out == snap.read_text()


def test_json_report_keys() -> None:
    code, out, _ = run("estimate", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml"), "--json")
    assert code == 0
    r = json.loads(out)
    assert r["engine"] == "analytic" and r["fits"] is True
    pg = r["per_gpu"]
    for key in ("capacity_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes",
                "headroom_bytes", "peak_phase", "breakdown", "outside_allocator"):
        assert key in pg
    assert set(pg["breakdown"]) == {"weights", "gradients", "optimizer_states", "master_weights", "activations",
                                    "kv_cache", "temporaries", "other"}
    assert {"cuda_context", "workspaces", "communication"} <= set(pg["outside_allocator"])
    assert sum(pg["breakdown"].values()) == pg["peak_allocated_bytes"]
    assert set(r["serve"]) == {"kv_cache_bytes", "num_gpu_blocks", "max_concurrency", "max_model_len_that_fits",
                               "kv_cache_bytes_low", "kv_cache_bytes_high", "max_concurrency_low", "max_concurrency_high",
                               "engine", "weights_bytes", "kv_cache_tokens", "host_bytes", "starts", "start_problem",
                               "start_fix",
                               "weights_gpu_bytes", "weights_host_bytes", "compute_buffer_bytes", "start_risk",
                               "start_risk_fix"}
    # the band beside the point (report/band.py)
    assert pg["peak_allocated_bytes_low"] <= pg["peak_allocated_bytes"] <= pg["peak_allocated_bytes_high"]
    assert r["verdict"] in ("FITS", "MAY NOT FIT", "DOES NOT FIT")
    assert "offloaded_bytes" in r["host"]


def test_flags_without_file() -> None:
    code, out, _ = run("estimate", "--model", "gpt2", "--gpu", "T4", "--micro-batch-size", "2", "--seq-len", "128",
                       "--json")
    assert code == 0 and json.loads(out)["scenario"]["train"]["micro_batch_size"] == 2


def test_every_scenario_key_has_a_flag() -> None:
    # each scenario key reachable from the command line: walk the Scenario model and look for the flag
    from pydantic import BaseModel

    from vramplan.spec.scenario import Scenario

    code, out, _ = run("estimate", "--help")
    assert code == 0
    helptext = " ".join(out.split())
    aliases = {"hardware.gpu": "--gpu", "train.peft.method": "--peft", "train.peft.rank": "--lora-rank",
               "train.peft.alpha": "--lora-alpha", "train.peft.dropout": "--lora-dropout",
               "software.bitsandbytes": "--bitsandbytes", "software.peft": "--peft-version",
               "software.transformers": "--transformers-version", "serve.engine": "--serve-engine",
               "serve.gguf.file": "--gguf-file", "serve.gguf.quant": "--gguf-quant",
               "serve.speculative.method": "--speculative-method", "serve.speculative.model": "--speculative-model"}
    from vramplan.cli.flags import RENAMED

    # every other renamed leaf (e.g. inference.autoawq.max_seq_len -> --awq-max-seq-len) under its flag name
    aliases = {**{k: "--" + v.replace("_", "-") for k, v in RENAMED.items()}, **aliases}
    missing = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = [a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                   if isinstance(a, type) and issubclass(a, BaseModel)]
            if sub:
                walk(sub[0], f"{prefix}{name}.")
                continue
            key = f"{prefix}{name}"
            flag = aliases.get(key, "--" + name.replace("_", "-"))
            if flag not in helptext:
                missing.append((key, flag))

    walk(Scenario, "")
    assert not missing


def test_new_flags_reach_the_scenario() -> None:
    code, out, _ = run("estimate", "--model", "llama-2-7b", "--gpu", "A100-80GB", "--peft", "qlora", "--quantization",
                       "nf4", "--bitsandbytes", "0.41.1", "--lora-dropout", "0.1", "--gpus-per-node", "4",
                       "--peft-version", "0.10.0", "--transformers-version", "4.46", "--json")
    assert code == 0
    sc = json.loads(out)["scenario"]
    assert sc["software"]["peft"] == "0.10.0" and sc["software"]["transformers"] == "4.46"
    assert sc["software"]["bitsandbytes"] == "0.41.1" and sc["train"]["peft"]["dropout"] == 0.1
    assert sc["hardware"]["gpus_per_node"] == 4
    code, out, _ = run("estimate", "--model", "llama-3-8b", "--task", "serve", "--gpu", "H100", "--no-cuda-graphs",
                       "--json")
    assert code == 0 and json.loads(out)["scenario"]["serve"]["cuda_graphs"] is False


def test_does_not_fit_exits_1() -> None:
    code, out, _ = run("estimate", str(ROOT / "examples" / "llama2-7b-full-naive-a100.yaml"))
    assert code == 1 and "DOES NOT FIT" in out


def test_models_and_gpus_listing() -> None:
    code, out, _ = run("models", "llama")
    assert code == 0 and "Llama-2-7b-hf" in out
    code, out, _ = run("gpus", "h100")
    assert code == 0 and "H100-SXM" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "--model", "llama-2-7bb", "--gpu", "A100-80GB"], "did you mean 'llama-2-7b'"),
        (["estimate", "--model", "gpt2", "--gpu", "A100-80"], "unknown gpu 'A100-80'"),
        (["estimate", "--model", "llama-2-7b", "--gpu", "A100-80GB", "--tp", "3", "--num-gpus", "3"],
         "does not divide the 32 attention heads"),
        (["estimate", "--model", "llama-2-7b", "--gpu", "A100-80GB", "--tp", "2", "--num-gpus", "3"],
         "does not divide num_gpus"),
        (["estimate", "--model", "gpt2", "--gpu", "T4", "--micro-batch-size", "-4"], "micro_batch_size"),
        (["estimate", "--model", "gpt2", "--gpu", "T4", "--precision", "bf16-mix"], "did you mean 'bf16-mixed'"),
        (["estimate", "--model", "gpt2"], "no GPU given"),
        (["estimate", "--gpu", "T4"], "no model given"),
        (["estimate", "--model", "gpt2", "--gpu", "T4", "--offload", "optimizer"], "offload needs ZeRO"),
    ],
)
def test_bad_input(args: list[str], needle: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert needle in " ".join((err + out).split())
    assert "Traceback" not in err + out


def test_malformed_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    code, _out, err = run("estimate", str(bad))
    assert code == 2 and "not valid" in err and "Traceback" not in err
    code, _, err = run("estimate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file" in err
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, _, err = run("estimate", "--model", str(cfg), "--gpu", "T4")
    assert code == 2 and "lacks required key" in " ".join(err.split())
    unk = tmp_path / "scn.yaml"
    unk.write_text("model: gpt2\nhardware: {gpu: T4}\ntrain: {micro_batch: 2}\n")
    code, _, err = run("estimate", str(unk))
    assert code == 2 and "did you mean 'micro_batch_size'" in " ".join(err.split())


def test_inline_and_local_config(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, _ = run("estimate", "--model", str(tmp_path), "--gpu", "T4", "--json")
    assert code == 0
    # embed + head 1000*256*2 = 512,000; per layer q,o 256*256*2 = 131,072, k,v 256*128*2 = 65,536,
    # MLP 3*256*688 = 528,384, norms 2*256 = 512 -> 725,504; two layers 1,451,008; final norm 256
    # -> 512,000 + 1,451,008 + 256 = 1,963,264
    assert json.loads(out)["model"]["parameters"] == 1_963_264


def test_console_script_no_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "vramplan.cli.main", "estimate", "--model", "nosuch", "--gpu", "T4"],
                          capture_output=True, text=True, env={**os.environ, **ENV}, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "unknown model" in proc.stderr


def test_error_text_with_brackets_is_printed_verbatim(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # rich would read "[trace]" as markup and drop it; the message must reach the user whole.
    import vramplan.trace
    from vramplan.errors import MissingExtraError

    def no_torch(_doc: object) -> None:
        raise MissingExtraError("the traced engine needs torch: pip install 'vramplan[trace]'")

    monkeypatch.setattr(vramplan.trace, "estimate", no_torch)
    res = CliRunner().invoke(app, ["estimate", "--model", "gpt2", "--gpu", "A100-80GB", "--engine", "trace"])
    assert res.exit_code == 2
    assert "pip install 'vramplan[trace]'" in res.output


def test_measure_without_torch_names_the_extra(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # As on a machine without torch: `measure` stops with exit 2 and names the extra, brackets intact.
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def no_torch(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None if name in ("torch", "transformers") else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    res = CliRunner().invoke(app, ["measure", "examples/gpt2-eager-fp32-t4.yaml"])
    assert res.exit_code == 2
    assert "pip install 'vramplan[trace]'" in res.output


def test_tight_fit_is_flagged() -> None:
    # headroom under 10% of the capacity (report.TIGHT_HEADROOM_FRACTION) is tight; the headline shows the
    # band's verdict instead (report/band.py): 5% of headroom is inside the band, MAY NOT FIT
    from vramplan import estimate

    doc = {"model": "meta-llama/Llama-2-7b-hf", "task": "inference", "hardware": {"capacity_gib": 80}}
    used = estimate(doc).per_gpu.device_used_bytes
    tight = estimate({**doc, "hardware": {"capacity_gib": used * 1.05 / 2**30}})
    roomy = estimate({**doc, "hardware": {"capacity_gib": used * 1.25 / 2**30}})
    assert tight.fits and tight.tight and roomy.fits and not roomy.tight
    code, out, _ = run("estimate", "--model", "meta-llama/Llama-2-7b-hf", "--task", "inference",
                       "--capacity-gib", f"{used * 1.05 / 2**30:.3f}")
    assert code == 0 and "MAY NOT FIT" in out
