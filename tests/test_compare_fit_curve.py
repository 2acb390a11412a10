"""The library functions behind the web page: compare, every GPU's fit, the serving concurrency curve."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vramplan.catalog.gpus import list_gpus
from vramplan.catalog.resolve import resolve
from vramplan.compare import compare, differing_keys
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.plan.every_gpu import fit_on_every_gpu, smallest_fitting_counts
from vramplan.serve.curve import concurrency_curve, default_lengths
from vramplan.spec.load import read_document

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_differing_keys_are_dotted_leaves_in_first_seen_order() -> None:
    a = {"a": 1, "b": {"c": 2, "l": [1, 2]}, "e": {}}
    b = {"a": 1, "b": {"c": 3, "l": [1, 2], "d": 0}, "e": {}}
    # b.c differs, b.d is missing from the first; a list compares whole; an empty mapping is one leaf
    assert differing_keys([a, b]) == ["b.c", "b.d"]
    assert differing_keys([a, a, a]) == []
    assert differing_keys([{"l": [1, 2]}, {"l": [2, 1]}]) == ["l"]


def test_compare_estimates_each_and_names_what_differs() -> None:
    lora = read_document(EXAMPLES / "lora-llama3-8b-a10g.yaml")
    out = compare([lora, {**lora, "train": {**lora["train"], "seq_len": 2048}}])
    assert [r["scenario"]["train"]["seq_len"] for r in out["reports"]] == [1024, 2048]
    assert out["reports"][0] == estimate(lora).to_json_dict()
    assert "scenario.train.seq_len" in out["differing_keys"]
    assert "per_gpu.breakdown.activations" in out["differing_keys"]
    assert "per_gpu.breakdown.weights" not in out["differing_keys"]  # the weights do not depend on seq_len
    with pytest.raises(ScenarioError):
        compare([lora], engine="guess")


def test_fit_on_every_gpu_is_the_estimate_on_each() -> None:
    doc = read_document(EXAMPLES / "qlora-7b-rtx4090.yaml")
    rows = fit_on_every_gpu(doc)
    assert sorted(r.gpu for r in rows) == sorted(g.name for g in list_gpus())
    for name in ("T4", "H100-SXM"):
        (row,) = [r for r in rows if r.gpu == name]
        rep = estimate({**doc, "hardware": {**doc["hardware"], "gpu": name}})
        assert (row.device_used_bytes, row.headroom_bytes) == (rep.per_gpu.device_used_bytes, rep.per_gpu.headroom_bytes)
        assert row.verdict == rep.verdict and rep.verdict in ("FITS", "MAY NOT FIT", "DOES NOT FIT")
    # no GPU named: each row names its own
    assert len(fit_on_every_gpu({k: v for k, v in doc.items() if k != "hardware"})) == len(rows)


def test_smallest_fitting_count_of_llama3_8b_fsdp() -> None:
    """Llama 3 8B (8,030,261,248 parameters), bf16-mixed AdamW, FSDP full shard: the smallest of 1, 2, 4, 8
    H100-SXM (85,017,755,648 bytes) that FITS is 4.

    One GPU: fp32 weights + fp32 gradients + two fp32 Adam moments = 16 B a parameter, unsharded:
    16 x 8,030,261,248 = 128,484,179,968 bytes > 85,017,755,648 before any activation: DOES NOT FIT.
    Two: the states halve (Adam moments 8 x 8,030,261,248 / 2 = 32,121,044,992 bytes) and the point estimate
    fits, but the calibrated band's high bound does not (MAY NOT FIT, report/band.py).  Four: FITS."""
    doc = read_document(EXAMPLES / "llama3-8b-fsdp-8xh100.yaml")
    rows = smallest_fitting_counts(doc)
    assert len(rows) == len(list_gpus())  # one row a GPU
    (h100,) = [r for r in rows if r.gpu == "H100-SXM"]
    assert (h100.num_gpus, h100.verdict) == (4, "FITS")
    every = fit_on_every_gpu(doc, [1, 2, 4])
    by = {r.num_gpus: r for r in every if r.gpu == "H100-SXM"}
    one = estimate(resolve({**doc, "hardware": {"gpu": "H100-SXM", "num_gpus": 1}})).per_gpu.breakdown
    assert one["weights"] + one["gradients"] + one["optimizer_states"] == 16 * 8_030_261_248
    assert by[1].verdict == "DOES NOT FIT" and by[2].verdict == "MAY NOT FIT"
    assert by[2].device_used_bytes is not None and by[2].device_used_bytes <= by[2].capacity_bytes
    assert h100.device_used_bytes == by[4].device_used_bytes
    # a GPU on which no count fits keeps its largest count's row: an RTX 4090 (23.6 GiB) even with 8
    (rtx,) = [r for r in rows if r.gpu == "RTX-4090"]
    assert (rtx.num_gpus, rtx.verdict) == (8, "DOES NOT FIT")


def test_default_lengths() -> None:
    assert default_lengths(8192) == [512, 1024, 2048, 4096, 8192]
    assert default_lengths(5000) == [512, 1024, 2048, 4096, 5000]
    assert default_lengths(300) == [300]


def test_concurrency_curve_is_blocks_over_blocks_per_request() -> None:
    r = resolve(read_document(EXAMPLES / "llama3-8b-serve-h100.yaml"))
    from vramplan.serve.vllm import decide

    blocks = decide(r, version=r.scenario.serve.vllm_version).num_gpu_blocks
    points = concurrency_curve(r, [1000, 4096])
    # full attention, 16-token blocks: 1000 tokens take ceil(1000 / 16) = 63 blocks, 4096 take 256
    assert [p.max_concurrency for p in points] == [round(blocks / 63, 4), round(blocks / 256, 4)]
    assert math.isclose(points[0].max_concurrency / points[1].max_concurrency, 256 / 63, rel_tol=1e-3)
