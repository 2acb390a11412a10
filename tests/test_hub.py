"""A model by Hugging Face Hub id (catalog/hub.py), against the local fake Hub (tests/fakehub.py): no test
here or elsewhere opens a network connection (conftest.py sets HF_HUB_OFFLINE=1; the ``fake_hub`` fixture
lifts it for a server on 127.0.0.1)."""

from __future__ import annotations

import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import fakehub
from vramplan import estimate
from vramplan.catalog.models import list_models, load_model
from vramplan.cli.main import app
from vramplan.errors import ScenarioError

runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
BASE = "Qwen/Qwen2.5-0.5B"
COPY = "someone/qwen-copy"
# Qwen2.5-0.5B: 494,032,768 parameters (its model card: 0.49B; tied embeddings counted once), so a
# bf16 checkpoint holds 2 x 494,032,768 = 988,065,536 bytes of tensors
PARAMS = 494_032_768


def _config() -> dict[str, Any]:
    (m,) = [m for m in list_models() if m.id == BASE]
    return dict(m.config)


def _tensors(extra: dict[str, tuple[str, list[int]]] | None = None) -> dict[str, tuple[str, list[int]]]:
    """One bf16 tensor per parameter group and copy, of the adapter's sizes (1-D: only the element count matters)."""
    spec = load_model(BASE)
    out = {f"{p.name}.{i}": ("BF16", [p.numel]) for p in spec.params for i in range(p.count)}
    return {**out, **(extra or {})}


def _sharded(hub: fakehub.FakeHub, repo: str, tensors: dict[str, tuple[str, list[int]]], **kw: Any) -> None:
    names = sorted(tensors)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    files: dict[str, Any] = {"config.json": _config(), "generation_config.json": {"max_new_tokens": 64}}
    files["model.safetensors.index.json"] = {"metadata": {"total_size": 0},
                                             "weight_map": {n: f for f, ns in half.items() for n in ns}}
    for f, ns in half.items():
        files[f] = fakehub.safetensors({n: tensors[n] for n in ns})
    hub.add(repo, files, **kw)


def _doc(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "task": "inference", "hardware": {"gpu": "H100"}, **extra}


def test_a_hub_id_is_estimated_like_the_catalog_row_it_copies(fake_hub: fakehub.FakeHub) -> None:
    _sharded(fake_hub, COPY, _tensors())
    r = estimate(_doc(COPY))
    assert r.model["name"] == COPY and r.model["parameters"] == PARAMS
    assert r.per_gpu == estimate(_doc(BASE)).per_gpu
    ck = r.model["checkpoint"]
    assert ck["files"] == 2 and ck["parameters"] == PARAMS
    assert ck["weight_bytes"] == 988_065_536 and ck["bytes_by_dtype"] == {"BF16": 988_065_536}
    assert not [a for a in r.assumptions if "checkpoint" in a]  # counts agree: nothing to say
    # the files huggingface_hub's cache layout keeps: snapshots/<commit>/<file>
    commit = fake_hub.repos[COPY].commit
    assert r.model["source"] == f"{fake_hub.url}/{COPY} config.json at {commit}"
    home = Path(os.environ["HF_HOME"])
    snapshot = home / "hub" / "models--someone--qwen-copy" / "snapshots" / commit
    assert {p.name for p in snapshot.iterdir()} == {"config.json", "generation_config.json",
                                                    "model.safetensors.index.json"}
    # the parsed headers beside the hub cache, not in it (scan_cache_dir would call it a corrupted repository)
    assert (home / "vramplan" / "safetensors" / "models--someone--qwen-copy" / f"{commit}.json").is_file()


def test_the_cli_estimates_a_hub_id_and_a_second_run_needs_no_network(fake_hub: fakehub.FakeHub) -> None:
    _sharded(fake_hub, COPY, _tensors())
    args = ["estimate", "--model", COPY, "--task", "inference", "--gpu", "H100", "--json"]
    first = runner.invoke(app, args, env=ENV)
    assert first.exit_code == 0, first.output
    seen = len(fake_hub.requests)
    assert seen > 0
    again = runner.invoke(app, args, env=ENV)  # online, but the cache answers
    offline = runner.invoke(app, [*args, "--offline"], env=ENV)
    env_offline = runner.invoke(app, args, env={**ENV, "HF_HUB_OFFLINE": "1"})
    assert len(fake_hub.requests) == seen
    docs = [json.loads(x.stdout) for x in (first, again, offline, env_offline)]
    assert all(d["per_gpu"] == docs[0]["per_gpu"] and d["model"] == docs[0]["model"] for d in docs)
    assert docs[0]["model"]["checkpoint"]["parameters"] == PARAMS


def test_offline_without_the_cache_is_a_clear_error(fake_hub: fakehub.FakeHub) -> None:
    _sharded(fake_hub, COPY, _tensors())
    for extra, env in (([], {"HF_HUB_OFFLINE": "1"}), (["--offline"], {})):
        res = runner.invoke(app, ["estimate", "--model", COPY, "--gpu", "H100", *extra], env={**ENV, **env})
        assert res.exit_code == 2
        text = " ".join(res.output.split())
        assert "not in the Hugging Face cache" in text and f"hf download {COPY} config.json" in text
    assert fake_hub.requests == []


def test_a_gated_repository_asks_for_a_token_and_never_prints_it(fake_hub: fakehub.FakeHub) -> None:
    secret = "hf_sEcReT0123456789abcdef"
    _sharded(fake_hub, "org/gated", _tensors(), gated_token=secret)
    args = ["estimate", "--model", "org/gated", "--gpu", "H100", "--task", "inference"]
    no_token = runner.invoke(app, args, env=ENV)
    assert no_token.exit_code == 2
    assert "gated" in no_token.output and "token" in no_token.output and "HF_TOKEN" in no_token.output
    wrong = runner.invoke(app, args, env={**ENV, "HF_TOKEN": "hf_wrongtoken000"})
    assert wrong.exit_code == 2 and "hf_wrongtoken000" not in wrong.output
    ok = runner.invoke(app, ["--token", secret, *args, "--json"], env=ENV)
    assert ok.exit_code == 0, ok.output
    assert secret not in ok.output and json.loads(ok.stdout)["model"]["name"] == "org/gated"
    assert (f"Bearer {secret}") in {auth for _, _, auth in fake_hub.requests}


def test_a_config_that_names_only_remote_code_is_refused_with_the_closest_family(fake_hub: fakehub.FakeHub) -> None:
    cfg = {**_config(), "model_type": "deepseek_vl_v2",
           "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekVLV2Config",
                        "AutoModelForCausalLM": "modeling_deepseek.DeepseekVLV2ForCausalLM"}}
    fake_hub.add("someone/remote", {"config.json": cfg})
    with pytest.raises(ScenarioError) as err:
        load_model("someone/remote")
    (p,) = err.value.problems
    # difflib's closest of the supported model types to "deepseek_vl_v2" (ratio 0.8 for deepseek_v2)
    assert "auto_map" in p.message and "trust_remote_code" in p.message and "'deepseek_v2'" in p.hint
    # nothing but config.json was read: no code file was asked for
    assert {path.rsplit("/", 1)[-1] for _, path, _ in fake_hub.requests} == {"config.json"}


def test_missing_repository_file_and_revision(fake_hub: fakehub.FakeHub) -> None:
    fake_hub.add("someone/no-config", {"README.md": b"# not a model"})
    _sharded(fake_hub, COPY, _tensors())
    cases = {"someone/absent": "no repository someone/absent", "someone/no-config": "has no config.json",
             f"{COPY}@v9": "has no revision 'v9'"}
    for name, text in cases.items():
        with pytest.raises(ScenarioError, match=text):
            load_model(name)
    commit = fake_hub.repos[COPY].commit
    assert load_model(f"{COPY}@{commit}").num_parameters == PARAMS


def test_an_unreachable_hub_suggests_offline_and_a_local_path(fake_hub: fakehub.FakeHub,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    res = runner.invoke(app, ["estimate", "--model", "qwen/qwen2.5-0.5b-typo", "--gpu", "H100"], env=ENV)
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "http://127.0.0.1:9/qwen/qwen2.5-0.5b-typo/resolve/main/config.json" in text
    assert "--offline" in text and "local config.json" in text and "did you mean" in text


def test_catalog_names_and_typos_never_reach_the_hub(fake_hub: fakehub.FakeHub) -> None:
    assert load_model(BASE).name == BASE
    with pytest.raises(ScenarioError, match="did you mean"):
        load_model("qwen2.5-0.5")
    assert fake_hub.requests == []


def test_malformed_and_oversized_config_json_are_refused_before_parsing(fake_hub: fakehub.FakeHub) -> None:
    fake_hub.add("bad/json", {"config.json": b'{"model_type": "llama", '})
    fake_hub.add("bad/list", {"config.json": b"[1, 2]"})
    fake_hub.add("bad/huge", {"config.json": fakehub.Blob(b"{", 2 << 20)})
    fake_hub.add("bad/deep", {"config.json": b"[" * 100 + b"]" * 100})
    for name, text in {"bad/json": "not valid JSON", "bad/list": "not a JSON object",
                       "bad/huge": "2,097,152 bytes", "bad/deep": "nested deeper"}.items():
        with pytest.raises(ScenarioError, match=text):
            load_model(name)
    # the oversized file was refused from its HEAD answer: never downloaded
    assert ("GET", "/bad/huge/resolve/main/config.json", "") not in fake_hub.requests


def _raw_safetensors(header: bytes, size: int) -> fakehub.Blob:
    return fakehub.Blob(struct.pack("<Q", len(header)) + header, size)


def test_hostile_safetensors_headers_are_refused(fake_hub: fakehub.FakeHub) -> None:
    good = {"a": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}}
    cases = {
        "h/len": (fakehub.Blob(struct.pack("<Q", 1 << 40), 1 << 41), "a header of 1,099,511,627,776 bytes"),
        "h/json": (_raw_safetensors(b"{not json", 100), "not JSON"),
        "h/short": (fakehub.Blob(b"\x01\x02", 2), "shorter than its 8-byte header"),
        "h/offsets": (_raw_safetensors(json.dumps({"a": {**good["a"], "data_offsets": [0, 31]}}).encode(), 200),
                      "spans 31 bytes, not 32"),
        "h/entry": (_raw_safetensors(json.dumps({"a": {"dtype": "BF16", "shape": "x"}}).encode(), 200),
                    "malformed safetensors entry"),
        "h/cut": (fakehub.Blob(struct.pack("<Q", 500_000) + b"{", 300_000), "cut short"),
    }
    for repo, (blob, text) in cases.items():
        fake_hub.add(repo, {"config.json": _config(), "model.safetensors": blob})
        with pytest.raises(ScenarioError, match=text):
            load_model(repo)
    fake_hub.add("h/index", {"config.json": _config(),
                             "model.safetensors.index.json": {"weight_map": {"a": "../../etc/passwd"}}})
    with pytest.raises(ScenarioError, match="not safetensors files"):
        load_model("h/index")


def test_a_server_that_ignores_range_costs_only_the_header(fake_hub: fakehub.FakeHub) -> None:
    """A header longer than the first read (100,000 bytes) from a server that answers every range with the
    whole 4 GiB file: the reader stops at the header's end."""
    tensors = {f"t{i:05d}": ("F32", [10]) for i in range(3000)}  # ~80 bytes of JSON each: a 240 kB header
    blob = fakehub.safetensors(tensors)
    blob.size = 4 << 30
    fake_hub.add("big/header", {"config.json": _config(), "model.safetensors": blob})
    fake_hub.ignore_range = True
    t0 = time.perf_counter()
    m = load_model("big/header")
    assert time.perf_counter() - t0 < 30
    assert m.checkpoint_files is not None
    assert m.checkpoint_files.tensors == 3000 and m.checkpoint_files.parameters == 30_000  # 3000 x 10
    assert m.checkpoint_files.weight_bytes == 120_000  # 30,000 fp32 elements x 4 bytes


def test_a_checkpoint_larger_than_the_adapter_says_so(fake_hub: fakehub.FakeHub) -> None:
    # a vision tower of 50,000,000 parameters beside the text model: 50e6 / 494,032,768 = +10.1%
    extra = {"vision_tower.patch_embed.weight": ("BF16", [50_000_000])}
    fake_hub.add("vl/model", {"config.json": _config(), "model.safetensors": fakehub.safetensors(_tensors(extra))})
    r = estimate(_doc("vl/model"))
    (note,) = [a for a in r.assumptions if "safetensors headers" in a]
    assert note.startswith("not modelled: the checkpoint holds 544,032,768 parameters")
    assert "models 494,032,768 (+10.1%)" in note and "vision tower" in note
    # a repository with no safetensors weights: no checkpoint record, the estimate from config.json alone
    fake_hub.add("bin/only", {"config.json": _config(), "pytorch_model.bin": b"x"})
    assert "checkpoint" not in estimate(_doc("bin/only")).model


def test_the_traced_engine_builds_a_hub_id_from_the_cache(fake_hub: fakehub.FakeHub) -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as trace_estimate

    fake_hub.add(COPY, {"config.json": _config(), "model.safetensors": fakehub.safetensors(_tensors())})
    doc = {**_doc(COPY), "inference": {"batch_size": 1, "prompt_len": 64, "new_tokens": 8}}
    hub = trace_estimate(doc)
    seen = len(fake_hub.requests)
    catalog = trace_estimate({**doc, "model": BASE})
    assert hub.per_gpu == catalog.per_gpu and hub.model["checkpoint"]["parameters"] == PARAMS
    assert len(fake_hub.requests) == seen


def test_offline_with_the_config_cached_but_not_the_headers_says_so(fake_hub: fakehub.FakeHub,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add(COPY, {"config.json": _config(), "model.safetensors": fakehub.safetensors(_tensors())})
    online = estimate(_doc(COPY))
    commit = fake_hub.repos[COPY].commit
    summary = Path(os.environ["HF_HOME"]) / "vramplan" / "safetensors" / "models--someone--qwen-copy" / f"{commit}.json"
    summary.unlink()
    seen = len(fake_hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = estimate(_doc(COPY))
    assert len(fake_hub.requests) == seen and "checkpoint" not in r.model
    assert r.per_gpu == online.per_gpu
    assert any(a.startswith("checkpoint: the safetensors headers of someone/qwen-copy") and "not cached" in a
               for a in r.assumptions)


_json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), _json_values | st.fixed_dictionaries(
    {"dtype": st.sampled_from(["BF16", "F32", "U8", "F4", "X9"]), "shape": st.lists(st.integers(0, 64), max_size=3),
     "data_offsets": st.lists(st.integers(0, 10**6), min_size=2, max_size=2)}), max_size=6))
def test_any_safetensors_header_is_summed_or_refused(header: dict[str, Any]) -> None:
    """Whatever JSON a header holds: a ScenarioError, or sums that agree with its entries."""
    from vramplan.catalog.hub import _tensor_sums

    try:
        tensors, elements, by_dtype = _tensor_sums(header, "o/n", "model.safetensors")
    except ScenarioError:
        return
    entries = [v for k, v in header.items() if k != "__metadata__"]
    assert tensors == len(entries)
    assert sum(by_dtype.values()) == sum(v["data_offsets"][1] - v["data_offsets"][0] for v in entries)
    assert elements == sum(math.prod(v["shape"]) for v in entries)


@given(st.text(max_size=60))
def test_hub_ids_are_owner_slash_name(name: str) -> None:
    from vramplan.catalog.hub import parse_hub_id

    parsed = parse_hub_id(name)
    if parsed is not None:
        repo, revision = parsed
        owner, _, rest = repo.partition("/")
        assert owner and rest and "/" not in rest and ".." not in repo and revision
        assert name.strip() in (repo, f"{repo}@{revision}")


def test_a_catalog_estimate_never_imports_huggingface_hub() -> None:
    """The catalog answers without the Hub client: huggingface_hub is imported only for a Hub id."""
    import subprocess
    import sys

    code = ("import sys; from vramplan import estimate; "
            "estimate({'model': 'llama-2-7b', 'hardware': {'gpu': 'A100-80GB'}}); "
            "assert 'huggingface_hub' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1],
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
