"""transformers before 5.18 runs the torch Mamba2 scan with broadcast products (facts/transformers.py
``MAMBA2_SCAN_EINSUM_RELEASE``): the prefill holds the largest one, each mixer's backward two.  Found when two
synthetic-Bamba scenarios ran out of memory on an H100 under transformers 5.17 (benchmarks/gpu/h100-2026-11-27,
made by benchmarks/gpu/measure_h200.py ``--set h100c``); checked after the change on the same GPU at sizes that
fit (``h100-2026-11-27d``) and under transformers 5.24 (``h100-2026-11-27d-tf524``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramplan.analytic.ssm_state import broadcast_product_bytes
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.transients import mixer_scan_products
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.facts.transformers import mamba2_scan_broadcasts

ROOT = Path(__file__).resolve().parents[1]
SYNTH = str(ROOT / "benchmarks/gpu/configs/bamba-synthetic-2b.json")
GPU = ROOT / "benchmarks/gpu"


def _inference(version: str | None, batch: int = 8, prompt: int = 2048) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": SYNTH, "task": "inference", "hardware": {"gpu": "H100"},
                           "inference": {"dtype": "bf16", "batch_size": batch, "prompt_len": prompt, "new_tokens": 64}}
    if version:
        doc["software"] = {"transformers": version}
    return doc


def _train(version: str | None, seq: int = 2048) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": SYNTH, "hardware": {"gpu": "H100"},
                           "train": {"precision": "bf16-true", "optimizer": "adamw", "micro_batch_size": 1,
                                     "seq_len": seq}}
    if version:
        doc["software"] = {"transformers": version}
    return doc


def test_release_threshold() -> None:
    assert mamba2_scan_broadcasts((5, 17, 0)) and mamba2_scan_broadcasts((4, 57, 6))
    assert not mamba2_scan_broadcasts((5, 18, 0)) and not mamba2_scan_broadcasts(None)
    assert not mamba2_scan_broadcasts((5, 18)) and mamba2_scan_broadcasts((5, 17))  # "5.18" parses as (5, 18)


def test_largest_product_by_hand() -> None:
    ms = resolve(_inference(None)).model.mamba
    assert ms is not None
    # 64 heads of 64 (I = 4,096), state 128, chunk 256; 8 x 2,048 tokens -> P = 16,384, 8 chunks a sequence.
    # G: 16,384 x 256 x 64 x 128 x 4 = 137,438,953,472 (128 GiB, what the H100 was asked for);
    # Y_diag: 16,384 x 256 x 4,096 x 4 = 68,719,476,736; states: 16,384 x 4,096 x 128 x 4 = 34,359,738,368;
    # recurrence: 8 x 9^2 x 4,096 x 128 x 4 = 1,358,954,496
    assert broadcast_product_bytes(ms, 8, 2048) == 137_438_953_472 == 128 * 2**30
    # one sequence of 100 tokens pads to one chunk of 256: G 256 x 256 x 64 x 128 x 4 = 2,147,483,648
    assert broadcast_product_bytes(ms, 1, 100) == 2_147_483_648
    # chunk 256 with a 16-head, state-16 model: Y_diag's P l I (256 x 256 x 4,096 x 4) beats G's P l H n
    small = ms.__class__(**{**ms.__dict__, "n_heads": 16, "head_dim": 256, "state_size": 16})
    assert broadcast_product_bytes(small, 1, 256) == 256 * 256 * 4096 * 4


def test_prefill_adds_the_product_before_5_18() -> None:
    ms = resolve(_inference(None)).model.mamba
    assert ms is not None
    old, new = estimate(_inference("5.17")), estimate(_inference("5.18"))
    assert estimate(_inference(None)).per_gpu.peak_allocated_bytes == new.per_gpu.peak_allocated_bytes
    # the prefill is the peak in both; the mixer's moment is the attention layer's larger one in neither
    assert old.per_gpu.peak_allocated_bytes - new.per_gpu.peak_allocated_bytes == broadcast_product_bytes(ms, 8, 2048)
    assert old.verdict == "DOES NOT FIT" and new.verdict == "FITS"
    assert any("transformers 5.17 (before 5.18) materializes" in a for a in old.assumptions)
    assert any("set software.transformers" in a for a in estimate(_inference(None)).assumptions)


def test_backward_term_is_two_products_at_each_mixer() -> None:
    r_old, r_new = resolve(_train("5.17")), resolve(_train(None))
    ms = r_old.model.mamba
    assert ms is not None
    terms = mixer_scan_products(StepContext(r_old, 0, "sdpa", 1))
    # one term a mixer layer (24 layers, attention at 5, 11, 17, 23: 20 mixers), each 2 x G's product for one
    # sequence of 2,048 tokens: 2 x 2,048 x 256 x 64 x 128 x 4 = 34,359,738,368
    assert len(terms) == 20 and {t.nbytes for t in terms} == {34_359_738_368}
    assert mixer_scan_products(StepContext(r_new, 0, "sdpa", 1)) == []
    assert estimate(_train("5.17")).per_gpu.peak_allocated_bytes > estimate(_train(None)).per_gpu.peak_allocated_bytes


def _rows(folder: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (GPU / folder / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("row", [r for r in _rows("h100-2026-11-27") if r["id"].startswith("bamba-")],
                         ids=lambda r: r["id"])
def test_h100c_ooms_are_not_called_fits(row: dict[str, Any]) -> None:
    """The two scenarios that ran out of memory under transformers 5.17 are no longer FITS when told the release."""
    assert row["rc"] != 0 and "CUDA out of memory" in row["stderr_tail"]
    doc = _inference("5.17") if "gen" in row["id"] else _train("5.17")
    assert estimate(doc).verdict in ("DOES NOT FIT", "MAY NOT FIT")


@pytest.mark.parametrize(("folder", "version"), [("h100-2026-11-27d", "5.17"), ("h100-2026-11-27d-tf524", None)])
def test_measured_on_h100_within_4_percent_allocated(folder: str, version: str | None) -> None:
    """transformers 5.17 at sizes that fit: +3.8% (train) and +1.6% (generate) allocated; 5.24's einsum scan:
    -0.2% and -1.8% (benchmarks/gpu/*/compare-now.md)."""
    for row in _rows(folder):
        flags = row["flags"]
        train = "train" in flags
        def value(f: str, flags: list[str] = flags) -> int:
            return int(flags[flags.index(f) + 1])
        doc = (_train(version, value("--seq-len")) if train
               else _inference(version, value("--batch-size"), value("--prompt-len")))
        if not train:
            doc["inference"]["new_tokens"] = value("--new-tokens")
        doc["software"] = {**doc.get("software", {}), "torch": "2.11"}
        predicted = estimate(doc).per_gpu.peak_allocated_bytes
        measured = row["result"]["peak_allocated_bytes"]
        assert abs(predicted - measured) / measured < 0.04, (row["id"], predicted, measured)
        if version:  # the older path is bounded from above: never under
            assert predicted >= measured


def test_measure_refuses_a_hybrid_shrunk_to_its_mixers() -> None:
    """--layers 2 keeps none of the synthetic Bamba's attention layers (5, 11, 17, 23): generate cannot run there
    (transformers' cache reads its length from an attention layer), so measure refuses before building it."""
    from vramplan.errors import ScenarioError
    from vramplan.measure.config import shrink

    doc = {"model": SYNTH, "task": "inference", "hardware": {"gpu": "H100"}}
    with pytest.raises(ScenarioError) as err:
        shrink(doc, layers=2)
    text = str(err.value)
    assert "bamba-synthetic-2b" in text and "use --layers 6 or more" in text
    kept = shrink(doc, layers=6)["model"]
    assert kept["attn_layer_indices"] == [5] and kept["num_hidden_layers"] == 6
    # a training step needs no cache: shrinking to mixers alone is allowed there
    assert shrink({**doc, "task": "train"}, layers=2)["model"]["attn_layer_indices"] == []


def test_split_segment_bound_on_the_h100_oom() -> None:
    """Mamba-Codestral-7B (128 heads of 64, state 128, chunk 256, 64 Mamba2 layers) under transformers 5.17, 2 x
    1,024-token prompts: G's product is 2 x 1,024 x 256 x 128 x 128 x 4 = 34,359,738,368 B (32 GiB).  On the H100
    the second layer's 32 GiB request failed with 14.58 GiB allocated and 32.20 GiB cached (the first product's
    segment, split): the point estimate of allocated bytes was right (47.81 GiB), the reserved one kept the segment
    reused, and it said FITS.  The high bound now adds one product, and the verdict is MAY NOT FIT."""
    (row,) = [json.loads(line) for line in (GPU / "h100-2026-11-27e/results.jsonl").read_text().splitlines()
              if json.loads(line)["id"] == "mamba-codestral-gen-b2-tf517"]
    assert "Tried to allocate 32.00 GiB" in row["stderr_tail"] and "32.20 GiB is reserved" in row["stderr_tail"]
    doc = {"model": "mistralai/Mamba-Codestral-7B-v0.1", "task": "inference", "hardware": {"gpu": "H100"},
           "software": {"transformers": "5.17"},
           "inference": {"dtype": "bf16", "batch_size": 2, "prompt_len": 1024, "new_tokens": 32}}
    rep = estimate(doc)
    pg = rep.per_gpu
    assert pg.reserved_excess_high_bytes == 34_359_738_368 == 32 * 2**30
    assert pg.peak_reserved_bytes_high == pg.peak_reserved_bytes + 34_359_738_368
    assert pg.device_used_bytes_high is not None and pg.device_used_bytes_high > pg.capacity_bytes
    assert rep.verdict == "MAY NOT FIT" and rep.fits
    assert any("split_product_excess_bytes" in a for a in rep.assumptions)
    # 5.18 and later (the einsum scan): no product, no excess, no statement
    doc["software"] = {"transformers": "5.18"}
    later = estimate(doc)
    assert later.per_gpu.reserved_excess_high_bytes == 0
    assert not any("split_product_excess_bytes" in a for a in later.assumptions)


def test_split_segment_bound_in_training() -> None:
    # the synthetic Bamba, 1 x 1,024 tokens under 5.17: G's product 1,024 x 256 x 64 x 128 x 4 = 8,589,934,592 B;
    # the measured step (h100-2026-11-27d: 41.26 GiB allocated, 44.82 reserved) stays inside the widened bound
    rep = estimate(_train("5.17", seq=1024))
    assert rep.per_gpu.reserved_excess_high_bytes == 8_589_934_592
    hi = rep.per_gpu.peak_reserved_bytes_high
    assert hi is not None and hi >= rep.per_gpu.peak_reserved_bytes + 8_589_934_592 > int(44.82 * 2**30)
