"""One test per GPU row, plus lookup behaviour."""

from __future__ import annotations

import pytest

from vramplan.catalog.gpus import list_gpus, resolve_gpu
from vramplan.errors import UnknownNameError
from vramplan.units import GB, GiB

ROWS = list_gpus()
REQUIRED = ["V100-16GB", "V100-32GB", "T4", "A10G", "A100-40GB", "A100-80GB", "L4", "L40S", "RTX-A6000",
            "RTX-3090", "RTX-4090", "RTX-5090", "H100-SXM", "H100-PCIe", "H100-NVL", "H200", "GH200", "B200",
            "MI250X", "MI300X"]


def test_at_least_20() -> None:
    assert len(ROWS) >= 20
    names = {g.name for g in ROWS}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize("gpu", ROWS, ids=[g.name for g in ROWS])
def test_row(gpu) -> None:  # type: ignore[no-untyped-def]
    assert gpu.sources, "every row needs a source"
    assert gpu.nominal_memory_bytes > 0
    assert gpu.hbm_bytes_per_s > 0
    assert gpu.sm_count > 0 or gpu.notes, "an unknown SM count must be explained"
    if gpu.total_memory_bytes:
        # usable (totalGlobalMem) never exceeds the physical HBM, which is the marketed number of GiB
        # (NVIDIA's "80GB" is 80 GiB) or, for a few cards, the marketed GB
        assert gpu.total_memory_bytes <= max(gpu.nominal_memory_bytes, gpu.nominal_memory_bytes // GB * GiB)
        assert gpu.total_memory_bytes > 0.85 * gpu.nominal_memory_bytes // GB * GB


def test_a100_80gb_total_memory() -> None:
    # torch reports 79.25 GiB for the A100 80GB SXM (85,100,068,864 B from deviceQuery)
    assert resolve_gpu("nvidia a100-sxm4-80gb").total_memory_bytes == 85_100_068_864


def test_typo() -> None:
    with pytest.raises(UnknownNameError) as exc:
        resolve_gpu("H10O")
    assert exc.value.suggestions
