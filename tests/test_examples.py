"""Every bundled example (YAML, TOML, JSON) loads and estimates, and its breakdown adds up."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramplan import estimate

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").iterdir())


def test_a_dozen_examples() -> None:
    assert len(EXAMPLES) >= 12
    assert {p.suffix for p in EXAMPLES} >= {".yaml", ".toml", ".json"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example(path: Path) -> None:
    r = estimate(path)
    assert r.per_gpu.peak_allocated_bytes == sum(r.per_gpu.breakdown.values())
    assert r.assumptions
