"""The web API with FastAPI's TestClient: the same documents as the CLI's ``--json``, 4xx with the
field's message for bad input (never a 500), no server file read from a request, the limits."""

from __future__ import annotations

import copy
import io
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan.cli.main import app as cli_app
from vramplan.errors import ScenarioError
from vramplan.spec.load import read_document

pytest.importorskip("fastapi", reason="needs the web extra (fastapi, uvicorn)")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx (the dev extra)")

from fastapi.testclient import TestClient

from vramplan.web import WebSettings, create_app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.*"))
ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(WebSettings(max_body_bytes=64 * 1024, time_limit_s=30)))


def cli_json(*args: str) -> Any:
    res = runner.invoke(cli_app, [*args, "--json"], env=ENV)
    assert res.exit_code in (0, 1), res.stderr
    return json.loads(res.stdout)


def problems_of(doc: dict[str, Any]) -> list[str]:
    """What `vramplan estimate` prints after "error:" for this scenario: the library's problems."""
    from vramplan.engine import estimate

    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    return [str(p) for p in exc.value.problems]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_estimate_is_the_cli_document(client: TestClient, path: Path) -> None:
    r = client.post("/api/estimate", json=read_document(path))
    assert r.status_code == 200
    assert r.json() == cli_json("estimate", str(path))
    # byte for byte the CLI's text, so a script may diff the two
    res = runner.invoke(cli_app, ["estimate", str(path), "--json"], env=ENV)
    assert r.text == res.stdout


def test_estimate_without_remedies_is_the_report(client: TestClient) -> None:
    from vramplan.engine import estimate

    doc = read_document(ROOT / "examples" / "lora-llama3-8b-a10g.yaml")
    report = estimate(doc)
    assert report.verdict != "FITS"  # so the whole document carries remedies (plan/remedies.py)
    whole = client.post("/api/estimate", json=doc).json()
    alone = client.post("/api/estimate", params={"remedies": "false"}, json=doc).json()
    assert whole["remedies"] and "remedies" not in alone
    assert alone == report.to_json_dict() == {k: v for k, v in whole.items() if k not in ("remedies", "assumed_settings")}


def test_serve_is_the_cli_document(client: TestClient) -> None:
    path = ROOT / "examples" / "llama3-8b-serve-h100.yaml"
    r = client.post("/api/serve", json=read_document(path))
    assert r.status_code == 200
    assert r.json() == cli_json("serve", str(path))


SERVE_CASES = [
    # (scenario flags of `vramplan serve`, the same scenario as a request body, query)
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100-SXM", "--engine", "sglang"],
     {"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "H100-SXM"}, "serve": {"engine": "sglang"}}, {}),
    # llama.cpp's decision and log lines (serve/llamacpp.py); this one will not start: 8,192 + 16,384 + 8,472 MiB
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "RTX-4090", "--engine", "llamacpp"],
     {"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "RTX-4090"}, "serve": {"engine": "llamacpp"}}, {}),
    # a Volta card: the GPU generation's note (no bf16) after vLLM's own assumptions, as the CLI prints it
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "V100-32GB", "--max-model-len", "4096"],
     {"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "V100-32GB"}, "serve": {"max_model_len": 4096}}, {}),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100-SXM", "--subtract-cudagraphs"],
     {"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "H100-SXM"}}, {"subtract_cudagraphs": "true"}),
]


@pytest.mark.parametrize(("flags", "body", "query"), SERVE_CASES, ids=["sglang", "llamacpp", "volta", "subtract"])
def test_serve_engines_are_the_cli_documents(client: TestClient, flags: list[str], body: dict[str, Any],
                                            query: dict[str, str]) -> None:
    r = client.post("/api/serve", params=query, json=body)
    assert r.status_code == 200, r.text
    assert r.json() == cli_json("serve", *flags)


def test_serve_refuses_what_the_cli_refuses(client: TestClient) -> None:
    body = {"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "H100-SXM"}, "serve": {"engine": "sglang"}}
    r = client.post("/api/serve", params={"subtract_cudagraphs": "true"}, json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["where"] == "--subtract-cudagraphs"
    res = runner.invoke(cli_app, ["serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100-SXM", "--engine",
                                  "sglang", "--subtract-cudagraphs"], env=ENV)
    assert res.exit_code == 2 and r.json()["detail"][0]["message"] in " ".join(res.stderr.split())


def test_compare_is_the_cli_document(client: TestClient, tmp_path: Path) -> None:
    a = read_document(ROOT / "examples" / "lora-llama3-8b-a10g.yaml")
    b = {**a, "hardware": {"gpu": "H100"}}
    (tmp_path / "b.json").write_text(json.dumps(b))
    r = client.post("/api/compare", json=[a, b])
    assert r.status_code == 200
    assert r.json() == cli_json("compare", str(ROOT / "examples" / "lora-llama3-8b-a10g.yaml"), str(tmp_path / "b.json"))


def test_generate_and_kv_are_the_cli_documents(client: TestClient) -> None:
    path = ROOT / "examples" / "llama2-7b-inference-a100.yaml"
    r = client.post("/api/generate", json=read_document(path))
    assert r.status_code == 200
    assert r.json() == cli_json("generate", str(path))
    body = {"model": "llama-3.1-8b", "seq": [1024, 8192], "batch": [1, 4], "kv_cache_dtype": "fp8", "budget_gb": 20}
    r = client.post("/api/kv", json=body)
    assert r.status_code == 200
    assert r.json() == cli_json("kv", "llama-3.1-8b", "--seq", "1024,8192", "--batch", "1,4", "--kv-cache-dtype", "fp8",
                                "--budget-gb", "20")
    bad = client.post("/api/kv", json={**body, "seq": [0], "kv_cache_dtype": "fp4"})
    assert bad.status_code == 422
    assert [p["where"] for p in bad.json()["detail"]] == ["seq.0", "kv_cache_dtype"]
    assert client.post("/api/kv", json={**body, "model": "/etc/hostname"}).status_code == 422


def test_models_and_gpus_are_the_cli_documents(client: TestClient) -> None:
    assert client.get("/api/models", params={"q": "llama-3.1"}).json() == cli_json("models", "llama-3.1")
    assert client.get("/api/gpus", params={"q": "h100"}).json() == cli_json("gpus", "h100")
    assert len(client.get("/api/gpus").json()) == len(cli_json("gpus"))


PLAN = {"model": "llama-3.1-8b", "gpu": "RTX-4090", "seq_len": 2048, "global_batch": 16, "peft": "allow"}


def _without_timing(doc: dict[str, Any]) -> dict[str, Any]:
    stats = {k: v for k, v in doc["stats"].items() if k not in ("seconds", "candidates_per_s")}
    return {**doc, "stats": stats}


def test_plan_is_the_cli_document_and_exports_zip(client: TestClient) -> None:
    r = client.post("/api/plan", json=PLAN)
    assert r.status_code == 200
    cli = cli_json("plan", "--model", "llama-3.1-8b", "--gpu", "RTX-4090", "--seq-len", "2048",
                   "--global-batch", "16", "--peft", "allow")
    assert _without_timing(r.json()) == _without_timing(cli)
    z = client.post("/api/plan/export.zip", json=PLAN)
    assert z.status_code == 200 and z.headers["content-type"] == "application/zip"
    from vramplan.export import export_files
    from vramplan.plan import PlanResult

    files = export_files(PlanResult.model_validate(r.json()))
    zf = zipfile.ZipFile(io.BytesIO(z.content))
    assert sorted(zf.namelist()) == sorted(files)
    assert all(zf.read(n).decode() == files[n] for n in files)


def test_plan_errors_name_the_option(client: TestClient) -> None:
    r = client.post("/api/plan", json={**PLAN, "seq_len": 0, "peft": "lorra"})
    assert r.status_code == 422
    where = [p["where"] for p in r.json()["detail"]]
    assert where == ["seq_len", "peft"]
    r = client.post("/api/plan", json={**PLAN, "num_gpus": "1-100000"})
    assert r.status_code == 422 and r.json()["detail"][0]["where"] == "num_gpus"
    r = client.post("/api/plan", json={**PLAN, "num_gpus": "abc"})
    assert r.status_code == 422 and r.json()["detail"][0]["where"] == "--num-gpus"
    r = client.post("/api/plan", json={**PLAN, "model": "/etc/hostname"})
    assert r.status_code == 422 and r.json()["detail"][0]["where"] == "model"


def test_solve_is_the_cli_document(client: TestClient) -> None:
    path = ROOT / "examples" / "lora-llama3-8b-a10g.yaml"
    r = client.post("/api/solve/max-batch", json=read_document(path))
    assert r.status_code == 200
    assert r.json() == cli_json("solve", "max-batch", str(path))
    assert client.post("/api/solve/max-bacth", json=read_document(path)).status_code == 422


def test_compare_lists_the_differences(client: TestClient) -> None:
    a = read_document(ROOT / "examples" / "lora-llama3-8b-a10g.yaml")
    b = {**a, "hardware": {"gpu": "H100"}}
    r = client.post("/api/compare", json=[a, b])
    assert r.status_code == 200
    doc = r.json()
    assert [x["gpu"]["name"] for x in doc["reports"]] == ["A10G", "H100-SXM"]
    assert "scenario.hardware.gpu" in doc["differing_keys"]
    assert "per_gpu.headroom_bytes" in doc["differing_keys"]
    # the weights do not depend on the GPU
    assert "per_gpu.breakdown.weights" not in doc["differing_keys"]
    assert client.post("/api/compare", json=[a] * 5).status_code == 422
    bad = client.post("/api/compare", json=[a, {**a, "train": {"seq_len": -1}}])
    assert bad.status_code == 422 and bad.json()["detail"][0]["where"] == "1.train.seq_len"


def test_fit_lists_every_catalog_gpu(client: TestClient) -> None:
    from vramplan.engine import estimate

    doc = read_document(ROOT / "examples" / "lora-llama3-8b-a10g.yaml")
    rows = client.post("/api/fit", json=doc).json()
    assert len(rows) == len(cli_json("gpus"))
    caps = [r["capacity_bytes"] for r in rows]
    assert caps == sorted(caps)
    (a10g,) = [r for r in rows if r["gpu"] == "A10G"]
    rep = estimate(doc)  # the example's own GPU: the row is its report's verdict and headroom
    assert a10g["device_used_bytes"] == rep.per_gpu.device_used_bytes
    assert a10g["headroom_bytes"] == rep.per_gpu.headroom_bytes
    assert a10g["verdict"] == rep.verdict  # the band's verdict (report/band.py), not a second rule


def test_fit_with_gpu_counts(client: TestClient) -> None:
    from vramplan.engine import estimate

    doc = read_document(ROOT / "examples" / "qwen25-7b-bf16-true-tp2.json")
    rows = client.post("/api/fit", params={"counts": "1,2,4"}, json=doc).json()
    h100 = {r["num_gpus"]: r for r in rows if r["gpu"] == "H100-SXM"}
    assert sorted(h100) == [1, 2, 4]
    # tp=2 does not divide one GPU: the scenario's own check, as a row
    assert h100[1]["verdict"] == "error" and "does not divide num_gpus = 1" in h100[1]["message"]
    four = estimate({**doc, "hardware": {**doc["hardware"], "gpu": "H100-SXM", "num_gpus": 4}})
    assert h100[4]["device_used_bytes"] == four.per_gpu.device_used_bytes
    assert client.post("/api/fit", params={"counts": "1-64"}, json=doc).status_code == 422


def test_fit_smallest_count_is_the_library_answer(client: TestClient) -> None:
    from vramplan.plan.every_gpu import smallest_fitting_counts

    doc = read_document(ROOT / "examples" / "llama3-8b-fsdp-8xh100.yaml")
    rows = client.post("/api/fit", params={"smallest": "true"}, json=doc).json()
    assert rows == [r.to_json_dict() for r in smallest_fitting_counts(doc)]
    (h100,) = [r for r in rows if r["gpu"] == "H100-SXM"]
    assert (h100["num_gpus"], h100["verdict"]) == (4, "FITS")  # tests/test_compare_fit_curve.py works it out
    # the counts asked bound the search: with 1 and 2 only, the H100 row is the largest that ran (2)
    two = client.post("/api/fit", params={"smallest": "true", "counts": "1,2"}, json=doc).json()
    assert [(r["num_gpus"], r["verdict"]) for r in two if r["gpu"] == "H100-SXM"] == [(2, "MAY NOT FIT")]


def test_serve_curve_is_blocks_over_blocks_per_request(client: TestClient) -> None:
    doc = read_document(ROOT / "examples" / "llama3-8b-serve-h100.yaml")
    blocks = client.post("/api/serve", json=doc).json()["vllm"]["num_gpu_blocks"]
    points = client.post("/api/serve/curve", json=doc).json()
    assert [p["context_len"] for p in points] == [512, 1024, 2048, 4096, 8192]  # max_position_embeddings 8192
    for p in points:
        # Llama 3 8B: full attention in every layer, 16-token blocks: ceil(L / 16) blocks per request
        assert p["max_concurrency"] == round(blocks / math.ceil(p["context_len"] / 16), 4)
        # 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 B = 131,072 B per token
        assert p["kv_bytes_per_request"] == 131_072 * p["context_len"]


BAD = [
    ({"model": "llama-3.1-8b", "hardware": {"gpu": "H1000"}}, "hardware.gpu"),
    ({"model": "llama-3.1-8b", "hardware": {"gpu": "H100"}, "train": {"seq_len": 0}}, "train.seq_len"),
    ({"model": "llama-3.1-8b", "hardware": {"gpu": "H100"}, "train": {"precision": "bf16"}}, "train.precision"),
    ({"model": "llama-3.1-8b", "hardware": {"gpu": "H100"}, "trian": {}}, "trian"),
    ({"model": "llama-3.1-8b", "hardware": {"gpu": "H100", "num_gpus": 8}, "parallel": {"tp": 3}}, "parallel.tp"),
    ({"model": "lama-3.1-8b", "hardware": {"gpu": "H100"}}, "model"),
]


@pytest.mark.parametrize(("doc", "where"), BAD, ids=[w for _, w in BAD])
def test_bad_input_is_422_with_the_cli_message(client: TestClient, doc: dict[str, Any], where: str) -> None:
    r = client.post("/api/estimate", json=doc)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert where in [p["where"] for p in detail]
    assert [p["text"] for p in detail] == problems_of(doc)


def test_cli_prints_the_same_message() -> None:
    res = runner.invoke(cli_app, ["estimate", "--model", "llama-3.1-8b", "--gpu", "H1000"], env=ENV)
    assert res.exit_code == 2
    text = TestClient(create_app()).post(
        "/api/estimate", json={"model": "llama-3.1-8b", "hardware": {"gpu": "H1000"}}).json()["detail"][0]["text"]
    # the CLI names the flag beside the key ("--gpu / hardware.gpu: ..."); the message itself is the same
    assert text.startswith("hardware.gpu: unknown gpu 'H1000'") and text in " ".join(res.stderr.split())


@pytest.mark.parametrize("model", ["/etc/passwd", "examples/lora-llama3-8b-a10g.yaml",
                                   str(ROOT / "src" / "vramplan" / "catalog" / "models"), "~/config.json", 7])
def test_no_server_file_is_read(client: TestClient, model: Any) -> None:
    r = client.post("/api/estimate", json={"model": model, "hardware": {"gpu": "H100"}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["where"] == "model"


@pytest.mark.parametrize("route", ["/api/estimate", "/api/serve", "/api/fit"])
def test_no_server_file_is_read_through_the_serving_keys(client: TestClient, route: str, tmp_path: Path) -> None:
    """serve.gguf.file (a GGUF file serve/gguf.py would open) and serve.speculative.model (a draft model load_model
    would read from a path): refused before the library sees them, even when the file exists and is valid."""
    from vramplan.catalog.models import list_models

    (m,) = [m for m in list_models() if m.id == "meta-llama/Llama-3.1-8B"]
    (tmp_path / "config.json").write_text(json.dumps(m.config))  # a valid config.json: `vramplan serve` would read it
    base = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100"}}
    for serve, where in (({"engine": "llamacpp", "gguf": {"file": "/etc/passwd"}}, "serve.gguf.file"),
                         ({"engine": "llamacpp", "gguf": {"file": str(tmp_path / "x.gguf")}}, "serve.gguf.file"),
                         ({"speculative": {"method": "draft", "model": str(tmp_path), "num_speculative_tokens": 4}},
                          "serve.speculative.model"),
                         ({"speculative": {"method": "draft", "model": "/etc/passwd", "num_speculative_tokens": 4}},
                          "serve.speculative.model"),
                         ({"speculative": {"method": "draft", "model": "someone/draft", "num_speculative_tokens": 4}},
                          "serve.speculative.model")):
        r = client.post(route, json={**base, "serve": serve})
        assert r.status_code == 422, (serve, r.text)
        assert r.json()["detail"][0]["where"] == where
        assert str(tmp_path) not in r.json()["detail"][0]["hint"]
        assert "upload" not in r.json()["detail"][0]["hint"]  # a draft model is a name, not an uploaded file
    # a catalog draft model is still estimated
    ok = client.post(route, json={**base, "serve": {"speculative": {"method": "draft", "model": "llama-3.2-1b",
                                                                    "num_speculative_tokens": 4}}})
    assert ok.status_code == 200, ok.text


def test_an_uploaded_config_is_accepted(client: TestClient) -> None:
    from vramplan.catalog.models import list_models

    (m,) = [m for m in list_models() if m.id == "meta-llama/Llama-3.1-8B"]
    inline = client.post("/api/estimate", json={"model": m.config, "hardware": {"gpu": "H100"}})
    by_id = client.post("/api/estimate", json={"model": m.id, "hardware": {"gpu": "H100"}})
    assert inline.status_code == 200
    assert inline.json()["per_gpu"] == by_id.json()["per_gpu"]


def test_an_uploaded_config_is_bounded_in_size(client: TestClient) -> None:
    from vramplan.catalog.models import list_models

    (m,) = [m for m in list_models() if m.id == "meta-llama/Llama-3.1-8B"]
    big = {**m.config, "num_hidden_layers": 100_000}
    r = client.post("/api/estimate", json={"model": big, "hardware": {"gpu": "H100"}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["where"] == "model.num_hidden_layers"
    # the largest catalog model is well inside the limit
    from vramplan.web.requests import SIZE_LIMITS

    layers = max(int(c.config.get("num_hidden_layers") or c.config.get("n_layer") or 0) for c in list_models())
    assert 10 * layers <= SIZE_LIMITS["num_hidden_layers"]
    # and the most experts (Qwen3-Next-80B-A3B's 512: 10 x 512 = 5,120)
    keys = ("num_local_experts", "n_routed_experts", "num_experts")
    experts = max(int(c.config.get(k) or 0) for c in list_models() for k in keys)
    assert experts == 512 and all(10 * experts <= SIZE_LIMITS[k] for k in keys)
    # a nested language model (Qwen3-Omni's thinker_config.text_config) is bounded as the top level is: it was not
    (omni,) = [m for m in list_models() if m.id == "Qwen/Qwen3-Omni-30B-A3B-Instruct"]
    cfg = copy.deepcopy(omni.config)
    cfg["thinker_config"]["text_config"]["num_hidden_layers"] = 100_000
    r = client.post("/api/estimate", json={"model": cfg, "hardware": {"gpu": "H200"}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["where"] == "model.thinker_config.text_config.num_hidden_layers"


def test_limits_and_malformed_bodies(client: TestClient) -> None:
    assert client.post("/api/estimate", content=b"{" + b" " * 70_000 + b"}").status_code == 413
    assert client.post("/api/estimate", content=b"not json").status_code == 400
    nan = b'{"model": "llama-3.1-8b", "hardware": {"gpu": "H100"}, "serve": {"gpu_memory_utilization": NaN}}'
    assert client.post("/api/estimate", content=nan).status_code == 400
    assert client.post("/api/estimate", json=[1, 2]).status_code == 422
    assert client.post("/api/estimate", json={"task": "train"}).json()["detail"][0]["where"] == "model"
    assert client.get("/nowhere").status_code == 404


def test_time_limit_answers_503() -> None:
    slow = TestClient(create_app(WebSettings(time_limit_s=0.001)))
    r = slow.post("/api/plan", json={**PLAN, "num_gpus": "1-8"})
    assert r.status_code == 503


def test_health_schema_and_page(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    schema = client.get("/api/schema").json()
    from vramplan.spec.scenario import Scenario

    assert schema == Scenario.model_json_schema()
    page = client.get("/")
    assert page.status_code == 200 and "vramplan" in page.text
    for asset in ("/static/app.js", "/static/style.css", "/static/vendor/chart.umd.min.js"):
        assert client.get(asset).status_code == 200
    # no CDN: every script and stylesheet the page loads is served by the package
    assert "http://" not in page.text.replace("http://www.w3.org", "") and "https://" not in page.text


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**9), st.floats(allow_nan=False, allow_infinity=False),
                       st.text(max_size=8), st.lists(st.integers(), max_size=2))
_PATHS = ["task", "framework", "hardware.gpu", "hardware.num_gpus", "hardware.capacity_gib", "train.seq_len",
          "train.micro_batch_size", "train.precision", "train.peft", "train.peft.rank", "train.optimizer",
          "inference.batch_size", "serve.max_model_len", "serve.gpu_memory_utilization", "parallel.tp",
          "parallel.zero_stage", "software.peft", "model"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(_PATHS), _json_leaf, max_size=3))
def test_any_body_is_answered_without_a_500(client: TestClient, changes: dict[str, Any]) -> None:
    doc: dict[str, Any] = {"model": "llama-3.1-8b", "hardware": {"gpu": "A100-80GB"}}
    for path, value in changes.items():
        d = doc
        *parents, last = path.split(".")
        for k in parents:
            d = d.setdefault(k, {}) if isinstance(d.get(k, {}), dict) else {}
        d[last] = value
    r = client.post("/api/estimate", json=doc)
    assert r.status_code in (200, 422), r.text


def _mutated(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(base))
    for path, value in changes.items():
        d = doc
        *parents, last = path.split(".")
        for k in parents:
            d = d.setdefault(k, {}) if isinstance(d.get(k, {}), dict) else {}
        d[last] = value
    return doc


# values a user would type, so that many bodies are valid and reach the library (not only the request checks)
_plausible_leaf = st.one_of(st.sampled_from(["vllm", "sglang", "llamacpp", "inference", "serve", "H100", "RTX-4090", "fp8",
                                             1, 2, 8, 512, 4096, 0.5, 0.9, True, None]), _json_leaf)
_SCENARIO_ROUTES = ["/api/serve", "/api/serve/curve", "/api/generate", "/api/solve/max-batch", "/api/solve/max-seq",
                    "/api/fit"]
_SERVE_PATHS = ["serve.engine", "serve.max_model_len", "serve.gpu_memory_utilization", "serve.kv_cache_dtype",
                "serve.gguf", "inference.prompt_len", "inference.new_tokens", "hardware.gpu", "parallel.tp", "model"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(_SCENARIO_ROUTES),
       changes=st.dictionaries(st.sampled_from(_SERVE_PATHS + _PATHS[:8]), _plausible_leaf, max_size=2),
       whole=st.one_of(st.none(), st.none(), st.none(), _json_leaf))
def test_any_body_to_the_scenario_routes_is_answered_without_a_500(client: TestClient, route: str,
                                                                  changes: dict[str, Any], whole: Any) -> None:
    """serve, its curve, generate, solve and fit: a scenario changed at random keys, or no object at all."""
    body = _mutated({"model": "llama-3.1-8b", "hardware": {"gpu": "A100-80GB"}}, changes) if whole is None else whole
    r = client.post(route, json=body)
    event(f"{route} {r.status_code}")  # pytest --hypothesis-show-statistics: how many answered 200
    assert r.status_code in (200, 422), (route, body, r.text)


_PLAN_KEYS = ["num_gpus", "task", "seq_len", "global_batch", "peft", "lora_rank", "max_model_len", "concurrency",
              "margin", "top", "mfu", "gpu", "model", "max_micro_batch", "host_memory_gib", "unknown"]
_KV_KEYS = ["seq", "batch", "kv_cache_dtype", "dtype", "tp", "block_size", "budget_gb", "model", "unknown"]
_option_leaf = st.one_of(_json_leaf, st.sampled_from(["1-100000", "0", "1,2", "serve", "qlora", "fp8", "H100", 1, 2,
                                                      4096, [1024], 0.2, True]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["/api/plan", "/api/kv", "/api/compare", "/api/plan/export.zip"]),
       plan=st.dictionaries(st.sampled_from(_PLAN_KEYS), _option_leaf, max_size=2),
       kv=st.dictionaries(st.sampled_from(_KV_KEYS), _option_leaf, max_size=2),
       setups=st.lists(st.dictionaries(st.sampled_from(_PATHS), _plausible_leaf, max_size=1), max_size=5))
def test_any_body_to_the_option_routes_is_answered_without_a_500(client: TestClient, route: str, plan: dict[str, Any],
                                                                kv: dict[str, Any], setups: list[Any]) -> None:
    """plan (and its zip), kv and compare: their options changed at random, or any number of setups."""
    body: Any
    if route.startswith("/api/plan"):
        # up to two options changed from a small job (seq_len 512, one GPU): a valid body plans in about a second
        body = {**PLAN, "seq_len": 512, **plan}
    elif route == "/api/kv":
        body = {"model": "llama-3.1-8b", **kv}
    else:
        body = [_mutated({"model": "llama-3.1-8b", "hardware": {"gpu": "A100-80GB"}}, c) for c in setups]
    r = client.post(route, json=body)
    event(f"{route} {r.status_code}")  # pytest --hypothesis-show-statistics: how many answered 200
    assert r.status_code in (200, 422), (route, body, r.text)


def test_raw_bodies_are_4xx(client: TestClient) -> None:
    for route in ("/api/estimate", "/api/plan", "/api/kv", "/api/compare", "/api/serve", "/api/fit"):
        for raw in (b"", b"\xff\xfe", b"[", b"1e999999", b'{"model": Infinity}', b"null"):
            r = client.post(route, content=raw)
            assert 400 <= r.status_code < 500, (route, raw, r.text)


def test_import_vramplan_does_not_import_fastapi() -> None:
    code = ("import sys, vramplan, vramplan.web; "
            "assert not [m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules], sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_missing_extra_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastapi", None)
    res = runner.invoke(cli_app, ["web", "--port", "0"], env=ENV)
    assert res.exit_code == 2
    assert "pip install 'vramplan[web]'" in res.stderr


def test_hub_ids_only_when_the_server_allows_them(fake_hub: Any) -> None:
    """The fake Hub (tests/fakehub.py, no network) at HF_ENDPOINT: a Hub id is estimated only by a server started
    with --allow-hub, through the library's resolver (catalog/hub.py) and the Hugging Face cache."""
    from vramplan.catalog.models import list_models

    (m,) = [m for m in list_models() if m.id == "meta-llama/Llama-3.1-8B"]
    fake_hub.add("someone/llama-copy", {"config.json": m.config})
    fake_hub.add("someone/gated", {"config.json": m.config}, gated_token="hf_serverless0123")
    fake_hub.add("someone/huge", {"config.json": {**m.config, "num_hidden_layers": 5000}})
    doc = {"model": "someone/llama-copy", "hardware": {"gpu": "H100"}}
    off = TestClient(create_app(WebSettings()))
    refused = off.post("/api/estimate", json=doc)
    assert refused.status_code == 422 and fake_hub.requests == []
    assert "--allow-hub" in refused.json()["detail"][0]["hint"]
    on = TestClient(create_app(WebSettings(allow_hub=True)))
    assert on.get("/healthz").json()["hub"] is True
    r = on.post("/api/estimate", json=doc)
    assert r.status_code == 200, r.text
    assert r.json()["model"]["name"] == "someone/llama-copy"
    same = on.post("/api/estimate", json={**doc, "model": m.id}).json()
    assert r.json()["per_gpu"] == same["per_gpu"]
    gated = on.post("/api/estimate", json={**doc, "model": "someone/gated"})
    assert gated.status_code == 422 and "token" in gated.json()["detail"][0]["message"]
    assert on.post("/api/estimate", json={**doc, "model": "someone/missing"}).json()["detail"][0]["where"] == "model"
    # the server's size limits apply to a Hub config as to an uploaded one
    huge = on.post("/api/estimate", json={**doc, "model": "someone/huge"})
    assert huge.status_code == 422 and "num_hidden_layers" in huge.json()["detail"][0]["where"]
    # a path is still no Hub id, and the kv route reads the Hub id the same way
    assert on.post("/api/estimate", json={**doc, "model": "../etc/passwd"}).status_code == 422
    kv = on.post("/api/kv", json={"model": "someone/llama-copy", "seq": [1024], "batch": [1]})
    assert kv.status_code == 200 and kv.json()["model"] == "someone/llama-copy"
    assert all("/resolve/" in path for _, path, _ in fake_hub.requests)


def test_serve_accepts_the_sglang_engine(client: TestClient) -> None:
    doc = {"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "H100-SXM"},
           "serve": {"engine": "sglang", "sglang_version": "0.4.1"}}
    data = client.post("/api/serve", json=doc).json()
    # the document of `vramplan serve --engine sglang --json`: 0.88 x free - weights = 444,058 tokens of 131,072 B
    assert data["engine"] == "sglang" and data["fits"] and "vllm" not in data
    assert data["sglang"]["max_total_num_tokens"] == 444_058
    r = client.post("/api/serve", json={**doc, "serve": {**doc["serve"], "gpu_memory_utilization": 0.8}})
    assert r.status_code == 422 and r.json()["detail"][0]["where"] == "serve.gpu_memory_utilization"
    r = client.post("/api/serve/curve", json=doc)
    assert r.status_code == 422 and r.json()["detail"][0]["where"] == "serve.engine"
