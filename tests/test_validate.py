"""`vramplan validate`: metrics by hand, rules of thumb by hand, skipped entries, bad files, the shipped set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import MissingExtraError, ScenarioError
from vramplan.report import PerGpu, Report, ServeBlock
from vramplan.spec.load import Resolved
from vramplan.validate import (
    RULES,
    load_dataset,
    parse_dataset,
    percentile,
    predicted_quantity,
    relative_error,
    run_validation,
    summarize,
    to_markdown,
)
from vramplan.validate.metrics import fits_verdict
from vramplan.validate.rules import model_state_shards, weights_bytes

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "validation" / "published.yaml"
runner = CliRunner()
ENV = {"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"}

LLAMA2_7B_PARAMS = 6_738_415_616


# ---------------------------------------------------------------- metrics by hand

def test_relative_error_sign() -> None:
    assert relative_error(9, 10) == pytest.approx(-0.1)
    assert relative_error(12, 10) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        relative_error(1, 0)


def test_percentile_linear_interpolation() -> None:
    xs = [0.5, 0.1, 0.3, 0.2, 0.4]
    assert percentile(xs, 0.5) == pytest.approx(0.3)
    # rank 0.9 * 4 = 3.6 -> 0.4 + 0.6 * (0.5 - 0.4) = 0.46
    assert percentile(xs, 0.9) == pytest.approx(0.46)
    # even count: rank 0.5 * 3 = 1.5 -> (0.2 + 0.3) / 2
    assert percentile([0.4, 0.1, 0.3, 0.2], 0.5) == pytest.approx(0.25)
    assert percentile([7.0], 0.9) == 7.0


def test_fits_verdict() -> None:
    assert fits_verdict(True, "fits") == "correct"
    assert fits_verdict(False, "oom") == "correct"
    assert fits_verdict(False, "fits") == "false_oom"
    assert fits_verdict(True, "oom") == "missed_oom"


def test_summarize_by_hand() -> None:
    s = summarize([-0.1, 0.2, 0.3, -0.4, 0.5, 0.0], ["correct", "correct", "missed_oom", "false_oom"])
    # |e| sorted: 0, .1, .2, .3, .4, .5 -> median (0.2 + 0.3) / 2 = 0.25; p90 rank 4.5 -> 0.45
    assert s.median_abs_error == pytest.approx(0.25)
    assert s.p90_abs_error == pytest.approx(0.45)
    assert (s.under, s.over) == (2, 3)  # the exact hit counts as neither
    assert (s.n_fits_checked, s.fits_correct, s.missed_oom, s.false_oom) == (4, 2, 1, 1)
    assert s.max_abs_error == pytest.approx(0.5)


# ---------------------------------------------------------------- a synthetic dataset and a fake engine

def _entry(i: int, quantity: str, measured: int, outcome: str = "fits", model: str = "gpt2",
           task: str = "train") -> dict[str, Any]:
    scen: dict[str, Any] = {"model": model, "task": task, "hardware": {"gpu": "T4"}}
    if task == "train":
        scen["train"] = {"micro_batch_size": i, "seq_len": 128}
    return {"id": f"e{i}", "source": "synthetic" if i % 2 else "other", "citation": "https://example.org",
            "quote": "x", "scenario": scen,
            "measured": {"quantity": quantity, "bytes": measured, "as_published": str(measured)},
            "outcome": outcome}


def _report(allocated: int, fits: bool) -> Report:
    # each quantity gets a different value, so that comparing the wrong field shows
    pg = PerGpu(capacity_bytes=10**12, peak_allocated_bytes=allocated, peak_reserved_bytes=2 * allocated,
                device_used_bytes=3 * allocated, headroom_bytes=0, peak_phase="x",
                breakdown={"other": allocated}, outside_allocator={"cuda_context": allocated})
    return Report(engine="fake", fits=fits, per_gpu=pg, serve=ServeBlock(kv_cache_bytes=4 * allocated))


# micro_batch_size -> (allocated bytes predicted, fits)
FAKE = {1: (900, True), 2: (1200, True), 3: (1300, True), 4: (600, True), 5: (1500, True),
        6: (100, True), 7: (100, False)}


def fake_engine(r: Resolved) -> Report:
    allocated, fits = FAKE[r.scenario.train.micro_batch_size]
    return _report(allocated, fits)


def synthetic() -> list[dict[str, Any]]:
    return [
        _entry(1, "max_memory_allocated", 1000),   # 900 vs 1000: -10%
        _entry(2, "peak_reserved", 2000),          # reserved 2 x 1200 = 2400 vs 2000: +20%
        _entry(3, "max_memory_allocated", 1000),   # +30%
        _entry(4, "max_memory_allocated", 1000),   # -40%
        _entry(5, "max_memory_allocated", 1000),   # +50%
        _entry(6, "unknown", 16 * 2**30, outcome="oom"),  # engine says fits: the worst failure
        _entry(7, "max_memory_allocated", 500),    # engine says OOM on a run that fitted
        _entry(8, "max_memory_allocated", 500, model="no-such-model"),
    ]


def test_synthetic_metrics_by_hand() -> None:
    res = run_validation(parse_dataset(synthetic()), engines={"fake": fake_engine}, rules=())
    by_id = {e.id: e for e in res.entries}
    assert by_id["e2"].predictions["fake"].compared == "per_gpu.peak_reserved_bytes"
    assert by_id["e2"].predictions["fake"].signed_error == pytest.approx(0.2)
    # e7: 100 vs 500 = -80%, and a false OOM
    assert by_id["e7"].predictions["fake"].signed_error == pytest.approx(-0.8)
    s = res.summary("fake").overall
    # |e| = .1 .2 .3 .4 .5 .8 -> median (.3 + .4) / 2 = .35; p90 rank 4.5 -> .5 + .5 * .3 = .65
    assert s.n_error == 6
    assert s.median_abs_error == pytest.approx(0.35)
    assert s.p90_abs_error == pytest.approx(0.65)
    assert (s.under, s.over) == (3, 3)
    assert (s.n_fits_checked, s.fits_correct, s.missed_oom, s.false_oom) == (7, 5, 1, 1)
    assert res.n_entries == 8 and res.n_resolved == 7 and res.n_usable == 6 and res.n_skipped == 1
    # by source: odd ids are "synthetic": e1 -.1, e3 +.3, e5 +.5, e7 -.8 (e8 is skipped)
    syn = res.summary("fake").by_source["synthetic"]
    assert syn.n_error == 4 and syn.median_abs_error == pytest.approx(0.4) and syn.false_oom == 1
    other = res.summary("fake").by_source["other"]  # e2 +.2, e4 -.4, e6 the missed OOM
    assert other.n_error == 2 and other.missed_oom == 1
    assert res.summary("fake").by_task["train"].n_error == 6
    assert res.summary("fake").by_workload["train-full"].n_error == 6  # no adapters in the synthetic set


def test_not_compared_entry_checks_the_verdict_only() -> None:
    data = synthetic()[:1]
    data[0]["not_compared"] = "sequence lengths came from the data"
    res = run_validation(parse_dataset(data), engines={"fake": fake_engine}, rules=())
    e = res.entries[0]
    # e1 would be -10% if compared; here no error, but the fits verdict (fits, fitted) still counts
    assert e.predictions["fake"].signed_error is None and e.predictions["fake"].verdict == "correct"
    assert not e.usable and res.n_usable == 0
    s = res.summary("fake").overall
    assert s.n_error == 0 and (s.n_fits_checked, s.fits_correct) == (1, 1)
    assert "sequence lengths came from the data" in to_markdown(res)


def test_skipped_entry_is_listed_with_reason() -> None:
    res = run_validation(parse_dataset(synthetic()), engines={"fake": fake_engine}, rules=())
    skipped = res.skipped
    assert [e.id for e in skipped] == ["e8"]
    assert "unknown model 'no-such-model'" in skipped[0].skip_reason
    js = res.to_json_dict()
    assert js["skipped"] == [{"id": "e8", "reason": skipped[0].skip_reason}]


def test_predicted_quantity_fields() -> None:
    rep = _report(10, True)
    assert predicted_quantity(rep, "max_memory_allocated") == 10
    assert predicted_quantity(rep, "max_memory_reserved") == 20
    assert predicted_quantity(rep, "nvidia_smi") == 30
    assert predicted_quantity(rep, "kv_cache") == 40
    assert predicted_quantity(rep, "peak_active") == 10
    # allocated + (device used - reserved) = 10 + 30 - 20
    assert predicted_quantity(rep, "allocated_plus_non_torch") == 20


def test_weights_gpu_reads_the_engine_that_filled_it() -> None:
    rep = _report(10, True)
    # vLLM's and SGLang's reports give all their weights in weights_bytes (weights_gpu_bytes null): "Model loading
    # took" is compared with them, not with 0
    vllm = rep.model_copy(update={"serve": ServeBlock(weights_bytes=50, engine="vllm")})
    assert predicted_quantity(vllm, "weights_gpu") == 50
    # llama.cpp splits them: the GPU's model buffer, not the whole model
    cpp = rep.model_copy(update={"serve": ServeBlock(weights_bytes=50, weights_gpu_bytes=30, weights_host_bytes=20,
                                                     engine="llamacpp")})
    assert predicted_quantity(cpp, "weights_gpu") == 30


def test_unavailable_engine_is_reported_per_entry() -> None:
    def missing(r: Resolved) -> Report:
        raise MissingExtraError("needs pip install 'vramplan[trace]'")

    res = run_validation(parse_dataset(synthetic()), engines={"trace": missing}, rules=())
    ok = [e for e in res.entries if e.status == "ok"]
    assert all(e.predictions["trace"].status == "unavailable" for e in ok)
    assert res.summary("trace").unavailable_reason == "needs pip install 'vramplan[trace]'"
    assert res.summary("trace").overall.not_run == len(ok)
    assert "unavailable: needs pip install" in to_markdown(res)


def test_failing_engine_on_one_entry_does_not_stop_the_others() -> None:
    def flaky(r: Resolved) -> Report:
        if r.scenario.train.micro_batch_size == 3:
            raise ZeroDivisionError("boom")
        return fake_engine(r)

    res = run_validation(parse_dataset(synthetic()), engines={"fake": flaky}, rules=())
    by_id = {e.id: e for e in res.entries}
    assert by_id["e3"].predictions["fake"].status == "error"
    assert "ZeroDivisionError: boom" in by_id["e3"].predictions["fake"].reason
    assert res.summary("fake").overall.n_error == 5 and res.summary("fake").overall.not_run == 1


# ---------------------------------------------------------------- rules of thumb by hand

def _resolved(doc: dict[str, Any]) -> Resolved:
    return resolve(doc)


def test_rules_on_llama2_7b() -> None:
    train = _resolved({"model": "meta-llama/Llama-2-7b-hf", "task": "train", "hardware": {"gpu": "A100-80GB"},
                       "train": {"precision": "bf16-mixed"}})
    rules = {r.key: r for r in RULES}
    # W = 6,738,415,616 x 2 B = 13,476,831,232 B; x4 = 53,907,324,928 B
    assert weights_bytes(train) == 13_476_831_232
    assert rules["rule:weights-x4"].predict(train) == 53_907_324_928
    # 16 x 6,738,415,616 = 107,814,649,856 B
    assert rules["rule:16-bytes-per-param"].predict(train) == 107_814_649_856
    infer = _resolved({"model": "meta-llama/Llama-2-7b-hf", "task": "inference", "hardware": {"gpu": "A100-80GB"},
                       "inference": {"dtype": "fp16"}})
    # 1.2 x 13,476,831,232 = 16,172,197,478.4 -> rounded up
    assert rules["rule:weights+20%"].predict(infer) == 16_172_197_479


def test_rules_shards_and_quantized_weights() -> None:
    fsdp = _resolved({"model": "meta-llama/Llama-2-7b-hf", "task": "train", "hardware": {"gpu": "A100-80GB",
                      "num_gpus": 8}, "parallel": {"fsdp": "full_shard"}})
    assert model_state_shards(fsdp) == 8
    rules = {r.key: r for r in RULES}
    # 107,814,649,856 / 8 = 13,476,831,232
    assert rules["rule:16-bytes-per-param"].predict(fsdp) == 13_476_831_232
    ddp = _resolved({"model": "meta-llama/Llama-2-7b-hf", "task": "train", "hardware": {"gpu": "A100-80GB",
                     "num_gpus": 8}})
    assert model_state_shards(ddp) == 1
    qlora = _resolved({"model": "meta-llama/Llama-2-7b-hf", "task": "train", "hardware": {"gpu": "RTX-4090"},
                       "train": {"quantization": "nf4", "peft": {"method": "qlora"}}})
    # 4-bit payload: 6,738,415,616 / 2 = 3,369,207,808; x4 = 13,476,831,232
    assert weights_bytes(qlora) == 3_369_207_808
    assert rules["rule:weights-x4"].predict(qlora) == 13_476_831_232
    tp = _resolved({"model": "meta-llama/Llama-2-7b-hf", "task": "serve", "hardware": {"gpu": "A100-80GB",
                    "num_gpus": 2}, "parallel": {"tp": 2}, "serve": {"dtype": "fp16"}})
    # 16,172,197,478.4 / 2 = 8,086,098,739.2 -> 8,086,098,740
    assert rules["rule:weights+20%"].predict(tp) == 8_086_098_740


def test_rules_in_the_run_apply_to_their_tasks_only() -> None:
    rows = [_entry(1, "max_memory_allocated", 10**9),
            _entry(2, "max_memory_allocated", 10**9, task="inference")]
    res = run_validation(parse_dataset(rows), engines={}, rules=RULES)
    e1, e2 = res.entries
    assert (e1.workload, e2.workload) == ("train-full", "inference")
    assert e1.predictions["rule:weights-x4"].status == "ok"
    assert e1.predictions["rule:weights+20%"].status == "not_applicable"
    assert e2.predictions["rule:weights+20%"].status == "ok"
    assert e2.predictions["rule:16-bytes-per-param"].status == "not_applicable"
    # gpt2: 124,439,808 params; inference default dtype bf16: W = 248,879,616; x 1.2 = 298,655,539.2
    assert e2.predictions["rule:weights+20%"].predicted_bytes == 298_655_540
    assert e2.predictions["rule:weights+20%"].signed_error == pytest.approx(298_655_540 / 10**9 - 1)


# ---------------------------------------------------------------- bad input: exit 2, clear message

def _invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(("content", "expect"), [
    ("- id: a\n  scenario: {model: gpt2\n", "not valid YAML"),
    ("model: gpt2\n", "must hold a list of entries"),
    ("[]\n", "holds no entries"),
    (("- id: a\n  scenario: {model: gpt2, hardware: {gpu: T4}}\n  measured: {quantity: max_memory_alocated, bytes: 5}\n"
     "  outcome: fits\n"), "did you mean 'max_memory_allocated'?"),
    ("- id: a\n  scenario: {model: gpt2}\n  measured: {quantity: unknown, bytes: 5}\n  outcome: ran\n",
     "entries[0] (a).outcome"),
    (("- id: a\n  scenario: {model: gpt2}\n  measured: {quantity: unknown, bytes: 5}\n  outcome: fits\n"
     "  citaton: x\n"), "did you mean 'citation'?"),
    (("- id: a\n  scenario: {model: gpt2}\n  measured: {quantity: unknown, bytes: 5}\n  outcome: fits\n"
     "- id: a\n  scenario: {model: gpt2}\n  measured: {quantity: unknown, bytes: 5}\n  outcome: fits\n"),
     "duplicate id"),
])
def test_bad_dataset_exits_2(tmp_path: Path, content: str, expect: str) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(content)
    code, out, err = _invoke("validate", str(f))
    assert code == 2
    assert expect in err
    assert "Traceback" not in out + err


def test_missing_dataset_file_and_bad_engine(tmp_path: Path) -> None:
    code, _, err = _invoke("validate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file" in err and "Traceback" not in err
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump([_entry(1, "max_memory_allocated", 10**9)]))
    code, _, err = _invoke("validate", str(f), "--engine", "magic")
    assert code == 2 and "unknown engine 'magic'" in err and "analytic, trace or all" in err


def test_load_dataset_reports_every_problem(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text("- id: a\n  scenario: {model: gpt2}\n  measured: {quantity: x, bytes: -1}\n  outcome: fits\n"
                 "- 3\n")
    with pytest.raises(ScenarioError) as exc:
        load_dataset(f)
    text = str(exc.value)
    assert "measured.quantity" in text and "measured.bytes" in text and "entries[1]" in text


# ---------------------------------------------------------------- the CLI on a small file

def test_cli_json_and_markdown(tmp_path: Path) -> None:
    rows = [_entry(1, "max_memory_allocated", 10**9), _entry(8, "max_memory_allocated", 10**9, model="nope")]
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(rows))
    code, out, _ = _invoke("validate", str(f), "--engine", "analytic", "--json")
    assert code == 0
    js = json.loads(out)
    assert {p["key"] for p in js["predictors"]} == {"analytic", *(r.key for r in RULES)}
    assert js["n_skipped"] == 1 and js["skipped"][0]["id"] == "e8"
    e1 = js["entries"][0]
    assert e1["predictions"]["analytic"]["compared"] == "per_gpu.peak_allocated_bytes"
    code, out, _ = _invoke("validate", str(f), "--engine", "analytic", "--markdown")
    assert code == 0 and "| predictor | applies to | n | median abs err |" in out and "`e8`" in out
    code, out, _ = _invoke("validate", str(f), "--engine", "analytic", "--entries")
    assert code == 0 and "analytic" in out and "skipped 1 entry" in out


# ---------------------------------------------------------------- the shipped dataset

def test_shipped_dataset_has_60_usable_cited_entries() -> None:
    ds = load_dataset(PUBLISHED)
    for e in ds.entries:
        assert "https://" in e.citation, e.id
        assert e.quote.strip(), e.id
        assert e.source, e.id
        assert e.measured.as_published.strip(), e.id
    res = run_validation(ds, engines={}, rules=())
    assert res.n_usable >= 60
    # every scenario in the shipped set is valid: an entry is skipped only for a model not in the catalog
    for e in res.skipped:
        assert "unknown model" in e.skip_reason, (e.id, e.skip_reason)
    # the sources the README table names are all there
    assert {"fms-acceleration", "litgpt-resource-tables", "vllm-github"} <= {e.source for e in res.entries}
