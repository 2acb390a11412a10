"""Solvers: the answer fits with the margin and its band (verdict FITS), and one step further does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.plan import solve, solve_max_batch, solve_max_seq, solve_min_gpus
from vramplan.plan.fit import fits_with_margin
from vramplan.spec.load import read_document

EX = Path(__file__).resolve().parents[1] / "examples"


def _used(doc: dict[str, Any]) -> int:
    return estimate(doc).per_gpu.device_used_bytes


def _ok(doc: dict[str, Any], margin: float = 0.1) -> bool:
    """Within (1 - margin) of the capacity and verdict FITS (plan/fit.py)."""
    return fits_with_margin(estimate(doc), margin)


def _with(doc: dict[str, Any], section: str, key: str, value: int) -> dict[str, Any]:
    return {**doc, section: {**doc[section], key: value}}


@pytest.mark.parametrize("margin", [0.1, 0.25])
def test_max_micro_batch(margin: float) -> None:
    res = solve_max_batch(EX / "qlora-7b-rtx4090.yaml", margin)
    assert res.value is not None and res.value >= 1 and res.report is not None
    doc = res.scenario
    assert doc["train"]["micro_batch_size"] == res.value
    assert _used(doc) <= res.usable_bytes and estimate(doc).verdict == "FITS"
    assert not _ok(_with(doc, "train", "micro_batch_size", res.value + 1), margin)
    assert res.probes < 30  # doubling then bisection, not a scan


def test_max_batch_inference_and_serve() -> None:
    inf = solve_max_batch(EX / "llama2-7b-inference-a100.yaml")
    assert inf.value is not None and inf.knob == "inference.batch_size"
    assert _ok(inf.scenario) and not _ok(_with(inf.scenario, "inference", "batch_size", inf.value + 1))
    srv = solve_max_batch(EX / "llama3-8b-serve-h100.yaml")
    # the concurrency the band's low KV pool holds, below the point's
    assert srv.report is not None and srv.value == srv.report.serve.max_concurrency_low
    assert 0 < srv.value < srv.report.serve.max_concurrency


def test_max_seq_len() -> None:
    res = solve_max_seq(EX / "llama2-7b-zero3-ckpt-8xa100.yaml")
    assert res.value is not None and res.value <= 4096  # Llama 2's context length caps the search
    doc = res.scenario
    assert _ok(doc)
    if res.value < 4096:
        assert not _ok(_with(doc, "train", "seq_len", res.value + 1))
    long = solve_max_seq({**read_document(EX / "llama2-7b-full-naive-a100.yaml")}, 0.1)
    assert long.value is None  # 16 B/parameter does not fit at any length


def test_min_gpus() -> None:
    res = solve_min_gpus(EX / "llama2-7b-zero3-ckpt-8xa100.yaml")
    assert res.value is not None and res.report is not None
    assert res.report.per_gpu.device_used_bytes <= res.usable_bytes and res.report.verdict == "FITS"
    if res.value > 1:
        fewer = _with(res.scenario, "hardware", "num_gpus", res.value - 1)
        assert not _ok(fewer)
    # plain data parallelism does not shrink per GPU with more GPUs: no count fits
    ddp = solve_min_gpus(EX / "llama2-7b-full-naive-a100.yaml")
    assert ddp.value is None and "ZeRO-3" in ddp.note


def test_unknown_solver() -> None:
    with pytest.raises(ScenarioError, match="max-batch"):
        solve("max-bach", EX / "qlora-7b-rtx4090.yaml")
