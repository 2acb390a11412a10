"""The shared bisection over a monotone predicate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vramplan.monotone import largest_true


@given(st.integers(-50, 50), st.integers(0, 100), st.integers(-60, 160))
def test_finds_the_threshold(lo: int, width: int, threshold: int) -> None:
    hi = lo + width
    calls: list[int] = []

    def ok(x: int) -> bool:
        calls.append(x)
        return x <= threshold

    got = largest_true(lo, hi, ok)
    expected = min(hi, threshold) if threshold >= lo else None
    assert got == expected
    assert len(calls) <= width.bit_length() + 2  # one check of lo, then a bisection


def test_worked_example() -> None:
    # 7 * 7 = 49 <= 50 < 64 = 8 * 8
    assert largest_true(1, 100, lambda x: x * x <= 50) == 7
    assert largest_true(3, 2, lambda x: True) is None
