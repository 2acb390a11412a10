"""CUDA context: one check per published row, the selection rule by hand, the scenario key and its flag."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vramplan.analytic.overhead import ARCHITECTURE_ORDER, cuda_context, cuda_context_bytes
from vramplan.catalog.contexts import context_rows, parse_size
from vramplan.catalog.gpus import list_gpus, resolve_gpu
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.units import GiB, MiB

REPO = Path(__file__).resolve().parents[1]
ROWS = context_rows()
CATALOG_ARCHS = {(g.vendor, g.architecture) for g in list_gpus()}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_is_sourced_plausible_and_known(row) -> None:
    # a published page, or this project's own GPU measurement file (benchmarks/gpu/)
    assert row.source.startswith("https://") or (REPO / row.source).is_file()
    assert len(row.quote) > 30
    assert row.loading_basis and row.measured
    # a context is more than the driver's bare minimum and less than the eager V100 figure doubled
    assert 64 * MiB <= row.bytes <= 2 * GiB
    assert (row.vendor, row.architecture) in CATALOG_ARCHS
    assert row.module_loading == ("n/a" if row.vendor == "amd" else row.module_loading)
    assert row.module_loading in ("lazy", "eager", "n/a")
    if row.oom:
        assert row.measured.startswith("oom_message")
        assert row.derived_bytes() == row.bytes
        # the printed figures appear verbatim in the quote
        for _, text in row.oom:
            assert text in row.quote or text == "0 bytes"


@pytest.mark.parametrize("row", [r for r in ROWS if not r.source.startswith("https://")], ids=lambda r: r.id)
def test_measured_row_is_the_median_of_its_file(row) -> None:
    """A row from benchmarks/gpu/: its bytes are the median of the file's outside_allocator_bytes for its task
    (NVML used for the process minus torch's reserved bytes, read after each measured step) and the quote is
    a verbatim piece of the file."""
    lines = (REPO / row.source).read_text()
    assert row.quote in lines
    task = "train" if "train" in row.id else "inference"
    values = sorted(json.loads(line)["result"]["outside_allocator_bytes"] for line in lines.splitlines()
                    if json.loads(line)["result"]["task"] == task)
    assert row.bytes == values[len(values) // 2]


def test_row_ids_unique() -> None:
    assert len({r.id for r in ROWS}) == len(ROWS)


def test_parse_size_is_exact() -> None:
    # 264.21 MiB = 264.21 x 1,048,576 = 277,044,264.96 B exactly (x 25 = 6,926,106,624)
    assert parse_size("264.21 MiB") * 25 == 6_926_106_624
    assert parse_size("0 bytes") == 0


def test_turing_lazy_is_median_of_the_four_t4_rows() -> None:
    # 109,062,390 / 128,849,019 / 132,277,862 / 141,715,046 -> (128,849,019 + 132,277,862) // 2
    c = cuda_context("turing", "nvidia", "lazy")
    assert c.bytes == (128_849_019 + 132_277_862) // 2 == 130_563_440
    assert len(c.rows) == 4 and c.fallback == ""


def test_volta_lazy_falls_back_to_nearest_architecture() -> None:
    c = cuda_context("volta", "nvidia", "lazy")
    assert c.bytes == 130_563_440 and c.architecture == "turing"
    assert "nearest architecture" in c.fallback and "turing" in c.assumption()


def test_volta_eager_is_median_of_two_v100_rows() -> None:
    # 400 MiB (PyTorch 1.1) and 1,343 MiB (CUDA 11.2): (419,430,400 + 1,408,237,568) // 2
    c = cuda_context("volta", "nvidia", "eager")
    assert c.bytes == 913_833_984 == int(871.5 * MiB)
    assert set(c.rows) == {"hf-model-memory-anatomy-v100-cuda11.2", "pytorch-20532-v100-p3.8xlarge"}


def test_pascal_falls_back_to_nearest_architecture() -> None:
    # pascal has no row. Lazy: volta (1 step) has no lazy row either; turing (2 steps) has the four
    # T4 rows -> (128,849,019 + 132,277,862) // 2 = 130,563,440 B. Eager: volta's two rows -> 913,833,984 B.
    lazy = cuda_context("pascal", "nvidia", "lazy")
    assert lazy.architecture == "turing" and lazy.bytes == 130_563_440 and "nearest architecture" in lazy.fallback
    eager = cuda_context("pascal", "nvidia", "eager")
    assert eager.architecture == "volta" and eager.bytes == 913_833_984
    # and a catalog Pascal GPU gets it through its architecture
    assert cuda_context_bytes(resolve_gpu("Tesla P100-PCIE-16GB")) == 130_563_440
    assert cuda_context_bytes(replace(resolve_gpu("Tesla P40"), cuda_module_loading="eager")) == 913_833_984


def test_cdna1_falls_back_to_cdna3() -> None:
    # MI100 (cdna1): cdna2 (1 step) has no row, cdna3 (2 steps) has the MI300X row 482,651,341 B
    c = cuda_context("cdna1", "amd", "lazy")
    assert c.architecture == "cdna3" and c.bytes == 482_651_341
    assert cuda_context_bytes(resolve_gpu("MI100")) == 482_651_341


def test_ada_lazy_is_middle_of_three() -> None:
    # 446,693,376 (RTX 6000 Ada) < 517,199,626 (L40S) < 531,229,573 (L40)
    assert cuda_context("ada", "nvidia", "lazy").bytes == 517_199_626


def test_amd_ignores_loading_and_falls_back_within_vendor() -> None:
    # MI300X: 191.98 GiB - 0 - 191.53 GiB - 520 KiB = 483,183,820.8 - 532,480 = 482,651,340.8 -> 482,651,341
    assert cuda_context("cdna3", "amd", "eager").bytes == 482_651_341
    c = cuda_context("cdna2", "amd", "lazy")
    assert c.bytes == 482_651_341 and c.architecture == "cdna3"


def test_unknown_architecture_uses_all_vendor_rows() -> None:
    # 15 NVIDIA lazy rows; the 8th smallest is 525,451,919 B (between the L40S's 517,199,626 and the L40's
    # 531,229,573)
    c = cuda_context("unknown", "nvidia", "lazy")
    assert len(c.rows) == 15 and c.bytes == 525_451_919
    assert "all nvidia lazy rows" in c.fallback


def test_tie_goes_to_the_newer_architecture() -> None:
    older = replace(ROWS[0], id="a", architecture="turing", module_loading="lazy", bytes=100 * MiB)
    newer = replace(ROWS[0], id="b", architecture="ada", module_loading="lazy", bytes=300 * MiB)
    c = cuda_context("ampere", "nvidia", "lazy", rows=(older, newer))
    assert c.architecture == "ada" and c.bytes == 300 * MiB


def test_hopper_lazy_is_the_middle_of_five() -> None:
    # hopper lazy rows: 550,429,000 (an H200 OOM message), 725,614,592 and 794,820,608 (this project's H100
    # measurements after generate and after a training step), 731,906,048 and 794,820,608 (the H200's): the
    # middle of the five is the H200 generate row's
    c = cuda_context("hopper", "nvidia", "lazy")
    assert len(c.rows) == 5 and c.bytes == 731_906_048


def test_every_catalog_architecture_has_a_value() -> None:
    for g in list_gpus():
        for mode in ("lazy", "eager"):
            assert cuda_context_bytes(replace(g, cuda_module_loading=mode)) > 0
    assert set(ARCHITECTURE_ORDER["nvidia"]) >= {a for v, a in CATALOG_ARCHS if v == "nvidia"}
    assert set(ARCHITECTURE_ORDER["amd"]) >= {a for v, a in CATALOG_ARCHS if v == "amd"}


def test_scenario_key_reaches_the_report() -> None:
    base = {"model": "facebook/opt-125m", "task": "inference", "hardware": {"gpu": "V100-16GB"}}
    lazy = estimate(base)
    eager = estimate({**base, "hardware": {"gpu": "V100-16GB", "cuda_module_loading": "eager"}})
    assert lazy.per_gpu.outside_allocator["cuda_context"] == 130_563_440
    assert eager.per_gpu.outside_allocator["cuda_context"] == 913_833_984
    assert eager.per_gpu.device_used_bytes - lazy.per_gpu.device_used_bytes == 913_833_984 - 130_563_440
    assert any("871.5 MiB, eager module loading" in a for a in eager.assumptions)
    assert resolve_gpu("V100-16GB").cuda_module_loading == "lazy"


runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_cli_flag() -> None:
    res = runner.invoke(app, ["estimate", "--model", "facebook/opt-125m", "--gpu", "V100-16GB",
                              "--cuda-module-loading", "eager", "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["per_gpu"]["outside_allocator"]["cuda_context"] == 913_833_984
    assert r["scenario"]["hardware"]["cuda_module_loading"] == "eager"


@pytest.mark.parametrize(("value", "hint"), [("bogus", "choose 'lazy' or 'eager'"), ("EAGERLY", "did you mean 'eager'")])
def test_cli_bad_value_exits_2_with_choices(value: str, hint: str) -> None:
    res = runner.invoke(app, ["estimate", "--model", "facebook/opt-125m", "--gpu", "T4",
                              "--cuda-module-loading", value], env=ENV)
    assert res.exit_code == 2
    assert f"hardware.cuda_module_loading: '{value}' is not allowed" in res.stderr and hint in res.stderr
    assert "Traceback" not in res.output


def test_at_start_leaves_out_the_rows_measured_after_a_workload() -> None:
    # SGLang reads the memory free at start, before a workload loads its kernels: hopper's rows measured after a
    # training step / generate (794,820,608 and 731,906,048 B) are left out, so the H200 OOM row alone remains
    from vramplan.analytic.overhead import cuda_context_for
    from vramplan.catalog.resolve import resolve

    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100-SXM"},
           "serve": {"engine": "sglang"}}
    r = resolve(doc)
    assert cuda_context_for(r.gpu, at_start=True).bytes == 550_429_000
    assert cuda_context_for(r.gpu).bytes == 731_906_048
    rep = estimate(doc)
    assert any("(arxiv-confi-etu-h200)" in a for a in rep.assumptions)
