"""The calibrated band and the verdict (report/band.py), and the freshness of the shipped calibration."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vramplan import estimate
from vramplan.report import PerGpu, Report
from vramplan.report.band import (
    CALIBRATION_FILE,
    Residual,
    band_bounds,
    conformal_quantile,
    fit_calibration,
    load_calibration,
    loso_coverage,
    verdict_for,
    with_band,
)

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "validation" / "published.yaml"
CAL_PATH = ROOT / "src" / "vramplan" / "report" / CALIBRATION_FILE


def test_conformal_quantile_one_row_per_source() -> None:
    # 9 sources of one row: target 0.9 x (9 + 1) = 9 -> the 9th smallest, 0.09 (split conformal's
    # ceil((n + 1) x 0.9)-th order statistic)
    scores = [0.05, 0.01, 0.03, 0.02, 0.04, 0.08, 0.06, 0.07, 0.09]
    assert conformal_quantile(scores) == 0.09
    # 8 sources: 0.9 x 9 = 8.1 > 8, the quantile is infinite
    assert conformal_quantile(scores[:8]) is None


def test_conformal_quantile_weighs_sources_equally() -> None:
    # 18 sources of one row (0.01 .. 0.18, mass 1 each) and source A of 10 rows at 0.50 (mass 0.1 each);
    # G = 19, target 0.9 x 20 = 18.0: the 18 single rows reach mass 18 at 0.18, so q = 0.18.
    # Weighting rows instead (n = 28) would give the ceil(29 x 0.9) = 27th smallest, 0.50: A alone would set it.
    scores = [round(0.01 * i, 2) for i in range(1, 19)] + [0.50] * 10
    groups = [f"s{i}" for i in range(1, 19)] + ["A"] * 10
    assert conformal_quantile(scores, groups) == 0.18
    assert conformal_quantile(scores) == 0.50  # one group per row


def test_band_bounds_by_hand() -> None:
    # 1000 x e^-0.1 = 904.84 -> 904 (down); 1000 x e^0.1 = 1105.17 -> 1106 (up)
    assert band_bounds(1000, 0.1) == (904, 1106)
    assert band_bounds(1000, 0.0) == (1000, 1000)


def _cal(q: float, n_sources: int = 9) -> object:
    rows = [Residual(id=f"r{i}", source=f"s{i}", engine="fake", workload="train-full", quantity="device_used",
                     log_ratio=q) for i in range(n_sources)]
    return fit_calibration(rows)


def _report(capacity: int, assumptions: list[str] | None = None) -> Report:
    # allocated 500, reserved 800, outside 200: device used 1000 (Report.check)
    pg = PerGpu(capacity_bytes=capacity, peak_allocated_bytes=500, peak_reserved_bytes=800, device_used_bytes=1000,
                headroom_bytes=capacity - 1000, peak_phase="backward", breakdown={"weights": 500},
                outside_allocator={"cuda_context": 200})
    return Report(engine="fake", fits=1000 <= capacity, per_gpu=pg, assumptions=assumptions or [],
                  scenario={"task": "train", "train": {"peft": None}})


def test_verdict_boundaries() -> None:
    assert verdict_for(True, 2000, 2000) == "FITS"          # high bound exactly at capacity
    assert verdict_for(True, 2001, 2000) == "MAY NOT FIT"   # one byte over
    assert verdict_for(False, 500, 2000) == "DOES NOT FIT"  # the point does not fit
    # through the report: q = ln 2, every quantity's high bound doubles: device used 1000 -> 2000
    # (reserved 800 -> 1600, + 200 outside = 1800 < 2000, so the device-used band decides)
    cal = _cal(math.log(2))
    at = with_band(_report(2000), cal)  # type: ignore[arg-type]
    over = with_band(_report(1999), cal)  # type: ignore[arg-type]
    assert at.per_gpu.device_used_bytes_high == 2000 and at.verdict == "FITS"
    assert over.per_gpu.device_used_bytes_high == 2000 and over.verdict == "MAY NOT FIT"
    assert with_band(_report(999), cal).verdict == "DOES NOT FIT"  # type: ignore[arg-type]
    assert at.per_gpu.peak_allocated_bytes_low == 250 and at.per_gpu.peak_reserved_bytes_high == 1600
    assert at.fits and over.fits  # the point verdict is unchanged


def test_high_bound_respects_reserved_plus_outside() -> None:
    # a device-used class narrower than the reserved one: used_high = max(1000 x e^q_u, reserved_high + 200)
    rows = [Residual(id=f"u{i}", source=f"s{i}", engine="fake", workload="train-full", quantity="device_used",
                     log_ratio=0.0) for i in range(9)]
    rows += [Residual(id=f"r{i}", source=f"s{i}", engine="fake", workload="train-full", quantity="reserved",
                      log_ratio=math.log(2)) for i in range(9)]
    rep = with_band(_report(4000), fit_calibration(rows))
    assert rep.per_gpu.peak_reserved_bytes_high == 1600 and rep.per_gpu.device_used_bytes_high == 1800


def test_not_modelled_widens_to_the_worst_class() -> None:
    rows = [Residual(id=f"u{i}", source=f"s{i}", engine="fake", workload="train-full", quantity="device_used",
                     log_ratio=0.1) for i in range(9)]
    rows += [Residual(id=f"k{i}", source=f"s{i}", engine="fake", workload="serve", quantity="kv_cache",
                      log_ratio=0.5) for i in range(9)]
    cal = fit_calibration(rows)
    plain = with_band(_report(4000), cal)
    wide = with_band(_report(4000, ["not modelled: clip_qkv"]), cal)
    # plain: class fake/train-full/device_used, 9 sources, q 0.1: 1000 x e^0.1 = 1105.2 -> 1106
    assert plain.per_gpu.device_used_bytes_high == 1106
    # widened: the engine's widest class, fake/serve (q 0.5): 1000 x e^0.5 = 1648.7 -> 1649
    assert wide.per_gpu.device_used_bytes_high == 1649
    assert any(a.startswith("band widened") for a in wide.assumptions)
    assert not any(a.startswith("band widened") for a in plain.assumptions)


def test_small_class_falls_back_and_says_so() -> None:
    # 3 sources for train-full/device_used: too few (9 needed), so the engine's pooled class answers
    rows = [Residual(id=f"u{i}", source=f"s{i}", engine="fake", workload="train-full", quantity="device_used",
                     log_ratio=0.3) for i in range(3)]
    rows += [Residual(id=f"a{i}", source=f"t{i}", engine="fake", workload="inference", quantity="allocated",
                      log_ratio=0.05) for i in range(9)]
    cal = fit_calibration(rows)
    q, key = cal.lookup("fake", "train-full", "device_used")
    assert key == "fake" and q == 0.3  # 12 sources pooled: target 0.9 x 13 = 11.7 -> the 12th smallest, 0.3
    rep = with_band(_report(4000), cal)
    assert rep.band["classes"]["device_used"]["class"] == "fake"


def test_loso_coverage_by_hand() -> None:
    # 10 sources, one row each, |r| = 0.01 .. 0.10.  Leaving out source i, 9 remain: q = the largest of them.
    # Covered unless the left-out row is the largest of all (0.10 > 0.09): 9 of 10.
    rows = [Residual(id=f"r{i}", source=f"s{i}", engine="fake", workload="inference", quantity="allocated",
                     log_ratio=-0.01 * i) for i in range(1, 11)]
    cov = loso_coverage(fit_calibration(rows))
    assert cov["fake/inference/allocated"] == {"n": 10, "covered": 9, "coverage": 0.9}


def test_reports_carry_band_and_verdict() -> None:
    rep = estimate(ROOT / "examples" / "qlora-7b-rtx4090.yaml")
    pg = rep.per_gpu
    assert pg.peak_allocated_bytes_low is not None and pg.peak_allocated_bytes_high is not None
    assert pg.peak_allocated_bytes_low <= pg.peak_allocated_bytes <= pg.peak_allocated_bytes_high
    assert pg.device_used_bytes_low is not None and pg.device_used_bytes_high is not None
    assert pg.device_used_bytes_low <= pg.device_used_bytes <= pg.device_used_bytes_high
    assert rep.verdict == verdict_for(rep.fits, pg.device_used_bytes_high, pg.capacity_bytes)
    srv = estimate(ROOT / "examples" / "llama3-8b-serve-h100.yaml")
    sv = srv.serve
    assert sv.kv_cache_bytes_low is not None and sv.kv_cache_bytes_low < sv.kv_cache_bytes < (sv.kv_cache_bytes_high or 0)
    assert sv.max_concurrency_low is not None and sv.max_concurrency_low <= sv.max_concurrency
    assert srv.verdict == ("FITS" if sv.max_concurrency_low >= 1 else "MAY NOT FIT")


def test_validate_published_band_counts() -> None:
    from vramplan.validate import validate

    res = validate(PUBLISHED, engine="analytic")
    o = res.summary("analytic").overall
    assert o.band_missed_oom == 0  # no FITS for a run that ran out of memory
    assert o.band_fits + o.band_may_not_fit + o.band_does_not_fit == o.n_fits_checked
    assert o.band_n_checked == o.n_error and o.band_coverage is not None and o.band_coverage >= 0.9
    by = res.summary("analytic").by_motivation
    assert set(by) == {"motivated", "not motivated"} and by["motivated"].n_error > 0


# ---- the shipped calibration is the one published.yaml gives today ---------------------------------------

def test_calibration_is_not_stale() -> None:
    """Fails after an engine change or a change of the published set: regenerate the file with
    ``PYTHONPATH=src python benchmarks/calibrate_band.py`` (docs/validation.md, "The band")."""
    from vramplan.validate import validate
    from vramplan.validate.calibrate import calibration_table, dataset_digest, residuals

    doc = json.loads(CAL_PATH.read_text(encoding="utf-8"))
    hint = "stale band calibration: run PYTHONPATH=src python benchmarks/calibrate_band.py"
    assert doc["dataset_digest"] == dataset_digest(PUBLISHED), hint
    stored = {(r["id"], r["engine"]): r for r in doc["residuals"]}
    fresh = residuals(validate(PUBLISHED, engine="analytic"), ("analytic",))
    assert {x.id for x in fresh} == {k[0] for k in stored if k[1] == "analytic"}, hint
    for x in fresh:
        assert stored[(x.id, "analytic")]["log_ratio"] == pytest.approx(x.log_ratio, abs=1e-9), f"{x.id}: {hint}"
    cal = load_calibration()
    assert calibration_table(cal) == doc["classes"], hint
    assert loso_coverage(cal) == doc["loso_coverage"], hint


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the traced engine needs torch")
def test_calibration_trace_sample_is_not_stale() -> None:
    # the traced engine takes minutes over the whole set: one training and one inference row are rescored
    from vramplan.catalog.resolve import resolve
    from vramplan.trace import estimate as trace_estimate
    from vramplan.validate import load_dataset, predicted_quantity

    doc = json.loads(CAL_PATH.read_text(encoding="utf-8"))
    entries = {e.id: e for e in load_dataset(PUBLISHED).entries}
    picked: dict[str, dict[str, object]] = {}
    for r in doc["residuals"]:
        if r["engine"] == "trace" and r["workload"] not in picked:
            picked[r["workload"]] = r
    for r in [picked[w] for w in ("train-peft", "inference") if w in picked]:
        e = entries[str(r["id"])]
        pred = predicted_quantity(trace_estimate(resolve(e.scenario)), e.measured.quantity)
        assert math.log(pred / e.measured.bytes) == pytest.approx(r["log_ratio"], abs=1e-9), (
            "stale band calibration: run PYTHONPATH=src python benchmarks/calibrate_band.py")


def test_cli_headline_shows_verdict_and_band() -> None:
    from vramplan.cli.main import app

    for width in ("60", "200"):
        res = CliRunner().invoke(app, ["estimate", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml")],
                                 env={"COLUMNS": width, "NO_COLOR": "1", "TERM": "dumb"})
        assert res.exit_code == 0
        text = " ".join(res.stdout.split())  # wrapping differs with the width
        rep = estimate(ROOT / "examples" / "qlora-7b-rtx4090.yaml")
        lo, hi = rep.per_gpu.device_used_bytes_low or 0, rep.per_gpu.device_used_bytes_high or 0
        assert f"{rep.verdict}: " in text
        assert f"(band {lo / 2**30:,.2f}-{hi / 2**30:,.2f} GiB)" in text


def test_a_small_class_floors_the_pooled_quantile() -> None:
    """Workload "b" has 20 sources scored 0.01, workload "a" two sources scored 0.3 and 0.1 (too few for a
    quantile of their own).  Pooled: 22 sources, the smallest score whose mass reaches 0.9 x 23 = 20.7 is
    the 21st, 0.1.  Class "a" is floored at its own largest score, 0.3; "b" has its own quantile, 0.01."""
    from vramplan.report.band import Residual, fit_calibration

    rows = [Residual(f"b{i}", f"sb{i}", "e", "b", "allocated", 0.01) for i in range(20)]
    rows += [Residual("a0", "sa0", "e", "a", "allocated", -0.3), Residual("a1", "sa1", "e", "a", "allocated", 0.1)]
    cal = fit_calibration(rows)
    assert cal.classes["e"].quantile == 0.1
    assert cal.lookup("e", "a", "allocated") == (0.3, "e/a/allocated")
    assert cal.lookup("e", "b", "allocated") == (0.01, "e/b/allocated")
    # a class that never measured a quantity falls back to its workload's floor, then the pooled quantile
    assert cal.lookup("e", "a", "reserved") == (0.3, "e/a")
    assert cal.lookup("e", "c", "allocated") == (0.1, "e")
    # inputs not modelled widen to the widest band lookup gives, a small class's floor included
    assert cal.worst("e") == (0.3, "e/a/allocated")
