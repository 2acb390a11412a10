"""The analytic engine against the H100 runs of ``benchmarks/gpu/h100-2026-11-27f`` (``measure_h200.py --set h100f``,
written before it ran, with nothing in the engines changed for it): families added since ``h100e`` and never measured
on a GPU (LFM2's short convolutions, MiniMax's lightning attention, Qwen3-Next's gated DeltaNet on transformers 5.17's
torch fallback, RecurrentGemma's RG-LRU, Gemma 3n's AltUp text model, Zamba2 on the 5.17 Mamba2 scan, Falcon-Mamba),
and LFM2 and Qwen3-Next training.  Each row's scenario is re-estimated with the releases that ran (torch 2.11,
transformers 5.17).  ``max_memory_allocated`` is within 2.0% on all nine (the worst, -2.0%, Qwen3-Next's generate);
reserved bytes are under on eight of nine (the caching allocator's cached blocks, replayed for dense models only), and
the band's high bound covers every row but Qwen3-Next's generate (14,589,886,464 B reserved measured, 13,662,645,693 B
high bound as it ran): that row is the known gap the test pins, so a change that moves it is seen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramplan.engine import estimate

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h100-2026-11-27f" / "results.jsonl"
ROWS = [json.loads(line) for line in RUN.read_text().splitlines()]
MEASURED = {r["id"]: r for r in ROWS if r["rc"] == 0}
# reserved bytes above the band's high bound, as the engine stands (module docstring)
RESERVED_OUTSIDE_BAND = {"qwen3next-synth-gen-b4-p4096"}


def test_the_run_is_what_the_list_says() -> None:
    # nine scenarios, all measured; Gemma 3n's first call failed on random ids past its per-layer vocabulary and
    # its row is the second call's (log.txt)
    assert len(MEASURED) == 9 == len(ROWS)
    assert {r["run"] for r in ROWS} == {"first call", "second call"}
    assert [r["id"] for r in ROWS if r["run"] == "second call"] == ["gemma3n-e4b-text-gen-b4"]


def _report(sid: str) -> tuple[Any, dict[str, Any]]:
    res = MEASURED[sid]["result"]
    doc: dict[str, Any] = dict(res["scenario"])
    doc["software"] = {**(doc.get("software") or {}), "transformers": "5.17", "torch": "2.11"}
    return estimate(doc), res


@pytest.mark.parametrize("sid", sorted(MEASURED))
def test_allocated_within_two_percent(sid: str) -> None:
    rep, res = _report(sid)
    measured_alloc = res["peak_allocated_bytes"]
    err = (rep.per_gpu.peak_allocated_bytes - measured_alloc) / measured_alloc
    assert abs(err) < 0.021, (sid, err)


@pytest.mark.parametrize("sid", sorted(MEASURED))
def test_reserved_high_bound(sid: str) -> None:
    rep, res = _report(sid)
    hi = rep.per_gpu.peak_reserved_bytes_high
    assert hi is not None
    assert (hi >= res["peak_reserved_bytes"]) == (sid not in RESERVED_OUTSIDE_BAND), (sid, hi, res["peak_reserved_bytes"])
